"""Serving an existing endpoint: the recording proxy in front of a server the serve step did not start.

    .venv/bin/python -m pytest -q tests/test_upstream.py      # ~40 s; one test starts vLLM (~1 min more)

The endpoints are `tests/scripted_model.py` (a double: an endpoint that is not vLLM cannot run here) as
an OpenAI-compatible server without token ids (`with_token_ids=False`), one that also refuses vLLM's fields
by name like OpenAI's own (`strict=True`), and one with vLLM's token fields; then the real vLLM on CPU.
Every dialect, streamed or not, gets its answer through official SDKs; every call is recorded, with token
ids where the endpoint returned them and the `untrainable` note where it did not. `steps.serve --upstream`
runs the `direct` harness's rollout of a built-in task on the double's oracle, and a dead or wrong upstream
stops it in one sentence.
"""

import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import anthropic
import openai
import pytest

from proxy_process import ProxyProcess
from scripted_model import WRONG_COMMANDS, ScriptedModel, logprob
from steps import sampling
from steps.net import free_port
from steps.proxy.client import ProxyClient, ProxyClientError
from steps.proxy.config import ProxyConfig
from steps.proxy.upstream import NO_TOKEN_IDS
from steps.rollout import RolloutSpec, run_rollout
from steps.tasks import BUILTIN_DATASET
from steps.trajectories.__main__ import main as trajectories_main
from steps.trajectories.collect import collect
from steps.contracts.rollout import RolloutResult
from tests.conftest import ADMIN_KEY

REMOTE = "remote-model"  # the name the endpoint serves
ASKED = "eval-model"  # the name the harness asks for (the run's model_name)
EXTERNAL = ["--external-upstream", "--model-name", ASKED, "--upstream-model", REMOTE,
            *sampling.as_flags(sampling.NEUTRAL)]
TOOL = {"name": "bash", "description": "run a command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
USER = "list the files"


@pytest.fixture(scope="module")
def endpoints():
    """The three doubles by kind: `plain` (no token ids), `strict` (OpenAI's refusals too), `ids` (vLLM's fields)."""
    with (ScriptedModel(model=REMOTE, commands=["ls"], with_token_ids=False) as plain,
          ScriptedModel(model=REMOTE, commands=["ls"], strict=True) as strict,
          ScriptedModel(model=REMOTE, commands=["ls"]) as ids):
        yield {"plain": plain, "strict": strict, "ids": ids}


@pytest.fixture(scope="module")
def proxies(proxy, endpoints):
    """An external-upstream proxy in front of each double."""
    return {kind: proxy(double.url, extra=EXTERNAL) for kind, double in endpoints.items()}


def ask(dialect: str, stream: bool, rollout: dict) -> str:
    """One call with the `bash` tool through an official SDK; the name of the tool the answer calls."""
    if dialect == "chat_completions":
        client = openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"], max_retries=0)
        kwargs = dict(model=ASKED, messages=[{"role": "user", "content": USER}], logprobs=True,
                      tools=[{"type": "function", "function": TOOL}])
        if not stream:
            return client.chat.completions.create(**kwargs).choices[0].message.tool_calls[0].function.name
        chunks = list(client.chat.completions.create(**kwargs, stream=True))
        return next(call.function.name for chunk in chunks for choice in chunk.choices
                    for call in choice.delta.tool_calls or [] if call.function and call.function.name)
    if dialect == "responses":
        client = openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"], max_retries=0)
        kwargs = dict(model=ASKED, input=USER, tools=[{"type": "function", **TOOL}])
        if stream:
            events = list(client.responses.create(**kwargs, stream=True))
            output = next(event.response.output for event in events if event.type == "response.completed")
        else:
            output = client.responses.create(**kwargs).output
        return next(item.name for item in output if item.type == "function_call")
    client = anthropic.Anthropic(base_url=rollout["anthropic_base_url"], api_key=rollout["api_key"], max_retries=0)
    kwargs = dict(model=ASKED, max_tokens=200, messages=[{"role": "user", "content": USER}],
                  tools=[{"name": TOOL["name"], "description": TOOL["description"], "input_schema": TOOL["parameters"]}])
    if stream:
        with client.messages.stream(**kwargs) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**kwargs)
    return next(block.name for block in message.content if block.type == "tool_use")


DIALECTS = [(dialect, stream) for dialect in ("chat_completions", "responses", "messages") for stream in (False, True)]


@pytest.mark.parametrize("dialect, stream", DIALECTS)
def test_an_endpoint_without_token_ids_is_answered_in_every_dialect_and_recorded_as_untrainable(
        dialect, stream, endpoints, proxies):
    double, served = endpoints["plain"], proxies["plain"]
    rollout = served.register(f"plain-{dialect}-{stream}")
    before = len(double.exchanges)
    assert ask(dialect, stream, rollout) == "bash"
    (exchange,) = double.exchanges[before:]
    (call,) = served.calls(rollout["rollout_id"])
    assert (call["status"], call["dialect"], call["stream"]) == ("ok", dialect, stream)
    assert call["untrainable"] == NO_TOKEN_IDS
    assert call["prompt_token_ids"] is None and call["response_token_ids"] is None
    # The endpoint's logprobs (asked for on every call) and its token counts are kept all the same.
    entries = exchange["response"]["choices"][0]["logprobs"]["content"]
    assert call["response_logprobs"] == [logprob(i) for i in range(len(entries))] != []
    usage = exchange["response"]["usage"]
    assert call["usage"] == {"prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"]}
    sent = exchange["request"]  # the upstream's name, and no vLLM-only key at its neutral value
    assert sent["model"] == REMOTE and not set(sampling.VLLM_ONLY) & set(sent) and sent["temperature"] == 1.0


def test_an_endpoint_that_refuses_return_token_ids_is_sent_the_call_again_without_it(endpoints, proxies):
    double, served = endpoints["strict"], proxies["strict"]
    rollout = served.register("strict")
    for stream in (False, True):
        assert ask("chat_completions", stream, rollout) == "bash"
    calls = served.calls("strict")
    assert [call["untrainable"] for call in calls] == [NO_TOKEN_IDS] * 2
    assert all(call["status"] == "ok" and call["response_logprobs"] for call in calls)
    probe, *asked = double.exchanges  # the proxy's own call at its start, answered once sent without the field
    assert probe["request"]["max_tokens"] == 1 and "return_token_ids" not in probe["request"]
    assert [("return_token_ids" in exchange["request"]) for exchange in asked[-2:]] == [False, False]
    # Refused once, then never sent again.
    assert served.log_tail(200).count("upstream refused a vLLM field") == 1


def test_an_external_upstream_that_returns_token_ids_has_them_recorded(endpoints, proxies):
    double, served = endpoints["ids"], proxies["ids"]
    rollout = served.register("ids")
    before = len(double.exchanges)
    assert ask("messages", True, rollout) == "bash"
    (exchange,) = double.exchanges[before:]
    (call,) = served.calls("ids")
    assert call["prompt_token_ids"] == exchange["response"]["prompt_token_ids"]
    assert call["response_token_ids"] == exchange["response"]["choices"][0]["token_ids"] != []
    assert "untrainable" not in call and exchange["request"]["return_token_ids"] is True


def test_the_serve_steps_own_vllm_answering_without_token_ids_is_still_a_502(proxy, endpoints):
    """The control: only an external upstream's answer without token ids is recorded as untrainable."""
    own = proxy(endpoints["plain"].url, extra=["--model-name", REMOTE])
    rollout = own.register("own")
    with pytest.raises(openai.APIStatusError) as refused:
        ask("chat_completions", False, rollout)
    assert refused.value.status_code == 502 and "no token ids" in str(refused.value)
    (call,) = own.calls("own")
    assert call["status"] == "error" and "untrainable" not in call


def test_vllm_only_keys_are_left_out_for_an_external_upstream_only_at_their_neutral_value():
    forced = {**sampling.NEUTRAL, "top_k": 20}
    harness = {"messages": [], "min_p": 0.3, "repetition_penalty": 1.5, "top_k": 5}
    external = ProxyConfig("u", "s", "k", forced_sampling=forced, external_upstream=True).sampling(dict(harness))
    assert external["top_k"] == 20 and "min_p" not in external and "repetition_penalty" not in external
    own = ProxyConfig("u", "s", "k", forced_sampling=forced).sampling(dict(harness))  # the control: vLLM gets all
    assert (own["top_k"], own["min_p"], own["repetition_penalty"]) == (20, 0.0, 1.0)


def test_untrainable_calls_stay_in_the_calls_table_and_make_no_sample(capsys):
    ok = {"status": "ok", "weight_version": "0", "response_logprobs": [-0.5]}
    calls = [{**ok, "call_index": 0, "prompt_token_ids": [1, 2], "response_token_ids": [3]},
             {**ok, "call_index": 1, "prompt_token_ids": None, "response_token_ids": None, "untrainable": NO_TOKEN_IDS}]
    result = {"rollout_id": "r", "task": "t", "sample": 0, "harness": "direct", "status": "ok", "reward": 1.0}
    rows, _ = collect([RolloutResult.from_json(result)], {"r": calls}, "run", 0)
    tables = rows.tables()
    assert tables["calls"].column("prompt_token_ids").to_pylist() == [[1, 2], None]
    assert tables["calls"].column("sample_index").to_pylist() == [0, None]
    assert tables["samples"].num_rows == 1 and rows.untrainable_calls == 1


# ---- python -m steps.serve --upstream ----

def serve_command(upstream: str, port: int, store: Path, model: str = REMOTE) -> list[str]:
    return [sys.executable, "-m", "steps.serve", "--upstream", upstream, "--upstream-model", model,
            "--model-name", ASKED, "--port", str(port), "--store", str(store)]


def start_serve(upstream: str, tmp_path: Path, model: str = REMOTE) -> ProxyProcess:
    """`steps.serve --upstream` as a subprocess, once its proxy answers /health."""
    port, log = free_port(), tmp_path / f"serve-{uuid.uuid4().hex[:6]}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(serve_command(upstream, port, tmp_path / "calls", model), stdout=out,
                                   stderr=subprocess.STDOUT, env={**os.environ, "OPENFORGE_ADMIN_KEY": ADMIN_KEY})
    served = ProxyProcess(process, port, ADMIN_KEY, log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, served.log_tail()
        try:
            ProxyClient(served.url, ADMIN_KEY, timeout_s=2, retries=0).health()
            return served
        except ProxyClientError:
            time.sleep(0.2)
    process.kill()
    raise AssertionError(f"steps.serve --upstream did not answer /health: {served.log_tail()}")


def stop_serve(served: ProxyProcess) -> None:
    served.process.terminate()
    served.process.wait(10)


def rollout_through(served: ProxyProcess, tmp_path: Path, task: str = "hello-file"):
    rollout_id = f"direct-{task}-{uuid.uuid4().hex[:6]}"
    spec = RolloutSpec(task=BUILTIN_DATASET / task, harness="direct", proxy_url=served.url, rollout_id=rollout_id,
                       out=tmp_path / rollout_id, admin_key=ADMIN_KEY, model_name=ASKED)
    return run_rollout(spec), served.calls(rollout_id)


@pytest.mark.parametrize("with_token_ids", [True, False])
def test_serve_upstream_runs_a_rollout_that_passes_on_the_oracle(with_token_ids, tmp_path, capsys):
    with ScriptedModel(model=REMOTE, oracle=BUILTIN_DATASET, with_token_ids=with_token_ids) as double:
        served = start_serve(double.url, tmp_path)
        try:
            result, calls = rollout_through(served, tmp_path)
            assert (result.status, result.reward) == ("ok", 1.0), result
            probe, *asked = double.exchanges  # the proxy's own one-token call at its start, then the harness's
            assert probe["request"]["max_tokens"] == 1
            assert result.num_calls == len(calls) == len(asked) == 2  # the oracle, then "done"
            assert all(call["status"] == "ok" for call in calls)
            if with_token_ids:
                assert [call["response_token_ids"] for call in calls] == [
                    exchange["response"]["choices"][0]["token_ids"] for exchange in asked]
                assert not any("untrainable" in call for call in calls)
            else:
                assert all(call["untrainable"] == NO_TOKEN_IDS and call["response_token_ids"] is None for call in calls)
            assert result.response_tokens == sum(e["response"]["usage"]["completion_tokens"] for e in asked)
            double.set_commands(WRONG_COMMANDS)  # the control: a wrong script fails the same task
            double.app.state.oracle = None
            wrong, _ = rollout_through(served, tmp_path)
            assert (wrong.status, wrong.reward) == ("ok", 0.0), wrong
        finally:
            stop_serve(served)
    # The trajectories step keeps every call and trains on those with token ids only, counting the others.
    assert trajectories_main(["--store", str(tmp_path / "calls"), "--results", str(tmp_path),
                              "--out", str(tmp_path / "tables")]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["rows"]["calls"] == 4 and summary["untrainable_calls"] == (0 if with_token_ids else 4)
    assert (summary["rows"]["samples"] > 0) == with_token_ids


def test_a_dead_or_wrong_upstream_stops_serve_in_one_sentence(tmp_path):
    env = {**os.environ, "OPENFORGE_ADMIN_KEY": ADMIN_KEY}
    dead = f"http://127.0.0.1:{free_port()}"
    run = subprocess.run(serve_command(dead, free_port(), tmp_path), env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr
    assert dead in run.stderr and "does not answer GET /v1/models" in run.stderr
    with ScriptedModel(model=REMOTE) as double:
        run = subprocess.run(serve_command(double.url, free_port(), tmp_path, model="other"), env=env,
                             capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and run.stderr.count("\n") == 1, run.stderr
    assert f"does not list the model 'other' in its /v1/models (it lists '{REMOTE}')" in run.stderr


def test_the_start_up_check_follows_no_redirect_with_the_key():
    """An upstream whose /v1/models redirects elsewhere: the check stops in one sentence and the other server
    never sees the key (control: urllib's own opener follows the redirect and sends the key there)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from steps import serve

    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.server.server_address[1], self.headers.get("authorization")))
            if self.server is upstream:
                self.send_response(302)
                self.send_header("location", f"http://127.0.0.1:{elsewhere.server_address[1]}/v1/models")
                self.send_header("content-length", "0")
                self.end_headers()
                return
            body = json.dumps({"data": [{"id": "m"}]}).encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    upstream, elsewhere = ThreadingHTTPServer(("127.0.0.1", 0), Handler), ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    for server in (upstream, elsewhere):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{upstream.server_address[1]}"
        problem = serve.upstream_problem(url, "m", api_key="secret-key")
        assert problem is not None and "answered 302 to GET /v1/models" in problem and "secret-key" not in problem
        assert [port for port, _ in seen] == [upstream.server_address[1]]
        request = urllib.request.Request(f"{url}/v1/models", headers={"Authorization": "Bearer secret-key"})
        urllib.request.urlopen(request, timeout=10).read()  # the control
        assert seen[-1] == (elsewhere.server_address[1], "Bearer secret-key")
    finally:
        upstream.shutdown(), elsewhere.shutdown()


def test_a_real_vllm_as_upstream_has_its_own_token_ids_recorded(vllm_server, tmp_path):
    served = start_serve(vllm_server, tmp_path, model="tiny")
    try:
        rollout = served.register("vllm")
        client = openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"], max_retries=0)
        messages = [{"role": "user", "content": USER}]
        client.chat.completions.create(model=ASKED, messages=messages, max_tokens=12, seed=7)
        (call,) = served.calls("vllm")
    finally:
        stop_serve(served)
    # The same call straight to vLLM, with what the proxy sent: the same seeded sample, token for token.
    body = {"model": "tiny", "messages": messages, **call["sampling"], "return_token_ids": True, "logprobs": True}
    request = urllib.request.Request(f"{vllm_server}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        direct = json.loads(answer.read())
    choice = direct["choices"][0]
    assert call["prompt_token_ids"] == direct["prompt_token_ids"]
    assert call["response_token_ids"] == choice["token_ids"] != []
    assert call["response_logprobs"] == pytest.approx([entry["logprob"] for entry in choice["logprobs"]["content"]])
    assert "untrainable" not in call and call["sampling"]["seed"] == 7


def test_an_https_upstream_is_verified_and_served(proxy, tmp_path):
    """An external endpoint over TLS: served when its certificate verifies (here against SSL_CERT_FILE), a 502
    naming the failure when it does not (the control: the same server, a CA file without its certificate)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    with ScriptedModel(model=REMOTE, commands=["ls"], with_token_ids=False, tls=(cert, key)) as double:
        trusted = proxy(double.url, extra=EXTERNAL, env={"SSL_CERT_FILE": str(cert)})
        assert ask("chat_completions", False, trusted.register("tls")) == "bash"
        (call,) = trusted.calls("tls")
        assert call["status"] == "ok" and call["untrainable"] == NO_TOKEN_IDS
        untrusted = proxy(double.url, extra=EXTERNAL, env={"SSL_CERT_FILE": str(tmp_path / "none.pem")})
        with pytest.raises(openai.APIStatusError) as refused:
            ask("chat_completions", False, untrusted.register("tls-untrusted"))
        assert refused.value.status_code == 502 and "CERTIFICATE_VERIFY_FAILED" in str(refused.value)


def test_only_a_400_naming_the_field_itself_drops_it():
    """`top_logprobs` out of range is the harness's error, not a refusal of `logprobs` (nor is another status)."""
    from steps.proxy.errors import ProxyError
    from steps.proxy.upstream import Upstream

    external, sent = Upstream("http://u", external=True), {"return_token_ids": True, "logprobs": True}
    assert external._refused_extra(ProxyError(400, "Unrecognized request argument supplied: return_token_ids"),
                                   sent) == "return_token_ids"
    assert external._refused_extra(ProxyError(400, "body.logprobs: Extra inputs are not permitted"), sent) == "logprobs"
    assert external._refused_extra(ProxyError(400, "top_logprobs must be at most 20"), sent) is None
    assert external._refused_extra(ProxyError(502, "return_token_ids"), sent) is None
    assert Upstream("http://u")._refused_extra(ProxyError(400, "return_token_ids"), sent) is None  # the run's own vLLM


def test_a_harness_call_whose_400_echoes_a_field_name_turns_off_nothing(monkeypatch):
    """A harness's bad field whose 400 echoes 'return_token_ids logprobs' (as pydantic echoes input values) is
    that harness's error: later calls of every rollout still carry both fields. Only the proxy's own probe
    call learns refusals (control: the probe refused by name drops the field). `send` is replaced because
    the point is which 400 text is trusted, not the HTTP exchange (the strict endpoint test covers that)."""
    import asyncio

    from steps.proxy.errors import ProxyError
    from steps.proxy.upstream import Upstream

    sent = []

    async def fake_send(self, method, path, body=None, **kw):
        sent.append(dict(body))
        if body.get("user") == "evil":
            raise ProxyError(400, "1 validation error: user: value 'return_token_ids logprobs' not allowed")
        if self.model == "strict" and "return_token_ids" in body:
            raise ProxyError(400, "Unrecognized request argument supplied: return_token_ids")
        return json.dumps({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop", "token_ids": [1]}],
                           "prompt_token_ids": [1, 2], "usage": {"prompt_tokens": 2}}).encode()

    monkeypatch.setattr(Upstream, "send", fake_send)

    async def calls(model: str) -> list[dict]:
        upstream = Upstream("http://x", external=True, model=model)
        await upstream.probe()
        with pytest.raises(ProxyError) as refused:
            await upstream.complete({"messages": [], "user": "evil"})
        assert refused.value.status == 400
        await upstream.complete({"messages": []})  # another rollout's call
        return sent[-1]

    later = asyncio.run(calls("m"))
    assert later["return_token_ids"] is True and later["logprobs"] is True
    assert "return_token_ids" not in asyncio.run(calls("strict")) and sent[-1]["logprobs"] is True  # the control


@pytest.mark.parametrize("url", ["http://h:abc", "http://", "ftp://h", "http://user:key@h:8000", "http://h/?key=1"])
def test_an_upstream_that_is_no_url_is_refused_in_one_sentence(url, capsys):
    from steps import serve

    with pytest.raises(SystemExit) as stopped:
        serve.parse_args(["--upstream", url, "--model-name", ASKED, "--port", "1", "--store", "s"])
    error = capsys.readouterr().err.splitlines()[-1]
    assert stopped.value.code == 2 and "--upstream must be an http:// or https:// URL" in error
    assert "user:key" not in error and "key=1" not in error  # not repeated: it may hold a password or a key
    assert serve.parse_args(["--upstream", "https://h/v1", "--model-name", ASKED, "--port", "1", "--store", "s"])  # control
