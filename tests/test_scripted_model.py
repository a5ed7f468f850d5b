"""The scripted vLLM double answers in vLLM's shape and picks each harness's shell tool correctly.

Runs offline in a second: the tool lists come from the requests captured from the real harnesses
(`tests/data/harness_requests/`, refreshed by `python tests/capture_requests.py --all`).
"""

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from scripted_model import NO_TASK_ANSWER, create_app, logprob, oracle_command, shell_call, token_ids
from steps.tasks import BUILTIN_DATASET

FIXTURES = Path(__file__).parent / "data" / "harness_requests"
SHELL_TOOL = {"codex": ("exec_command", "cmd"), "claude-code": ("Bash", "command"),
              "openclaw": ("exec", "command"), "qwen-code": ("run_shell_command", "command"),
              "opencode": ("bash", "command")}


@pytest.mark.parametrize("harness", list(SHELL_TOOL))
def test_shell_call_fits_the_schema_each_harness_offers(harness):
    body = json.loads((FIXTURES / f"{harness}.json").read_text())["body"]
    name, arguments = shell_call(body["tools"], "echo hello > answer.txt")
    assert (name, next(iter(arguments))) == SHELL_TOOL[harness]
    assert arguments[SHELL_TOOL[harness][1]] == "echo hello > answer.txt"
    (tool,) = [t for t in body["tools"] if (t.get("function") or t).get("name") == name]
    schema = (tool.get("function") or tool).get("parameters") or tool.get("input_schema")
    assert set(schema.get("required", [])) <= set(arguments) <= set(schema["properties"])


def test_answers_like_vllm_then_finishes_after_the_tool_result():
    client = TestClient(create_app(model="tiny", commands=["echo hello > answer.txt"]))
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
    request = {"model": "tiny", "messages": [{"role": "user", "content": "go"}], "tools": tools,
               "return_token_ids": True, "logprobs": True}
    first = client.post("/v1/chat/completions", json=request).json()
    choice = first["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    assert choice["finish_reason"] == "tool_calls" and call["function"]["name"] == "bash"
    assert json.loads(call["function"]["arguments"]) == {"command": "echo hello > answer.txt"}
    prompt = json.dumps({"messages": request["messages"], "tools": tools}, sort_keys=True,
                        separators=(",", ":"), ensure_ascii=False)
    assert first["prompt_token_ids"] == token_ids(prompt)
    entries = choice["logprobs"]["content"]
    assert [entry["logprob"] for entry in entries] == [logprob(i) for i in range(len(choice["token_ids"]))]
    assert token_ids(b"".join(bytes(entry["bytes"]) for entry in entries)) == choice["token_ids"]

    request["messages"] += [{"role": "assistant", "content": None, "tool_calls": [call]},
                            {"role": "tool", "tool_call_id": call["id"], "content": ""}]
    final = client.post("/v1/chat/completions", json=request).json()["choices"][0]
    assert final["message"]["content"] == "done" and final["finish_reason"] == "stop"
    assert final["token_ids"] == token_ids("done")
    assert len(client.get("/requests").json()) == 2


def test_the_final_answer_is_the_given_one():
    """`final_answer` replaces "done" once the commands are done (with none: at once; the distillation benchmark's
    teacher); the control, the default, still answers "done"."""
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
    request = {"model": "tiny", "messages": [{"role": "user", "content": "go"}], "tools": tools}
    app = create_app(model="tiny", final_answer="hello")
    app.state.commands = []
    answer = TestClient(app).post("/v1/chat/completions", json=request).json()["choices"][0]["message"]
    assert answer["content"] == "hello" and not answer.get("tool_calls")
    control = create_app(model="tiny")
    control.state.commands = []
    assert TestClient(control).post("/v1/chat/completions", json=request).json()["choices"][0]["message"]["content"] \
        == "done"


def test_refuses_what_vllm_would_and_answers_plain_requests():
    client = TestClient(create_app(model="tiny", max_model_len=100))

    def chat(**body):
        return client.post("/v1/chat/completions", json={"model": "tiny", **body})

    assert chat(stream=True, messages=[]).status_code == 400  # the proxy must never stream upstream
    too_long = chat(messages=[{"role": "user", "content": "x" * 400}])
    assert too_long.status_code == 400 and "maximum context length" in too_long.json()["error"]["message"]
    title = chat(messages=[{"role": "user", "content": "t"}]).json()  # no tools, no token fields asked
    assert title["choices"][0]["finish_reason"] == "stop" and "prompt_token_ids" not in title


BASH_TOOL = [{"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def ask_oracle(client, content, messages=()) -> dict:
    return client.post("/v1/chat/completions", json={
        "model": "tiny", "tools": BASH_TOOL, "messages": [{"role": "user", "content": content}, *messages]}).json()


def test_the_oracle_mode_plays_the_solution_of_the_task_in_the_conversation():
    client = TestClient(create_app(oracle=BUILTIN_DATASET))
    instruction = (BUILTIN_DATASET / "csv-stats" / "instruction.md").read_text()
    # As a harness wraps it: a text part among others, inside its own framing.
    first = ask_oracle(client, [{"type": "text", "text": f"<task>\n{instruction}\n</task>"}])["choices"][0]
    (call,) = first["message"]["tool_calls"]
    command = json.loads(call["function"]["arguments"])["command"]
    assert command == oracle_command(BUILTIN_DATASET / "csv-stats")
    assert (BUILTIN_DATASET / "csv-stats" / "solution" / "solve.sh").read_text() in command
    result = [{"role": "assistant", "content": None, "tool_calls": [call]},
              {"role": "tool", "tool_call_id": call["id"], "content": "exit code: 0"}]
    assert ask_oracle(client, instruction, result)["choices"][0]["message"]["content"] == "done"
    # A conversation without any task's instruction: no tool call, a plain answer saying so.
    unknown = ask_oracle(client, "write a poem")["choices"][0]
    assert unknown["message"]["content"] == NO_TASK_ANSWER and not unknown["message"]["tool_calls"]


def test_an_endpoint_that_is_not_vllm_returns_no_token_ids_or_refuses_vllms_fields():
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "return_token_ids": True, "logprobs": True}
    plain = TestClient(create_app(with_token_ids=False)).post("/v1/chat/completions", json=body).json()
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]
    assert plain["choices"][0]["logprobs"]["content"]  # logprobs, as OpenAI's API gives them
    strict = TestClient(create_app(strict=True))
    refused = strict.post("/v1/chat/completions", json={**body, "top_k": 0})
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == "Unrecognized request argument supplied: return_token_ids"
    del body["return_token_ids"]
    answered = strict.post("/v1/chat/completions", json=body)  # the control: without it, answered
    assert answered.status_code == 200 and "prompt_token_ids" not in answered.json()
