"""A local rollout's network: its own namespace, with one way out, to the recording proxy.

    with ProxyTunnel("of-r0", "127.0.0.1", 8100) as tunnel:     # ip netns add; lo up; a listener inside
        box.run(argv, ..., network=tunnel)                        # the agent sees 127.0.0.1:8100 and nothing else

The runner makes a network namespace that holds only a loopback interface and, owned by the runner (not by
anything in the sandbox), a listening socket on 127.0.0.1:PORT inside it. Each connection made to it is
forwarded to the proxy's address on the host, byte for byte. Everything else on the host's loopback (vLLM
and its dev-mode routes, the S3 endpoint, other services) and the outside network are unreachable: there is
no route out of the namespace. The namespace is owned by the host's user namespace, so the agent, root only
in a user namespace of its own, cannot reconfigure it. At most `max_connections` are forwarded at once;
more are closed as they arrive.

Each tunnel connects to a proxy on loopback from a loopback address of its own (`loopback_source`: all of
127.0.0.0/8 is loopback on Linux), so the proxy, which caps the connections of each client address
(`--max-connections-per-client`, steps/proxy/connections.py), caps each rollout on its own: one rollout
holding all it may cannot take another's share, as it could when every tunnel connected from 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import ipaddress
import os
import re
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
MAX_CONNECTIONS = 64  # one rollout's connections to the proxy at once (a harness uses a few)
_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")


class NetworkError(RuntimeError):
    """The rollout's network namespace cannot be set up; the message says why in one sentence."""


class Loopback:
    """A network namespace of the runner's holding only a loopback interface: a command and the task's app beside
    it (`steps.sandbox.app`) share it, and reach nothing else.

    >>> Loopback("of-1-x").netns
    PosixPath('/run/netns/of-1-x')
    """

    def __init__(self, name: str):
        self.name = name

    @property
    def netns(self) -> Path:
        """The namespace's file, for `nsenter --net=...`."""
        return NETNS_DIR / self.name

    def __enter__(self) -> Loopback:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)  # a dead run's leftover
        for argv in (["ip", "netns", "add", self.name], ["ip", "-n", self.name, "link", "set", "lo", "up"]):
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                self._delete()
                raise NetworkError(f"cannot set up the rollout's network namespace ({' '.join(argv)}): "
                                   f"{done.stderr.strip() or done.returncode}")
        return self

    def __exit__(self, *exc_info) -> None:
        self._delete()

    def _delete(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)


def loopback_source(name: str) -> str:
    """The loopback address the tunnel named `name` connects to the proxy from: derived from the name (a rollout's
    is unique), outside 127.0.x.x, where the host's own services are (127.0.0.1, 127.0.0.53, 127.0.1.1). Two of
    256 rollouts share one with a chance of about 1 in 500; they then share one cap of the proxy's.

    >>> loopback_source("of-4242-17"), loopback_source("of-4242-18")
    ('127.27.99.216', '127.117.205.137')
    """
    digest = hashlib.sha256(name.encode()).digest()
    return f"127.{1 + digest[0] % 254}.{digest[1]}.{1 + digest[2] % 254}"


class ProxyTunnel(Loopback):
    """A network namespace whose 127.0.0.1:`listen_port` is forwarded to `target_host:target_port` on the host,
    from `source` (default: a proxy on loopback is reached from the tunnel's own `loopback_source`)."""

    def __init__(self, name: str, target_host: str, target_port: int, listen_port: int | None = None,
                 max_connections: int = MAX_CONNECTIONS, source: str | None = None):
        super().__init__(name)
        self.target = (target_host, target_port)
        self.source = source
        self.listen_port = listen_port or target_port
        self.max_connections = max_connections
        self._listener: socket.socket | None = None
        self._open = threading.BoundedSemaphore(max_connections)
        self._closed = threading.Event()
        self._connections: set[socket.socket] = set()

    def __enter__(self) -> ProxyTunnel:
        self._bind_source()
        super().__enter__()
        self._listener = _listen_inside(self.netns, self.listen_port)
        threading.Thread(target=self._accept, name=f"tunnel-{self.name}", daemon=True).start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._closed.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept(); close() alone does not
            self._listener.close()
        for connection in list(self._connections):  # what the harness left open: its pumps end with them
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        self._delete()

    def _bind_source(self) -> None:
        """Resolves the target once and, for a proxy on loopback, takes the tunnel's own source address; checks
        that the host lets it be bound (Linux routes all of 127.0.0.0/8 to loopback)."""
        try:
            address = socket.getaddrinfo(self.target[0], self.target[1], socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
        except OSError:  # not resolvable now: connecting fails later, as it would have
            return
        self.target = (address, self.target[1])
        if self.source is None and ipaddress.ip_address(address).is_loopback:
            self.source = loopback_source(self.name)
        if self.source is None:
            return
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((self.source, 0))
            except OSError as exc:
                raise NetworkError(f"cannot connect to the proxy from the rollout's own loopback address "
                                   f"{self.source} ({exc.strerror or exc}); this host does not route 127.0.0.0/8 "
                                   "to loopback") from None

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                inside, _ = self._listener.accept()
            except OSError:
                return
            if not self._open.acquire(blocking=False):
                inside.close()  # over the cap: the harness sees a closed connection
                continue
            threading.Thread(target=self._forward, args=(inside,), daemon=True).start()

    def _forward(self, inside: socket.socket) -> None:
        self._connections.add(inside)
        try:
            outside = socket.create_connection(self.target, timeout=10,
                                               source_address=None if self.source is None else (self.source, 0))
        except OSError:
            self._connections.discard(inside)
            inside.close()
            self._open.release()
            return
        outside.settimeout(None)
        self._connections.add(outside)
        pump = threading.Thread(target=_pump, args=(outside, inside), daemon=True)
        pump.start()
        _pump(inside, outside)
        pump.join()
        for end in (inside, outside):
            self._connections.discard(end)
            end.close()
        self._open.release()


def sweep_namespaces() -> None:
    """Delete the network namespaces of runners that died without deleting them (named `of-PID-...`)."""
    if not NETNS_DIR.is_dir():
        return
    for entry in NETNS_DIR.iterdir():
        owner = re.match(r"of-(\d+)-", entry.name)
        if owner and int(owner.group(1)) != os.getpid() and not Path(f"/proc/{owner.group(1)}").exists():
            subprocess.run(["ip", "netns", "del", entry.name], capture_output=True, check=False)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy bytes until `source` ends, then end the write side of `sink`."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    try:
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def inside(netns: Path, make: Callable[[], T]) -> T:
    """What `make()` returns, run by a thread that enters `netns` (its OSError raised here). A socket belongs to the
    namespace it was made in, whichever thread uses it later; only that short-lived thread ever enters the
    namespace."""
    made: dict = {}

    def enter_and_make() -> None:
        try:
            with open(netns) as handle:
                if _libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            made["result"] = make()
        except OSError as exc:
            made["error"] = exc

    thread = threading.Thread(target=enter_and_make)
    thread.start()
    thread.join()
    if "error" in made:
        raise made["error"]
    return made["result"]


def _listen_inside(netns: Path, port: int) -> socket.socket:
    """A socket listening on 127.0.0.1:`port` inside `netns`."""
    def listen() -> socket.socket:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
        return listener

    try:
        return inside(netns, listen)
    except OSError as exc:
        raise NetworkError(f"cannot listen for the proxy inside the rollout's network namespace: {exc}") from None
