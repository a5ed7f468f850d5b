"""The dialect translations as pure functions: harness request -> vLLM chat body, completion -> answer.

End-to-end behaviour (real vLLM, official SDKs, real harnesses) is covered elsewhere; these pin down
the translation rules whose breakage would silently change what the model sees or what a harness reads.
"""

import json

import msgspec
import orjson
import pytest

from steps.proxy import chat, messages, responses
from steps.proxy.errors import ProxyError
from steps.proxy.protocol import decode
from steps.proxy.upstream import Completion, ToolCall, parse_completion


def request(dialect, body: dict):
    """The dialect's checked request, decoded from the JSON bytes as the proxy does."""
    return decode(orjson.dumps(body), dialect.Request)[0]


def sent(dialect, body: dict, raw: dict | None = None) -> dict:
    """The chat body vLLM receives for a harness request, as JSON (raw texts and schemas included)."""
    return orjson.loads(msgspec.json.encode(dialect.to_upstream(request(dialect, body), raw or {})))


def completion(**overrides) -> Completion:
    fields = dict(content="Let me look.", reasoning=None, finish_reason="tool_calls", stop_reason=None,
                  tool_calls=[ToolCall("call_1", "exec_command", '{"cmd": "ls"}')],
                  prompt_token_ids=[1, 2, 3], response_token_ids=[7, 8], response_logprobs=[-0.1, -0.2])
    fields.update(overrides)
    return Completion(**fields)


# --- Responses -------------------------------------------------------------------------------------
def test_responses_merges_one_model_turn_into_one_assistant_message():
    body = sent(responses, {"model": "m", "instructions": "be brief", "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox rules"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": '{"cmd": "ls"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
    ]})
    assert body["messages"] == [
        {"role": "system", "content": "be brief\n\nsandbox rules"},
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": "Let me look.", "reasoning_content": "think",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "exec_command", "arguments": '{"cmd": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        {"role": "assistant", "content": "done"},
    ]


def test_responses_custom_tools_round_trip_through_a_string_argument():
    req = request(responses, {"model": "m", "input": "patch it", "tools": [
        {"type": "custom", "name": "apply_patch", "description": "patch", "format": {"type": "grammar"}},
        {"type": "web_search"},
    ]})
    body = orjson.loads(msgspec.json.encode(responses.to_upstream(req, {})))
    assert body["tools"] == [{"type": "function", "function": {"name": "apply_patch", "description": "patch",
                                                               "parameters": responses._CUSTOM_PARAMS}}]
    c = completion(content=None, tool_calls=[ToolCall("c9", "apply_patch", '{"input": "*** Begin Patch"}')])
    (item,) = responses.to_body(c, req, "r", 0)["output"]
    assert item["type"] == "custom_tool_call" and item["input"] == "*** Begin Patch" and item["call_id"] == "c9"


@pytest.mark.parametrize("item, field", [
    ({"type": "item_reference", "id": "x"}, "input.0"),
    ({"type": "local_shell_call"}, "input.0.type"),
    ({"type": "message", "role": "tool", "content": "x"}, "input.0.role"),
])
def test_responses_refuses_items_it_cannot_render(item, field):
    req = request(responses, {"model": "m", "input": [item]})
    with pytest.raises(ProxyError) as err:
        responses.to_messages(req)
    assert err.value.status == 400 and err.value.param == field


def test_responses_texts_arrive_as_sent_whatever_their_escapes():
    # Instructions and tool outputs go to vLLM as the JSON the harness sent, joined as JSON to the
    # developer messages that follow the instructions: vLLM must decode the Python join of the texts.
    parts = [{"type": "input_text", "text": text} for text in TRICKY]
    for encoded in (json.dumps, orjson.dumps, lambda b: json.dumps(b, ensure_ascii=False)):
        data = encoded({"model": "m", "instructions": TRICKY[0], "input": [
            {"type": "message", "role": "developer", "content": parts},
            {"type": "message", "role": "user", "content": TRICKY[1]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": t} for t in TRICKY]},
            {"type": "message", "role": "assistant", "content": TRICKY[3]},
            {"type": "function_call", "call_id": "c", "name": "sh", "arguments": '{"cmd": "echo \\"é\\""}'},
            {"type": "function_call_output", "call_id": "c", "output": parts}]})
        req, raw = decode(data if isinstance(data, bytes) else data.encode(), responses.Request)
        body = orjson.loads(msgspec.json.encode(responses.to_upstream(req, raw)))
        assert [m["content"] for m in body["messages"]] == [
            TRICKY[0] + "\n\n" + "".join(TRICKY), TRICKY[1], "".join(TRICKY) + TRICKY[3], "".join(TRICKY)]
        assert body["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"cmd": "echo \\"é\\""}'


def test_responses_echo_copies_instructions_and_tools_as_sent_on_one_line():
    tools = [{"type": "function", "name": "sh", "parameters": {"type": "object"}, "vendor": [1, 2]}]
    data = json.dumps({"model": "m", "input": "hi", "instructions": "line\none", "tools": tools}, indent=2).encode()
    req, _ = decode(data, responses.Request)
    for _, event in responses.to_events(completion(), req, "r", 0)[:1]:
        wire = orjson.dumps(event)
        assert b"\n" not in wire
        echoed = orjson.loads(wire)["response"]
        assert (echoed["instructions"], echoed["tools"]) == ("line\none", tools)


@pytest.mark.parametrize("body, field", [
    ({"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": 1}]}]},
     "input.0.content.0.text"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": 3}]}, "input.0.output"),
    ({"input": "hi", "tools": [{"type": "function", "parameters": {}}]}, "tools.0.name"),
    ({"input": "hi", "tools": [{"type": "function", "name": "x", "parameters": []}]}, "tools.0.parameters"),
    ({"input": "hi", "tools": {"type": "function"}}, "tools"),
])
def test_responses_names_the_bad_field_inside_items_and_tools(body, field):
    with pytest.raises(ProxyError) as err:
        sent(responses, {"model": "m", **body})
    assert err.value.status == 400 and err.value.param == field and f"'{field}'" in err.value.message


def test_responses_stream_gives_each_item_done_then_completed():
    req = request(responses, {"model": "m", "input": "hi", "stream": True})
    events = responses.to_events(completion(reasoning="hmm"), req, "r", 0)
    names = [name for name, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"] and names[-1] == "response.completed"
    done = [data["item"]["type"] for name, data in events if name == "response.output_item.done"]
    assert done == ["reasoning", "message", "function_call"]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert events[-1][1]["response"]["output"] == responses.to_body(completion(reasoning="hmm"), req, "r", 0)["output"]


def test_responses_length_limit_is_incomplete():
    req = request(responses, {"model": "m", "input": "hi", "max_output_tokens": 2})
    assert responses.to_upstream(req, {})["max_tokens"] == 2
    events = responses.to_events(completion(finish_reason="length", tool_calls=[]), req, "r", 0)
    assert events[-1][0] == "response.incomplete"
    assert events[-1][1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


# --- Anthropic Messages ----------------------------------------------------------------------------
def test_messages_tool_use_and_results_become_chat_tool_calls():
    body = sent(messages, {"model": "m", "max_tokens": 50, "system": [{"type": "text", "text": "sys"}],
        "messages": [
            {"role": "system", "content": "more sys"},
            {"role": "user", "content": "write a file"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "plan", "signature": ""},
                {"type": "text", "text": "ok"},
                {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "echo é > a"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "done"}]},
                {"type": "text", "text": "thanks"}]},
        ],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any"}, "stop_sequences": ["END"], "top_k": 5}, {"top_k": 5})
    assert body["messages"] == [
        {"role": "system", "content": "sys\n\nmore sys"},
        {"role": "user", "content": "write a file"},
        {"role": "assistant", "content": "ok", "reasoning_content": "plan", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "echo é > a"}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "done"},
        {"role": "user", "content": "thanks"},
    ]
    assert [t["function"]["name"] for t in body["tools"]] == ["Bash"]
    assert body["tool_choice"] == "required" and body["stop"] == ["END"] and body["top_k"] == 5
    assert body["max_tokens"] == 50


TRICKY = ['quote " backslash \\ tab \t', "line\nbreak \u2028 é 😀", "", "\\u0041 is not an escape here"]


def test_messages_texts_arrive_as_sent_whatever_their_escapes():
    # Tool results go to vLLM as the JSON the harness sent (an error's gets "Error: " joined on as JSON):
    # what vLLM decodes must be the Python join of the texts, whatever escapes the harness's encoder chose.
    blocks = [{"type": "text", "text": text} for text in TRICKY]
    for encoded in (json.dumps, orjson.dumps, lambda b: json.dumps(b, ensure_ascii=False)):
        data = encoded({"model": "m", "max_tokens": 5, "system": blocks[:2], "messages": [
            {"role": "user", "content": blocks},
            {"role": "assistant", "content": [*blocks[2:], {"type": "tool_use", "id": "t", "name": "Bash", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": True, "content": blocks},
                                         {"type": "tool_result", "tool_use_id": "t", "content": TRICKY[1]}]}]})
        req, raw = decode(data if isinstance(data, bytes) else data.encode(), messages.Request)
        body = orjson.loads(msgspec.json.encode(messages.to_upstream(req, raw)))
        assert [m["content"] for m in body["messages"]] == [
            "".join(TRICKY[:2]), "".join(TRICKY), "".join(TRICKY[2:]), "Error: " + "".join(TRICKY), TRICKY[1]]


def test_messages_names_a_bad_block_inside_a_tool_result():
    with pytest.raises(ProxyError) as err:
        sent(messages, {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "hi"},
            {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": 7}]}]}]})
    assert err.value.status == 400 and err.value.param == "messages.0.content.1.content.0.text"
    assert "'messages.0.content.1.content.0.text'" in err.value.message and "Expected `str`" in err.value.message


@pytest.mark.parametrize("tool, field", [({"name": "x", "input_schema": "object"}, "tools.0.input_schema"),
                                         ({"name": "x", "description": 3}, "tools.0.description")])
def test_messages_tool_schemas_are_checked_though_forwarded_as_sent(tool, field):
    with pytest.raises(ProxyError) as err:
        sent(messages, {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [tool]})
    assert err.value.param == field


def test_messages_stream_fills_every_block_with_deltas():
    req = request(messages, {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    c = completion(reasoning="hmm", tool_calls=[ToolCall("t1", "Bash", '{"command": "ls"}')])
    events = messages.to_events(c, req, "r", 0)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    deltas = [data["delta"] for name, data in events if name == "content_block_delta"]
    assert [d["type"] for d in deltas] == ["thinking_delta", "text_delta", "input_json_delta"]
    assert json.loads(deltas[2]["partial_json"]) == {"command": "ls"}
    assert names.count("content_block_start") == names.count("content_block_stop") == 3
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_messages_stop_sequence_is_reported():
    req = request(messages, {"model": "m", "max_tokens": 5, "stop_sequences": ["END"],
                             "messages": [{"role": "user", "content": "x"}]})
    body = messages.to_body(completion(finish_reason="stop", stop_reason="END", tool_calls=[]), req, "r", 0)
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", "END")


# --- Chat Completions ------------------------------------------------------------------------------
def test_chat_forwards_the_harness_request_less_streaming_options():
    raw = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True,
           "stream_options": {"include_usage": True}, "max_completion_tokens": 9, "temperature": 0.3, "vendor": 1}
    req, fields = decode(orjson.dumps(raw), chat.Request)  # fields stay raw JSON and are copied upstream
    body = orjson.loads(msgspec.json.encode(chat.to_upstream(req, fields)))
    assert body == {"messages": raw["messages"], "max_tokens": 9, "temperature": 0.3, "vendor": 1}


def test_chat_stream_options_need_stream():
    raw = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": True}}
    with pytest.raises(ProxyError, match="stream_options"):
        chat.to_upstream(request(chat, raw), raw)


def test_chat_stream_ends_with_usage_and_done():
    req = request(chat, {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True,
                         "stream_options": {"include_usage": True}})
    events = chat.to_events(completion(), req, "r", 0)
    assert events[-1] == (None, "[DONE]")
    assert events[-2][1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert events[-3][1]["choices"][0]["finish_reason"] == "tool_calls"


# --- Upstream parsing ------------------------------------------------------------------------------
def test_upstream_answer_without_token_ids_is_refused():
    body = {"prompt_token_ids": None, "choices": [{"message": {"content": "x"}, "token_ids": None}]}
    with pytest.raises(ProxyError) as err:
        parse_completion(orjson.dumps(body))
    assert err.value.status == 502 and "token ids" in err.value.message


def test_upstream_logprobs_must_cover_every_sampled_token():
    body = {"prompt_token_ids": [1], "choices": [{"message": {"content": "x"}, "token_ids": [5, 6],
                                                  "logprobs": {"content": [{"logprob": -1.0}]}}]}
    with pytest.raises(ProxyError, match="1 logprobs for 2 sampled tokens"):
        parse_completion(orjson.dumps(body))


def stored(value) -> object:
    """A completion field as the store writes it (prompt ids stay vLLM's own JSON bytes)."""
    return orjson.loads(orjson.dumps({"value": value}))["value"]


@pytest.mark.parametrize("body", [
    {"prompt_token_ids": [1, 2, 3], "choices": [{"message": {"content": "x"}, "token_ids": [5],
                                                 "logprobs": {"content": [{"logprob": -1.0}]}}]},
    # The key inside the model's text (escaped quotes) and as a nested key: the top-level ids still win.
    {"choices": [{"message": {"content": '"prompt_token_ids":[9]', "extra": {"prompt_token_ids": [7, 8]}},
                  "token_ids": [5], "logprobs": {"content": [{"logprob": -1.0}]}}], "prompt_token_ids": [1, 2, 3]},
    {"prompt_token_ids": [1, 2, 3], "choices": [{"message": {"content": "x"}, "token_ids": [5],
                                                 "logprobs": {"content": [{"logprob": -1.0}]}}],
     "usage": {"prompt_tokens": 3}},
])
def test_upstream_prompt_ids_are_kept_exactly_as_vllm_sent_them(body):
    c = parse_completion(orjson.dumps(body))
    assert stored(c.prompt_token_ids) == [1, 2, 3] and c.prompt_tokens == 3
    assert (c.response_token_ids, c.response_logprobs) == ([5], [-1.0])


def test_upstream_prompt_ids_that_are_not_numbers_are_decoded_not_cut():
    body = {"prompt_token_ids": ["a]", "b"], "choices": [{"message": {"content": "x"}, "token_ids": [],
                                                           "logprobs": {"content": []}}]}
    assert stored(parse_completion(orjson.dumps(body)).prompt_token_ids) == ["a]", "b"]


@pytest.mark.parametrize("body, field, says", [
    ({"model": "m", "messages": [{"role": "robot"}]}, "messages.0.role", "Invalid enum value 'robot'"),
    ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages.0.content", "must be a string"),
    ({"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]},
     "messages.0.tool_calls.0.function.name", "missing required field"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 3}, "temperature", "<= 2"),
    ({"messages": [{"role": "user", "content": "x"}]}, "model", "missing required field"),
])
def test_a_bad_request_field_is_named(body, field, says):
    with pytest.raises(ProxyError) as err:
        decode(orjson.dumps(body), chat.Request)
    assert (err.value.status, err.value.param) == (400, field) and says in err.value.message


def test_a_body_that_is_not_a_json_object_is_400():
    for data, says in ((b"{not json", "not valid JSON"), (b"[1]", "must be a JSON object")):
        with pytest.raises(ProxyError, match=says):
            decode(data, chat.Request)
