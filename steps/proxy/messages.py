"""Anthropic Messages (`/v1/messages`), the dialect of Claude Code.

Content blocks become chat messages for vLLM: `tool_use` blocks become the assistant's tool calls
(arguments serialised the way vLLM's tool parser serialises them), `tool_result` blocks become tool
messages, `thinking` becomes reasoning content. Image blocks (in user turns and in tool results)
become data-URL image parts; a `url` or `file` source is a 400 (docs/proxy.md, "Images"). Anthropic's
schema-less client tools (computer, bash, text editor) become function tools of their names with the input
schemas Anthropic documents for them; a tool of any other `type` (a server tool) is a 400.
The answer streams as Claude Code requires: every block opened, filled by `content_block_delta`
events, and closed.
"""

import json

import orjson

from steps.proxy.errors import ProxyError, anthropic_error_body as error_body  # noqa: F401 (dialect interface)
from steps.proxy.images import base64_part
from steps.proxy.protocol import AnthropicBlock, AnthropicTool, Raw, decode_part, expect, function_tool, join_text
from steps.proxy.protocol import MessagesRequest as Request
from steps.proxy.upstream import Completion

NAME = "messages"
RAW_FIELDS = False  # to_upstream builds vLLM's body from the checked request alone
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
COMPUTER_TOOLS = ("computer_20241022", "computer_20250124", "computer_20251124")
BASH_TOOLS = ("bash_20241022", "bash_20250124")
TEXT_EDITOR_TOOLS = ("text_editor_20241022", "text_editor_20250124", "text_editor_20250429", "text_editor_20250728")
_CUSTOM_TOOLS = (None, "custom")  # a tool of its own input_schema
_COORDINATE = {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}
# The computer tool's input, as the function's arguments: Anthropic's actions and their fields.
COMPUTER_INPUT = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": [
            "screenshot", "left_click", "right_click", "middle_click", "double_click", "triple_click", "type", "key",
            "hold_key", "mouse_move", "left_mouse_down", "left_mouse_up", "left_click_drag", "scroll", "wait",
            "cursor_position"]},
        "coordinate": _COORDINATE,
        "start_coordinate": _COORDINATE,
        "text": {"type": "string"},
        "scroll_direction": {"type": "string", "enum": ["up", "down", "left", "right"]},
        "scroll_amount": {"type": "integer"},
        "duration": {"type": "number"},
    },
    "required": ["action"],
}
# The bash tool's input: a command, or restart (then no command).
BASH_INPUT = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "The bash command to run. Required unless the tool is being restarted."},
        "restart": {"type": "boolean", "description": "Specifying true will restart this tool. Otherwise, leave this unspecified."},
    },
}
# The text editor's input: one command on one path, and that command's fields. undo_edit is the older versions'
# (text_editor_20241022 and _20250124, named str_replace_editor); the later ones (str_replace_based_edit_tool) lack it.
TEXT_EDITOR_INPUT = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert"]},
        "path": {"type": "string", "description": "Absolute path to a file or directory."},
        "file_text": {"type": "string", "description": "create: the content of the file to be created."},
        "old_str": {"type": "string", "description": "str_replace: the text to replace, exactly as in the file (once)."},
        "new_str": {"type": "string", "description": "str_replace: the text replacing old_str; insert: the text to insert."},
        "insert_line": {"type": "integer", "description": "insert: the line after which to insert (0: the start)."},
        "view_range": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2,
                       "description": "view: [first, last] line of the file to show, from 1 (last -1: to the end)."},
    },
    "required": ["command", "path"],
}


def _text(content: str | list[AnthropicBlock]) -> str:
    if isinstance(content, str):
        return content
    return "".join(block.text for block in content or [] if block.type == "text")


def _result_content(block: AnthropicBlock, index: int, at: int) -> str | Raw | list:
    """A tool_result's content for vLLM: its string (forwarded as sent), the text of its blocks, or text and
    image parts when it holds images (a screenshot); 400 naming a block of another type."""
    field = f"messages.{index}.content.{at}.content"
    kind = expect(block.content, '"[n', "a string, an array of blocks or null", "messages", index, "content", at, "content")
    if kind != "[":
        return "" if kind == "n" else block.content
    blocks = decode_part(block.content, list[AnthropicBlock], field)
    for j, inner in enumerate(blocks):
        if inner.type not in ("text", "image"):
            raise ProxyError(400, f"invalid request field '{field}.{j}.type': a tool_result block of type "
                                  f"{inner.type!r} cannot be passed to the model (text and image blocks can)",
                             f"{field}.{j}.type")
    if not any(inner.type == "image" for inner in blocks):
        return _text(blocks)
    return [_image(inner, f"{field}.{j}") if inner.type == "image" else {"type": "text", "text": inner.text}
            for j, inner in enumerate(blocks)]


def _image(block: AnthropicBlock, field: str) -> dict:
    """The chat image part of an image block; 400 for a source other than base64 (the proxy fetches nothing)."""
    source = block.source or {}
    if source.get("type") != "base64":
        raise ProxyError(400, f"invalid request field '{field}.source.type': an image must be sent as a base64 "
                              f"source, not {source.get('type')!r}; the proxy fetches no URL and keeps no files",
                         f"{field}.source.type")
    return base64_part(source.get("media_type"), source.get("data"), f"{field}.source")


def _user(blocks: list[AnthropicBlock], messages: list[dict], index: int) -> None:
    """A user turn: tool results first (they answer the previous turn), then text and images."""
    rest = []
    for j, block in enumerate(blocks):
        if block.type == "tool_result":
            content = _result_content(block, index, j)
            if block.is_error:
                content = ([{"type": "text", "text": "Error: "}, *content] if isinstance(content, list)
                           else join_text(["Error: ", content]))
            messages.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": content})
        elif block.type == "text":
            rest.append(block)
        elif block.type == "image":
            rest.append(_image(block, f"messages.{index}.content.{j}"))
        elif block.type == "document" and (block.source or {}).get("type") == "text":
            rest.append(AnthropicBlock(type="text", text=block.source.get("data") or ""))
        else:
            raise ProxyError(400, f"messages[{index}] has a content block of type {block.type!r} that the proxy "
                                  "cannot pass to the model (text, image, tool_result and text documents can be)",
                             f"messages.{index}.content")
    if not rest:
        return
    if any(isinstance(block, dict) for block in rest):  # images
        content = [block if isinstance(block, dict) else {"type": "text", "text": block.text} for block in rest]
    else:
        content = _text(rest)
    messages.append({"role": "user", "content": content})


def _assistant(blocks: list[AnthropicBlock]) -> dict:
    message = {"role": "assistant", "content": None}
    for block in blocks:
        if block.type == "text":
            message["content"] = (message["content"] or "") + block.text
        elif block.type == "thinking":
            message["reasoning_content"] = block.thinking
        elif block.type == "tool_use":
            # json.dumps with default separators is how vLLM's tool parsers serialise arguments.
            arguments = json.dumps(block.input or {}, ensure_ascii=False)
            message.setdefault("tool_calls", []).append(
                {"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}})
    return message


def _imageless(blocks: list[AnthropicBlock] | str | None, field: str) -> None:
    """400 naming an image block of a turn whose images the proxy cannot render (system, assistant)."""
    for j, block in enumerate(blocks if isinstance(blocks, list) else ()):
        if block.type == "image":
            raise ProxyError(400, f"invalid request field '{field}.{j}': an image can be passed to the model in a "
                                  "user turn or a tool_result, not here", f"{field}.{j}")


def to_messages(req: Request) -> list[dict]:
    """Chat messages for the system prompt and the conversation."""
    _imageless(req.system, "system")
    system = [_text(req.system)] if req.system else []
    messages = []
    for i, message in enumerate(req.messages):
        blocks = [AnthropicBlock(type="text", text=message.content)] if isinstance(message.content, str) else message.content
        if message.role != "user":
            _imageless(blocks, f"messages.{i}.content")
        if message.role == "system" and not messages:
            system.append(_text(blocks))
        elif message.role == "system":
            messages.append({"role": "system", "content": _text(blocks)})
        elif message.role == "user":
            _user(blocks, messages, i)
        else:
            messages.append(_assistant(blocks))
    head = [{"role": "system", "content": "\n\n".join(system)}] if system else []
    return head + messages


def to_upstream(req: Request, raw: dict) -> dict:
    """The chat body for vLLM."""
    body = {"messages": to_messages(req), "max_tokens": req.max_tokens}
    tools = _tools(req.tools or [])
    if tools:
        if (req.tool_choice or {}).get("disable_parallel_tool_use"):
            body["parallel_tool_calls"] = False
        body["tools"] = tools
        choice = (req.tool_choice or {}).get("type")
        if choice == "any":
            body["tool_choice"] = "required"
        elif choice == "tool":
            body["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice.get("name")}}
        elif choice in ("auto", "none"):
            body["tool_choice"] = choice
    for key in ("temperature", "top_p", "top_k", "seed"):
        if getattr(req, key) is not None:
            body[key] = getattr(req, key)
    if req.stop_sequences:
        body["stop"] = req.stop_sequences
    return body


def _tools(tools: list[AnthropicTool]) -> list[dict]:
    """The chat tools for vLLM: a custom tool as a function tool of its schema, an Anthropic-defined client tool
    (computer, bash, text editor) as a function tool of its name and Anthropic's input schema. 400 naming
    `tools.N.type` for any other type (a server tool, such as web search or code execution, runs on Anthropic's
    side and a local model has none: the request is refused rather than the tool dropped), or `tools.N.name`
    for a name another tool has."""
    chat_tools, names = [], set()
    for i, tool in enumerate(tools):
        if tool.type in _CUSTOM_TOOLS:
            chat_tools.append(function_tool(tool.name, tool.description, tool.input_schema, tool.strict, i, "input_schema"))
        elif tool.type in COMPUTER_TOOLS:
            chat_tools.append(_computer_tool(tool))
        elif tool.type in BASH_TOOLS:
            chat_tools.append(_defined_tool(tool.name, "Run commands in a bash shell that keeps its state (working "
                                            "directory, environment, files) between calls; restart: true restarts it.",
                                            BASH_INPUT))
        elif tool.type in TEXT_EDITOR_TOOLS:
            chat_tools.append(_text_editor_tool(tool))
        else:
            raise ProxyError(400, f"invalid request field 'tools.{i}.type': the proxy cannot offer the model a "
                                  f"{tool.type!r} tool; it offers custom tools (input_schema) and Anthropic's client "
                                  f"tools ({', '.join(COMPUTER_TOOLS + BASH_TOOLS + TEXT_EDITOR_TOOLS)}), while a server "
                                  "tool (web search, code execution, ...) runs on Anthropic's side", f"tools.{i}.type")
        if tool.name in names:
            raise ProxyError(400, f"invalid request field 'tools.{i}.name': another tool is named {tool.name!r} "
                                  "(tool names must be unique)", f"tools.{i}.name")
        names.add(tool.name)
    return chat_tools


def _defined_tool(name: str, description: str, schema: dict) -> dict:
    """An Anthropic-defined tool as a function tool of its name; its calls come back as tool_use blocks of that
    name, as Anthropic's do."""
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


def _computer_tool(tool: AnthropicTool) -> dict:
    """The function tool a computer tool (`computer_2025*`) is offered to the model as."""
    screen = (f" The screen is {tool.display_width_px}x{tool.display_height_px} pixels."
              if tool.display_width_px and tool.display_height_px else "")
    description = ("Use the computer's mouse and keyboard: one action per call, answered with a screenshot."
                   f"{screen} Coordinates are [x, y] pixels from the top left.")
    schema = COMPUTER_INPUT
    if tool.type == "computer_20251124":  # adds zoom: a region [x1, y1, x2, y2] shown at full resolution
        action = {**schema["properties"]["action"], "enum": [*schema["properties"]["action"]["enum"], "zoom"]}
        region = {"type": "array", "items": {"type": "integer"}, "minItems": 4, "maxItems": 4}
        schema = {**schema, "properties": {**schema["properties"], "action": action, "region": region}}
    return _defined_tool(tool.name, description, schema)


def _text_editor_tool(tool: AnthropicTool) -> dict:
    """The function tool a text editor tool (`text_editor_*`) is offered to the model as: the older versions
    have undo_edit; text_editor_20250728's `max_characters` cuts a file's view."""
    schema, commands = TEXT_EDITOR_INPUT, "view (a file with line numbers, or a directory), create, str_replace, insert"
    if tool.type in ("text_editor_20241022", "text_editor_20250124"):
        command = {**schema["properties"]["command"], "enum": [*schema["properties"]["command"]["enum"], "undo_edit"]}
        schema = {**schema, "properties": {**schema["properties"], "command": command}}
        commands += ", undo_edit (the last edit of a file)"
    cut = f" A file's view is cut at {tool.max_characters} characters." if tool.max_characters else ""
    return _defined_tool(tool.name, f"View, create and edit text files, one command per call: {commands}.{cut}", schema)


def _input(arguments: str) -> dict:
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {"input": arguments}
    return value if isinstance(value, dict) else {"input": value}


def content_blocks(c: Completion) -> list[dict]:
    """The answer's content: thinking, text, then one tool_use block per tool call."""
    blocks = []
    if c.reasoning:
        blocks.append({"type": "thinking", "thinking": c.reasoning, "signature": ""})
    if c.content:
        blocks.append({"type": "text", "text": c.content})
    blocks.extend({"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call.arguments)}
                  for call in c.tool_calls)
    return blocks


def _stop(c: Completion, req: Request) -> tuple[str, str | None]:
    if c.finish_reason == "stop" and isinstance(c.stop_reason, str) and c.stop_reason in (req.stop_sequences or []):
        return "stop_sequence", c.stop_reason
    return _STOP_REASONS.get(c.finish_reason, "end_turn"), None


def _usage(c: Completion, output_tokens: int) -> dict:
    return {"input_tokens": c.prompt_tokens, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def to_body(c: Completion, req: Request, response_id: str, created: int) -> dict:
    """The non-streaming `message` object."""
    stop_reason, stop_sequence = _stop(c, req)
    return {"id": f"msg_{response_id}", "type": "message", "role": "assistant", "model": req.model,
            "content": content_blocks(c), "stop_reason": stop_reason, "stop_sequence": stop_sequence,
            "usage": _usage(c, c.completion_tokens)}


def _block_events(block: dict, index: int) -> list[tuple[str, dict]]:
    if block["type"] == "text":
        start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
    elif block["type"] == "thinking":
        start, delta = {"type": "thinking", "thinking": "", "signature": ""}, {"type": "thinking_delta", "thinking": block["thinking"]}
    else:
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        delta = {"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}
    return [("content_block_start", {"index": index, "content_block": start}),
            ("content_block_delta", {"index": index, "delta": delta}),
            ("content_block_stop", {"index": index})]


def to_events(c: Completion, req: Request, response_id: str, created: int) -> list[tuple[str, dict]]:
    """message_start, ping, each block's start/delta/stop, message_delta, message_stop."""
    head = {**to_body(c, req, response_id, created), "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": _usage(c, 1)}
    events = [("message_start", {"message": head}), ("ping", {})]
    for index, block in enumerate(content_blocks(c)):
        events.extend(_block_events(block, index))
    stop_reason, stop_sequence = _stop(c, req)
    events.append(("message_delta", {"delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                     "usage": {"output_tokens": c.completion_tokens}}))
    events.append(("message_stop", {}))
    return [(name, {"type": name, **data}) for name, data in events]
