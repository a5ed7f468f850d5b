"""A rollout's exchange as the harness saw it, from the proxy's call records, in one shape for every dialect.

A turn is {"role", "kind", "name", "text"}: role system | user | assistant | tool; kind text | reasoning |
tool_call | tool_result | image | other; a turn that carried images also has `images`, the names (SHA-256) its
stored request gives them in the order the harness sent them (`steps.proxy.image_store`: a stored request holds
`openforge-image:sha256:<name>` where an image's bytes were). Each call shows what its request added to the one
before it (an agent's context grows by appending) and its response; where the harness rewrote its history
(compaction, a dropped turn), the turn it rewrote from is named and the request is shown from there.
"""

import json
import re

from steps.proxy.images import REFERENCE_PREFIX

_REFERENCE = re.compile(re.escape(REFERENCE_PREFIX) + "([0-9a-f]{64})")
# The parts that carry an image in each dialect: Chat `image_url`, Responses `input_image` and a computer call's
# `computer_screenshot`, Messages `image`.
IMAGE_PARTS = ("image_url", "input_image", "computer_screenshot", "image")


def turn(role: str, kind: str, text, name: str | None = None, images: list[str] | None = None) -> dict:
    """One turn; non-string content is shown as JSON; `images` (names) only when it carried some.

    >>> turn("tool", "tool_result", {"exit": 0}, name="shell")
    {'role': 'tool', 'kind': 'tool_result', 'name': 'shell', 'text': '{"exit": 0}'}
    """
    out = {"role": role, "kind": kind, "name": name,
           "text": text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)}
    if images:
        out["images"] = images
    return out


def image_name(part) -> str | None:
    """The stored image an image part names (its SHA-256), or None: a part of another type, or one whose payload is
    not a reference (a record hand-written, or older than the image store), which is shown as JSON text.

    >>> image_name({"type": "input_image", "image_url": "openforge-image:sha256:" + "ab" * 32}) == "ab" * 32
    True
    >>> image_name({"type": "text", "text": "openforge-image:sha256:" + "ab" * 32}) is None
    True
    """
    if not isinstance(part, dict) or part.get("type") not in IMAGE_PARTS:
        return None
    if part["type"] == "image":  # Messages: {"source": {"type": "base64", "data": ...}}
        payload = part["source"].get("data") if isinstance(part.get("source"), dict) else None
    else:  # Chat: {"image_url": {"url": ...}}; Responses: {"image_url": ...}
        payload = part.get("image_url")
        payload = payload.get("url") if isinstance(payload, dict) else payload
    match = _REFERENCE.fullmatch(payload) if isinstance(payload, str) else None
    return match[1] if match else None


def _content_text(content) -> str:
    """The text of a content that is a string or a list of text parts (stored images left to `_content_images`,
    others shown as JSON)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part.get("text", "") if isinstance(part, dict) and "text" in part
                         else json.dumps(part, ensure_ascii=False) for part in content if image_name(part) is None)
    if image_name(content) is not None:
        return ""
    return json.dumps(content, ensure_ascii=False)


def _content_images(content) -> list[str]:
    """The stored images a content (a list of parts, or one part) names, in the order it holds them."""
    parts = content if isinstance(content, list) else [content]
    return [name for name in map(image_name, parts) if name is not None]


# --- Chat Completions --------------------------------------------------------------------------------------
def _chat_message(message: dict) -> list[dict]:
    role = str(message.get("role", "?"))
    out = []
    for key in ("reasoning_content", "reasoning"):
        if message.get(key):
            out.append(turn(role, "reasoning", message[key]))
    if role == "tool":
        content = message.get("content")
        out.append(turn(role, "tool_result", _content_text(content), message.get("name"), _content_images(content)))
    elif message.get("content") not in (None, "", []):
        parts = message["content"] if isinstance(message["content"], list) else [message["content"]]
        for part in parts:
            if isinstance(part, dict) and part.get("type") == "image_url":
                name = image_name(part)
                out.append(turn(role, "image", "" if name else part, images=[name] if name else None))
            else:
                out.append(turn(role, "text", _content_text([part] if isinstance(part, dict) else part)))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        out.append(turn(role, "tool_call", function.get("arguments", ""), function.get("name")))
    return out


def _chat_request(request: dict) -> list[dict]:
    return [t for m in request.get("messages") or [] if isinstance(m, dict) for t in _chat_message(m)]


def _chat_response(response) -> list[dict]:
    if isinstance(response, list):  # a stream: the deltas put back together
        message: dict = {"role": "assistant", "content": "", "reasoning_content": ""}
        calls: dict[int, dict] = {}
        for event in response:
            data = event.get("data") if isinstance(event, dict) else None
            for choice in (data or {}).get("choices", []) if isinstance(data, dict) else []:
                delta = choice.get("delta") or {}
                message["content"] += delta.get("content") or ""
                message["reasoning_content"] += delta.get("reasoning_content") or delta.get("reasoning") or ""
                for call in delta.get("tool_calls") or []:
                    slot = calls.setdefault(call.get("index", 0), {"function": {"name": "", "arguments": ""}})
                    function = call.get("function") or {}
                    slot["function"]["name"] += function.get("name") or ""
                    slot["function"]["arguments"] += function.get("arguments") or ""
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
        return _chat_message(message)
    choices = (response or {}).get("choices") or [{}]
    return _chat_message(choices[0].get("message") or {})


# --- Responses ---------------------------------------------------------------------------------------------
def _responses_item(item) -> list[dict]:
    if not isinstance(item, dict):
        return [turn("user", "text", _content_text(item))]
    kind = item.get("type", "message")
    if kind == "message":
        content = item.get("content")
        return [turn(str(item.get("role", "?")), "text", _content_text(content), images=_content_images(content))]
    if kind == "function_call":
        return [turn("assistant", "tool_call", item.get("arguments", ""), item.get("name"))]
    if kind == "function_call_output":
        output = item.get("output")
        return [turn("tool", "tool_result", _content_text(output), item.get("call_id"), _content_images(output))]
    if kind == "computer_call_output" and _content_images(item.get("output")):  # the screenshot answering a computer call
        return [turn("tool", "tool_result", "", item.get("call_id"), _content_images(item.get("output")))]
    if kind == "reasoning":
        text = "\n".join(_content_text(part.get("text", "")) for part in (item.get("summary") or []) + (item.get("content") or [])
                         if isinstance(part, dict))
        return [turn("assistant", "reasoning", text)]
    return [turn("assistant" if kind.endswith("_call") else "tool", "other", item, kind)]


def _responses_request(request: dict) -> list[dict]:
    out = [turn("system", "text", request["instructions"])] if request.get("instructions") else []
    items = request.get("input")
    return out + ([turn("user", "text", items)] if isinstance(items, str)
                  else [t for item in items or [] for t in _responses_item(item)])


def _responses_response(response) -> list[dict]:
    if isinstance(response, list):  # a stream: its last event with the whole response
        finals = [e["data"]["response"] for e in response if isinstance(e, dict) and isinstance(e.get("data"), dict)
                  and isinstance(e["data"].get("response"), dict)]
        response = finals[-1] if finals else {}
    return [t for item in (response or {}).get("output") or [] for t in _responses_item(item)]


# --- Anthropic Messages ------------------------------------------------------------------------------------
def _messages_block(role: str, block) -> list[dict]:
    if not isinstance(block, dict):
        return [turn(role, "text", _content_text(block))]
    kind = block.get("type")
    if kind == "text":
        return [turn(role, "text", block.get("text", ""))]
    if kind in ("thinking", "redacted_thinking"):
        return [turn(role, "reasoning", block.get("thinking", block.get("data", "")))]
    if kind == "tool_use":
        return [turn(role, "tool_call", block.get("input", {}), block.get("name"))]
    if kind == "tool_result":
        content = block.get("content")
        return [turn("tool", "tool_result", _content_text(content), block.get("tool_use_id"), _content_images(content))]
    if kind == "image":
        name = image_name(block)
        return [turn(role, "image", "" if name else block, images=[name] if name else None)]
    return [turn(role, "other", block, kind)]


def _messages_request(request: dict) -> list[dict]:
    out = [turn("system", "text", _content_text(request["system"]))] if request.get("system") else []
    for message in request.get("messages") or []:
        if not isinstance(message, dict):
            continue
        role, content = str(message.get("role", "?")), message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        out += [t for block in blocks for t in _messages_block(role, block)]
    return out


def _messages_response(response) -> list[dict]:
    if isinstance(response, list):  # a stream: the content blocks put back together
        blocks: dict[int, dict] = {}
        for event in response:
            data = event.get("data") if isinstance(event, dict) else None
            if not isinstance(data, dict):
                continue
            if data.get("type") == "content_block_start":
                blocks[data.get("index", 0)] = dict(data.get("content_block") or {}, partial="")
            elif data.get("type") == "content_block_delta":
                block, delta = blocks.setdefault(data.get("index", 0), {"type": "text", "partial": ""}), data.get("delta") or {}
                for key in ("text", "thinking"):
                    if key in delta:
                        block[key] = block.get(key, "") + delta[key]
                block["partial"] += delta.get("partial_json", "")
        response = {"content": [dict(b, input=b["partial"]) if b.get("type") == "tool_use" and b["partial"] else b
                                for _, b in sorted(blocks.items())]}
    return [t for block in (response or {}).get("content") or [] for t in _messages_block("assistant", block)]


DIALECTS = {"chat_completions": (_chat_request, _chat_response), "responses": (_responses_request, _responses_response),
            "messages": (_messages_request, _messages_response)}


def request_turns(dialect: str, request) -> list[dict]:
    """The turns of a call's request (the whole context the harness sent).

    >>> request_turns("messages", {"system": "be brief", "messages": [{"role": "user", "content": "hi"}]})
    [{'role': 'system', 'kind': 'text', 'name': None, 'text': 'be brief'}, {'role': 'user', 'kind': 'text', 'name': None, 'text': 'hi'}]
    """
    if not isinstance(request, dict) or dialect not in DIALECTS:
        return [] if request is None else [turn("user", "other", request, "request")]
    return DIALECTS[dialect][0](request)


def response_turns(dialect: str, response) -> list[dict]:
    """The turns of a call's response (a JSON body, or the stored events of a stream).

    >>> response_turns("chat_completions", [{"data": {"choices": [{"delta": {"content": "do"}}]}},
    ...                                     {"data": {"choices": [{"delta": {"content": "ne"}}]}}, {"data": "[DONE]"}])
    [{'role': 'assistant', 'kind': 'text', 'name': None, 'text': 'done'}]
    """
    if dialect not in DIALECTS or response is None:
        return [] if response is None else [turn("assistant", "other", response, "response")]
    return DIALECTS[dialect][1](response)


def _same(a: dict, b: dict) -> bool:
    """The same turn, whatever re-serialisation the harness applied (JSON arguments re-spaced, text trimmed)."""
    def norm(text: str) -> str:
        try:
            return json.dumps(json.loads(text), sort_keys=True)
        except ValueError:
            return text.strip()
    return (a["kind"], a.get("name")) == (b["kind"], b.get("name")) and norm(a["text"]) == norm(b["text"])


def sent_back(added: list[dict], answered: list[dict]) -> list[dict]:
    """What a request added, without the previous response the harness sent back at its start: a leading
    assistant turn is left out only when it equals a turn of that response (a reasoning turn the harness did
    not send back may be skipped); one that differs is kept and marked `changed`, so that nothing the harness
    sent is hidden.

    >>> said = [turn("assistant", "text", "ok")]
    >>> [(t["text"], t.get("changed")) for t in sent_back([turn("assistant", "text", "ok"), turn("user", "text", "go")], said)]
    [('go', None)]
    >>> [(t["text"], t.get("changed")) for t in sent_back([turn("assistant", "text", "I agree to anything")], said)]
    [('I agree to anything', True)]
    """
    out, rest = list(added), list(answered)
    while rest and out and out[0]["role"] == "assistant":
        match = next((n for n, t in enumerate(rest) if _same(t, out[0])), None)
        if match is None:
            return [dict(t, changed=True) if t["role"] == "assistant" and n < _leading(out) else t
                    for n, t in enumerate(out)]
        out, rest = out[1:], rest[match + 1:]
    return out


def _leading(turns: list[dict]) -> int:
    return next((n for n, t in enumerate(turns) if t["role"] != "assistant"), len(turns))


def exchange(records: list[dict]) -> list[dict]:
    """Per call: its index, what its request added to the previous call's (`added`), `rewritten_from` (the
    turn the harness rewrote its history from, or None) and its response turns. The previous response, which
    the harness sends back as the start of what the next request adds, is not shown twice.

    >>> calls = [{"call_index": 0, "dialect": "messages", "request": {"messages": [{"role": "user", "content": "hi"}]},
    ...           "response": {"content": [{"type": "text", "text": "yo"}]}},
    ...          {"call_index": 1, "dialect": "messages", "request": {"messages": [{"role": "user", "content": "hi"},
    ...           {"role": "assistant", "content": "yo"}, {"role": "user", "content": "more"}]}, "response": None}]
    >>> [([t["text"] for t in c["added"]], c["rewritten_from"]) for c in exchange(calls)]
    [(['hi'], None), (['more'], None)]
    """
    out, before, answered = [], [], []
    for record in records:
        turns = request_turns(record.get("dialect"), record.get("request"))
        shared = 0
        while shared < min(len(before), len(turns)) and before[shared] == turns[shared]:
            shared += 1
        rewritten = shared if shared < len(before) else None
        added = turns[shared:] if rewritten is not None else sent_back(turns[shared:], answered)
        answered = response_turns(record.get("dialect"), record.get("response"))
        out.append({"call_index": record.get("call_index"), "added": added, "rewritten_from": rewritten,
                    "response": answered})
        before = turns
    return out
