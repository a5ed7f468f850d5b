"""The proxy's promises beyond translation: sessions, errors, durability, concurrency, weight swaps.

Everything runs the real proxy process; calls that need a model answer go to the real vLLM on CPU
serving the tiny model. Error cases that need no answer point the proxy at a port nobody listens on.
"""

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import httpx
import openai
import pytest

from proxy_process import serve_proxy, start_proxy, stop_proxy
from steps.net import free_port
from steps.tiny_model import build_tiny_model

ADMIN = "test-admin-key"
USER = [{"role": "user", "content": "hello"}]


def post(url: str, body, headers: dict | None = None, raw: bytes | None = None) -> tuple[int, dict]:
    """POSTs JSON (or raw bytes) and returns (status, parsed body) whatever the status."""
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def bearer(key: str) -> dict:
    return {"authorization": f"Bearer {key}"}


@pytest.fixture
def dead_upstream_proxy(tmp_path):
    """A proxy whose upstream port has nothing behind it: every model call fails upstream."""
    with serve_proxy(f"http://127.0.0.1:{free_port()}", str(tmp_path / "store"), ADMIN,
                     extra=["--model-name", "tiny", "--max-body-bytes", "20000"]) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def live_proxy(vllm_server, tmp_path_factory):
    """A proxy in front of the real vLLM, shared by the tests that only read its answers."""
    with serve_proxy(vllm_server, str(tmp_path_factory.mktemp("store")), ADMIN) as proxy:
        yield proxy


def test_admin_routes_need_the_admin_key(dead_upstream_proxy):
    url = dead_upstream_proxy.url
    assert post(f"{url}/rollouts", {"rollout_id": "a"})[0] == 401
    assert post(f"{url}/rollouts", {"rollout_id": "a"}, bearer("wrong"))[0] == 401
    status, body = post(f"{url}/rollouts", {"rollout_id": "a"}, bearer(ADMIN))
    assert status == 200 and body["openai_base_url"] == f"{url}/rollouts/a/v1"
    assert body["anthropic_base_url"] == f"{url}/rollouts/a" and body["api_key"] != ADMIN
    assert post(f"{url}/rollouts", {"rollout_id": "a"}, bearer(ADMIN))[0] == 409
    status, body = post(f"{url}/rollouts", {"rollout_id": "../etc"}, bearer(ADMIN))
    assert status == 400 and "rollout_id" in body["error"]["message"]


def test_a_rollout_key_opens_only_its_own_session(dead_upstream_proxy):
    proxy = dead_upstream_proxy
    one, two = proxy.register("one"), proxy.register("two")
    chat = {"model": "tiny", "messages": USER}
    status, body = post(f"{two['openai_base_url']}/chat/completions", chat, bearer(one["api_key"]))
    assert status == 401 and "rollout 'two'" in body["error"]["message"]
    assert post(f"{proxy.url}/rollouts/nope/v1/chat/completions", chat, bearer(one["api_key"]))[0] == 404
    status, body = post(f"{one['anthropic_base_url']}/v1/messages", {}, {"x-api-key": "wrong"})
    assert status == 401 and body["type"] == "error" and body["error"]["type"] == "authentication_error"
    assert post(f"{proxy.url}/rollouts/one/calls", {}, bearer(one["api_key"]))[0] in (401, 405)
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(urllib.request.Request(f"{proxy.url}/rollouts/one/calls", headers=bearer(one["api_key"])))
    assert err.value.code == 401
    proxy.client.close("one")
    status, body = post(f"{one['openai_base_url']}/chat/completions", chat, bearer(one["api_key"]))
    assert status == 403 and "closed" in body["error"]["message"]


def test_bad_input_gets_a_clear_error_in_the_dialects_shape(dead_upstream_proxy):
    rollout = dead_upstream_proxy.register("bad")
    key, base = bearer(rollout["api_key"]), rollout["openai_base_url"]
    status, body = post(f"{base}/chat/completions", None, key, raw=b"{not json")
    assert status == 400 and "not valid JSON" in body["error"]["message"]
    status, body = post(f"{base}/chat/completions", {"model": "tiny", "messages": [{"role": "robot"}]}, key)
    assert status == 400 and body["error"]["param"] == "messages.0.role"
    status, body = post(f"{base}/responses", {"model": "tiny", "input": [{"type": "item_reference", "id": "x"}]}, key)
    assert status == 400 and "item_reference" in body["error"]["message"]
    status, body = post(f"{rollout['anthropic_base_url']}/v1/messages", {"model": "tiny", "messages": USER}, key)
    assert status == 400 and body["error"]["type"] == "invalid_request_error" and "max_tokens" in body["error"]["message"]
    status, body = post(f"{base}/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x" * 30000}]}, key)
    assert status == 413 and "20000 bytes" in body["error"]["message"]
    assert dead_upstream_proxy.calls("bad") == []  # refused before they became calls


def test_a_harness_that_hangs_up_mid_request_leaves_no_call_and_no_error(dead_upstream_proxy):
    rollout = dead_upstream_proxy.register("cut")
    with socket.create_connection(("127.0.0.1", dead_upstream_proxy.port)) as conn:
        conn.sendall(b"POST /rollouts/cut/v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"authorization: Bearer " + rollout["api_key"].encode() + b"\r\ncontent-length: 5000\r\n\r\n"
                     b'{"model": "tiny", "messages": [')
    status, body = post(f"{rollout['openai_base_url']}/chat/completions", {"model": "tiny", "messages": "x"},
                        bearer(rollout["api_key"]))
    assert status == 400 and body["error"]["param"] == "messages"  # still serving, in order
    assert dead_upstream_proxy.calls("cut") == []
    assert "Traceback" not in dead_upstream_proxy.log_tail() and "unexpected" not in dead_upstream_proxy.log_tail()


def test_a_dead_upstream_is_502_and_the_call_is_kept(dead_upstream_proxy):
    rollout = dead_upstream_proxy.register("dead")
    # Pretty-printed, with CRLF line breaks: the record still fills exactly one line of the store's log.
    sent = json.dumps({"model": "tiny", "max_tokens": 5, "messages": USER}, indent=2).replace("\n", "\r\n")
    status, body = post(f"{rollout['anthropic_base_url']}/v1/messages", None, {"x-api-key": rollout["api_key"]},
                        raw=sent.encode())
    assert status == 502 and body["error"]["type"] == "api_error" and "unreachable" in body["error"]["message"]
    (call,) = dead_upstream_proxy.calls("dead")
    assert call["status"] == "error" and call["error"]["status"] == 502 and call["request"]["messages"] == USER


def test_over_the_context_window_is_400_in_each_dialect(live_proxy):
    rollout = live_proxy.register("long")
    key, long_text = rollout["api_key"], "word " * 40000  # over the 32768-token context
    status, body = post(f"{rollout['openai_base_url']}/chat/completions",
                        {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": long_text}]}, bearer(key))
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    status, body = post(f"{rollout['anthropic_base_url']}/v1/messages",
                        {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": long_text}]}, {"x-api-key": key})
    assert status == 400 and body["error"]["type"] == "invalid_request_error" and "context length" in body["error"]["message"]


def test_a_slow_upstream_is_504(vllm_server, tmp_path):
    with serve_proxy(vllm_server, str(tmp_path), ADMIN, extra=["--upstream-timeout", "0.3"]) as proxy:
        rollout = proxy.register("slow")
        body = {"model": "tiny", "max_tokens": 3000, "ignore_eos": True, "messages": USER}
        status, answer = post(f"{rollout['openai_base_url']}/chat/completions", body, bearer(rollout["api_key"]))
        assert status == 504 and "did not answer within" in answer["error"]["message"]


def test_a_harness_that_disconnects_leaves_an_aborted_call(live_proxy):
    rollout = live_proxy.register("gone")
    body = {"model": "tiny", "stream": True, "max_tokens": 3000, "ignore_eos": True, "messages": USER}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{rollout['openai_base_url']}/chat/completions", json=body,
                   headers=bearer(rollout["api_key"]), timeout=httpx.Timeout(30, read=0.5))
    deadline = time.monotonic() + 10
    while not (calls := live_proxy.calls("gone")) and time.monotonic() < deadline:
        time.sleep(0.1)
    (call,) = calls
    assert call["status"] == "aborted" and call["response_token_ids"] is None


def test_calls_and_keys_survive_a_restart(vllm_server, tmp_path):
    store = str(tmp_path / "store")
    proxy = start_proxy(vllm_server, store, ADMIN)
    try:
        rollout = proxy.register("keep")
        client = openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"])
        client.chat.completions.create(model="tiny", messages=USER, max_tokens=3)
    finally:
        stop_proxy(proxy)
    # A crash in the middle of writing the next record: it was never answered, so it must not count.
    log = tmp_path / "store" / "rollouts" / "keep" / "calls.jsonl"
    with log.open("ab") as f:
        f.write(b'{"rollout_id": "keep", "call_index": 1, "status": "ok", "prompt_tok')
    proxy = start_proxy(vllm_server, store, ADMIN, port=proxy.port)
    try:
        (first,) = proxy.calls("keep")
        assert first["status"] == "ok" and len(first["response_token_ids"]) == len(first["response_logprobs"]) > 0
        client.chat.completions.create(model="tiny", messages=USER, max_tokens=3)
        assert [call["call_index"] for call in proxy.calls("keep")] == [0, 1]
        assert [json.loads(line)["call_index"] for line in log.read_bytes().splitlines()] == [0, 1]
    finally:
        stop_proxy(proxy)


def test_a_growing_prompt_is_stored_as_what_it_adds_and_read_back_whole(vllm_server, tmp_path):
    """An agent's context grows by appending, so each stored call keeps only the prompt ids (and request
    bytes) it adds to the rollout's last call; the calls route still gives each call its whole prompt,
    equal to vLLM's own, and its request as sent."""
    turn = [{"role": "user", "content": "hello"}]
    conversations = [turn, turn, turn + [{"role": "assistant", "content": "hi there"}, {"role": "user", "content": "and?"}],
                     [{"role": "user", "content": "something else"}]]
    with serve_proxy(vllm_server, str(tmp_path / "store"), ADMIN) as proxy:
        rollout = proxy.register("grows")
        client = openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"])
        for messages in conversations:
            client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
        calls = proxy.calls("grows")
    vllm_ids = [post(f"{vllm_server}/v1/chat/completions", {"model": "tiny", "messages": messages, "max_tokens": 1,
                                                            "return_token_ids": True})[1]["prompt_token_ids"]
                for messages in conversations]
    assert [call["prompt_token_ids"] for call in calls] == vllm_ids and "prompt_shared" not in calls[0]
    assert [call["request"]["messages"] for call in calls] == conversations  # as the SDK sent them
    log = tmp_path / "store" / "rollouts" / "grows" / "calls.jsonl"
    records = list(map(json.loads, log.read_bytes().splitlines()))
    assert records[0]["request_shared"] is None and records[1]["request"] == ""  # the same request again
    assert records[2]["request_shared"]["call_index"] == 1 and '"hi there"' in records[2]["request"]
    stored = [(r["prompt_shared"], r["prompt_token_ids"]) for r in records]
    assert stored[0] == (None, vllm_ids[0])  # the first call has nothing to extend
    assert stored[1] == ({"call_index": 0, "tokens": len(vllm_ids[0])}, [])  # the same prompt again
    grown, before = vllm_ids[2], vllm_ids[1]
    # The chat template appends the new turns after the whole last prompt (special tokens keep the token
    # boundaries where they were), so the third call keeps only the new turns' ids.
    assert grown[:len(before)] == before
    assert stored[2] == ({"call_index": 1, "tokens": len(before)}, grown[len(before):])
    assert stored[3] == (None, vllm_ids[3])  # another conversation: stored whole


def test_64_concurrent_rollouts_each_get_all_their_calls(live_proxy):
    rollouts = [live_proxy.register(f"many-{i}") for i in range(64)]

    async def agent(rollout: dict, turns: int = 3) -> None:
        async with openai.AsyncOpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"]) as client:
            for turn in range(turns):
                text = f"{rollout['rollout_id']} turn {turn}"
                await client.chat.completions.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": text}])

    async def run_all() -> None:
        await asyncio.gather(*(agent(rollout) for rollout in rollouts))

    asyncio.run(run_all())
    for rollout in rollouts:
        calls = live_proxy.calls(rollout["rollout_id"])
        assert [c["call_index"] for c in calls] == [0, 1, 2]
        assert [c["request"]["messages"][0]["content"] for c in calls] == [f"{rollout['rollout_id']} turn {t}" for t in range(3)]
        assert all(c["status"] == "ok" and c["response_token_ids"] for c in calls)




def test_a_weight_swap_holds_new_calls_and_finishes_in_flight_ones(vllm_server, tiny_model, live_proxy, tmp_path):
    other = build_tiny_model(tmp_path / "other", seed=1)
    rollout = live_proxy.register("swap")
    initial = live_proxy.client.health()["weight_version"]  # vLLM's own, read at proxy start
    client = openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"])
    ask = dict(model="tiny", max_tokens=8, temperature=0, messages=[{"role": "user", "content": "Say something."}])
    client.chat.completions.create(**ask)
    long_call = threading.Thread(target=client.chat.completions.create,
                                 kwargs={**ask, "max_tokens": 400, "extra_body": {"ignore_eos": True}})
    long_call.start()
    time.sleep(0.3)  # the long call is in flight when the swap starts
    try:
        health = live_proxy.client.update_weights(str(other), "1")
        assert health["weight_version"] == "1" and not health["paused"]
        long_call.join(60)
        client.chat.completions.create(**ask)
    finally:
        live_proxy.client.update_weights(str(tiny_model), initial)
    before, in_flight, after = live_proxy.calls("swap")
    assert (before["weight_version"], in_flight["weight_version"], after["weight_version"]) == (initial, initial, "1")
    assert in_flight["status"] == "ok" and len(in_flight["response_token_ids"]) == 400
    assert before["prompt_token_ids"] == after["prompt_token_ids"]
    assert before["response_token_ids"] != after["response_token_ids"]  # new weights, new greedy answer


def test_the_store_can_be_s3(vllm_server, s3_server):
    store = f"s3://{s3_server['bucket']}/proxy-test"
    with serve_proxy(vllm_server, store, ADMIN, env=s3_server["env"]) as proxy:
        rollout = proxy.register("in-s3")
        client = openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"])
        client.chat.completions.create(model="tiny", messages=USER, max_tokens=3)
    with serve_proxy(vllm_server, store, ADMIN, env=s3_server["env"]) as proxy:
        (call,) = proxy.calls("in-s3")
        assert call["status"] == "ok" and call["response_token_ids"]


@pytest.mark.parametrize("flag, message", [
    ("top_k=-1", "--sampling top_k must be 0 (off) or a whole number >= 1, got -1"),
    ("topp=1", "--sampling takes KEY=VALUE with KEY one of temperature, top_p, top_k"),
    ("temperature=warm", "--sampling temperature must be a number, got 'warm'"),
])
def test_a_bad_sampling_flag_stops_the_proxy_in_one_sentence(flag: str, message: str, capsys) -> None:
    """A bad `--sampling` is one line naming the key and what it takes; a good one forces every key (control)."""
    from steps.proxy.__main__ import parse_args

    argv = ["--upstream", "http://127.0.0.1:1", "--port", "1", "--store", "calls", "--admin-key", "k"]
    with pytest.raises(SystemExit):
        parse_args([*argv, "--sampling", flag])
    assert message in capsys.readouterr().err.strip().splitlines()[-1]
    forced = parse_args([*argv, "--sampling", "temperature=0.7", "--sampling", "top_k=20"]).forced_sampling
    assert forced == {"temperature": 0.7, "top_p": 1.0, "top_k": 20, "min_p": 0.0, "presence_penalty": 0.0,
                      "frequency_penalty": 0.0, "repetition_penalty": 1.0}
    assert parse_args(argv).forced_sampling == {}  # no --sampling: a plain recorder


def test_fields_that_reshape_the_distribution_are_removed_when_the_run_owns_sampling() -> None:
    """logit_bias, token masks, min_tokens and structured outputs would make vLLM's logprobs those of another
    distribution than the trainer's: with the run's sampling forced they never reach vLLM; a plain recorder
    (the control) passes them on."""
    from steps.proxy.config import ProxyConfig
    from steps.sampling import NEUTRAL, RESHAPING

    asked = {"temperature": 0.2, "logit_bias": {"10": 100}, "allowed_token_ids": [10], "min_tokens": 4,
             "response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a+"}, "stop": ["\n"]}
    forced = ProxyConfig("u", "s", "k", forced_sampling=dict(NEUTRAL)).sampling(dict(asked))
    assert forced == {"stop": ["\n"], **NEUTRAL}
    assert ProxyConfig("u", "s", "k").sampling(dict(asked)) == asked
    assert {"logit_bias", "allowed_token_ids", "min_tokens", "response_format", "structured_outputs"} <= set(RESHAPING)


def test_tool_call_grammars_are_lifted_when_the_run_owns_sampling() -> None:
    """A required or named tool_choice, parallel_tool_calls false and strict tools make vLLM sample tool calls
    under a grammar, whose logprobs the trainer does not reproduce: with the run's sampling forced the model
    chooses freely ("auto"); a plain recorder (the control) passes them on. Raw JSON (the Chat dialect) too."""
    from msgspec import Raw

    from steps.proxy.config import ProxyConfig
    from steps.sampling import NEUTRAL

    tools = b'[{"type":"function","function":{"name":"shell","parameters":{},"strict":true}}]'
    asked = {"tool_choice": Raw(b'{"type":"function","function":{"name":"shell"}}'), "parallel_tool_calls": False,
             "tools": Raw(tools), "max_tokens": 5}
    forced = ProxyConfig("u", "s", "k", forced_sampling=dict(NEUTRAL)).sampling(dict(asked))
    assert forced["tool_choice"] == "auto" and "parallel_tool_calls" not in forced
    assert forced["tools"] == [{"type": "function", "function": {"name": "shell", "parameters": {}}}]
    for choice in ("required", "auto", "none"):
        lifted = ProxyConfig("u", "s", "k", forced_sampling=dict(NEUTRAL)).sampling({"tool_choice": choice})
        assert lifted["tool_choice"] == ("auto" if choice == "required" else choice)
    assert ProxyConfig("u", "s", "k").sampling(dict(asked)) == asked
    loose = Raw(tools.replace(b"true", b"false"))  # strict false constrains nothing: forwarded as sent
    assert ProxyConfig("u", "s", "k", forced_sampling=dict(NEUTRAL)).sampling({"tools": loose})["tools"] is loose


def test_max_completion_tokens_cannot_pass_the_token_cap() -> None:
    """vLLM takes max_completion_tokens over max_tokens: sent beside a small max_tokens it would have bypassed
    the run's cap. It becomes the one max_tokens, which the cap bounds."""
    from steps.proxy import chat
    from steps.proxy.config import ProxyConfig
    from steps.proxy.protocol import decode

    data = b'{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"max_completion_tokens":100000}'
    req, raw = decode(data, chat.Request, fields=chat.RAW_FIELDS)
    body = ProxyConfig("u", "s", "k", max_tokens_cap=256).sampling(chat.to_upstream(req, raw))
    assert body["max_tokens"] == 256 and "max_completion_tokens" not in body
    req, raw = decode(data.replace(b',"max_completion_tokens":100000', b""), chat.Request, fields=chat.RAW_FIELDS)
    assert ProxyConfig("u", "s", "k", max_tokens_cap=256).sampling(chat.to_upstream(req, raw))["max_tokens"] == 5
