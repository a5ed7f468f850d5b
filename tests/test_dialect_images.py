"""Images through the real proxy in every dialect, streamed and not: what reaches vLLM's chat body.

The upstream is the scripted vLLM double (tests/scripted_model.py: a small random model cannot call the
computer tool on cue), which keeps every body it was sent; the proxy is the real `python -m steps.proxy`.
Each test reads the images of that body with `images.collect`, the function the store names them with,
so an image dropped anywhere on the way (the silent drops this file guards against) fails a test. The
last tests render one conversation with two screenshots, sent in each dialect, with the tiny vision
model's own tokenizer, template and image processor.
"""

import base64
import doctest
import hashlib
import importlib
import io
import json
import secrets

import httpx
import orjson
import pytest
from PIL import Image as PILImage
from transformers import AutoTokenizer
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from steps import tiny_model
from steps.proxy import chat, images, messages, responses
from steps.proxy.config import ProxyConfig
from steps.proxy.errors import ProxyError
from steps.proxy.protocol import decode

SHELL = {"type": "function", "function": {"name": "exec_command", "parameters": {
    "type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}


def png(color: tuple[int, int, int], size: tuple[int, int] = (28, 28)) -> bytes:
    """A PNG of one colour: two colours of one size give two images that tokenize alike."""
    out = io.BytesIO()
    PILImage.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


RED, BLUE, GREEN, GREY = png((255, 0, 0)), png((0, 0, 255)), png((0, 255, 0)), png((90, 90, 90))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def url(data: bytes) -> str:
    return f"data:image/png;base64,{b64(data)}"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- one request with a user image and a tool result's image, in each dialect ----------------------
def chat_body(user: bytes | None, result: bytes | None) -> dict:
    user_content = [{"type": "text", "text": "what is on screen?"}]
    result_content = [{"type": "text", "text": "screenshot"}]
    if user is not None:
        user_content.append({"type": "image_url", "image_url": {"url": url(user), "detail": "auto"}})
    if result is not None:
        result_content.append({"type": "image_url", "image_url": {"url": url(result)}})
    return {"model": "tiny", "tools": [SHELL], "messages": [
        {"role": "system", "content": "You operate a computer."},
        {"role": "user", "content": user_content},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "exec_command", "arguments": '{"cmd": "shot"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": result_content}]}


def responses_body(user: bytes | None, result: bytes | None) -> dict:
    user_content = [{"type": "input_text", "text": "what is on screen?"}]
    output = [{"type": "input_text", "text": "screenshot"}]
    if user is not None:
        user_content.append({"type": "input_image", "image_url": url(user), "detail": "auto"})
    if result is not None:
        output.append({"type": "input_image", "image_url": url(result)})
    return {"model": "tiny", "instructions": "You operate a computer.",
            "tools": [{"type": "function", "name": "exec_command", "parameters": SHELL["function"]["parameters"]}],
            "input": [{"type": "message", "role": "user", "content": user_content},
                      {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": '{"cmd": "shot"}'},
                      {"type": "function_call_output", "call_id": "c1", "output": output}]}


def anthropic_image(data: bytes) -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(data)}}


def messages_body(user: bytes | None, result: bytes | None) -> dict:
    user_content = [{"type": "text", "text": "what is on screen?"}]
    result_content = [{"type": "text", "text": "screenshot"}]
    if user is not None:
        user_content.append(anthropic_image(user))
    if result is not None:
        result_content.append(anthropic_image(result))
    return {"model": "tiny", "max_tokens": 64, "system": "You operate a computer.",
            "tools": [{"name": "exec_command", "input_schema": SHELL["function"]["parameters"]}],
            "messages": [{"role": "user", "content": user_content},
                         {"role": "assistant", "content": [
                             {"type": "tool_use", "id": "c1", "name": "exec_command", "input": {"cmd": "shot"}}]},
                         {"role": "user", "content": [
                             {"type": "tool_result", "tool_use_id": "c1", "content": result_content}]}]}


BODIES = {"chat": chat_body, "responses": responses_body, "messages": messages_body}
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


@pytest.fixture(scope="module")
def proxies(proxy, scripted):
    """Three proxies before one scripted model: images in tool turns (limit 3), images of tool results in a
    following user message, and a model that takes no images."""
    return {"tool": proxy(scripted.url, extra=["--image-limit", "3"]),
            "user": proxy(scripted.url, extra=["--tool-images", "user"]),
            "blind": proxy(scripted.url, extra=["--image-limit", "0"])}


def send(proxy, dialect: str, body: dict, stream: bool = False, rollout: str | None = None):
    """(status, answer) of one call: the JSON object, or the list of SSE data objects when streamed."""
    registered = proxy.register(rollout or f"r-{dialect}-{secrets.token_hex(4)}")
    base = registered["anthropic_base_url"] if dialect == "messages" else registered["openai_base_url"].removesuffix("/v1")
    headers = {"x-api-key" if dialect == "messages" else "authorization":
               registered["api_key"] if dialect == "messages" else f"Bearer {registered['api_key']}"}
    answer = httpx.post(base + PATHS[dialect], json={**body, "stream": stream}, headers=headers, timeout=60)
    if not stream or answer.status_code != 200:
        return answer.status_code, answer.json()
    return 200, [json.loads(line[6:]) for line in answer.text.splitlines()
                 if line.startswith("data: ") and line != "data: [DONE]"]


def upstream(scripted) -> dict:
    """The chat body vLLM was last sent."""
    return scripted.exchanges[-1]["request"]


def image_roles(messages: list[dict]) -> list[tuple[str, str]]:
    """(role, sha256) of each image vLLM was sent, in prompt order, read as the store reads them."""
    found = images.collect(messages)
    roles = [message["role"] for message in messages if isinstance(message.get("content"), list)
             for part in message["content"] if part.get("type") == "image_url"]
    assert all(part_url.startswith("data:image/") for part_url in
               (p["image_url"]["url"] for m in messages if isinstance(m.get("content"), list)
                for p in m["content"] if p.get("type") == "image_url"))
    return list(zip(roles, (image.sha256 for image in found)))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
def test_images_reach_vllm_as_data_urls_in_their_messages_in_order(proxies, scripted, dialect, stream):
    scripted.set_commands(["echo ok"])
    status, _ = send(proxies["tool"], dialect, BODIES[dialect](RED, BLUE), stream)
    assert status == 200
    # The tool result's screenshot stays in the tool message: the tiny vision model's template renders it there.
    assert image_roles(upstream(scripted)["messages"]) == [("user", sha(RED)), ("tool", sha(BLUE))]


@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
def test_a_text_only_call_sends_no_image_so_the_check_above_can_fail(proxies, scripted, dialect):
    """The control: the same call without images gives no image, and the assertion above tells them apart
    (were the tool result's image dropped, the list would lack its entry)."""
    scripted.set_commands(["echo ok"])
    assert send(proxies["tool"], dialect, BODIES[dialect](None, None))[0] == 200
    assert image_roles(upstream(scripted)["messages"]) == []
    assert send(proxies["tool"], dialect, BODIES[dialect](RED, None))[0] == 200
    assert image_roles(upstream(scripted)["messages"]) == [("user", sha(RED))] != [("user", sha(RED)), ("tool", sha(BLUE))]


@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
def test_tool_result_images_go_to_a_following_user_message_for_a_template_without_them(proxies, scripted, dialect):
    scripted.set_commands(["echo ok"])
    assert send(proxies["user"], dialect, BODIES[dialect](RED, BLUE))[0] == 200
    messages = upstream(scripted)["messages"]
    assert image_roles(messages) == [("user", sha(RED)), ("user", sha(BLUE))]
    tool = next(i for i, message in enumerate(messages) if message["role"] == "tool")
    assert messages[tool]["content"] == "screenshot" and messages[tool + 1]["role"] == "user"


# --- refused: what would be fetched, a file, too many images, a model without vision --------------
def error_text(answer: dict) -> str:
    return answer["error"]["message"]


@pytest.mark.parametrize("dialect, change, field", [
    ("chat", lambda b: b["messages"][1]["content"][1]["image_url"].update(url="https://example.com/a.png"),
     "messages.1.content.1.image_url.url"),
    ("chat", lambda b: b["messages"][1]["content"].append({"type": "input_audio", "input_audio": {"data": "AA=="}}),
     "messages.1.content.2.type"),
    ("responses", lambda b: b["input"][0]["content"][1].update(image_url="http://127.0.0.1/a.png"),
     "input.0.content.1.image_url"),
    ("responses", lambda b: b["input"][0]["content"][1].update(image_url=None, file_id="file-1"),
     "input.0.content.1.file_id"),
    ("responses", lambda b: b["input"][2]["output"][1].update(image_url=None, file_id="file-2"),
     "input.2.output.1.file_id"),
    ("messages", lambda b: b["messages"][0]["content"][1].update(source={"type": "url", "url": "https://x/a.png"}),
     "messages.0.content.1.source.type"),
    ("messages", lambda b: b["messages"][2]["content"][0]["content"][1]["source"].update(media_type="image/svg+xml"),
     "messages.2.content.0.content.1.source.media_type"),
    ("messages", lambda b: b["messages"][2]["content"][0]["content"].append({"type": "search_result"}),
     "messages.2.content.0.content.2.type"),
])
def test_an_image_the_proxy_cannot_send_as_a_data_url_is_a_400_naming_its_field(proxies, scripted, dialect, change, field):
    body = BODIES[dialect](RED, BLUE)
    change(body)
    scripted.set_commands(["echo ok"])
    before = len(scripted.exchanges)
    status, answer = send(proxies["tool"], dialect, body)
    assert status == 400 and f"'{field}'" in error_text(answer), answer
    assert len(scripted.exchanges) == before  # nothing went upstream


@pytest.mark.parametrize("dialect, field", [("chat", "messages.3.content.3.image_url.url"),
                                            ("responses", "input.2.output.3.image_url"),
                                            ("messages", "messages.2.content.0.content.3.source")])
def test_more_images_than_the_limit_is_a_400_naming_the_first_over_it(proxies, dialect, field):
    body = BODIES[dialect](RED, BLUE)
    extra = {"chat": lambda: body["messages"][3]["content"],
             "responses": lambda: body["input"][2]["output"],
             "messages": lambda: body["messages"][2]["content"][0]["content"]}[dialect]()
    extra.append(extra[1])  # two more: image 3 is allowed (limit 3), image 4 is not
    extra.append(extra[1])
    status, answer = send(proxies["tool"], dialect, body)
    assert status == 400 and f"'{field}'" in error_text(answer) and "at most 3" in error_text(answer), answer
    extra.pop()
    assert send(proxies["tool"], dialect, body)[0] == 200


@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
def test_a_model_without_vision_refuses_any_image(proxies, dialect):
    status, answer = send(proxies["blind"], dialect, BODIES[dialect](RED, None))
    assert status == 400 and "takes no images" in error_text(answer), answer
    assert send(proxies["blind"], dialect, BODIES[dialect](None, None))[0] == 200


# --- computer tools, both ways --------------------------------------------------------------------
CLICK = {"type": "click", "x": 10, "y": 20, "button": "left"}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("tool_type", ["computer_use_preview", "computer"])
def test_responses_computer_call_round_trip(proxies, scripted, tool_type, stream):
    scripted.set_commands([{"tool": "computer", "arguments": CLICK}])
    tool = {"type": tool_type, "display_width": 1280, "display_height": 720, "environment": "browser"}
    body = {"model": "tiny", "tools": [tool], "input": "Click the button."}
    status, answer = send(proxies["tool"], "responses", body, stream)
    assert status == 200
    (offered,) = upstream(scripted)["tools"]
    assert offered["function"]["name"] == "computer" and "1280x720" in offered["function"]["description"]
    assert "click" in offered["function"]["parameters"]["properties"]["type"]["enum"]
    if stream:
        added = [e for e in answer if e["type"] == "response.output_item.added"]
        done = [e for e in answer if e["type"] == "response.output_item.done"]
        assert [e["item"]["type"] for e in added] == ["computer_call"] and added[0]["item"]["status"] == "in_progress"
        (item,) = [e["item"] for e in done]
        assert answer[-1]["type"] == "response.completed" and answer[-1]["response"]["output"] == [item]
    else:
        (item,) = answer["output"]
    assert item["type"] == "computer_call" and item["action"] == CLICK and item["pending_safety_checks"] == []
    assert item["status"] == "completed" and item["id"] and item["call_id"]

    shot = {"type": "computer_call_output", "call_id": item["call_id"],
            "output": {"type": "computer_screenshot", "image_url": url(GREEN)}}
    status, _ = send(proxies["tool"], "responses", {**body, "input": [
        {"type": "message", "role": "user", "content": "Click the button."}, item, shot]}, stream)
    assert status == 200
    messages = upstream(scripted)["messages"]
    call = messages[-2]["tool_calls"][0]
    assert call["id"] == item["call_id"] and call["function"]["name"] == "computer"
    assert json.loads(call["function"]["arguments"]) == CLICK
    assert messages[-1]["role"] == "tool" and messages[-1]["tool_call_id"] == item["call_id"]
    assert image_roles(messages) == [("tool", sha(GREEN))]


def test_a_computer_screenshot_by_file_id_is_a_400(proxies):
    body = {"model": "tiny", "tools": [{"type": "computer_use_preview"}], "input": [
        {"type": "computer_call", "call_id": "c1", "action": CLICK},
        {"type": "computer_call_output", "call_id": "c1", "output": {"type": "computer_screenshot", "file_id": "f"}}]}
    status, answer = send(proxies["tool"], "responses", body)
    assert status == 400 and "'input.1.output.file_id'" in error_text(answer)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("tool_type", ["computer_20250124", "computer_20251124"])
def test_messages_computer_tool_round_trip(proxies, scripted, tool_type, stream):
    action = {"action": "left_click", "coordinate": [10, 20]}
    scripted.set_commands([{"tool": "computer", "arguments": action}])
    tool = {"type": tool_type, "name": "computer", "display_width_px": 1280, "display_height_px": 720}
    body = {"model": "tiny", "max_tokens": 64, "tools": [tool],
            "messages": [{"role": "user", "content": "Click the button."}]}
    status, answer = send(proxies["tool"], "messages", body, stream)
    assert status == 200
    (offered,) = upstream(scripted)["tools"]  # was dropped silently: the model saw no computer tool
    assert offered["function"]["name"] == "computer" and "1280x720" in offered["function"]["description"]
    assert ("zoom" in offered["function"]["parameters"]["properties"]["action"]["enum"]) == (tool_type == "computer_20251124")
    if stream:
        (start,) = [e for e in answer if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"]
        use = {**start["content_block"], "input": json.loads(next(
            e["delta"]["partial_json"] for e in answer if e["type"] == "content_block_delta"
            and e["index"] == start["index"]))}
    else:
        (use,) = [block for block in answer["content"] if block["type"] == "tool_use"]
    assert use["name"] == "computer" and use["input"] == action

    result = {"type": "tool_result", "tool_use_id": use["id"], "content": [anthropic_image(GREY)]}
    status, _ = send(proxies["tool"], "messages", {**body, "messages": [
        *body["messages"], {"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]}, stream)
    assert status == 200
    messages = upstream(scripted)["messages"]
    assert json.loads(messages[-2]["tool_calls"][0]["function"]["arguments"]) == action
    assert image_roles(messages) == [("tool", sha(GREY))]


ANTHROPIC_DEFINED = [  # (type, name, a call, whether its schema has undo_edit)
    ("bash_20250124", "bash", {"command": "ls -la"}, None),
    ("text_editor_20250124", "str_replace_editor", {"command": "undo_edit", "path": "/app/a.py"}, True),
    ("text_editor_20250429", "str_replace_based_edit_tool", {"command": "view", "path": "/app", "view_range": [1, 9]}, False),
    ("text_editor_20250728", "str_replace_based_edit_tool",
     {"command": "str_replace", "path": "/app/a.py", "old_str": "x = 1", "new_str": "x = 2"}, False),
]


@pytest.mark.parametrize("tool_type, name, action, undo", ANTHROPIC_DEFINED, ids=[t[0] for t in ANTHROPIC_DEFINED])
def test_messages_bash_and_text_editor_tools_are_offered_and_called_back_as_tool_use(proxies, scripted, tool_type,
                                                                                     name, action, undo):
    """Were they dropped (as they were), the model would see no such tool and could not call it."""
    scripted.set_commands([{"tool": name, "arguments": action}])
    tools = [{"type": tool_type, "name": name, **({"max_characters": 500} if tool_type == "text_editor_20250728" else {})},
             {"type": "computer_20250124", "name": "computer", "display_width_px": 640, "display_height_px": 480}]
    body = {"model": "tiny", "max_tokens": 64, "tools": tools, "messages": [{"role": "user", "content": "Fix a.py."}]}
    stream = tool_type == "text_editor_20250728"
    status, answer = send(proxies["tool"], "messages", body, stream)
    assert status == 200
    offered = {tool["function"]["name"]: tool["function"] for tool in upstream(scripted)["tools"]}
    assert list(offered) == [name, "computer"]
    schema = offered[name]["parameters"]
    if undo is None:
        assert set(schema["properties"]) == {"command", "restart"} and "required" not in schema
    else:
        assert ("undo_edit" in schema["properties"]["command"]["enum"]) == undo and schema["required"] == ["command", "path"]
        assert ("500 characters" in offered[name]["description"]) == stream
    if stream:
        (start,) = [e for e in answer if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"]
        use = {**start["content_block"], "input": json.loads(next(
            e["delta"]["partial_json"] for e in answer if e["type"] == "content_block_delta" and e["index"] == start["index"]))}
    else:
        (use,) = [block for block in answer["content"] if block["type"] == "tool_use"]
    stop = next(e["delta"] for e in answer if e["type"] == "message_delta") if stream else answer
    assert use["name"] == name and use["input"] == action and stop["stop_reason"] == "tool_use"

    result = {"type": "tool_result", "tool_use_id": use["id"], "content": "total 0"}
    assert send(proxies["tool"], "messages", {**body, "messages": [
        *body["messages"], {"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]})[0] == 200
    call, answered = upstream(scripted)["messages"][-2:]
    assert call["tool_calls"][0]["function"]["name"] == name and json.loads(call["tool_calls"][0]["function"]["arguments"]) == action
    assert answered == {"role": "tool", "tool_call_id": use["id"], "content": "total 0"}


@pytest.mark.parametrize("tool", [{"type": "web_search_20250305", "name": "web_search"},
                                  {"type": "code_execution_20250825", "name": "code_execution"},
                                  {"type": "memory_20250818", "name": "memory"},
                                  {"type": "bash_20990101", "name": "bash", "input_schema": {"type": "object"}}],
                         ids=lambda tool: tool["type"])
def test_a_messages_tool_of_another_type_is_a_400_naming_it_never_dropped(proxies, scripted, tool):
    """A server tool runs on Anthropic's side and an unknown type has no schema the proxy knows: the request is
    refused (it was answered 200 with the tool silently missing); the control is the same request without it."""
    scripted.set_commands(["echo ok"])
    body = messages_body(None, None)
    body["tools"] = [*body["tools"], tool]
    before = len(scripted.exchanges)
    status, answer = send(proxies["tool"], "messages", body)
    assert status == 400 and answer["type"] == "error" and "'tools.1.type'" in error_text(answer), answer
    assert repr(tool["type"]) in error_text(answer) and len(scripted.exchanges) == before
    body["tools"].pop()
    assert send(proxies["tool"], "messages", body)[0] == 200


def test_two_messages_tools_of_one_name_are_a_400():
    body = {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "bash", "input_schema": {"type": "object"}}, {"type": "bash_20250124", "name": "bash"}]}
    req, raw = decode(orjson.dumps(body), messages.Request, fields=messages.RAW_FIELDS)
    with pytest.raises(ProxyError) as err:
        messages.to_upstream(req, raw)
    assert err.value.status == 400 and err.value.param == "tools.1.name"
    body["tools"][1]["name"] = "shell"  # the control
    req, raw = decode(orjson.dumps(body), messages.Request, fields=messages.RAW_FIELDS)
    assert [tool["function"]["name"] for tool in messages.to_upstream(req, raw)["tools"]] == ["bash", "shell"]


def test_a_request_without_a_computer_tool_offers_none(proxies, scripted):
    """The control of the computer tests: the offered tools are read from what vLLM was sent."""
    scripted.set_commands(["echo ok"])
    assert send(proxies["tool"], "messages", messages_body(None, None))[0] == 200
    assert [tool["function"]["name"] for tool in upstream(scripted)["tools"]] == ["exec_command"]


def test_renders_tool_images_reads_the_template_of_the_model():
    """Decided once per model: the tiny vision model's template renders tool-turn images, the text model's
    (which renders only a part's text) does not."""
    assert images.renders_tool_images(tiny_model.VISION_CHAT_TEMPLATE)
    assert not images.renders_tool_images(tiny_model.CHAT_TEMPLATE)


@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
def test_collect_reads_the_body_each_dialect_builds_and_names_the_harness_field(dialect):
    """What the store calls on every upstream body (chat's raw-forwarded messages included)."""
    module = {"chat": chat, "responses": responses, "messages": messages}[dialect]

    def body_of(request: dict) -> dict:
        req, raw = decode(orjson.dumps(request), module.Request, fields=module.RAW_FIELDS)
        return module.to_upstream(req, raw)

    assert [image.sha256 for image in images.collect(body_of(BODIES[dialect](RED, BLUE))["messages"])] == [sha(RED), sha(BLUE)]
    assert images.collect(body_of(BODIES[dialect](None, None))["messages"]) == []
    broken = BODIES[dialect](RED, BLUE)
    text = json.dumps(broken).replace(b64(BLUE), b64(b"not an image"))
    field = {"chat": "messages.3.content.1.image_url.url", "responses": "input.2.output.1.image_url",
             "messages": "messages.2.content.0.content.1.source"}[dialect]
    with pytest.raises(ProxyError) as err:
        images.collect(body_of(json.loads(text))["messages"])
    assert err.value.status == 400 and err.value.param == field


@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
def test_each_image_is_named_with_the_string_its_request_carried(dialect):
    """`Image.sent` is what the store replaces by a reference in the stored request: it must occur there."""
    request = BODIES[dialect](RED, BLUE)
    req, raw = decode(orjson.dumps(request), module_of(dialect).Request, fields=module_of(dialect).RAW_FIELDS)
    found = images.collect(module_of(dialect).to_upstream(req, raw)["messages"])
    stored = orjson.dumps(request).decode()
    assert [image.sent in stored for image in found] == [True, True]
    assert [image.sent for image in found] == ([b64(RED), b64(BLUE)] if dialect == "messages" else [url(RED), url(BLUE)])


def module_of(dialect: str):
    return {"chat": chat, "responses": responses, "messages": messages}[dialect]


@pytest.mark.parametrize("dialect, request_body, field", [
    ("messages", {"model": "tiny", "max_tokens": 8, "system": [anthropic_image(RED)],
                  "messages": [{"role": "user", "content": "hi"}]}, "system.0"),
    ("messages", {"model": "tiny", "max_tokens": 8, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": [anthropic_image(RED)]}]},
     "messages.1.content.0"),
    ("responses", {"model": "tiny", "input": [{"type": "message", "role": "assistant", "content": [
        {"type": "input_image", "image_url": url(RED)}]}]}, "input.0.content.0.type"),
    ("responses", {"model": "tiny", "input": [{"type": "message", "role": "user", "content": [
        {"type": "input_file", "file_id": "f"}]}]}, "input.0.content.0.type"),
])
def test_an_image_in_a_turn_that_cannot_carry_one_is_a_400_not_a_drop(dialect, request_body, field):
    module = module_of(dialect)
    req, raw = decode(orjson.dumps(request_body), module.Request, fields=module.RAW_FIELDS)
    with pytest.raises(ProxyError) as err:
        module.to_upstream(req, raw)
    assert err.value.status == 400 and err.value.param == field


# --- the tiny vision model's template: one conversation in every dialect is one prompt -------------
SCREEN, RESULT = png((200, 30, 30), (1280, 720)), png((30, 30, 200), (640, 480))


def screenshots_body(dialect: str) -> dict:
    """A user turn with a screenshot, a tool call, and its result holding another, in `dialect`."""
    url = {data: f"data:image/png;base64,{b64(data)}" for data in (SCREEN, RESULT)}
    if dialect == "chat":
        return {"model": "tiny", "max_tokens": 4, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is here?"},
                                         {"type": "image_url", "image_url": {"url": url[SCREEN]}}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "shot", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": [
                {"type": "text", "text": "zoomed"}, {"type": "image_url", "image_url": {"url": url[RESULT]}}]}]}
    if dialect == "responses":
        return {"model": "tiny", "max_output_tokens": 4, "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is here?"},
                                                            {"type": "input_image", "image_url": url[SCREEN]}]},
            {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": [
                {"type": "input_text", "text": "zoomed"}, {"type": "input_image", "image_url": url[RESULT]}]}]}
    image = {data: {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(data)}}
             for data in (SCREEN, RESULT)}
    return {"model": "tiny", "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is here?"}, image[SCREEN]]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1",
                                      "content": [{"type": "text", "text": "zoomed"}, image[RESULT]]}]}]}


@pytest.fixture(scope="module")
def checkpoint(tiny_vision_model):
    """The tiny vision model's own tokenizer and image processor."""
    return AutoTokenizer.from_pretrained(tiny_vision_model), Qwen2VLImageProcessorPil.from_pretrained(tiny_vision_model)


@pytest.fixture(scope="module")
def vision_proxy(proxy, vision_vllm):
    """The proxy in front of the session's vision vLLM (tests/conftest.py)."""
    return proxy(vision_vllm.base_url, extra=["--image-limit", "4"])


def expected_ids(dialect: str, body: dict, checkpoint) -> list[int]:
    """The template's ids for what the request means, each image pad expanded to its merged patches."""
    tokenizer, processor = checkpoint
    module = module_of(dialect)
    req, raw = decode(orjson.dumps(body), module.Request, fields=module.RAW_FIELDS)
    chat_messages = ProxyConfig("u", "s", "k").sampling(module.to_upstream(req, raw))["messages"]
    chat_messages = orjson.loads(orjson.dumps(chat_messages if isinstance(chat_messages, list)
                                              else orjson.loads(bytes(chat_messages))))
    ids = tokenizer.apply_chat_template(chat_messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    found = images.collect(chat_messages)
    grids = processor(images=[PILImage.open(io.BytesIO(image.data)).convert("RGB") for image in found],
                      return_tensors="np")["image_grid_thw"]
    counts = iter(int(t * h * w) // processor.merge_size ** 2 for t, h, w in grids)
    assert ids.count(pad) == len(found) == 2
    return [token for token in ids for token in ([token] * next(counts) if token == pad else [token])]


def test_the_three_dialects_render_one_conversation_to_the_same_ids(checkpoint):
    """The same screenshots and tool result, sent in each dialect, mean one prompt: the translations agree
    token for token under the tiny vision model's template (each image in its place, expanded)."""
    ids = {dialect: expected_ids(dialect, screenshots_body(dialect), checkpoint) for dialect in BODIES}
    assert ids["chat"] == ids["responses"] == ids["messages"]
    # 1280x720 is 24x42 patches at the tiny model's pixel cap, 640x480 is 26x36; 2x2 of them merge into a token.
    assert ids["chat"].count(checkpoint[0].convert_tokens_to_ids("<|image_pad|>")) == 252 + 234


@pytest.mark.parametrize("module", ["steps.proxy.images", "steps.proxy.chat", "steps.proxy.image_store"])
def test_doctests(module):
    failures, tried = doctest.testmod(importlib.import_module(module))
    assert tried > 0 and failures == 0


@pytest.mark.vllm
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", list(BODIES))
def test_recorded_prompt_ids_are_the_templates_with_each_image_expanded(dialect, stream, vision_proxy, checkpoint):
    body, rollout = screenshots_body(dialect), f"vision-{dialect}-{'sse' if stream else 'json'}"
    status, answer = send(vision_proxy, dialect, body, stream, rollout=rollout)
    assert status == 200, answer
    (call,) = vision_proxy.calls(rollout)
    assert call["status"] == "ok" and call["prompt_token_ids"] == expected_ids(dialect, body, checkpoint)


def test_images_of_parallel_tool_results_move_after_the_run_of_tool_messages_in_order():
    """A user message between two tool messages would split the model's parallel calls' results."""
    def tool(call_id: str, data: bytes) -> dict:
        return {"role": "tool", "tool_call_id": call_id, "content": [
            {"type": "text", "text": call_id}, images.image_part(url(data), f"{call_id}.image")]}

    calls = {"role": "assistant", "content": None, "tool_calls": [{"id": "a"}, {"id": "b"}]}
    conversation = [calls, tool("a", RED), tool("b", BLUE), {"role": "assistant", "content": "ok"}]
    placed = images.place(conversation, None, tool_images=False)
    assert [m["role"] for m in placed] == ["assistant", "tool", "tool", "user", "assistant"]
    assert [placed[1]["content"], placed[2]["content"]] == ["a", "b"]
    assert [image.sha256 for image in images.collect(placed)] == [sha(RED), sha(BLUE)]
    assert images.place(conversation, None, tool_images=True) is conversation  # the template renders them: kept
