"""One error type for the proxy, rendered in the error shape of the dialect that was called.

A handler never lets a traceback reach a harness: everything becomes a `ProxyError` and then the
OpenAI shape (`{"error": {...}}`) or the Anthropic shape (`{"type": "error", "error": {...}}`).
"""

from dataclasses import dataclass

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


@dataclass
class ProxyError(Exception):
    """An error for the client: HTTP status, a sentence for people, and optional field / code."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None

    def __str__(self) -> str:
        return self.message


def openai_error_body(err: ProxyError) -> dict:
    """The OpenAI error object used by Chat Completions and Responses."""
    kind = _OPENAI_TYPES.get(err.status, "server_error" if err.status >= 500 else "invalid_request_error")
    return {"error": {"message": err.message, "type": kind, "param": err.param, "code": err.code}}


def anthropic_error_body(err: ProxyError) -> dict:
    """The Anthropic Messages error object."""
    return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(err.status, "api_error"), "message": err.message}}


def validation_message(exc) -> tuple[str, str]:
    """Turns a pydantic ValidationError into ("field.path: what is wrong", "field.path")."""
    first = exc.errors()[0]
    loc = ".".join(str(part) for part in first["loc"]) or "body"
    return f"invalid request field '{loc}': {first['msg']}", loc
