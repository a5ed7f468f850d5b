"""The proxy's HTTP/1.1 server: model calls go from the socket straight to `ModelCalls.answer`; every
other request goes to the ASGI app.

uvicorn runs it (`uvicorn.run(app, http=ProxyProtocol)`) and keeps what it does well: binding, the
lifespan, signals and graceful shutdown. Only the per-request work is replaced: uvicorn's protocol
builds a scope, an event, an ASGI task and message dicts per request and checks headers on every
send. Answering a 40 KB request with a 58 KB stream cost it ~0.2 ms of CPU against ~0.06 for a bare
asyncio + httptools protocol; in the proxy this one saves ~0.06 ms a call (benchmarks/proxy_overhead.py,
`--proxy-arg=--http-server=uvicorn` for the other). A connection answers its requests one at a time
and in order (pipelined requests wait, with reading paused); a request's body is read whole before it
is served, up to `--max-body-bytes`. Answers carry a content-length, SSE streams too, since the proxy
sends a stream only once it is complete.

Limits (docs/proxy.md, "Limits"; the table and sweep are in `connections.py`): a request head past
`--max-head-bytes` or with more than `--max-headers` headers gets a 431 and is not parsed further; a head
or body that does not arrive within `--head-timeout` / `--body-timeout` gets a 408; a new connection that
sends nothing is closed after `--head-timeout`, an idle keep-alive one after `--keep-alive-timeout`; past
`--max-connections` or `--max-connections-per-client` an idle connection is closed to make room, or the new
one gets a 503. Each refusal closes the connection.
"""

import asyncio
import functools
import http
import logging
import sys
from collections import deque
from urllib.parse import unquote

import httptools
import orjson

from steps.proxy.config import ProxyConfig
from steps.proxy.connections import Client, Connections
from steps.proxy.errors import ProxyError, openai_error_body
from steps.proxy.serving import ClientGone, json_answer, read_headers, too_large

log = logging.getLogger("openforge.proxy.http")

_STATUS = {status: f"HTTP/1.1 {status} {phrase}\r\n".encode() for status, phrase in
           ((s.value, s.phrase) for s in http.HTTPStatus)}
_NO_BODY_STATUS = {204, 304}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_FRAMING = (b"content-length", b"transfer-encoding", b"connection")


def protocol_factory(config: ProxyConfig, open_files: int):
    """What uvicorn's `http=` takes: ProxyProtocol with the process's one connection table."""
    return functools.partial(ProxyProtocol, connections=Connections(config, open_files))


class _Refused(Exception):
    """A request past a limit of the head: (status, reason, kind)."""


class _Request:
    """One parsed request; its body is read whole before it is served."""

    __slots__ = ("chunks", "declared", "expects_continue", "headers", "http_version", "keep_alive", "method",
                 "path", "query", "raw_path", "size", "too_large", "url")

    def __init__(self):
        self.url, self.headers, self.chunks, self.size = b"", [], [], 0
        self.method: str | None = None  # set once the head is complete
        self.declared: bytes | None = None
        self.too_large = self.expects_continue = False

    def body(self) -> bytes:
        return self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)


class ProxyProtocol(asyncio.Protocol):
    """One client connection. uvicorn makes one per connection, as it does its own protocols."""

    def __init__(self, config, server_state, app_state: dict, _loop=None, *, connections: Connections):
        if not config.loaded:
            config.load()
        self.calls = config.app  # steps.proxy.app.ModelCalls: the fast path's `route` and `answer`
        self.asgi = config.loaded_app
        self.server_state, self.app_state = server_state, app_state
        self.connections = connections
        self.limit = self.calls.app.state.config.max_body_bytes
        self.max_head = connections.max_head_bytes or None
        self.max_headers = connections.max_headers or sys.maxsize
        self.loop = _loop or asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)  # data after `Connection: close`
        self.transport: asyncio.Transport | None = None
        self.request: _Request | None = None  # being parsed
        self.waiting: deque[_Request] = deque()  # parsed, behind the one being answered
        self.task: asyncio.Task | None = None  # answering a request
        self.guarding = False  # the task awaits its upstream call: a hang-up cancels it
        self.lost: asyncio.Future | None = None  # set when the client is gone (for the ASGI app)
        self.gone = False  # the client hung up
        self.closing = False  # no further request is taken (`Connection: close`, a refused request, ...)
        self.shutting_down = False  # the answer in progress is the last
        self.refusal: tuple[int, str] | None = None  # (status, reason) the client's last bytes were refused with
        self.writing_paused = False
        self.host = ""  # the client's address
        self.client: Client | None = None  # its entry in the connection table, while counted
        self.head_left = self.max_head  # bytes the next or current head may still take; None while a body is read
        self.first = True  # no answer sent yet: it waits for its first head, not as an idle keep-alive connection
        self.since = self.loop.time()  # when the connection's current wait (idle, head, body, closing) began

    # --- the connection -------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.server_state.connections.add(self)
        peer = transport.get_extra_info("peername")
        self.host = peer[0] if isinstance(peer, tuple) else ""
        refusal = self.connections.admit(self, self.loop)
        if refusal is not None:  # a 503 before any request; clients read it as the answer to theirs
            self.refusal, self.closing = (503, refusal), True
            self._write(*json_answer(503, orjson.dumps(openai_error_body(ProxyError(503, refusal)))), last=True)
            transport.close()

    def connection_lost(self, exc) -> None:
        self.gone = self.closing = True
        self.server_state.connections.discard(self)
        self.connections.release(self)
        self.waiting.clear()
        if self.lost is not None and not self.lost.done():
            self.lost.set_result(None)
        if self.task is not None and self.guarding:
            self.task.cancel()  # the upstream call is abandoned; `guard` turns this into ClientGone

    def data_received(self, data: bytes) -> None:
        if self.refusal is not None:
            return  # the parser stopped at bytes it refused: nothing after them is read
        try:
            left = self.head_left
            if left is None or len(data) <= left:
                if left is not None:
                    self.head_left = left - len(data)
                self.parser.feed_data(data)
            else:
                self._feed_past(data)
        except _Refused as exc:
            self._refuse(*exc.args)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "upgrades (WebSocket, h2c) are not served", "upgrade")
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _Refused):  # raised in a callback (on_headers_complete)
                self._refuse(*exc.__context__.args)
            else:
                self._refuse(400, f"invalid HTTP request: {exc}", "invalid_http")

    def _feed_past(self, data: bytes) -> None:
        """Feeds bytes that run past what the head being read may still take: up to there, and on only
        if the head ended within them. httptools would otherwise buffer a header of any size."""
        view, at = memoryview(data), 0
        while at < len(view) and self.refusal is None:
            left = self.head_left
            if left is None or len(view) - at <= left:
                if left is not None:
                    self.head_left = left - (len(view) - at)
                self.parser.feed_data(view[at:])
                return
            self.head_left = 0
            self.parser.feed_data(view[at:at + left])
            at += left
            if self.head_left == 0:
                raise _Refused(431, f"the request head is larger than {self.max_head} bytes", "head_too_large")

    def eof_received(self) -> None:
        """The client stopped sending: treat it as gone (the transport then closes)."""

    def pause_writing(self) -> None:
        self.writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._update_reading()

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: close when idle, else after the answer being prepared."""
        self.closing = self.shutting_down = True
        self.waiting.clear()
        if self.task is None:
            self.transport.close()

    # --- parsing (httptools callbacks) ----------------------------------------------------------
    def on_message_begin(self) -> None:
        self.request = _Request()
        if self.task is None:  # not waiting behind an answer: it is being read from now
            self.connections.reading(self)
            if not self.first:  # a new connection's first head is timed from its opening
                self.since = self.loop.time()

    def on_url(self, url: bytes) -> None:
        self.request.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length":
            self.request.declared = value
        elif name == b"expect" and value.lower() == b"100-continue":
            self.request.expects_continue = True
        self.request.headers.append((name, value))

    def on_headers_complete(self) -> None:
        req, parser = self.request, self.parser
        if len(req.headers) > self.max_headers:
            raise _Refused(431, f"the request has {len(req.headers)} headers; at most {self.max_headers} are read",
                           "too_many_headers")
        self.head_left = None
        if self.task is None:
            self.since = self.loop.time()
        req.method = parser.get_method().decode("ascii")
        req.http_version = parser.get_http_version()
        req.keep_alive = parser.should_keep_alive()
        url = httptools.parse_url(req.url)
        req.raw_path, req.query = url.path, url.query or b""
        req.path = req.raw_path.decode("latin-1")
        if "%" in req.path:
            req.path = unquote(req.path)
        if req.declared is not None and req.declared.isdigit() and int(req.declared) > self.limit:
            req.too_large = True
        elif req.expects_continue and self.task is None and not self.waiting:
            self.transport.write(_CONTINUE)  # mid-answer it would corrupt that answer; the client goes on anyway

    def on_body(self, body: bytes) -> None:
        req = self.request
        if req.too_large:
            return
        req.size += len(body)
        if req.size > self.limit:
            req.too_large, req.chunks = True, []
        else:
            req.chunks.append(body)

    def on_message_complete(self) -> None:
        req, self.request, self.head_left = self.request, None, self.max_head
        if self.closing:
            return  # after `Connection: close`, a refused request or shutdown nothing more is answered
        self.closing = not req.keep_alive or req.too_large  # answered, then the connection closes
        if self.task is None:
            self.connections.busy(self)
            self._start(req)
        else:
            self.waiting.append(req)
            self._update_reading()

    # --- answering ------------------------------------------------------------------------------
    def _start(self, req: _Request) -> None:
        call = self.calls.route(req.method, req.path)
        work = self._model_call(req, *call) if call is not None else self._asgi_call(req)
        self.task = self.loop.create_task(work)
        self.server_state.tasks.add(self.task)
        self.task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self.server_state.tasks.discard(task)
        if task.cancelled() or task.exception() is not None:  # cancelled at shutdown, or a bug: never hang
            if not task.cancelled():
                log.error("unexpected error answering a request", exc_info=task.exception())
            self.task = None
            self._close()

    async def _model_call(self, req: _Request, rollout_id: str, dialect) -> None:
        async def read() -> bytes:
            if req.too_large:
                raise too_large(req.declared, self.limit)
            return req.body()

        key = read_headers(req.headers)[0]
        status, headers, body = await self.calls.answer(rollout_id, dialect, key, read, self._guard)
        self._answer(req, status, headers, body)

    async def _guard(self, work):
        """Awaits a call's upstream work; ClientGone if the client hangs up meanwhile."""
        self.guarding = True
        try:
            return await work
        except asyncio.CancelledError:
            if not self.gone:
                raise
            asyncio.current_task().uncancel()
            raise ClientGone() from None
        finally:
            self.guarding = False

    async def _asgi_call(self, req: _Request) -> None:
        """Any other route, through the ASGI app; its answer is collected, then sent whole."""
        if req.too_large:
            err = too_large(req.declared, self.limit)
            return self._answer(req, *json_answer(err.status, orjson.dumps(openai_error_body(err))))
        transport = self.transport
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": req.http_version,
                 "method": req.method, "scheme": "http", "path": req.path, "raw_path": req.raw_path,
                 "query_string": req.query, "root_path": "", "headers": req.headers,
                 "client": _address(transport, "peername"), "server": _address(transport, "sockname"),
                 "state": self.app_state.copy()}
        received, answer, parts = False, {}, []
        self.lost = self.loop.create_future() if not self.gone else None

        async def receive() -> dict:
            nonlocal received
            if not received:
                received = True
                return {"type": "http.request", "body": req.body(), "more_body": False}
            if self.lost is not None:
                await self.lost
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                answer.update(message)
            elif message["type"] == "http.response.body":
                parts.append(message.get("body", b""))

        try:
            await self.asgi(scope, receive, send)
        except Exception as exc:  # the app's handlers log what they answered; the rest is logged here
            if not answer:
                log.error("unexpected error", exc_info=exc, extra={"path": req.path})
        if not answer:
            err = ProxyError(500, "internal proxy error; see the proxy log")
            return self._answer(req, *json_answer(500, orjson.dumps(openai_error_body(err))))
        headers = [(name.lower(), value) for name, value in answer.get("headers", [])]
        self._answer(req, answer["status"], headers, b"".join(parts))

    def _answer(self, req: _Request, status: int, headers: list, body: bytes) -> None:
        """Sends an answer whole, then serves the next waiting request or waits for one."""
        self.task = None
        if self.gone:
            return
        last = not req.keep_alive or req.too_large or self.shutting_down
        self._write(status, headers, body, last, head_only=req.method == "HEAD")
        if last:
            self._close()
        elif self.waiting:
            self._start(self.waiting.popleft())
            self._update_reading()
        elif self.refusal is not None:
            self._send_refusal()
        else:  # waits: idle, or reading the request that arrived meanwhile
            self.first, self.since = False, self.loop.time()
            self.connections.wait(self, idle=self.request is None)

    def _refuse(self, status: int, reason: str, kind: str) -> None:
        """A refused request (bytes that are not HTTP, a head past a limit, a slow request) gets its error
        after any answer due, and the connection closes."""
        self.connections.refused(kind, self.host, reason)
        self.refusal, self.closing = (status, reason), True
        self.waiting.clear()
        self.transport.pause_reading()
        if self.task is None:
            self._send_refusal()

    def _send_refusal(self) -> None:
        status, reason = self.refusal
        self._write(*json_answer(status, orjson.dumps(openai_error_body(ProxyError(status, reason)))), last=True)
        self._close()

    def _close(self) -> None:
        """Closes the connection once its answers are sent. It stays counted until it is gone, and swept:
        a client that takes none of those bytes within the keep-alive timeout is cut off."""
        self.closing = True
        self.transport.close()
        self.since = self.loop.time()
        self.connections.wait(self, idle=False)

    def check_timeout(self, now: float) -> None:
        """The sweep's check of a connection that answers nothing: closes it if its wait took too long."""
        limits, waited = self.connections, now - self.since
        if self.transport.is_closing():
            if limits.keep_alive_s and waited > limits.keep_alive_s:
                self.transport.abort()
        elif self.request is None:  # idle: no byte of a request yet
            limit = limits.head_timeout_s if self.first else limits.keep_alive_s
            if limit and waited > limit:
                if self.first:
                    limits.refused("idle_timeout", self.host, f"a new connection sent nothing for {limit:g} s")
                self._close()
        else:
            head = self.request.method is None
            limit = limits.head_timeout_s if head else limits.body_timeout_s
            if limit and waited > limit:
                what = "head" if head else "body"
                self._refuse(408, f"the request {what} did not arrive within {limit:g} s", f"{what}_timeout")

    def shed(self) -> None:
        """Closed to make room for a new connection (this one is idle)."""
        self.closing = True
        self.transport.close()

    def _write(self, status: int, headers: list, body: bytes, last: bool, head_only: bool = False) -> None:
        """One answer on the wire: its own framing (content-length, `connection: close` when `last`)
        replaces whatever framing `headers` carry."""
        if status in _NO_BODY_STATUS:
            body, length = b"", []
        else:
            length = [b"content-length: %d\r\n" % len(body)]
            body = b"" if head_only else body
        head = [_STATUS.get(status) or b"HTTP/1.1 %d \r\n" % status]
        head += [b"%s: %s\r\n" % pair for pair in headers if pair[0] not in _FRAMING]
        head += [b"%s: %s\r\n" % pair for pair in self.server_state.default_headers]
        head += length
        head.append(b"connection: close\r\n\r\n" if last else b"\r\n")
        self.transport.writelines([b"".join(head), body])

    def _update_reading(self) -> None:
        """Reads while nothing waits behind the answer in progress and the client takes its answers."""
        if self.transport.is_closing():
            return
        if self.waiting or self.writing_paused or self.refusal is not None:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()


def _address(transport, which: str) -> tuple[str, int] | None:
    """(host, port) of a socket's end, as ASGI has it (an IPv6 address comes with two more fields)."""
    address = transport.get_extra_info(which)
    return tuple(address[:2]) if isinstance(address, tuple) else None
