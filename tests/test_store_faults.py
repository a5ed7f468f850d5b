"""The store under faults: poisoned requests and records, a proxy killed under load, a full disk, torn
records on local disk and S3, a second writer, and vLLM killed mid-call.

The proxy is the real subprocess; its upstream is `benchmarks/fake_vllm.py`'s app on a loopback thread,
each completion delayed by a few tenths of a second (like a model generating) so that calls overlap and
finish out of order; a request whose text holds "slow" takes 60 s, a call that is still in flight when
the test wants one. Only the last test runs the real vLLM, because its death is the point (the vLLM that
then comes back at the dead one's address is the session's, through a TCP relay on that port).
"""

import asyncio
import importlib.util
import json
import os
import random
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3
import httpx
import orjson
import pytest
import uvicorn

from proxy_process import start_proxy, stop_proxy
from steps.net import HOST, free_port
from steps.contracts.rollout import RolloutResult
from steps.rollout import RolloutSpec, record_calls
from steps.contracts.table_files import partition_url, read_table
from vllm_process import serve_vllm

ADMIN = "test-admin-key"
ROOT = Path(__file__).resolve().parents[1]


def _fake_vllm():
    spec = importlib.util.spec_from_file_location("fake_vllm", ROOT / "benchmarks" / "fake_vllm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def jittered(app):
    """fake_vllm's app with each completion taking 0.05-0.4 s (60 s if the request says "slow")."""
    async def wrapped(scope, receive, send):
        if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
            body, more = b"", True
            while more:
                message = await receive()
                body += message.get("body", b"")
                more = message.get("more_body", False)
            await asyncio.sleep(60 if b"slow" in body else random.uniform(0.05, 0.4))
            replay = iter([{"type": "http.request", "body": body, "more_body": False}])
            return await app(scope, lambda: _next(replay, receive), send)
        return await app(scope, receive, send)
    return wrapped


async def _next(replay, receive):
    return next(replay, None) or await receive()


@pytest.fixture(scope="module")
def upstream():
    """A fast vLLM stand-in on a loopback thread; yields its URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(jittered(_fake_vllm().make_app()), host=HOST, port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield f"http://{HOST}:{port}"
    server.should_exit = True
    thread.join(10)


def chat_body(text: str, stream: bool = True, **extra) -> dict:
    return {"model": "tiny", "stream": stream, "max_tokens": 8, "messages": [{"role": "user", "content": text}], **extra}


def post(url: str, key: str, body=None, raw: bytes | None = None) -> tuple[int, dict | bytes]:
    """POSTs JSON (or raw bytes) with a rollout key: (status, JSON body, or the SSE bytes of a stream)."""
    data = raw if raw is not None else json.dumps(body).encode()  # json: integers past 64 bits too
    answer = httpx.post(url, content=data, headers={"authorization": f"Bearer {key}", "x-api-key": key,
                                                    "content-type": "application/json"}, timeout=120)
    is_json = answer.headers.get("content-type", "").startswith("application/json")
    return answer.status_code, answer.json() if is_json else answer.content


def stored_lines(store: Path, rollout_id: str) -> list[bytes]:
    path = store / "rollouts" / rollout_id / "calls.jsonl"
    return path.read_bytes().splitlines() if path.exists() else []


def read_back(proxy, rollout_id: str) -> dict:
    answer = proxy.client.calls(rollout_id)
    return {"calls": answer.calls, "skipped": answer.skipped}


# --- 3. no bad byte or field poisons anything ------------------------------------------------------

POISONS = [
    ("not valid UTF-8", "chat/completions", None, b'{"model": "tiny", "messages": [{"role": "user", "content": "\xff\xfe"}]}'),
    ("not valid UTF-8", "responses", None, b'{"model": "tiny", "input": "x", "instructions": "\xc0\xaf"}'),
    ("not valid UTF-8", "messages", None,
     b'{"model": "tiny", "max_tokens": 4, "tools": [{"name": "t", "description": "\xed\xa0\x80"}],'
     b' "messages": [{"role": "user", "content": "x"}]}'),
    ("max_tokens", "chat/completions", {"max_tokens": 10**30}, None),
    ("max_output_tokens", "responses", {"max_output_tokens": 2**31}, None),
    ("max_tokens", "messages", {"max_tokens": 10**30}, None),
    ("seed", "chat/completions", {"seed": 2**63}, None),
    ("top_k", "messages", {"top_k": 2**40}, None),
    ("top_k", "chat/completions", {"top_k": 2**40}, None),
    ("tool_choice.x", "chat/completions", {"tool_choice": {"type": "function", "x": 10**30}}, None),
    ("presence_penalty", "chat/completions", None,
     b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "presence_penalty": 1e400}'),
    ("nested too deeply", "chat/completions", None,
     b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "extra": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
]
VALID = {"chat/completions": chat_body("fine", stream=False),
         "responses": {"model": "tiny", "input": "fine"},
         "messages": {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "fine"}]}}


def test_a_poisoned_request_is_a_400_naming_the_problem_and_takes_no_index(upstream, proxy):
    served = proxy(upstream, extra=["--max-body-bytes", str(1 << 20)])
    rollout = served.register("poison")
    key, root = rollout["api_key"], f"{served.url}/rollouts/poison/v1/"
    for problem, route, fields, raw in POISONS:
        status, body = post(root + route, key, {**VALID[route], **(fields or {})}, raw=raw)
        message = body["error"]["message"]
        assert status == 400 and problem in message, (problem, route, body)
        assert (body.get("type") == "error") == (route == "messages")  # the dialect's own error shape
        if fields:
            assert body.get("error", {}).get("param", problem) == problem
    # Control: the valid variants are answered and stored, and took the indices 0, 1, 2: none was
    # taken by the refused calls before them.
    for route, body in VALID.items():
        assert post(root + route, key, body)[0] == 200, route
    calls = served.calls("poison")
    assert [(c["call_index"], c["status"]) for c in calls] == [(0, "ok"), (1, "ok"), (2, "ok")]
    assert read_back(served, "poison")["skipped"] == []
    assert "Traceback" not in served.log_tail(200)


def write_log(store: Path, rollout_id: str, lines: list[bytes]) -> None:
    path = store / "rollouts" / rollout_id / "calls.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))


def test_a_poisoned_record_is_named_and_the_rollout_still_reads_grades_and_trains(upstream, proxy, tmp_path):
    """Records as an earlier proxy left them: undecoded bytes in a stored request, a garbage line, a
    record glued after a torn one, a number orjson cannot read back. Each is named or kept by the rule,
    the runner's `record_calls` counts the calls, and the trajectories step writes the iteration."""
    store = tmp_path / "store"
    served = proxy(upstream, store=str(store))
    for rollout_id in ("bad-0", "good-0"):
        rollout = served.register(rollout_id)
        for turn in range(3):
            assert post(f"{rollout['openai_base_url']}/chat/completions", rollout["api_key"],
                        chat_body(f"{rollout_id} turn {turn}"))[0] == 200
    first, second, third = stored_lines(store, "bad-0")
    utf8 = first.replace(b'"bad-0 turn 0"', b'"\xff\xfe"')  # a request stored without being decoded
    at = first.index(b'"request":{')  # call 0 is stored whole; as call 3, its request holds a number
    huge = first[:at].replace(b'"call_index":0', b'"call_index":3') + first[at:].replace(b'"max_tokens": 8', b'"max_tokens": 1e400')
    write_log(store, "bad-0", [utf8, b"garbage, not a record", second[: len(second) // 2] + third, huge, third])
    # Control: what the readers did before, one orjson.loads a line, fails the whole rollout.
    with pytest.raises(orjson.JSONDecodeError):
        [orjson.loads(line) for line in stored_lines(store, "bad-0")]

    answer = read_back(served, "bad-0")
    calls, skipped = answer["calls"], answer["skipped"]
    assert [c["call_index"] for c in calls] == [0, 2, 3]  # call 2 is read from where it starts, once
    for call in (calls[0], calls[2]):  # a request no JSON reader takes: null, and why
        assert call["request"] is None and "request: not readable back as JSON" in call["store_error"]
    # Call 2's prompt and request extend call 1's, which is torn: they are null, and say so.
    assert calls[1]["prompt_token_ids"] is None and calls[1]["request"] is None
    assert "extends the prompt of call 1" in calls[1]["store_error"]
    assert all(c["status"] == "ok" and c["response_token_ids"] for c in calls)  # the tokens sampled are kept
    assert [s["record"] for s in skipped] == ["calls.jsonl line 2", "calls.jsonl line 3", "calls.jsonl line 5"]
    assert "not JSON" in skipped[0]["error"] and "torn record" in skipped[1]["error"]
    assert "repeats call index 2" in skipped[2]["error"]

    result = RolloutResult(rollout_id="bad-0", task="t", harness="direct", status="infra_error", reward=None)
    record_calls(RolloutSpec(task=tmp_path, harness="direct", proxy_url=served.url, rollout_id="bad-0",
                             out=tmp_path, admin_key=ADMIN), result)  # raises InfraError if nothing reads
    assert result.num_calls == 3 and result.response_tokens > 0

    results = tmp_path / "results"
    for rollout_id in ("bad-0", "good-0"):
        (results / rollout_id).mkdir(parents=True)
        (results / rollout_id / "result.json").write_text(json.dumps(
            {"rollout_id": rollout_id, "task": "t", "harness": "direct", "status": "ok", "reward": 0.0, "num_calls": 3}))
    for source in (["--store", str(store)], ["--proxy-url", served.url]):
        out = tmp_path / f"out-{source[0][2:]}"
        done = subprocess.run([sys.executable, "-m", "steps.trajectories", *source, "--results", str(results),
                               "--out", str(out)], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "OPENFORGE_ADMIN_KEY": ADMIN})
        assert done.returncode == 0, done.stderr
        assert "rollout bad-0: stored record calls.jsonl line 2 skipped: not JSON" in done.stderr
        summary = json.loads(done.stdout)
        assert summary["rows"]["calls"] == 6 and len(summary["skipped"]) == 3
        calls_table = read_table(partition_url(str(out), "default", 0), "calls").to_pylist()
        assert sorted((c["rollout_id"], c["call_index"]) for c in calls_table) == [
            ("bad-0", 0), ("bad-0", 2), ("bad-0", 3), ("good-0", 0), ("good-0", 1), ("good-0", 2)]
        # Behaviour reads the same records: the three calls whose request is lost count as unreadable.
        behaviour = {r["rollout_id"]: r for r in read_table(partition_url(str(out), "default", 0), "behaviour").to_pylist()}
        assert [(behaviour[r]["calls"], behaviour[r]["unreadable"]) for r in ("bad-0", "good-0")] == [(3, 3), (3, 0)]


# --- 4. integrity across restarts, full disks and concurrent writers --------------------------------

async def _agent(client: httpx.AsyncClient, rollout: dict, worker: int, answered: list, stop: asyncio.Event) -> None:
    """Sends streamed calls one after another until `stop`; keeps the text of every call answered whole."""
    turn = 0
    while not stop.is_set():
        text = f"{rollout['rollout_id']} worker {worker} turn {turn}"
        turn += 1
        try:
            answer = await client.post(f"{rollout['openai_base_url']}/chat/completions", json=chat_body(text),
                                       headers={"authorization": f"Bearer {rollout['api_key']}"})
        except httpx.HTTPError:
            return  # the proxy died under this call: it was never answered
        if answer.status_code == 200 and answer.content.endswith(b"data: [DONE]\n\n"):
            answered.append((rollout["rollout_id"], text))


def _unanswered(url: str, key: str, body: dict) -> None:
    """A call whose proxy is killed under it."""
    with pytest.raises(httpx.HTTPError):
        post(url, key, body)


def run_agents(rollouts: list[dict], workers: int, seconds: float, kill=None) -> list[tuple[str, str]]:
    """`workers` concurrent streamed callers per rollout for `seconds`, then `kill()` (if given) while
    they are still calling; returns (rollout id, text) of every call answered."""
    answered: list = []

    async def main() -> None:
        stop = asyncio.Event()
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=256)) as client:
            tasks = [asyncio.create_task(_agent(client, r, w, answered, stop)) for r in rollouts for w in range(workers)]
            await asyncio.sleep(seconds)
            if kill is not None:
                kill()
            stop.set()
            await asyncio.gather(*tasks)

    asyncio.run(main())
    return answered


def test_sigkill_under_64_concurrent_streamed_calls_loses_no_answered_call_and_repeats_no_index(upstream, tmp_path):
    store = tmp_path / "store"
    proxy = start_proxy(upstream, str(store), ADMIN, log_path=tmp_path / "proxy.log")
    try:
        rollouts = [proxy.register(f"busy-{i}") for i in range(16)]
        # Call 0 of busy-0 is still in flight at the kill while its call 1 is stored: a restart that took
        # the number of stored records as the next index would give index 1 again.
        slow = threading.Thread(target=_unanswered, args=(f"{rollouts[0]['openai_base_url']}/chat/completions",
                                                          rollouts[0]["api_key"], chat_body("slow")), daemon=True)
        slow.start()
        time.sleep(0.3)
        answered = run_agents(rollouts, workers=4, seconds=2.0, kill=proxy.process.kill)  # 64 calls in flight
        proxy.process.wait()
    finally:
        stop_proxy(proxy)
    lines = stored_lines(store, "busy-0")
    indices = [json.loads(line)["call_index"] for line in lines if line.endswith(b"}")]
    assert 0 not in indices and len(lines) < max(indices) + 1  # control: the old rule would repeat an index
    assert len(answered) > 64

    proxy = start_proxy(upstream, str(store), ADMIN, port=proxy.port, log_path=tmp_path / "proxy.log")
    try:
        answered += run_agents(rollouts, workers=2, seconds=1.0)
        for rollout in rollouts:
            answer = read_back(proxy, rollout["rollout_id"])
            calls = answer["calls"]
            assert answer["skipped"] == []  # a torn last record is cut off, never read as garbage
            indices = [c["call_index"] for c in calls]
            assert len(indices) == len(set(indices)), rollout["rollout_id"]
            texts = {c["request"]["messages"][0]["content"] for c in calls if c["status"] == "ok"}
            mine = {text for rid, text in answered if rid == rollout["rollout_id"]}
            assert mine <= texts, mine - texts  # every call answered is stored and reads back
            assert any("turn" in t for t in texts)
    finally:
        stop_proxy(proxy)


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs mounted for the store (needs root), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path, leave: int) -> Path:
    """Fills the disk but for about `leave` bytes; returns the filler file."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    os.truncate(filler, max(filler.stat().st_size - leave, 0))
    return filler


def test_a_full_disk_refuses_calls_in_the_dialects_shape_and_stores_them_once_freed(upstream, small_disk, tmp_path):
    store = small_disk / "store"
    proxy = start_proxy(upstream, str(store), ADMIN, log_path=tmp_path / "proxy.log")
    big = "word " * 20_000  # a ~100 KB request, a ~200 KB record
    try:
        rollout = proxy.register("full")
        key = rollout["api_key"]
        assert post(f"{rollout['openai_base_url']}/chat/completions", key, chat_body(big))[0] == 200
        before = stored_lines(store, "full")
        filler = fill(small_disk, leave=48 * 1024)
        with open(small_disk / "probe", "wb", buffering=0) as probe:  # control: a record's write is cut short
            assert 0 < probe.write(b"x" * 200_000) < 200_000
        os.remove(small_disk / "probe")
        status, body = post(f"{rollout['openai_base_url']}/chat/completions", key, chat_body("other " * 20_000))
        assert status == 503 and body["error"]["type"] == "server_error" and "could not store" in body["error"]["message"]
        status, body = post(f"{rollout['anthropic_base_url']}/v1/messages", key,
                            {"model": "tiny", "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": "mess " * 20_000}]})
        assert status == 503 and body["type"] == "error" and body["error"]["type"] == "overloaded_error"
        assert stored_lines(store, "full") == before  # what the failed writes wrote was cut off again
        os.remove(filler)
        for text in ("after 1", "after 2"):
            assert post(f"{rollout['openai_base_url']}/chat/completions", key, chat_body(text))[0] == 200
    finally:
        stop_proxy(proxy)
    proxy = start_proxy(upstream, str(store), ADMIN, port=proxy.port, log_path=tmp_path / "proxy.log")
    try:
        assert post(f"{rollout['openai_base_url']}/chat/completions", key, chat_body("after restart"))[0] == 200
        answer = read_back(proxy, "full")
    finally:
        stop_proxy(proxy)
    assert answer["skipped"] == []
    assert [(c["call_index"], c["request"]["messages"][0]["content"][:12]) for c in answer["calls"]] == [
        (0, "word word wo"), (1, "after 1"), (2, "after 2"), (3, "after restar")]


TORN_TEXTS = ["a" * 300, "b" * 600, "c" * 300]


def test_a_torn_local_record_is_cut_off_and_a_record_after_it_is_still_read(upstream, tmp_path):
    store = tmp_path / "store"
    proxy = start_proxy(upstream, str(store), ADMIN, log_path=tmp_path / "proxy.log")
    try:
        rollout = proxy.register("torn")
        # Call 2 neither starts with call 1's request nor with its prompt: it is stored whole.
        for text in TORN_TEXTS:
            assert post(f"{rollout['openai_base_url']}/chat/completions", rollout["api_key"], chat_body(text))[0] == 200
    finally:
        proxy.process.kill()
        proxy.process.wait()
    zero, one, two = stored_lines(store, "torn")
    # Call 1 torn in the middle of the log with call 2 written after it, and call 3 torn at the end.
    log = store / "rollouts" / "torn" / "calls.jsonl"
    log.write_bytes(zero + b"\n" + one[:200] + two + b"\n" + two.replace(b'"call_index":2', b'"call_index":3')[:300])
    proxy = start_proxy(upstream, str(store), ADMIN, port=proxy.port, log_path=tmp_path / "proxy.log")
    try:
        answer = read_back(proxy, "torn")
        assert [c["call_index"] for c in answer["calls"]] == [0, 2]
        assert [s["record"] for s in answer["skipped"]] == ["calls.jsonl line 2"]  # the torn bytes before call 2
        assert post(f"{rollout['openai_base_url']}/chat/completions", rollout["api_key"], chat_body("d"))[0] == 200
        calls = read_back(proxy, "torn")["calls"]
        assert [(c["call_index"], c["request"]["messages"][0]["content"][0]) for c in calls] == [(0, "a"), (2, "c"), (3, "d")]
        assert all(line.endswith(b"}") for line in stored_lines(store, "torn"))  # the torn tail was cut
    finally:
        stop_proxy(proxy)


def test_on_s3_a_torn_object_is_skipped_its_index_is_never_reused_and_no_writer_replaces_another(upstream, s3_server, tmp_path):
    prefix = f"faults-{random.randrange(1 << 30):x}"
    store = f"s3://{s3_server['bucket']}/{prefix}"
    s3 = boto3.client("s3", endpoint_url=s3_server["endpoint_url"], region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    key_of = lambda index: f"{prefix}/rollouts/s3-torn/calls/{index:06d}.json"  # noqa: E731
    proxy = start_proxy(upstream, store, ADMIN, env=s3_server["env"], log_path=tmp_path / "proxy.log")
    try:
        rollout = proxy.register("s3-torn")
        for turn in range(3):
            assert post(f"{rollout['openai_base_url']}/chat/completions", rollout["api_key"], chat_body(f"t{turn}"))[0] == 200
    finally:
        stop_proxy(proxy)
    torn = s3.get_object(Bucket=s3_server["bucket"], Key=key_of(2))["Body"].read()
    s3.put_object(Bucket=s3_server["bucket"], Key=key_of(2), Body=torn[: len(torn) // 2])
    other = b'{"written": "by another writer"}'
    s3.put_object(Bucket=s3_server["bucket"], Key=key_of(3), Body=other)  # holds index 3 already
    proxy = start_proxy(upstream, store, ADMIN, env=s3_server["env"], port=proxy.port, log_path=tmp_path / "proxy.log")
    try:
        answer = read_back(proxy, "s3-torn")
        assert [c["call_index"] for c in answer["calls"]] == [0, 1]
        assert [s["record"] for s in answer["skipped"]] == ["calls/000002.json", "calls/000003.json"]
        assert post(f"{rollout['openai_base_url']}/chat/completions", rollout["api_key"], chat_body("t4"))[0] == 200
        # The index after the highest name (3) was taken; now another writer takes the next one first:
        # the call is created under the next free index and replaces nothing.
        s3.put_object(Bucket=s3_server["bucket"], Key=key_of(5), Body=other)
        assert post(f"{rollout['openai_base_url']}/chat/completions", rollout["api_key"], chat_body("t6"))[0] == 200
        calls = read_back(proxy, "s3-torn")["calls"]
    finally:
        stop_proxy(proxy)
    assert [(c["call_index"], c["request"]["messages"][0]["content"]) for c in calls] == [
        (0, "t0"), (1, "t1"), (4, "t4"), (6, "t6")]
    for index in (3, 5):  # the other writer's objects are as it wrote them
        assert s3.get_object(Bucket=s3_server["bucket"], Key=key_of(index))["Body"].read() == other


# --- vLLM killed mid-call -----------------------------------------------------------------------

class Relay(socketserver.ThreadingTCPServer):
    """Relays every TCP connection to 127.0.0.1:`port` to the server at `url`, byte for byte, both ways."""

    daemon_threads = allow_reuse_address = True

    def __init__(self, port: int, url: str):
        self.target = (HOST, int(url.rsplit(":", 1)[1]))
        super().__init__((HOST, port), RelayedConnection)

    def __enter__(self) -> "Relay":
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()


class RelayedConnection(socketserver.BaseRequestHandler):
    """One connection, relayed until either side closes it."""

    def handle(self) -> None:
        with socket.create_connection(self.server.target) as upstream:
            threading.Thread(target=_pump, args=(upstream, self.request), daemon=True).start()
            _pump(self.request, upstream)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:  # the other direction closed both
        pass


@pytest.mark.vllm
def test_vllm_killed_mid_call_is_the_dialects_error_a_failed_call_and_the_proxy_serves_a_new_vllm(
        tiny_model, vllm_server, tmp_path):
    port = free_port()
    with serve_vllm(tiny_model, name="tiny", port=port, log_path=tmp_path / "vllm-1.log") as vllm:
        proxy = start_proxy(vllm.base_url, str(tmp_path / "store"), ADMIN, log_path=tmp_path / "proxy.log")
        try:
            rollout = proxy.register("vllm-dies")
            key, base = rollout["api_key"], rollout["openai_base_url"]
            assert post(f"{base}/chat/completions", key, chat_body("before"))[0] == 200
            outcome = {}
            long_call = threading.Thread(target=lambda: outcome.update(answer=post(
                f"{base}/chat/completions", key, chat_body("go on", max_tokens=3000, ignore_eos=True))))
            long_call.start()
            time.sleep(2)  # the long call is generating (3000 tokens take the tiny model several seconds)
            os.killpg(vllm.process.pid, signal.SIGKILL)
            long_call.join(60)
            status, body = outcome["answer"]
            assert status == 502 and body["error"]["type"] == "server_error" and "upstream" in body["error"]["message"]
            status, body = post(f"{rollout['anthropic_base_url']}/v1/messages", key,
                                {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "down"}]})
            assert status == 502 and body["type"] == "error" and body["error"]["type"] == "api_error"
        except BaseException:
            stop_proxy(proxy)
            raise
    # The new vLLM at the dead one's address is the session's, through a TCP relay on that port: another start
    # of vLLM here would cost half a minute or more.
    with Relay(port, vllm_server):
        try:
            assert post(f"{base}/chat/completions", key, chat_body("after"))[0] == 200
            calls = proxy.calls("vllm-dies")
        finally:
            stop_proxy(proxy)
    assert [(c["call_index"], c["status"]) for c in calls] == [(0, "ok"), (1, "error"), (2, "error"), (3, "ok")]
    assert calls[1]["error"]["status"] == 502 and calls[1]["response_token_ids"] is None
    assert calls[0]["response_token_ids"] and calls[3]["response_token_ids"]
