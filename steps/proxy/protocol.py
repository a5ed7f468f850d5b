"""Request models of the three dialects the proxy speaks, checked before anything goes upstream.

They type what the proxy reads and bound what it forwards; unknown fields are allowed (harnesses
send many vendor extras) and ignored. Responses are built as plain dicts by each dialect module.

msgspec Structs rather than pydantic models (STYLE.md 6), for the hot path: one pass over an agent's
30-80 KB request decodes and checks it 2-3x faster than orjson + pydantic, and `decode` keeps the
top-level fields as raw JSON, so what is forwarded to vLLM is copied, never decoded and re-encoded.
"""

import re
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta, Raw, Struct

from steps.proxy.errors import ProxyError

T = TypeVar("T")
_FIELDS = msgspec.json.Decoder(dict[str, Raw])
_DECODERS: dict[type, msgspec.json.Decoder] = {}
_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_NAMED = re.compile(r"^(?:Object missing required field )?`(?P<name>[^`]+)`")


def decode(data: bytes, kind: type[T]) -> tuple[T, dict[str, Raw]]:
    """The request body checked against `kind`, and its top-level fields as raw JSON; 400 naming the
    field if it is not valid JSON or not a valid request."""
    try:
        fields = _FIELDS.decode(data)
    except msgspec.ValidationError:
        raise ProxyError(400, "request body must be a JSON object") from None
    except msgspec.DecodeError as exc:
        raise ProxyError(400, f"request body is not valid JSON: {exc}") from None
    decoder = _DECODERS.get(kind) or _DECODERS.setdefault(kind, msgspec.json.Decoder(kind))
    try:
        return decoder.decode(data), fields
    except msgspec.ValidationError as exc:
        message, field = invalid_field(exc)
        raise ProxyError(400, message, param=field) from None


def plain(value):
    """A value as Python data, decoding it if it was kept as raw JSON."""
    return msgspec.json.decode(value) if isinstance(value, Raw) else value


def invalid_field(exc: msgspec.ValidationError) -> tuple[str, str]:
    """("invalid request field 'messages.0.role': what is wrong", "messages.0.role") from msgspec's
    "Invalid enum value 'robot' - at `$.messages[0].role`"."""
    match = _AT.match(str(exc))
    what, path = match["what"], re.sub(r"\[(\d+)\]", r".\1", match["path"] or "").lstrip(".")
    named = _NAMED.match(what)
    if named:
        path = f"{path}.{named['name']}".lstrip(".")
    field = path or "body"
    return f"invalid request field '{field}': {what}", field


class Sampling(Struct, kw_only=True):
    """Sampling settings shared by all dialects."""

    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    seed: int | None = None


# --- OpenAI Chat Completions -------------------------------------------------------------------
class ChatFunctionCall(Struct, kw_only=True):
    name: str
    arguments: str | dict = "{}"


class ChatToolCall(Struct, kw_only=True):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ChatFunctionCall


class ChatMessage(Struct, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    # Forwarded as sent and never read here: kept raw, only its JSON type is checked.
    content: Raw = Raw(b"null")
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: str | None = None

    def __post_init__(self) -> None:
        if bytes(memoryview(self.content)[:1]) not in b'"[n':  # a JSON string, array or null, by its first byte
            raise ValueError("`content` must be a string, an array of parts or null")


class ChatFunction(Struct, kw_only=True):
    name: str  # description and parameters are forwarded as sent, not decoded here


class ChatTool(Struct, kw_only=True):
    type: Literal["function"] = "function"
    function: ChatFunction


class ChatRequest(Sampling, kw_only=True):
    model: str
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Meta(ge=1)] | None = None
    stop: str | list[str] | None = None
    n: Literal[1] = 1
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None


# --- OpenAI Responses ----------------------------------------------------------------------------
class ResponsesRequest(Sampling, kw_only=True):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: Annotated[int, Meta(ge=1)] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: None = None  # server-side state is not kept
    text: dict[str, Any] | None = None


# --- Anthropic Messages --------------------------------------------------------------------------
class AnthropicMessage(Struct, kw_only=True):
    # "system" is not in Anthropic's API, but Claude Code sends it inside `messages`.
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class AnthropicTool(Struct, kw_only=True):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None
    strict: bool | None = None


class MessagesRequest(Sampling, kw_only=True):
    model: str
    messages: Annotated[list[AnthropicMessage], Meta(min_length=1)]
    max_tokens: Annotated[int, Meta(ge=1)]
    system: str | list[dict[str, Any]] | None = None
    stream: bool = False
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None
