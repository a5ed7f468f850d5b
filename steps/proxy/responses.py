"""OpenAI Responses (`/v1/responses`), the dialect of Codex CLI.

Input items become chat messages for vLLM: a model turn's reasoning, text and tool calls are merged
back into ONE assistant message, so the chat template renders it the way it was generated. Custom
(free-form) tools become function tools with one string argument `input`; a computer tool becomes the
function `computer` whose arguments are one action, called back as `computer_call` items, whose
screenshots (`computer_call_output`) become the tool results. `input_image` parts (in messages and tool
outputs) become data-URL image parts; a `file_id` or a remote URL is a 400 (docs/proxy.md, "Images").
The answer's output items are streamed as Codex requires: every item in `response.output_item.done`,
then `response.completed`.
"""

import functools
import json

import orjson

from steps.proxy.errors import ProxyError, openai_error_body as error_body  # noqa: F401 (dialect interface)
from steps.proxy.images import image_part
from steps.proxy.protocol import (NULL, Raw, ResponsesItem, ResponsesPart, ResponsesTool, decode_part, expect,
                                  function_tool, join_text, one_line)
from steps.proxy.protocol import ResponsesRequest as Request
from steps.proxy.upstream import Completion, ToolCall

NAME = "responses"
RAW_FIELDS = False  # to_upstream builds vLLM's body from the checked request alone
_CUSTOM_PARAMS = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal", "reasoning_text", "summary_text"})
COMPUTER = "computer"  # the function a computer tool is offered to the model as
_POINT = {"x": {"type": "integer"}, "y": {"type": "integer"}}
# A computer_call's action, as the function's arguments: OpenAI's action types and their fields.
COMPUTER_ACTION = {
    "type": "object",
    "properties": {
        "type": {"type": "string", "enum": ["click", "double_click", "scroll", "type", "keypress", "move", "drag",
                                            "screenshot", "wait"]},
        **_POINT,
        "button": {"type": "string", "enum": ["left", "right", "wheel", "back", "forward"]},
        "scroll_x": {"type": "integer"}, "scroll_y": {"type": "integer"},
        "text": {"type": "string"},
        "keys": {"type": "array", "items": {"type": "string"}},
        "path": {"type": "array", "items": {"type": "object", "properties": _POINT, "required": ["x", "y"]}},
    },
    "required": ["type"],
}


def _text(content: str | list[ResponsesPart] | None, field: str) -> str:
    """The text of a message's content; 400 naming the part of one that is not text (an image in an
    assistant turn, a file): such a part is never dropped."""
    if isinstance(content, str):
        return content
    return "".join(_part_text(part, f"{field}.{j}") for j, part in enumerate(content or []))


def _part_text(part: ResponsesPart, field: str) -> str:
    if part.type not in _TEXT_PARTS:
        raise ProxyError(400, f"invalid request field '{field}.type': a {part.type!r} part cannot be passed on here "
                              "(text parts can, and input_image parts in user, system and tool turns)", f"{field}.type")
    return part.text or part.refusal or ""


def _image(part: ResponsesPart, field: str) -> dict:
    """The chat image part of an `input_image`; 400 for a file_id (the proxy keeps no files) or a remote URL."""
    if part.image_url is None and part.file_id is not None:
        raise ProxyError(400, f"invalid request field '{field}.file_id': the proxy keeps no files; send the image "
                              "itself as a base64 data URL in image_url", f"{field}.file_id")
    return image_part(part.image_url, f"{field}.image_url")


def _content(content: str | list[ResponsesPart] | None, field: str):
    """Message or tool output content for vLLM: a string, or parts when images are present."""
    if isinstance(content, str) or not any(part.type == "input_image" for part in content or []):
        return _text(content, field)
    return [_image(part, f"{field}.{j}") if part.type == "input_image" else
            {"type": "text", "text": _part_text(part, f"{field}.{j}")} for j, part in enumerate(content)]


def _output(item: ResponsesItem, index: int) -> str | Raw | list:
    """A tool output for vLLM: its string (forwarded as sent), or its parts (text, images)."""
    kind = expect(item.output, '"[n', "a string or an array of parts", "input", index, "output")
    if kind == "[":
        return _content(decode_part(item.output, list[ResponsesPart], f"input.{index}.output"), f"input.{index}.output")
    return "" if kind == "n" else item.output


def _screenshot(item: ResponsesItem, index: int) -> list[dict]:
    """A computer_call_output's screenshot as the tool message's content."""
    field = f"input.{index}.output"
    expect(item.output, "{", "an object {type: computer_screenshot, image_url}", "input", index, "output")
    shot = decode_part(item.output, ResponsesPart, field)
    if shot.type != "computer_screenshot":
        raise ProxyError(400, f"invalid request field '{field}.type': must be computer_screenshot", f"{field}.type")
    return [_image(shot, field)]


def _assistant(messages: list[dict]) -> dict:
    """The assistant message that the current model turn's items attach to."""
    last = messages[-1] if messages else None
    if last is None or last["role"] != "assistant":
        last = {"role": "assistant", "content": None}
        messages.append(last)
    return last


def to_messages(req: Request) -> list[dict]:
    """Chat messages for the instructions and input items."""
    instructions = expect(req.instructions, '"n', "a string or null", "instructions") == '"'
    messages = [{"role": "system", "content": req.instructions}] if instructions else []
    items = [ResponsesItem(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    for i, item in enumerate(items):
        kind = item.type
        if kind == "message":
            role = {"developer": "system"}.get(item.role, item.role)
            if role not in ("system", "user", "assistant"):
                raise ProxyError(400, f"input[{i}].role must be user, assistant, system or developer", f"input.{i}.role")
            if role == "assistant":
                turn = _assistant(messages)
                if turn.get("tool_calls"):  # text after a tool call starts a new model turn
                    turn = {"role": "assistant", "content": None}
                    messages.append(turn)
                turn["content"] = (turn["content"] or "") + _text(item.content, f"input.{i}.content")
            else:
                messages.append({"role": role, "content": _content(item.content, f"input.{i}.content")})
        elif kind == "reasoning":
            parts = (item.content if isinstance(item.content, list) else None) or item.summary or []
            turn = _assistant(messages)
            if turn["content"] is not None or turn.get("tool_calls"):
                turn = {"role": "assistant", "content": None}
                messages.append(turn)
            turn["reasoning_content"] = "".join(part.text or "" for part in parts)
        elif kind in ("function_call", "custom_tool_call"):
            if kind == "custom_tool_call":
                arguments = orjson.dumps({"input": item.input or ""}).decode()
            else:
                arguments = item.arguments or "{}"
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": arguments}}
            _assistant(messages).setdefault("tool_calls", []).append(call)
        elif kind == "computer_call":
            # json.dumps with default separators is how vLLM's tool parsers serialise the arguments generated.
            arguments = json.dumps(item.action or {}, ensure_ascii=False)
            call = {"id": item.call_id, "type": "function", "function": {"name": COMPUTER, "arguments": arguments}}
            _assistant(messages).setdefault("tool_calls", []).append(call)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _output(item, i)})
        elif kind == "computer_call_output":
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _screenshot(item, i)})
        elif kind == "item_reference":
            raise ProxyError(400, f"input[{i}] is an item_reference: the proxy keeps no server-side state; send items in full", f"input.{i}")
        else:
            raise ProxyError(400, f"input[{i}].type {kind!r} is not supported (message, reasoning, function_call, "
                                  "function_call_output, custom_tool_call, custom_tool_call_output, computer_call, "
                                  "computer_call_output are)", f"input.{i}.type")
    return _merge_leading_system(messages)


def _merge_leading_system(messages: list[dict]) -> list[dict]:
    """Instructions and developer messages at the start become one system message (templates expect one)."""
    lead = 0
    while lead < len(messages) and messages[lead]["role"] == "system" and not isinstance(messages[lead]["content"], list):
        lead += 1
    if lead <= 1:
        return messages
    return [{"role": "system", "content": join_text([m["content"] for m in messages[:lead]], "\n\n")}] + messages[lead:]


@functools.lru_cache(maxsize=64)
def _tool_set(tools: bytes) -> tuple[tuple[dict, ...], frozenset[str]]:
    """The chat tools for vLLM and the names of the custom tools (and COMPUTER, for a computer tool), from a
    request's `tools` as sent.

    Kept by their bytes: a harness sends the same tools on every call, and decoding Codex's 18 KB of
    them twice a call cost ~30 us, five times what finding them here costs. The tools are shared
    between calls: never changed."""
    if expect(tools, "[n", "an array or null", "tools") == "n":
        return (), frozenset()
    chat_tools, custom = [], set()
    for i, tool in enumerate(decode_part(tools, list[ResponsesTool], "tools")):
        if tool.type in ("computer", "computer_use_preview"):
            chat_tools.append(_computer_tool(tool))
            custom.add(COMPUTER)
            continue
        if tool.type not in ("function", "custom"):
            continue  # hosted tools (web_search, file_search, ...) run on OpenAI's side; a local model has none
        if not tool.name:
            raise ProxyError(400, f"invalid request field 'tools.{i}.name': a {tool.type} tool needs a name", f"tools.{i}.name")
        if tool.type == "function":
            chat_tools.append(function_tool(tool.name, tool.description, tool.parameters, tool.strict, i, "parameters"))
        else:
            chat_tools.append(function_tool(tool.name, tool.description, _CUSTOM_PARAMS, None, i, "parameters"))
            custom.add(tool.name)
    names = [tool["function"]["name"] for tool in chat_tools]
    if COMPUTER in custom and names.count(COMPUTER) > 1:
        raise ProxyError(400, "invalid request field 'tools': a computer tool is offered to the model as a function "
                              f"named {COMPUTER!r}, and another tool has that name", "tools")
    return tuple(chat_tools), frozenset(custom)


def _computer_tool(tool: ResponsesTool) -> dict:
    """The function tool a computer tool is offered to the model as: its arguments are one action."""
    screen = f" The screen is {tool.display_width}x{tool.display_height} pixels" if tool.display_width else ""
    where = f" ({tool.environment})" if tool.environment else ""
    description = (f"Use the computer: one mouse or keyboard action per call, answered with a screenshot.{screen}"
                   f"{where}. Coordinates are pixels from the top left.")
    return {"type": "function", "function": {"name": COMPUTER, "description": description, "parameters": COMPUTER_ACTION}}


def to_upstream(req: Request, raw: dict) -> dict:
    """The chat body for vLLM."""
    body = {"messages": to_messages(req)}
    tools = _tool_set(bytes(req.tools))[0]
    if tools:
        body["tools"] = list(tools)
        choice = req.tool_choice
        if isinstance(choice, dict) and choice.get("name"):
            choice = {"type": "function", "function": {"name": choice["name"]}}
        if choice is not None:
            body["tool_choice"] = choice
        if req.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = req.parallel_tool_calls
    for key in ("temperature", "top_p", "seed"):
        if getattr(req, key) is not None:
            body[key] = getattr(req, key)
    if req.max_output_tokens is not None:
        body["max_tokens"] = req.max_output_tokens
    fmt = (req.text or {}).get("format") or {}
    if fmt.get("type") == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
    return body


def _call_item(call: ToolCall, index: int, custom: frozenset[str], response_id: str) -> dict:
    item_id = f"fc_{response_id}_{index}"
    if call.name == COMPUTER and COMPUTER in custom:
        action = _action(call.arguments)
        if action is not None:
            return {"type": "computer_call", "id": f"cu_{response_id}_{index}", "call_id": call.id, "action": action,
                    "pending_safety_checks": [], "status": "completed"}
        # Not an action object: the harness sees the model's text as a function call, as generated.
        return {"type": "function_call", "id": item_id, "call_id": call.id, "name": call.name,
                "arguments": call.arguments, "status": "completed"}
    if call.name in custom:
        try:
            text = orjson.loads(call.arguments).get("input", "")
        except (orjson.JSONDecodeError, AttributeError):
            text = call.arguments
        return {"type": "custom_tool_call", "id": item_id, "call_id": call.id, "name": call.name,
                "input": text, "status": "completed"}
    return {"type": "function_call", "id": item_id, "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": "completed"}


def _action(arguments: str) -> dict | None:
    """A computer call's action: its arguments, if they are a JSON object with a string `type`."""
    try:
        action = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return None
    return action if isinstance(action, dict) and isinstance(action.get("type"), str) else None


def output_items(c: Completion, req: Request, response_id: str) -> list[dict]:
    """The response's output: reasoning, message, then one item per tool call."""
    items = []
    if c.reasoning:
        items.append({"type": "reasoning", "id": f"rs_{response_id}", "summary": [],
                      "content": [{"type": "reasoning_text", "text": c.reasoning}]})
    if c.content:
        items.append({"type": "message", "id": f"msg_{response_id}", "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": c.content, "annotations": [], "logprobs": []}]})
    custom = _tool_set(bytes(req.tools))[1] if c.tool_calls else frozenset()
    items.extend(_call_item(call, i, custom, response_id) for i, call in enumerate(c.tool_calls))
    return items


def _echoed(req: Request) -> dict:
    """The request fields a response object repeats. Instructions and tools are often 10-30 KB and are
    repeated in three events and the stored call: they are copied as sent, never decoded."""
    return {"instructions": orjson.Fragment(one_line(req.instructions)), "max_output_tokens": req.max_output_tokens,
            "parallel_tool_calls": bool(req.parallel_tool_calls), "temperature": req.temperature,
            "top_p": req.top_p, "tool_choice": req.tool_choice or "auto",
            "tools": orjson.Fragment(b"[]" if req.tools == NULL else one_line(req.tools)),
            "store": False, "text": req.text or {"format": {"type": "text"}}}


def _response(c: Completion | None, req: Request, response_id: str, created: int, output: list[dict],
              echoed: dict) -> dict:
    incomplete = c is not None and c.finish_reason == "length"
    status = "in_progress" if c is None else ("incomplete" if incomplete else "completed")
    usage = None if c is None else {
        "input_tokens": c.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": c.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": c.prompt_tokens + c.completion_tokens}
    return {
        "id": f"resp_{response_id}", "object": "response", "created_at": created, "status": status,
        "model": req.model, "output": output, "usage": usage, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None, **echoed,
    }


def to_body(c: Completion, req: Request, response_id: str, created: int) -> dict:
    """The non-streaming `response` object."""
    return _response(c, req, response_id, created, output_items(c, req, response_id), _echoed(req))


def _item_events(item: dict, index: int) -> list[tuple[str, dict]]:
    """Events for one output item: added, its content deltas, done."""
    opened = {**item, "status": "in_progress"}
    base = {"output_index": index, "item_id": item["id"]}
    if item["type"] == "message":
        opened["content"] = []
        text, part = item["content"][0]["text"], {"type": "output_text", "text": "", "annotations": []}
        middle = [("response.content_part.added", {**base, "content_index": 0, "part": part}),
                  ("response.output_text.delta", {**base, "content_index": 0, "delta": text, "logprobs": []}),
                  ("response.output_text.done", {**base, "content_index": 0, "text": text, "logprobs": []}),
                  ("response.content_part.done", {**base, "content_index": 0, "part": item["content"][0]})]
    elif item["type"] == "reasoning":
        opened["content"] = []
        text = item["content"][0]["text"]
        middle = [("response.reasoning_text.delta", {**base, "content_index": 0, "delta": text}),
                  ("response.reasoning_text.done", {**base, "content_index": 0, "text": text})]
    elif item["type"] == "computer_call":  # no deltas: the action arrives whole, in output_item.done
        middle = []
    elif item["type"] == "function_call":
        opened["arguments"] = ""
        middle = [("response.function_call_arguments.delta", {**base, "delta": item["arguments"]}),
                  ("response.function_call_arguments.done", {**base, "arguments": item["arguments"]})]
    else:  # custom_tool_call
        opened["input"] = ""
        middle = [("response.custom_tool_call_input.delta", {**base, "delta": item["input"]}),
                  ("response.custom_tool_call_input.done", {**base, "input": item["input"]})]
    return [("response.output_item.added", {"output_index": index, "item": opened}), *middle,
            ("response.output_item.done", {"output_index": index, "item": item})]


def to_events(c: Completion, req: Request, response_id: str, created: int) -> list[tuple[str, dict]]:
    """created, in_progress, each item's events, then completed (or incomplete at the token limit)."""
    items = output_items(c, req, response_id)
    echoed = _echoed(req)
    start = _response(None, req, response_id, created, [], echoed)
    events = [("response.created", {"response": start}), ("response.in_progress", {"response": start})]
    for index, item in enumerate(items):
        events.extend(_item_events(item, index))
    final = _response(c, req, response_id, created, items, echoed)
    events.append(("response.incomplete" if final["status"] == "incomplete" else "response.completed",
                   {"response": final}))
    return [(name, {"type": name, "sequence_number": n, **data}) for n, (name, data) in enumerate(events)]
