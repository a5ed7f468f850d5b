"""HttpPool against real servers on 127.0.0.1, under both the default asyncio loop and uvloop.

Well-behaved answers come from a bare ASGI app under uvicorn (what vLLM runs on); misbehaving
servers (stale keep-alive, stalls, drops, broken HTTP) are raw asyncio servers in the test's loop.
"""

import asyncio
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, Self

import pytest
import uvicorn
import uvloop

from steps.net import HOST, free_port
from steps.proxy.http_pool import HttpPool, NotSent, UpstreamFailed, UpstreamTimeout

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


class AsgiServer:
    """uvicorn in a thread serving a bare ASGI app; records client ports and seen disconnects."""

    def __init__(self) -> None:
        self.ports: list[int] = []
        self.hanging: set[str] = set()
        self.disconnects: set[str] = set()
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"

    async def app(self, scope: dict, receive: Callable, send: Callable) -> None:
        """Routes: /echo, /slow-echo, /chunked (echo in 3 chunks), /port, /close, /hang."""
        self.ports.append(scope["client"][1])
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        path, headers = scope["path"], []
        if path == "/slow-echo":
            await asyncio.sleep(0.05)
        elif path == "/port":
            body = str(scope["client"][1]).encode()
        elif path == "/close":
            headers = [(b"connection", b"close")]
        elif path == "/hang":
            self.hanging.add(scope["query_string"].decode())
            await receive()  # returns only with http.disconnect
            self.disconnects.add(scope["query_string"].decode())
            return
        if path == "/chunked":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            third = len(body) // 3
            for part in (body[:third], body[third:2 * third]):
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": body[2 * third:]})
            return
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": 201, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def asgi() -> Iterator[AsgiServer]:
    """One uvicorn server for the module, stopped at its end."""
    app = AsgiServer()
    server = uvicorn.Server(uvicorn.Config(app.app, host=HOST, port=app.port, lifespan="off", log_level="warning",
                                           interface="asgi3"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    yield app
    server.should_exit = True
    thread.join(5)


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine], Any]:
    """Runs a coroutine to completion on a fresh loop of each kind."""
    return asyncio.run if request.param == "asyncio" else uvloop.run


class RawServer:
    """An asyncio server in the test's own loop; `handle(server, reader, writer)` serves each connection."""

    def __init__(self, handle: Callable[["RawServer", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]):
        self.handle = handle
        self.connections = 0
        self.disconnects = 0
        self.heads: list[bytes] = []

    async def __aenter__(self) -> Self:
        self.server = await asyncio.start_server(self._serve, HOST, 0)
        self.url = f"http://{HOST}:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handle(self, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self.disconnects += 1

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        """Reads one request head (and its body, by content-length) and records the head."""
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        for line in head.lower().split(b"\r\n"):
            if line.startswith(b"content-length:"):
                await reader.readexactly(int(line.split(b":")[1]))
        return head


async def eventually(check: Callable[[], bool], within_s: float = 2.0) -> None:
    """Waits until `check()` holds, failing after `within_s`."""
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.01)


def test_content_length_chunked_and_megabyte_bodies(run, asgi: AsgiServer) -> None:
    async def go() -> None:
        pool = HttpPool(asgi.url)
        big = os.urandom(1 << 20)
        assert await pool.request("POST", "/echo", b"hello", timeout_s=5) == (201, b"hello")
        assert await pool.request("POST", "/chunked", b"abcdefghij", timeout_s=5) == (200, b"abcdefghij")
        assert await pool.request("POST", "/echo", big, timeout_s=5) == (201, big)
        assert await pool.request("POST", "/chunked", big, timeout_s=5) == (200, big)
        assert await pool.request("POST", "/echo", timeout_s=5) == (201, b"")
        assert await pool.request("GET", "/echo", timeout_s=5) == (201, b"")
        await pool.close()
    run(go())


def test_sequential_requests_reuse_one_connection(run, asgi: AsgiServer) -> None:
    async def go() -> None:
        pool = HttpPool(asgi.url)
        ports = {(await pool.request("GET", "/port", timeout_s=5))[1] for _ in range(10)}
        await pool.close()
        assert len(ports) == 1
    run(go())


def test_connection_close_response_is_not_reused(run, asgi: AsgiServer) -> None:
    async def go() -> None:
        pool = HttpPool(asgi.url)
        before = len(asgi.ports)
        for _ in range(3):
            assert await pool.request("GET", "/close", timeout_s=5) == (201, b"")
        await pool.close()
        assert len(set(asgi.ports[before:])) == 3
    run(go())


def test_64_concurrent_requests_then_all_connections_reused(run, asgi: AsgiServer) -> None:
    async def go() -> None:
        pool = HttpPool(asgi.url)
        before = len(asgi.ports)
        for _ in range(2):
            bodies = [os.urandom(100 + i) for i in range(64)]
            answers = await asyncio.gather(*(pool.request("POST", "/slow-echo", b, timeout_s=5) for b in bodies))
            assert answers == [(201, b) for b in bodies]
        await pool.close()
        assert len(set(asgi.ports[before:])) == 64
    run(go())


def test_request_head(run) -> None:
    async def serve(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await server.read_request(reader)
            writer.write(OK)

    async def go() -> None:
        async with RawServer(serve) as server:
            pool = HttpPool(server.url)
            await pool.request("POST", "/a", timeout_s=5)
            await pool.request("POST", "/b", b"{}", headers={"content-type": "application/json", "x-id": "7"},
                               timeout_s=5)
            await pool.request("GET", "/c?d=1", timeout_s=5)
            await pool.close()
        host = server.url.removeprefix("http://")
        assert server.heads == [
            f"POST /a HTTP/1.1\r\nhost: {host}\r\ncontent-length: 0\r\n\r\n".encode(),
            f"POST /b HTTP/1.1\r\nhost: {host}\r\ncontent-length: 2\r\ncontent-type: application/json\r\n"
            "x-id: 7\r\n\r\n".encode(),
            f"GET /c?d=1 HTTP/1.1\r\nhost: {host}\r\n\r\n".encode(),
        ]
    run(go())


@pytest.mark.parametrize("answer, body, reused", [
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", b"abcde", True),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", b"ok", True),
    (b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok", b"ok", False),
    (b"HTTP/1.1 200 OK\r\n\r\nuntil the end", b"until the end", False),
])
def test_raw_answers_and_keep_alive(run, answer: bytes, body: bytes, reused: bool) -> None:
    async def serve(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await server.read_request(reader)
            writer.write(answer)
            if b"until" in answer:
                return  # the body ends with the connection

    async def go() -> None:
        async with RawServer(serve) as server:
            pool = HttpPool(server.url)
            for _ in range(2):
                assert await pool.request("GET", "/", timeout_s=5) == (200, body)
            await pool.close()
        assert server.connections == (1 if reused else 2)
    run(go())


def test_idle_connection_closed_by_server_is_never_handed_out(run) -> None:
    async def serve(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(OK)

    async def go() -> None:
        async with RawServer(serve) as server:
            pool = HttpPool(server.url)
            assert await pool.request("GET", "/", timeout_s=5) == (200, b"ok")
            await eventually(lambda: not pool._idle)
            assert await pool.request("GET", "/", timeout_s=5) == (200, b"ok")
            await pool.close()
        assert server.connections == 2
    run(go())


def test_stale_connection_closed_as_we_send_is_retried_once(run) -> None:
    async def serve(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(OK)
        await server.read_request(reader)  # then hang up without answering, like a keep-alive timeout race

    async def go() -> None:
        async with RawServer(serve) as server:
            pool = HttpPool(server.url)
            for _ in range(3):
                assert await pool.request("GET", "/", timeout_s=5) == (200, b"ok")
            await pool.close()
        assert server.connections == 3
    run(go())


def test_a_server_gone_while_a_reused_connection_carried_the_request_is_failed_not_unsent(run) -> None:
    """A vLLM killed mid-generation: the request was sent, so it is no `NotSent` (which would let it go elsewhere)."""
    async def serve(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(OK)
        await server.read_request(reader)
        server.server.close()  # the server goes away with the second request unanswered: no new connection

    async def go() -> None:
        async with RawServer(serve) as server:
            pool = HttpPool(server.url)
            assert await pool.request("GET", "/", timeout_s=5) == (200, b"ok")
            with pytest.raises(UpstreamFailed, match="without answering, and cannot connect"):
                await pool.request("GET", "/", timeout_s=5)
            await pool.close()
    run(go())


def test_new_connection_closed_without_answer_fails(run) -> None:
    async def go() -> None:
        async with RawServer(server_hangs_up) as server:
            pool = HttpPool(server.url)
            with pytest.raises(UpstreamFailed, match="without answering"):
                await pool.request("GET", "/", timeout_s=5)
            await pool.close()
        assert server.connections == 1

    async def server_hangs_up(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
    run(go())


def test_connect_refused_is_not_sent(run) -> None:
    async def go() -> None:
        pool = HttpPool(f"http://{HOST}:{free_port()}")
        with pytest.raises(NotSent, match="cannot connect"):
            await pool.request("GET", "/", timeout_s=5)
        await pool.close()
    run(go())


def test_connect_that_hangs_times_out_or_is_cancelled(run) -> None:
    async def go() -> None:
        with socket.socket() as listener:
            listener.bind((HOST, 0))
            listener.listen(0)
            port = listener.getsockname()[1]
            fillers = [socket.socket() for _ in range(4)]
            for filler in fillers:  # a full accept queue: Linux drops further SYNs, so connect hangs
                filler.setblocking(False)
                filler.connect_ex((HOST, port))
            pool = HttpPool(f"http://{HOST}:{port}")
            with pytest.raises(UpstreamTimeout, match="could not connect"):
                await pool.request("GET", "/", timeout_s=0.2)
            task = asyncio.create_task(pool.request("GET", "/", timeout_s=5))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await pool.close()
            for filler in fillers:
                filler.close()
    run(go())


def test_stalled_server_times_out_and_sees_the_disconnect(run) -> None:
    async def serve(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\npart")
        await reader.read()  # returns at the client's hang-up

    async def go() -> None:
        async with RawServer(serve) as server:
            pool = HttpPool(server.url)
            start = time.monotonic()
            with pytest.raises(UpstreamTimeout, match="within 0.2 s"):
                await pool.request("GET", "/", timeout_s=0.2)
            # The timeout ended the wait, not the server: well before the 10 bytes could come (they never do).
            # uvloop's timers tick in whole milliseconds and may fire up to one early; a loaded machine fires late.
            assert 0.19 <= time.monotonic() - start < 5.0
            await eventually(lambda: server.disconnects == 1)
            assert not pool._idle and not pool._live
            await pool.close()
    run(go())


@pytest.mark.parametrize("answer, error", [
    (b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly ten b", "mid-response"),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nabc", "mid-response"),
    (b"HTTP/1.1 200 OK\r\ncontent-len", "mid-response"),
    (b"SPDY/3 200 OK\r\n\r\n", "broken HTTP"),
    (b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nok", "broken HTTP"),
])
def test_broken_answers_fail(run, answer: bytes, error: str) -> None:
    async def serve(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(answer)
        await writer.drain()

    async def go() -> None:
        async with RawServer(serve) as server:
            pool = HttpPool(server.url)
            with pytest.raises(UpstreamFailed, match=error):
                await pool.request("GET", "/", timeout_s=5)
            await eventually(lambda: not pool._live)
            await pool.close()
    run(go())


def test_cancelled_request_closes_its_connection(run, asgi: AsgiServer) -> None:
    async def go() -> None:
        pool = HttpPool(asgi.url)
        key = f"cancel-{id(pool)}"
        task = asyncio.create_task(pool.request("POST", f"/hang?{key}", b"work", timeout_s=5))
        await eventually(lambda: key in asgi.hanging)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await eventually(lambda: key in asgi.disconnects)
        assert await pool.request("GET", "/port", timeout_s=5)
        await pool.close()
    run(go())


def test_close_is_idempotent_and_ends_requests_in_flight(run, asgi: AsgiServer) -> None:
    async def go() -> None:
        pool = HttpPool(asgi.url)
        await pool.request("GET", "/port", timeout_s=5)
        key = f"close-{id(pool)}"
        task = asyncio.create_task(pool.request("POST", f"/hang?{key}", b"work", timeout_s=5))
        await eventually(lambda: key in asgi.hanging)
        await pool.close()
        await pool.close()
        with pytest.raises(RuntimeError, match="closed"):
            await task
        with pytest.raises(RuntimeError, match="closed"):
            await pool.request("GET", "/port", timeout_s=5)
        assert not pool._live
        await eventually(lambda: key in asgi.disconnects)
    run(go())


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:1", "http://127.0.0.1:1/v1", "127.0.0.1:1", "http://:1",
                                 "http://user@127.0.0.1:1", "http://127.0.0.1:port"])
def test_only_bare_http_origins_are_accepted(url: str) -> None:
    with pytest.raises(ValueError, match="bare origin"):
        HttpPool(url)
    assert HttpPool("https://127.0.0.1:1").url == "https://127.0.0.1:1"  # control: an https origin is one


@pytest.mark.parametrize("method, path, headers", [
    ("GET", "/a b", None), ("GET", "a", None), ("GET", "/\r\nx: y", None), ("HEAD", "/", None),
    ("GET", "/", {"x": "1\r\nx-injected: 1"}), ("GET", "/", {"bad name": "1"}), ("POST", "/", {"Content-Length": "5"}),
])
def test_malformed_requests_are_refused_before_sending(method: str, path: str, headers: dict | None) -> None:
    async def go() -> None:
        with pytest.raises(ValueError):
            await HttpPool(f"http://{HOST}:1").request(method, path, headers=headers, timeout_s=1)
    asyncio.run(go())
