"""A TCP relay in front of a server whose answers can be held: a test decides when a call in flight ends.

Timing races between "the call is in flight" and "the tiny model already answered" go away: while held, what
the server sends back waits in the relay (the server itself answers at its own pace), and `release()` lets
it through. Requests always pass. `cut()` takes the server away: every relayed connection is closed and new
ones are refused, as when the server's host goes down.
"""

import socket
import socketserver
import threading


class HeldRelay(socketserver.ThreadingTCPServer):
    """Relays TCP connections to the server at `url`; while held, what that server sends back waits."""

    daemon_threads = allow_reuse_address = True

    def __init__(self, url: str, port: int = 0):
        self.target = ("127.0.0.1", int(url.rstrip("/").rsplit(":", 1)[1]))
        self.flowing = threading.Event()
        self.flowing.set()
        self.open: set[socket.socket] = set()  # both ends of every connection relayed
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", port), _HeldConnection)  # `port`: a cut relay's, to stand it up again
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def hold(self) -> None:
        self.flowing.clear()

    def release(self) -> None:
        self.flowing.set()

    def cut(self) -> None:
        """Refuses new connections and closes those relayed (after this, a client gets connection errors)."""
        self.shutdown()
        self.server_close()
        with self.lock:
            for sock in self.open:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.open.clear()

    def __enter__(self) -> "HeldRelay":
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
        if self.fileno() != -1:  # not cut
            self.shutdown()
            self.server_close()


class _HeldConnection(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        with socket.create_connection(self.server.target) as upstream:
            with self.server.lock:
                self.server.open |= {upstream, self.request}
            threading.Thread(target=_pump, args=(upstream, self.request, self.server.flowing), daemon=True).start()
            _pump(self.request, upstream, None)


def _pump(source: socket.socket, sink: socket.socket, flowing: threading.Event | None) -> None:
    try:
        while data := source.recv(65536):
            if flowing is not None:
                flowing.wait()
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:  # the other direction closed both
        pass
