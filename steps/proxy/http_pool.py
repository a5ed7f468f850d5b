"""A lean HTTP/1.1 keep-alive client for the proxy's calls to vLLM.

aiohttp spends about 0.2 ms of CPU per request; this pool (asyncio.Protocol + httptools' parser)
spends about 0.04 ms, which matters when one proxy records thousands of calls a second. It does
only what the proxy needs: one origin (plain HTTP, or HTTPS for an external endpoint, verified against the
system's CAs or SSL_CERT_FILE), whole bodies in memory, no redirects.

    pool = HttpPool("http://127.0.0.1:8000")
    status, body = await pool.request("POST", "/v1/chat/completions", data,
                                      headers={"content-type": "application/json"}, timeout_s=600)
    await pool.close()

`NotSent`: connecting failed, so sending again is safe. `UpstreamTimeout`: no whole answer within
`timeout_s` (connect included). `UpstreamFailed`: the connection broke, or the server spoke broken
HTTP, after the request may have reached it. A cancelled caller closes its connection, so the server
sees the disconnect and can abort the work (vLLM does).
"""

import asyncio
import re
import ssl
from urllib.parse import urlsplit

import httptools

_RESERVED_HEADERS = frozenset({"host", "content-length", "transfer-encoding"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_PATH = re.compile(r"[\x00-\x20\x7f]")
_BAD_VALUE = re.compile(r"[\x00\r\n]")


class NotSent(Exception):
    """Nothing of the request can have reached the server (connect failed): safe to send again."""


class UpstreamTimeout(Exception):
    """The server gave no whole answer within the request's timeout; its connection was closed."""


class UpstreamFailed(Exception):
    """The connection broke or the server spoke broken HTTP after the request may have been sent."""


class _Stale(Exception):
    """The connection closed before any byte of the response: a reused one was closed by the server as we sent."""


class _Connection(asyncio.Protocol):
    """One TCP connection carrying one request at a time; the pool owns it between requests."""

    __slots__ = ("_answered", "_chunks", "_framed", "_headers_done", "_on_lost", "_parser", "_pool", "_waiter",
                 "closed", "reusable", "transport")

    def __init__(self, pool: "HttpPool"):
        self._pool = pool
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future | None = None
        self._chunks: list[bytes] = []
        self._answered = False
        self._framed = False
        self._headers_done = False
        self.reusable = False
        self.closed = False
        self._on_lost: asyncio.Future | None = None

    def send(self, waiter: asyncio.Future, head: bytes, body: bytes | None) -> None:
        """Writes one request; `waiter` gets (status, body) or the exception that ended it."""
        self._waiter = waiter
        self._answered = self._framed = self._headers_done = False
        if body:
            self.transport.writelines([head, body])
        else:
            self.transport.write(head)

    def expire(self, timeout_s: float) -> None:
        """The request's deadline passed: fail it and hang up."""
        self._fail(UpstreamTimeout(f"{self._pool.url} did not answer within {timeout_s:g} s"))

    def abort(self) -> None:
        """Drops the connection at once; it is never handed out again."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def abort_and_wait(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        """Drops the connection; the returned future resolves once the transport is gone."""
        self._on_lost = loop.create_future()
        self.abort()
        return self._on_lost

    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        self.abort()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # bytes while idle (e.g. a 408 before the server hangs up): unusable
            self.abort()
            return
        self._answered = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamFailed(f"{self._pool.url} answered with broken HTTP ({exc})"))

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length" or name == b"transfer-encoding":
            self._framed = True

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:  # an interim answer (100 Continue): the real one follows on the same parser
            self._chunks.clear()
            self._framed = self._headers_done = False
            return
        waiter, self._waiter = self._waiter, None
        if waiter is None:  # a second response nobody asked for
            self.abort()
            return
        self.reusable = self._parser.should_keep_alive()
        body = b"".join(self._chunks)
        self._chunks.clear()
        if not waiter.done():
            waiter.set_result((status, body))

    def eof_received(self) -> None:
        self.closed = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool._forget(self)
        if self._on_lost is not None and not self._on_lost.done():
            self._on_lost.set_result(None)
        if self._waiter is None or self._waiter.done():
            return
        if self._headers_done and not self._framed:  # neither content-length nor chunked: the body ends here
            self.on_message_complete()
        elif not self._answered:
            self._fail(_Stale())
        else:
            reason = f": {exc}" if exc else ""
            self._fail(UpstreamFailed(f"{self._pool.url} closed the connection mid-response{reason}"))


class HttpPool:
    """Keep-alive HTTP/1.1 connections to one server, reused last-in first-out, unbounded in number."""

    def __init__(self, url: str):
        scheme, self._host, self._port, self._host_header = _parse_origin(url)
        self.url = f"{scheme}://{self._host_header}"
        self._tls = ssl.create_default_context() if scheme == "https" else None
        self._idle: list[_Connection] = []
        self._live: set[_Connection] = set()
        self._closed = False

    async def request(self, method: str, path: str, body: bytes | None = None, *,
                      headers: dict[str, str] | None = None, timeout_s: float) -> tuple[int, bytes]:
        """Sends one request and returns (status, whole response body).

        A reused connection that the server closed without answering is retried once on a new one. If that new
        one cannot be made, the failure is `UpstreamFailed`, not `NotSent`: the request may have reached the server
        before it went away (a vLLM killed mid-generation closes the connection just so).
        """
        head = self._head(method, path, body, headers)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        conn = self._take_idle()
        if conn is not None:
            try:
                return await self._exchange(loop, conn, head, body, deadline, timeout_s)
            except _Stale:
                pass
            try:
                conn = await self._connect(loop, deadline, timeout_s)
            except NotSent as exc:
                raise UpstreamFailed(f"{self.url} closed the connection without answering, and {exc}") from None
        else:
            conn = await self._connect(loop, deadline, timeout_s)
        try:
            return await self._exchange(loop, conn, head, body, deadline, timeout_s)
        except _Stale:
            if self._closed:
                raise RuntimeError("HttpPool was closed during the request") from None
            raise UpstreamFailed(f"{self.url} closed the connection without answering") from None

    async def close(self) -> None:
        """Closes every connection, idle or busy, and waits until they are gone; calling it again does nothing."""
        self._closed = True
        self._idle.clear()
        if self._live:
            loop = asyncio.get_running_loop()
            await asyncio.gather(*(conn.abort_and_wait(loop) for conn in list(self._live)))

    def _forget(self, conn: _Connection) -> None:
        self._live.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and not conn.transport.is_closing():
                return conn
        return None

    async def _connect(self, loop: asyncio.AbstractEventLoop, deadline: float, timeout_s: float) -> _Connection:
        if self._closed:
            raise RuntimeError("HttpPool is closed")
        timeout = asyncio.timeout_at(deadline)
        try:
            async with timeout:
                _, conn = await loop.create_connection(lambda: _Connection(self), self._host, self._port, ssl=self._tls,
                                                       server_hostname=self._host if self._tls else None)
        except OSError as exc:  # TimeoutError is an OSError too
            if timeout.expired():
                raise UpstreamTimeout(f"could not connect to {self.url} within {timeout_s:g} s") from None
            raise NotSent(f"cannot connect to {self.url}: {exc}") from None
        if self._closed:
            conn.abort()
            raise RuntimeError("HttpPool is closed")
        self._live.add(conn)
        return conn

    async def _exchange(self, loop: asyncio.AbstractEventLoop, conn: _Connection, head: bytes, body: bytes | None,
                        deadline: float, timeout_s: float) -> tuple[int, bytes]:
        waiter = loop.create_future()
        conn.send(waiter, head, body)
        timer = loop.call_at(deadline, conn.expire, timeout_s)
        try:
            result = await waiter
        except BaseException:  # failed, timed out or cancelled: the server must see us hang up
            conn.abort()
            raise
        finally:
            timer.cancel()
        if conn.reusable and not conn.closed and not self._closed:
            self._idle.append(conn)
        else:
            conn.abort()
        return result

    def _head(self, method: str, path: str, body: bytes | None, headers: dict[str, str] | None) -> bytes:
        _check_request(method, path, headers)
        parts = [method, " ", path, " HTTP/1.1\r\nhost: ", self._host_header, "\r\n"]
        if body is not None:
            parts += ("content-length: ", str(len(body)), "\r\n")
        elif method in _BODY_METHODS:
            parts.append("content-length: 0\r\n")
        if headers:
            for name, value in headers.items():
                parts += (name, ": ", value, "\r\n")
        parts.append("\r\n")
        return "".join(parts).encode("latin-1")


def _check_request(method: str, path: str, headers: dict[str, str] | None) -> None:
    """Refuses what would corrupt the request head or hang the response parser."""
    if method == "HEAD":
        raise ValueError("HttpPool cannot send HEAD: the parser would wait for a body that never comes")
    if not _TOKEN.fullmatch(method):
        raise ValueError(f"invalid HTTP method {method!r}")
    if not path.startswith("/") or _BAD_PATH.search(path):
        raise ValueError(f"invalid request path {path!r}: it must start with / and hold no spaces or controls")
    for name, value in (headers or {}).items():
        if not _TOKEN.fullmatch(name) or _BAD_VALUE.search(value):
            raise ValueError(f"invalid header {name!r}: {value!r}")
        if name.lower() in _RESERVED_HEADERS:
            raise ValueError(f"header {name!r} is set by HttpPool itself")


def _parse_origin(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, host header) of "http[s]://host[:port]"; anything else is a ValueError saying what
    is accepted."""
    expected = f"HttpPool needs a bare origin like http://127.0.0.1:8000 (no path, query or user), not {url!r}"
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise ValueError(expected) from None
    if (parts.scheme not in ("http", "https") or not parts.hostname or parts.username is not None or port == 0
            or parts.path not in ("", "/") or parts.query or parts.fragment):
        raise ValueError(expected)
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80), parts.netloc
