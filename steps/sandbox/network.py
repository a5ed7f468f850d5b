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
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import socket
import subprocess
import threading
from pathlib import Path

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
MAX_CONNECTIONS = 64
_libc = ctypes.CDLL(None, use_errno=True)


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


class ProxyTunnel(Loopback):
    """A network namespace whose 127.0.0.1:`listen_port` is forwarded to `target_host:target_port` on the host."""

    def __init__(self, name: str, target_host: str, target_port: int, listen_port: int | None = None,
                 max_connections: int = MAX_CONNECTIONS):
        super().__init__(name)
        self.target = (target_host, target_port)
        self.listen_port = listen_port or target_port
        self.max_connections = max_connections
        self._listener: socket.socket | None = None
        self._open = threading.BoundedSemaphore(max_connections)
        self._closed = threading.Event()
        self._connections: set[socket.socket] = set()

    def __enter__(self) -> ProxyTunnel:
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
            outside = socket.create_connection(self.target, timeout=10)
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


def _listen_inside(netns: Path, port: int) -> socket.socket:
    """A socket listening on 127.0.0.1:`port` inside `netns`, made by a thread that enters the namespace.

    A socket belongs to the namespace it was made in, whichever thread uses it later; only that short-lived
    thread ever enters the namespace.
    """
    made: dict = {}

    def enter_and_listen() -> None:
        try:
            with open(netns) as handle:
                if _libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", port))
            listener.listen(128)
            made["socket"] = listener
        except OSError as exc:
            made["error"] = exc

    thread = threading.Thread(target=enter_and_listen)
    thread.start()
    thread.join()
    if "error" in made:
        raise NetworkError(f"cannot listen for the proxy inside the rollout's network namespace: {made['error']}")
    return made["socket"]
