"""The proxy's client connections: how many are open, from whom, and how long a request may take to arrive.

The proxy's own HTTP server (`http_server.py`) keeps one `Connections` table per process. A connection
is in it from `connection_made` to `connection_lost`. One timer sweeps the connections that are not
answering a request (idle ones, ones whose request is still arriving, ones closing) every second or so:
per call, the server only moves a connection between two dicts and reads the loop's clock, instead of
arming a timer per request. Answers are never timed: a call may take minutes while the model generates.

At a cap (open connections in all, or from one client address), the oldest idle connection of the
client holding the most idle ones is closed to make room; with none idle, the new connection gets a 503
and is closed. Refusals are logged as one warning per kind and minute, with how many there were.
"""

import logging
import resource
from typing import Protocol

from steps.proxy.config import ProxyConfig

log = logging.getLogger("openforge.proxy.http")

FD_RESERVE = 64  # open files kept for the listening socket, the store's files, logs and imports
LOG_EVERY_S = 60.0  # a refusal of one kind is logged at most this often (with the count since)
SWEEP_MAX_S = 1.0


class Tracked(Protocol):
    """What the table needs of a connection (http_server.ProxyProtocol)."""

    host: str
    client: "Client | None"

    def check_timeout(self, now: float) -> None:
        """Closes the connection if it waited too long in its current state (idle, reading, closing)."""

    def shed(self) -> None:
        """Closes an idle connection to make room for a new one."""


class Client:
    """One client address: its open connections and, oldest first, those of them that are idle."""

    __slots__ = ("host", "idle", "open")

    def __init__(self, host: str):
        self.host, self.open = host, 0
        self.idle: dict[Tracked, None] = {}


def raise_open_file_limit() -> int:
    """Raises this process's soft limit on open files to its hard limit (Go's runtime does the same) and
    returns the soft limit in effect: a container's soft limit is often 1024, too few for 256 rollouts."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # some sandboxes refuse; the soft limit then stands
            pass
    return soft


def connection_cap(setting: int | None, open_files: int) -> int:
    """The cap on open client connections: `setting` (0: none), or by default half the open files left
    after a reserve, since each connection may hold a second file, its call's connection to vLLM.

    >>> connection_cap(None, 256), connection_cap(None, 1 << 20), connection_cap(500, 256)
    (96, 524256, 500)
    """
    if setting is not None:
        return setting
    return max(16, (open_files - FD_RESERVE) // 2)


class Connections:
    """The table of open client connections, their caps and the sweep that times them out."""

    def __init__(self, config: ProxyConfig, open_files: int):
        self.max_total = connection_cap(config.max_connections, open_files)
        self.max_per_client = config.max_connections_per_client
        self.max_head_bytes, self.max_headers = config.max_head_bytes, config.max_headers
        self.head_timeout_s, self.body_timeout_s = config.head_timeout_s, config.body_timeout_s
        self.keep_alive_s = config.keep_alive_s
        timeouts = [t for t in (self.head_timeout_s, self.body_timeout_s, self.keep_alive_s) if t > 0]
        self.sweep_s = min(SWEEP_MAX_S, min(timeouts) / 4) if timeouts else None
        self.open = 0
        self.clients: dict[str, Client] = {}
        self.waiting: dict[Tracked, None] = {}  # connections not answering a request
        self.loop = None
        self.sweeper = None
        self.refusals: dict[str, int] = {}  # kind -> refusals not yet logged
        self.logged_at: dict[str, float] = {}

    def admit(self, conn: Tracked, loop) -> str | None:
        """Counts a new connection in, closing an idle one if a cap is reached; returns why it is refused
        (then it is not counted) or None."""
        self.loop = loop
        client = self.clients.get(conn.host)
        if client is None:
            client = Client(conn.host)
        if self.max_per_client and client.open >= self.max_per_client and not self._shed(client):
            return self.refused("client_connections", conn.host, f"too many connections from {conn.host} "
                                f"(at most {self.max_per_client}); retry later")
        if self.max_total and self.open >= self.max_total and not self._shed(self._most_idle()):
            return self.refused("connections", conn.host,
                                f"the proxy has too many open connections (at most {self.max_total}); retry later")
        client = self.clients.setdefault(conn.host, client)  # shedding its last connection dropped its entry
        client.open += 1
        self.open += 1
        conn.client = client
        self.waiting[conn] = None
        client.idle[conn] = None
        self._arm()
        return None

    def release(self, conn: Tracked) -> None:
        """Counts a connection out (again: nothing)."""
        client, conn.client = conn.client, None
        if client is None:
            return
        client.open -= 1
        self.open -= 1
        client.idle.pop(conn, None)
        self.waiting.pop(conn, None)
        if not client.open:
            del self.clients[client.host]

    def reading(self, conn: Tracked) -> None:
        """A request's first byte arrived: the connection is no longer idle (it cannot be shed)."""
        if conn.client is not None:
            conn.client.idle.pop(conn, None)

    def busy(self, conn: Tracked) -> None:
        """The connection answers a request: it is not swept until it waits again."""
        self.waiting.pop(conn, None)
        if conn.client is not None:
            conn.client.idle.pop(conn, None)

    def wait(self, conn: Tracked, idle: bool) -> None:
        """The connection answers nothing now: it is swept; `idle` if no byte of a request has arrived."""
        if conn.client is None:
            return
        self.waiting[conn] = None
        if idle:
            conn.client.idle[conn] = None
        else:
            conn.client.idle.pop(conn, None)
        self._arm()

    def refused(self, kind: str, host: str, reason: str) -> str:
        """Logs a refusal (quietly: one warning per kind and minute, with the count) and returns `reason`."""
        self.refusals[kind] = self.refusals.get(kind, 0) + 1
        now = self.loop.time() if self.loop is not None else 0.0
        if now - self.logged_at.get(kind, -LOG_EVERY_S) >= LOG_EVERY_S:
            self.logged_at[kind] = now
            log.warning("refused a connection or request", extra={
                "kind": kind, "client": host, "reason": reason, "count": self.refusals.pop(kind)})
        return reason

    def _most_idle(self) -> Client | None:
        return max(self.clients.values(), key=lambda client: len(client.idle), default=None)

    def _shed(self, client: Client | None) -> bool:
        """Closes the client's oldest idle connection; False if it has none."""
        if client is None or not client.idle:
            return False
        conn = next(iter(client.idle))
        self.release(conn)
        conn.shed()
        self.refused("idle_shed", client.host, "an idle connection was closed to make room for a new one")
        return True

    def _arm(self) -> None:
        if self.sweeper is None and self.sweep_s is not None and self.waiting:
            self.sweeper = self.loop.call_later(self.sweep_s, self._sweep)

    def _sweep(self) -> None:
        self.sweeper = None
        now = self.loop.time()
        for conn in list(self.waiting):
            if conn.client is not None:  # not counted out by an earlier one's check
                conn.check_timeout(now)
        self._arm()
