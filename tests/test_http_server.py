"""The proxy's own HTTP/1.1 server (steps/proxy/http_server.py), spoken to byte by byte.

Raw sockets, so that each test controls exactly what goes on the wire: keep-alive, pipelining,
`Connection: close`, HTTP/1.0, chunked bodies, `Expect: 100-continue`, bodies over the limit and bytes
that are not HTTP. The proxy's upstream is a port nobody listens on: these answers need no model.
Graceful shutdown runs against the real vLLM, with both HTTP servers the proxy offers.
"""

import json
import signal
import socket
import threading
import time
import urllib.request

import httpx
import pytest

from held_relay import HeldRelay
from proxy_process import serve_proxy, start_proxy
from steps.net import free_port

ADMIN = "test-admin-key"
CHAT = json.dumps({"model": "tiny", "messages": [{"role": "robot", "content": "hi"}]}).encode()  # 400 messages.0.role


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    with serve_proxy(f"http://127.0.0.1:{free_port()}", str(tmp_path_factory.mktemp("store")), ADMIN,
                     extra=["--model-name", "tiny", "--max-body-bytes", "20000"]) as proxy:
        yield proxy


@pytest.fixture
def rollout(proxy, request):
    return proxy.register(request.node.name.replace("[", "-").replace("]", ""))


def call(rollout: dict, body: bytes, key: str | None = None, extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    """A chat call's bytes, with a content-length unless `extra` sets its own framing."""
    head = (b"POST /rollouts/%s/v1/chat/completions HTTP/%s\r\nhost: proxy\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer %s\r\n" % (rollout["rollout_id"].encode(), version, (key or rollout["api_key"]).encode()))
    if b"transfer-encoding" not in extra:
        head += b"content-length: %d\r\n" % len(body)
    return head + extra + b"\r\n" + body


def read_answer(stream) -> tuple[int, dict[str, str], bytes]:
    """One answer off the connection: status, headers (lower-case names), body (by content-length)."""
    status_line = stream.readline()
    assert status_line.startswith(b"HTTP/1.1 "), status_line
    headers = {}
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, stream.read(int(headers.get("content-length", 0)))


def connect(proxy):
    conn = socket.create_connection(("127.0.0.1", proxy.port), timeout=30)
    return conn, conn.makefile("rb")


def test_one_connection_carries_pipelined_requests_answered_in_order(proxy, rollout):
    conn, stream = connect(proxy)
    with conn:
        conn.sendall(call(rollout, CHAT, key="wrong") + b"GET /health HTTP/1.1\r\nhost: proxy\r\n\r\n" + call(rollout, CHAT))
        status, headers, body = read_answer(stream)
        assert status == 401 and "connection" not in headers and "rollout" in json.loads(body)["error"]["message"]
        status, _, body = read_answer(stream)
        assert status == 200 and json.loads(body)["status"] == "ok"  # an admin route, served by the ASGI app
        status, _, body = read_answer(stream)
        assert status == 400 and json.loads(body)["error"]["param"] == "messages.0.role"
        conn.sendall(call(rollout, CHAT))  # still open: keep-alive
        assert read_answer(stream)[0] == 400


@pytest.mark.parametrize("how", ["connection-close", "http-1.0"])
def test_a_last_request_is_answered_then_the_connection_closes(proxy, rollout, how):
    conn, stream = connect(proxy)
    with conn:
        request = call(rollout, CHAT, extra=b"connection: close\r\n") if how == "connection-close" else \
            call(rollout, CHAT, version=b"1.0")
        conn.sendall(request + call(rollout, CHAT))  # the second is never answered
        status, headers, body = read_answer(stream)
        assert status == 400 and headers["connection"] == "close" and json.loads(body)["error"]["param"] == "messages.0.role"
        assert stream.read() == b""


def test_a_chunked_body_and_expect_100_continue_are_read(proxy, rollout):
    conn, stream = connect(proxy)
    with conn:
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (CHAT[:10], CHAT[10:])) + b"0\r\n\r\n"
        conn.sendall(call(rollout, chunks, extra=b"transfer-encoding: chunked\r\n"))
        status, _, body = read_answer(stream)
        assert status == 400 and json.loads(body)["error"]["param"] == "messages.0.role"  # the body was put together
        head, _, body = call(rollout, CHAT, extra=b"expect: 100-continue\r\n").partition(b"\r\n\r\n")
        conn.sendall(head + b"\r\n\r\n")
        assert read_answer(stream)[0] == 100  # only then does the client send its body
        conn.sendall(body)
        assert read_answer(stream)[0] == 400


@pytest.mark.parametrize("framing", ["declared", "chunked"])
def test_a_body_over_the_limit_is_413_in_the_dialects_shape_and_closes(proxy, rollout, framing):
    big = b'{"model": "tiny", "messages": "' + b"x" * 30000 + b'"}'
    conn, stream = connect(proxy)
    with conn:
        if framing == "declared":
            conn.sendall(call(rollout, big))
        else:
            conn.sendall(call(rollout, b"%x\r\n%s\r\n0\r\n\r\n" % (len(big), big), extra=b"transfer-encoding: chunked\r\n"))
        status, headers, body = read_answer(stream)
        error = json.loads(body)["error"]
        assert status == 413 and headers["connection"] == "close" and "20000 bytes" in error["message"]
        assert (f"{len(big)} bytes" in error["message"]) == (framing == "declared")  # its size, when declared
        assert stream.read() == b""
    assert proxy.calls(rollout["rollout_id"]) == []


def test_bytes_that_are_not_http_get_400_and_the_connection_closes(proxy):
    conn, stream = connect(proxy)
    with conn:
        conn.sendall(b"GET /health HTTP/1.1\r\nhost: proxy\r\n\r\nnot http at all\r\n\r\n")
        assert read_answer(stream)[0] == 200  # what came before is still answered
        status, headers, body = read_answer(stream)
        assert status == 400 and headers["connection"] == "close" and "invalid HTTP" in json.loads(body)["error"]["message"]
        assert stream.read() == b""
    assert "Traceback" not in proxy.log_tail()


def health(proxy) -> dict:
    with urllib.request.urlopen(f"{proxy.url}/health", timeout=10) as answer:
        return json.loads(answer.read())


@pytest.mark.parametrize("server", ["openforge", "uvicorn"])
def test_shutdown_lets_the_call_in_flight_finish(vllm_server, tmp_path, server):
    """SIGTERM while vLLM is generating: the harness still gets its answer, the call is stored, the
    proxy exits cleanly. `--http-server uvicorn` is the fallback to uvicorn's own protocol.

    vLLM's answer is held in a relay until the signal has been sent, so the call is in flight when it
    arrives however fast the tiny model generates (a 400-token answer once finished before the test saw it)."""
    with HeldRelay(vllm_server) as relay:
        proxy = start_proxy(relay.url, str(tmp_path / "store"), ADMIN, extra=["--http-server", server])
        try:
            rollout = proxy.register("inflight")
            body = {"model": "tiny", "max_tokens": 400, "ignore_eos": True,
                    "messages": [{"role": "user", "content": "hi"}]}
            answers = []
            relay.hold()
            client = threading.Thread(target=lambda: answers.append(httpx.post(
                f"{rollout['openai_base_url']}/chat/completions", json=body,
                headers={"authorization": f"Bearer {rollout['api_key']}"}, timeout=120)))
            client.start()
            deadline = time.monotonic() + 30  # urllib, not httpx.get: a new httpx client builds an SSL context
            while health(proxy)["in_flight"] == 0:
                assert time.monotonic() < deadline, "the call never reached the proxy"
                time.sleep(0.01)
            stopped_at = time.time()
            proxy.process.send_signal(signal.SIGTERM)
            time.sleep(0.5)  # the proxy is stopping while vLLM's answer is still on its way
            relay.release()
            client.join(120)
            assert proxy.process.wait(60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it is done
            assert "Traceback" not in proxy.log_tail()
        finally:
            relay.release()
            if proxy.process.poll() is None:
                proxy.process.kill()
    (answer,) = answers
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 400
    restarted = start_proxy(vllm_server, str(tmp_path / "store"), ADMIN)
    try:
        (stored,) = restarted.calls("inflight")
    finally:
        restarted.process.send_signal(signal.SIGTERM)
        restarted.process.wait(30)
    assert stored["status"] == "ok" and stored["timings"]["responded_at"] > stopped_at  # it was in flight


def test_a_url_that_does_not_parse_gets_400_and_the_connection_closes(proxy):
    conn, stream = connect(proxy)
    with conn:
        conn.sendall(b"GET http://[bad HTTP/1.1\r\nhost: proxy\r\n\r\n")
        status, headers, body = read_answer(stream)
        assert status == 400 and headers["connection"] == "close" and "invalid HTTP" in json.loads(body)["error"]["message"]
        assert stream.read() == b""
    assert "Traceback" not in proxy.log_tail()
