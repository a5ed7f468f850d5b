"""The loopback address every local server of OpenForge binds, and a way to pick a free port on it.

    port = free_port()    # e.g. 41873: nothing listens there right now
"""

import socket

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]
