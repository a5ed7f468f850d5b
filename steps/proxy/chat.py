"""OpenAI Chat Completions (`/v1/chat/completions`): the dialect closest to vLLM's own.

The harness's request goes upstream nearly as sent (vendor extras included); the answer is rebuilt
from the recorded completion, so what the harness sees is exactly what was recorded.
"""

import msgspec

from steps.proxy.errors import ProxyError, openai_error_body as error_body  # noqa: F401 (dialect interface)
from steps.proxy.images import image_part
from steps.proxy.protocol import ChatPart, decode_part
from steps.proxy.protocol import ChatRequest as Request
from steps.proxy.upstream import Completion

NAME = "chat_completions"
RAW_FIELDS = True  # to_upstream forwards the request's own top-level fields, kept as raw JSON
ID_PREFIX = "chatcmpl-"
_NOT_FORWARDED = {"stream", "stream_options", "n", "model", "logprobs", "top_logprobs", "return_token_ids"}
# Parts vLLM renders as text. Every other part vLLM takes carries media (audio, video, embeddings, PIL
# objects, files, a URL it would fetch): the proxy could not record them, so they are refused, never dropped.
_TEXT_PARTS = frozenset({"text", "input_text", "output_text", "refusal", "thinking"})


def to_upstream(req: Request, raw: dict) -> dict:
    """The chat body for vLLM: the harness's own fields, less streaming and token options."""
    if req.stream_options and not req.stream:
        raise ProxyError(400, "stream_options is only allowed with stream: true", param="stream_options")
    body = {key: value for key, value in raw.items() if key not in _NOT_FORWARDED}
    if "messages" in raw and not _text_only(req):  # decoded only when a part is not text: an image, or a refusal
        body["messages"] = checked_messages(msgspec.json.decode(raw["messages"]))
    if req.max_completion_tokens is not None:  # vLLM takes it over max_tokens: one key, which the cap bounds
        body.pop("max_completion_tokens", None)
        body["max_tokens"] = req.max_completion_tokens
    if req.top_logprobs:
        body["top_logprobs"] = req.top_logprobs
    return body


def _text_only(req: Request) -> bool:
    """Whether every content part of the request is text (read without decoding the texts)."""
    for i, message in enumerate(req.messages):
        if bytes(memoryview(message.content)[:1]) == b"[":
            parts = decode_part(message.content, list[ChatPart | str], f"messages.{i}.content")
            if any(not isinstance(part, str) and (part.type not in _TEXT_PARTS or part.uuid is not None) for part in parts):
                return False
    return True


def checked_messages(messages: list[dict]) -> list[dict]:
    """Chat messages whose content parts are each text or an image as a data URL, the image parts made
    `ImagePart`s (which name their field); 400 naming the part of any other.

    >>> checked_messages([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}])
    Traceback (most recent call last):
    ...
    steps.proxy.errors.ProxyError: invalid request field 'messages.0.content.0.type': 'input_audio' parts are not passed on (text parts and image_url parts holding a base64 data URL are)
    """
    for i, message in enumerate(messages):
        content = message.get("content")
        for j, part in enumerate(content if isinstance(content, list) else ()):
            field = f"messages.{i}.content.{j}"
            kind = part.get("type") if isinstance(part, dict) else "text" if isinstance(part, str) else None
            if isinstance(part, dict) and "uuid" in part:  # vLLM would take it as a cached image's name
                raise ProxyError(400, f"invalid request field '{field}.uuid': the proxy passes no media by "
                                      "reference; send the image itself as a data URL", param=f"{field}.uuid")
            if kind == "image_url":
                url = part.get("image_url")
                content[j] = image_part(url.get("url") if isinstance(url, dict) else url, f"{field}.image_url.url")
            elif kind not in _TEXT_PARTS:
                raise ProxyError(400, f"invalid request field '{field}.type': {kind!r} parts are not passed on (text "
                                      "parts and image_url parts holding a base64 data URL are)", param=f"{field}.type")
    return messages


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
