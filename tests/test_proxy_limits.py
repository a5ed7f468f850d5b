"""What the proxy does against clients that hold its connections, send oversized or slow requests, or race
its registrations (docs/proxy.md, "Limits").

Every test runs the real proxy process; model calls go to benchmarks/fake_vllm.py, run in a thread on
loopback (a canned vLLM-shaped answer, optionally delayed like a model generating): these tests are about
connections, not tokens. Raw sockets put exactly the bytes under test on the wire. Each refusal has a
control: the same load with the limit turned off, or the valid variant, is answered.
"""

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import uvicorn

from benchmarks.fake_vllm import make_app
from steps.net import HOST, free_port
from steps.proxy.config import ProxyConfig
from steps.proxy.connections import Connections
from proxy_process import ProxyProcess, serve_proxy, start_proxy, stop_proxy
from steps.proxy.sessions import Sessions
from steps.proxy.store import CallStore

ADMIN = "test-admin-key"
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
HEALTH = b"GET /health HTTP/1.1\r\nhost: proxy\r\n"


class FakeModel:
    """benchmarks/fake_vllm.py in a background thread; `delay_s` is how long each completion takes."""

    def __init__(self, delay_s: float = 0.0):
        self.url = f"http://{HOST}:{free_port()}"
        config = uvicorn.Config(make_app(delay_s), host=HOST, port=int(self.url.rsplit(":", 1)[1]),
                                log_level="warning", access_log=False, backlog=4096)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "FakeModel":
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the fake model did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def model():
    with FakeModel() as server:
        yield server


@pytest.fixture(scope="module")
def proxy(model, tmp_path_factory):
    """The proxy with its default limits, except short timeouts so that slow requests fail fast."""
    with serve_proxy(model.url, str(tmp_path_factory.mktemp("store")), ADMIN,
                     extra=["--model-name", "fake", "--head-timeout", "1", "--body-timeout", "1"]) as proxy:
        yield proxy


def post(url: str, body: dict, key: str, timeout: float = 30) -> tuple[int, dict]:
    """POSTs JSON; (status, parsed body) whatever the status."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json", "authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def chat(rollout: dict, timeout: float = 30) -> int:
    return post(f"{rollout['openai_base_url']}/chat/completions", CHAT, rollout["api_key"], timeout)[0]


def connect(proxy: ProxyProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=30)


def answer(conn: socket.socket) -> tuple[int, bytes]:
    """(status, body) of one answer read off `conn`, or (0, b"") if it closed without one."""
    stream = conn.makefile("rb")
    status_line = stream.readline()
    if not status_line:
        return 0, b""
    length = 0
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        length = int(value) if name.strip().lower() == "content-length" else length
    return int(status_line.split()[1]), stream.read(length)


def closed_by_proxy(conn: socket.socket, wait_s: float = 0.0) -> bool:
    """Whether the proxy has closed `conn` (EOF or reset, after any answer), waiting up to `wait_s`."""
    timeout = conn.gettimeout()
    conn.settimeout(wait_s or 0.001)
    try:
        while conn.recv(1 << 16):
            pass
        return True
    except (TimeoutError, BlockingIOError):
        return False
    except OSError:
        return True
    finally:
        conn.settimeout(timeout)  # a later read waits as long as before


def peak_rss_mb(proxy: ProxyProcess) -> float:
    """The proxy process's peak resident memory (VmHWM), in MiB."""
    with open(f"/proc/{proxy.process.pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


# --- registration -------------------------------------------------------------------------------
def test_concurrent_registrations_of_one_rollout_give_one_key(proxy):
    def register(rollout_id: str) -> tuple[int, dict]:
        start.wait()
        return post(f"{proxy.url}/rollouts", {"rollout_id": rollout_id}, ADMIN)

    start = threading.Barrier(40)
    with ThreadPoolExecutor(40) as pool:
        answers = list(pool.map(register, ["race"] * 40))
    statuses = sorted(status for status, _ in answers)
    assert statuses == [200] + [409] * 39
    (won,) = [body for status, body in answers if status == 200]
    assert chat(won) == 200
    assert {body["error"]["param"] for status, body in answers if status == 409} == {"rollout_id"}
    # control: 40 concurrent registrations of 40 ids all succeed, and every key opens its own rollout
    start = threading.Barrier(40)
    with ThreadPoolExecutor(40) as pool:
        answers = list(pool.map(register, [f"race-{i}" for i in range(40)]))
    assert {status for status, _ in answers} == {200}
    assert {chat(body) for _, body in answers} == {200}
    assert len(proxy.calls("race")) == 1


def test_a_closed_rollout_leaves_memory_and_still_answers_403(tmp_path):
    """The sessions table itself, on a real local store: closed rollouts leave `rollouts`; only the last
    `closed_kept` stay, the rest are read back from the store when asked for."""
    async def run() -> None:
        sessions = Sessions(CallStore(str(tmp_path / "store")), closed_kept=2)
        keys = {}
        for i in range(5):
            rollout, keys[f"r-{i}"] = await sessions.register(f"r-{i}", {"i": i})
        open_rollout, open_key = await sessions.register("open", {})
        for i in range(5):
            await sessions.close(f"r-{i}")
        assert set(sessions.rollouts) == {"open"} and list(sessions.closed) == ["r-3", "r-4"]
        for rollout_id, key in keys.items():  # kept or read back: the key is known, the rollout closed
            with pytest.raises(Exception) as refused:
                await sessions.authorize(rollout_id, key)
            assert refused.value.status == 403
            with pytest.raises(Exception) as wrong:
                await sessions.authorize(rollout_id, "of-wrong")
            assert wrong.value.status == 401
            assert (await sessions.close(rollout_id)).closed_at is not None
        assert len(sessions.closed) == 2 and set(sessions.rollouts) == {"open"}
        with pytest.raises(Exception) as taken:
            await sessions.register("r-0", {})
        assert taken.value.status == 409
        # control: the open rollout stayed and its key is accepted
        assert await sessions.authorize("open", open_key) is open_rollout

    asyncio.run(run())


def test_a_closed_rollouts_calls_stay_readable(proxy):
    rollout = proxy.register("closed")
    assert chat(rollout) == 200
    closed = proxy.client.close("closed")
    assert closed["num_calls"] == 1
    assert chat(rollout) == 403
    assert [call["status"] for call in proxy.calls("closed")] == ["ok"]
    assert proxy.client.close("closed") == closed  # closing again changes nothing


# --- request heads ------------------------------------------------------------------------------
def send_until_refused(conn: socket.socket, head: bytes, total: int) -> None:
    """Sends `head`, then header bytes up to `total`, stopping when the proxy hangs up."""
    chunk = b"a" * (1 << 20)
    try:
        conn.sendall(head)
        for _ in range(total // len(chunk)):
            conn.sendall(chunk)
        conn.sendall(b"\r\n\r\n")
    except OSError:
        pass


def test_an_oversized_header_is_refused_without_being_buffered(proxy, tmp_path, model):
    before = peak_rss_mb(proxy)
    conn = connect(proxy)
    with conn:
        sender = threading.Thread(target=send_until_refused, args=(conn, HEALTH + b"x-big: ", 100 << 20))
        sender.start()
        status, body = answer(conn)
        sender.join(30)
    assert status == 431 and "larger than 65536 bytes" in json.loads(body)["error"]["message"]
    assert peak_rss_mb(proxy) - before < 20
    conn = connect(proxy)  # control: a large header within the limit is read
    with conn:
        conn.sendall(HEALTH + b"x-big: " + b"a" * 60000 + b"\r\n\r\n")
        assert answer(conn)[0] == 200
    # control: without the limit the same kind of header is buffered whole (here 20 MiB) and answered
    with serve_proxy(model.url, str(tmp_path / "store"), ADMIN,
                     extra=["--model-name", "fake", "--max-head-bytes", "0"]) as unlimited:
        before = peak_rss_mb(unlimited)
        conn = connect(unlimited)
        with conn:
            send_until_refused(conn, HEALTH + b"x-big: ", 20 << 20)
            assert answer(conn)[0] == 200
        assert peak_rss_mb(unlimited) - before > 20


def test_too_many_headers_are_refused(proxy):
    conn = connect(proxy)
    with conn:
        conn.sendall(HEALTH + b"".join(b"x-h%d: v\r\n" % i for i in range(200)) + b"\r\n")
        status, body = answer(conn)
        assert status == 431 and "201 headers; at most 128" in json.loads(body)["error"]["message"]
        assert closed_by_proxy(conn, wait_s=5)
    conn = connect(proxy)  # control: 100 headers are read
    with conn:
        conn.sendall(HEALTH + b"".join(b"x-h%d: v\r\n" % i for i in range(100)) + b"\r\n")
        assert answer(conn)[0] == 200


# --- slow requests and idle connections ---------------------------------------------------------
@pytest.mark.parametrize("part", ["head", "body"])
def test_a_request_that_does_not_arrive_in_time_gets_408(proxy, part):
    conn = connect(proxy)
    with conn:
        if part == "head":
            conn.sendall(b"POST /rollouts HTTP/1.1\r\nhost: proxy\r\n")
        else:
            conn.sendall(b"POST /rollouts HTTP/1.1\r\nhost: proxy\r\ncontent-length: 100\r\n\r\n{\"rollout")
        started = time.monotonic()
        status, body = answer(conn)
        assert status == 408 and f"request {part} did not arrive within 1 s" in json.loads(body)["error"]["message"]
        assert 0.9 < time.monotonic() - started < 5
    conn = connect(proxy)  # control: a request that trickles in within the timeout is answered
    with conn:
        for piece in (b"GET /hea", b"lth HTTP/1.1\r\n", b"host: proxy\r\n", b"\r\n"):
            conn.sendall(piece)
            time.sleep(0.1)
        assert answer(conn)[0] == 200


def test_a_connection_that_sends_nothing_is_closed_silently(proxy):
    conn = connect(proxy)
    with conn:
        assert not closed_by_proxy(conn, wait_s=0.5)  # control: open while within --head-timeout (1 s)
        conn.settimeout(5)
        assert conn.recv(1 << 16) == b""  # then closed, with no answer: it asked nothing


def test_an_answer_may_take_longer_than_every_timeout(tmp_path):
    """The timeouts are for reading requests: a model that takes 1.5 s is waited for, under 1 s timeouts,
    on a new connection and on a kept-alive one."""
    timeouts = ["--head-timeout", "1", "--body-timeout", "1", "--keep-alive-timeout", "1"]
    with FakeModel(delay_s=1.5) as slow, \
            serve_proxy(slow.url, str(tmp_path / "store"), ADMIN, extra=["--model-name", "fake", *timeouts]) as proxy:
        rollout = proxy.register("slow")
        body = json.dumps(CHAT).encode()
        request = (b"POST /rollouts/slow/v1/chat/completions HTTP/1.1\r\nhost: proxy\r\n"
                   b"content-type: application/json\r\nauthorization: Bearer %s\r\ncontent-length: %d\r\n\r\n%s"
                   % (rollout["api_key"].encode(), len(body), body))
        conn = connect(proxy)
        with conn:
            for _ in range(2):
                conn.sendall(request)
                assert answer(conn)[0] == 200
            assert closed_by_proxy(conn, wait_s=5)  # then idle: closed after the keep-alive timeout


# --- connection caps ----------------------------------------------------------------------------
def test_a_client_over_its_connection_cap_sheds_an_idle_one_or_gets_503(model, tmp_path):
    with serve_proxy(model.url, str(tmp_path / "store"), ADMIN,
                     extra=["--model-name", "fake", "--max-connections-per-client", "3"]) as proxy:
        idle = [connect(proxy) for _ in range(3)]
        time.sleep(0.2)
        conn = connect(proxy)  # the oldest idle one makes room
        conn.sendall(HEALTH + b"\r\n")
        assert answer(conn)[0] == 200
        assert closed_by_proxy(idle[0], wait_s=5) and not any(closed_by_proxy(c) for c in idle[1:])
        busy = idle[1:] + [conn]
        for c in busy:  # now none is idle: all three are sending a head
            c.sendall(b"GET /health HTTP/1.1\r\n")
        time.sleep(0.5)
        refused = connect(proxy)
        status, body = answer(refused)
        message = json.loads(body)["error"]["message"]
        assert status == 503 and "too many connections from 127.0.0.1 (at most 3)" in message
        for c in busy:  # control: the three are still served
            c.sendall(b"host: proxy\r\n\r\n")
            assert answer(c)[0] == 200
        for c in idle + [conn, refused]:
            c.close()
        assert '"kind":"client_connections"' in proxy.log_tail(50)


class TableEntry:
    """A connection as the table sees it. A stand-in, so that the table's counts can be checked one
    admission at a time (the real connections are shown through the proxy in the tests around)."""

    def __init__(self, host: str):
        self.host, self.client, self.was_shed = host, None, False

    def check_timeout(self, now: float) -> None:
        pass

    def shed(self) -> None:
        self.was_shed = True


def test_the_connection_table_counts_what_it_sheds_and_refuses():
    loop = asyncio.new_event_loop()
    table = Connections(ProxyConfig(upstream="", store="", admin_key="", max_connections=2,
                                    max_connections_per_client=1), open_files=256)
    a1, a2, b, c = (TableEntry(host) for host in "aabc")
    assert table.admit(a1, loop) is None and table.admit(a2, loop) is None
    assert a1.was_shed and table.open == 1 and table.clients["a"].open == 1  # a's only idle one made room
    table.reading(a2)  # none idle from here on
    assert table.admit(b, loop) is None
    table.reading(b)
    assert "too many open connections (at most 2)" in table.admit(c, loop)
    assert table.open == 2 and set(table.clients) == {"a", "b"}
    for entry in (a1, a2, b):  # a1 was counted out when shed: releasing it again changes nothing
        table.release(entry)
    assert table.open == 0 and table.clients == {} and table.waiting == {}
    assert table.admit(c, loop) is None  # control: with room, the refused client is admitted
    loop.close()


def test_256_concurrent_calls_from_one_address_fit_the_default_limits(tmp_path):
    """Local mode: every rollout's harness connects from 127.0.0.1; the defaults must not refuse 256 of
    them calling at once (each call takes 1 s upstream, so all are open together)."""
    async def call(rollout: dict) -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        body = json.dumps(CHAT).encode()
        writer.write(b"POST /rollouts/%s/v1/chat/completions HTTP/1.1\r\nhost: proxy\r\nauthorization: Bearer %s\r\n"
                     b"content-length: %d\r\n\r\n%s" % (rollout["rollout_id"].encode(), rollout["api_key"].encode(),
                                                        len(body), body))
        status = int((await reader.readline()).split()[1])
        writer.close()
        return status

    async def all_at_once(rollouts: list[dict]) -> list[int]:
        return await asyncio.gather(*(call(rollout) for rollout in rollouts))

    with FakeModel(delay_s=1.0) as slow, serve_proxy(slow.url, str(tmp_path / "store"), ADMIN,
                                                     extra=["--model-name", "fake"]) as proxy:
        rollouts = [proxy.register(f"r-{i}") for i in range(256)]
        assert asyncio.run(all_at_once(rollouts)) == [200] * 256


def trickle(conns: list[socket.socket], stop: threading.Event) -> None:
    """Slowloris: one more header byte on every connection every 0.2 s, so none is ever idle."""
    while not stop.wait(0.2):
        for conn in conns:
            try:
                conn.send(b"x")
            except OSError:
                pass


def calls_answered(proxy: ProxyProcess, rollout: dict, deadline_s: float) -> bool:
    """Whether 4 model calls, each retried on a refusal until `deadline_s`, all get their answer."""
    deadline = time.monotonic() + deadline_s
    for _ in range(4):
        while True:
            try:
                if chat(rollout, timeout=max(0.5, deadline - time.monotonic())) == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
    return True


@pytest.mark.parametrize("clients", ["idle", "slowloris", "unlimited"])
def test_real_calls_are_answered_at_the_open_file_limit(model, tmp_path, clients):
    """The proxy may open 256 files; a sandbox opens 300 connections that never finish a request. Idle
    ones are shed to make room for real calls; slow ones are cut off by the head timeout (calls in
    between get a 503 and retry). Control ("unlimited"): without the limits the idle connections take
    every file and the calls fail."""
    extra = ["--model-name", "fake"] + (["--head-timeout", "2"] if clients == "slowloris" else [])
    if clients == "unlimited":
        extra += ["--max-connections", "0", "--head-timeout", "0", "--keep-alive-timeout", "0"]
    proxy = start_proxy(model.url, str(tmp_path / "store"), ADMIN, extra=extra, open_files=256,
                        log_path=tmp_path / "proxy.log")
    conns, stop = [], threading.Event()
    try:
        rollout = proxy.register("real")
        for _ in range(300):
            conn = socket.socket()
            conn.settimeout(5)
            conn.connect(("127.0.0.1", proxy.port))
            if clients == "slowloris":
                conn.send(b"POST /rollouts/real/v1/chat/completions HTTP/1.1\r\nx-slow: ")
            conns.append(conn)
        if clients == "slowloris":
            threading.Thread(target=trickle, args=(conns, stop), daemon=True).start()
        time.sleep(0.5)
        answered = calls_answered(proxy, rollout, deadline_s=8 if clients == "slowloris" else 5)
        if clients == "unlimited":
            assert not answered
        else:
            assert answered, proxy.log_tail()
            assert sum(closed_by_proxy(conn, wait_s=0.01) for conn in conns) >= 300 - 96
            assert proxy.process.poll() is None and "Traceback" not in proxy.log_tail(200)
    finally:
        stop.set()
        for conn in conns:
            conn.close()
        stop_proxy(proxy)
