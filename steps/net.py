"""The loopback address every local server of OpenForge binds, a way to pick a free port on it, and what
an upstream server's URL may be.

    port = free_port()    # e.g. 41873: nothing listens there right now
"""

import socket
import urllib.error
import urllib.request
from urllib.parse import urlsplit

HOST = "127.0.0.1"


def healthy(base_url: str, timeout_s: float = 2.0) -> bool:
    """Whether the server at `base_url` answers `GET /health` with 200 now (no answer, a refused connection or
    another status: not yet)."""
    try:
        with urllib.request.urlopen(f"{base_url.rstrip('/')}/health", timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


# What `upstream_url_problem` accepts, for its callers' one-sentence errors.
UPSTREAM_URL = "an http:// or https:// URL with a host and no user, password, query or fragment (e.g. " \
    "http://10.0.0.5:8000; a key goes in OPENFORGE_UPSTREAM_API_KEY)"


def is_upstream_url(url: str) -> bool:
    """Whether `url` is http(s)://HOST[:PORT][/PATH]: a port that is a number, no user, password, query or
    fragment, so that no secret in it reaches a Workflow, a record or a report.

    >>> is_upstream_url("http://10.0.0.5:8000/v1"), is_upstream_url("http://user:pw@x:80/v1")
    (True, False)
    >>> is_upstream_url("http://x/v1?key=abc"), is_upstream_url("http://x:port"), is_upstream_url("ftp://x")
    (False, False, False)
    """
    parts = urlsplit(url)
    try:
        parts.port
    except ValueError:
        return False
    return (parts.scheme in ("http", "https") and bool(parts.hostname) and parts.username is None
            and parts.password is None and not parts.query and not parts.fragment)
