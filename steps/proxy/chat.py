"""OpenAI Chat Completions (`/v1/chat/completions`): the dialect closest to vLLM's own.

The harness's request goes upstream nearly as sent (vendor extras included); the answer is rebuilt
from the recorded completion, so what the harness sees is exactly what was recorded.
"""

from steps.proxy.errors import ProxyError, openai_error_body as error_body  # noqa: F401 (dialect interface)
from steps.proxy.protocol import ChatRequest as Request
from steps.proxy.upstream import Completion

NAME = "chat_completions"
RAW_FIELDS = True  # to_upstream forwards the request's own top-level fields, kept as raw JSON
ID_PREFIX = "chatcmpl-"
_NOT_FORWARDED = {"stream", "stream_options", "n", "model", "logprobs", "top_logprobs", "return_token_ids"}


def to_upstream(req: Request, raw: dict) -> dict:
    """The chat body for vLLM: the harness's own fields, less streaming and token options."""
    if req.stream_options and not req.stream:
        raise ProxyError(400, "stream_options is only allowed with stream: true", param="stream_options")
    body = {key: value for key, value in raw.items() if key not in _NOT_FORWARDED}
    if req.max_completion_tokens is not None:  # vLLM takes it over max_tokens: one key, which the cap bounds
        body.pop("max_completion_tokens", None)
        body["max_tokens"] = req.max_completion_tokens
    if req.top_logprobs:
        body["top_logprobs"] = req.top_logprobs
    return body


def _message(c: Completion) -> dict:
    message = {"role": "assistant", "content": c.content}
    if c.reasoning is not None:
        message["reasoning_content"] = c.reasoning
    if c.tool_calls:
        message["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in c.tool_calls
        ]
    return message


def _usage(c: Completion) -> dict:
    return {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
            "total_tokens": c.prompt_tokens + c.completion_tokens}


def _logprobs(c: Completion, req: Request) -> dict | None:
    return {"content": c.logprob_entries} if req.logprobs else None


def to_body(c: Completion, req: Request, response_id: str, created: int) -> dict:
    """The non-streaming `chat.completion` object."""
    return {
        "id": ID_PREFIX + response_id,
        "object": "chat.completion",
        "created": created,
        "model": req.model,
        "choices": [{"index": 0, "message": _message(c), "logprobs": _logprobs(c, req),
                     "finish_reason": c.finish_reason}],
        "usage": _usage(c),
    }


def to_events(c: Completion, req: Request, response_id: str, created: int) -> list[tuple[str | None, object]]:
    """The `chat.completion.chunk` stream: role, reasoning, content, tool calls, finish, usage, [DONE]."""
    head = {"id": ID_PREFIX + response_id, "object": "chat.completion.chunk", "created": created, "model": req.model}

    def chunk(delta: dict, finish: str | None = None) -> tuple[None, dict]:
        return None, {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    events = [chunk({"role": "assistant", "content": ""})]
    if c.reasoning:
        events.append(chunk({"reasoning_content": c.reasoning}))
    if c.content:
        events.append(chunk({"content": c.content}))
    for index, call in enumerate(c.tool_calls):
        events.append(chunk({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                             "function": {"name": call.name, "arguments": call.arguments}}]}))
    last = chunk({}, c.finish_reason)
    if req.logprobs:
        last[1]["choices"][0]["logprobs"] = _logprobs(c, req)
    events.append(last)
    if (req.stream_options or {}).get("include_usage"):
        events.append((None, {**head, "choices": [], "usage": _usage(c)}))
    events.append((None, "[DONE]"))
    return events
