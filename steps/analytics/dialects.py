"""Where tool calls and tool results sit in each dialect's recorded request and response.

A recorded call's `request` is the body exactly as the harness sent it, and its `response` is what the
harness was answered: one JSON body, or for a streamed call the list of SSE events as sent
(`[{"event": name or None, "data": object or "[DONE]"}, ...]`). One small reader per dialect reads them,
each with the functions of `DialectReader`. Nothing here trusts a shape: a field of the wrong type reads as
absent, so a malformed record gives fewer calls or results, never an exception.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model made: its id, the tool's name, and its arguments as sent (text or object)."""

    id: str
    name: str
    arguments: object


@dataclass(frozen=True)
class ToolResult:
    """What the harness sent back for one tool call: its id, the text, and the dialect's error flag (None
    where the dialect has none)."""

    id: str
    text: str
    is_error: bool | None = None


class DialectReader(Protocol):
    """The role each dialect's reader plays for behaviour analytics."""

    def offered_tools(self, request: object) -> list[str]:
        """The names of the tools a request offers."""

    def tool_calls(self, response: object) -> list[ToolCall]:
        """The tool calls in a response as the harness received it (streamed or not)."""

    def tool_results(self, request: object) -> list[ToolResult]:
        """Every tool result a request's conversation holds."""


def _get(value: object, key: str, kind: type | tuple = object):
    """`value[key]` when `value` is a dict and the item is of `kind`, else None."""
    item = value.get(key) if isinstance(value, dict) else None
    return item if isinstance(item, kind) else None


def _list(value: object, key: str) -> list:
    return _get(value, key, list) or []


def _text(content: object) -> str:
    """A result's content as text: a string, or the text parts of a list of content blocks.

    >>> _text("ok"), _text([{"type": "text", "text": "a"}, {"type": "input_text", "text": "b"}, 7])
    ('ok', 'a\\nb')
    """
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part["text"] for part in content if isinstance(_get(part, "text", str), str))
    return ""


def _events(response: object) -> list[dict]:
    """The data objects of a stored SSE stream (a response that is a list), else []."""
    if not isinstance(response, list):
        return []
    return [event["data"] for event in response if isinstance(_get(event, "data", dict), dict)]


class Chat:
    """OpenAI Chat Completions: `tools[].function.name`; `choices[0].message.tool_calls` (streamed: the
    `delta.tool_calls` pieces, joined by index); results are `role: "tool"` messages."""

    def offered_tools(self, request: object) -> list[str]:
        return [name for tool in _list(request, "tools") if (name := _get(_get(tool, "function", dict), "name", str))]

    def tool_calls(self, response: object) -> list[ToolCall]:
        if isinstance(response, dict):
            message = _get((_list(response, "choices") or [None])[0], "message", dict)
            pieces = [(n, piece) for n, piece in enumerate(_list(message, "tool_calls"))]
        else:
            pieces = [(_get(piece, "index", int), piece)
                      for data in _events(response) for choice in _list(data, "choices")[:1]
                      for piece in _list(_get(choice, "delta", dict), "tool_calls")]
        calls: dict[int | None, dict] = {}
        for index, piece in pieces:
            call = calls.setdefault(index, {"id": "", "name": "", "arguments": []})
            function = _get(piece, "function", dict) or {}
            # The id and name come once, in a call's first piece; an upstream repeating them on every
            # piece must not make "aaa" of them.
            call["id"] = call["id"] or _get(piece, "id", str) or ""
            call["name"] = call["name"] or _get(function, "name", str) or ""
            call["arguments"].append(_get(function, "arguments", str) or "")  # joined once: linear time
        return [ToolCall(c["id"], c["name"], "".join(c["arguments"])) for c in calls.values()]

    def tool_results(self, request: object) -> list[ToolResult]:
        return [ToolResult(_get(m, "tool_call_id", str) or "", _text(_get(m, "content")))
                for m in _list(request, "messages") if _get(m, "role") == "tool"]


class Responses:
    """OpenAI Responses: `tools[].name`; `function_call` / `custom_tool_call` output items (streamed: the
    output of `response.completed`, else each `response.output_item.done`); results are
    `function_call_output` / `custom_tool_call_output` input items."""

    CALLS = {"function_call": "arguments", "custom_tool_call": "input"}
    RESULTS = ("function_call_output", "custom_tool_call_output")

    def offered_tools(self, request: object) -> list[str]:
        return [name for tool in _list(request, "tools") if (name := _get(tool, "name", str))]

    def tool_calls(self, response: object) -> list[ToolCall]:
        items = _list(response, "output")
        events = _events(response)
        completed = [_get(e, "response", dict) for e in events if _get(e, "type") == "response.completed"]
        if completed:
            items = _list(completed[-1], "output")
        elif events:
            items = [_get(e, "item", dict) for e in events if _get(e, "type") == "response.output_item.done"]
        return [ToolCall(_get(item, "call_id", str) or "", _get(item, "name", str) or "",
                         _get(item, self.CALLS[kind]))
                for item in items if (kind := _get(item, "type", str)) in self.CALLS]

    def tool_results(self, request: object) -> list[ToolResult]:
        return [ToolResult(_get(item, "call_id", str) or "", _text(_get(item, "output")))
                for item in _list(request, "input") if _get(item, "type") in self.RESULTS]


class Messages:
    """Anthropic Messages: `tools[].name`; `tool_use` content blocks (streamed: `content_block_start` and
    the `input_json_delta` pieces of its index); results are `tool_result` blocks with `is_error`."""

    def offered_tools(self, request: object) -> list[str]:
        return [name for tool in _list(request, "tools") if (name := _get(tool, "name", str))]

    def tool_calls(self, response: object) -> list[ToolCall]:
        if isinstance(response, dict):
            return [ToolCall(_get(b, "id", str) or "", _get(b, "name", str) or "", _get(b, "input"))
                    for b in _list(response, "content") if _get(b, "type") == "tool_use"]
        blocks: dict[object, dict] = {}
        for data in _events(response):
            index, block = _get(data, "index", int), _get(data, "content_block", dict)
            if _get(data, "type") == "content_block_start" and _get(block, "type") == "tool_use":
                blocks[index] = {"id": _get(block, "id", str) or "", "name": _get(block, "name", str) or "",
                                 "json": [], "input": _get(block, "input")}
            delta = _get(data, "delta", dict)
            if index in blocks and _get(delta, "type") == "input_json_delta":
                blocks[index]["json"].append(_get(delta, "partial_json", str) or "")  # joined once: linear time
        # The deltas carry the input; the start block's `{}` stands only when no delta came.
        return [ToolCall(b["id"], b["name"], "".join(b["json"]) or b["input"]) for b in blocks.values()]

    def tool_results(self, request: object) -> list[ToolResult]:
        return [ToolResult(_get(block, "tool_use_id", str) or "", _text(_get(block, "content")),
                           _get(block, "is_error", bool))
                for message in _list(request, "messages") for block in _list(message, "content")
                if _get(block, "type") == "tool_result"]


READERS: dict[str, DialectReader] = {"chat_completions": Chat(), "responses": Responses(), "messages": Messages()}


def decoded_arguments(arguments: object) -> dict | None:
    """A tool call's arguments as an object: decoded from JSON text, or None when they are not an object.

    >>> decoded_arguments('{"cmd": "ls"}'), decoded_arguments({"command": "ls"}), decoded_arguments("ls -la")
    ({'cmd': 'ls'}, {'command': 'ls'}, None)
    """
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    return arguments if isinstance(arguments, dict) else None
