"""Start and stop the recording proxy as a subprocess, for the tests and benchmarks.

    with serve_proxy(upstream, store, admin_key) as proxy:
        rollout = proxy.register("r-0")          # {"rollout_id", "api_key", "openai_base_url", ...}
        calls = proxy.calls("r-0")
        proxy.client.close("r-0")                # every admin route: `steps.proxy.client.ProxyClient`

The command is exactly `python -m steps.proxy ...`, the one the serve pod runs.
"""

import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from steps.net import HOST, free_port
from steps.proxy.__main__ import command_line
from steps.proxy.client import ProxyClient, ProxyClientError

ADMIN_KEY = "test-admin-key"  # the admin key of every proxy the tests start (conftest's `proxy` fixture)


@dataclass
class ProxyProcess:
    """A running proxy: its address, admin key and log."""

    process: subprocess.Popen
    port: int
    admin_key: str
    log_path: Path
    args: list[str] = field(default_factory=list)
    store: str = ""  # the proxy's store: rollouts/<id>/rollout.json holds each registration

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def client(self) -> ProxyClient:
        """The admin API, with this proxy's admin key."""
        return ProxyClient(self.url, self.admin_key)

    def register(self, rollout_id: str, metadata: dict | None = None) -> dict:
        """Registers a rollout; returns its key and base URLs."""
        return self.client.register(rollout_id, metadata)

    def calls(self, rollout_id: str) -> list[dict]:
        """The rollout's recorded calls, in order."""
        return self.client.calls(rollout_id).calls

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def proxy_command(upstream: str, store: str, port: int, extra: list[str] = ()) -> list[str]:
    """The proxy's command line (the admin key travels in the environment, never on the command line)."""
    return [sys.executable, "-m", "steps.proxy", *command_line(upstream, store, port, extra=extra)]


def start_proxy(upstream: str, store: str, admin_key: str, port: int | None = None, extra: list[str] = (),
                log_path: Path | None = None, env: dict | None = None, timeout_s: float = 30.0,
                open_files: int | None = None) -> ProxyProcess:
    """Starts the proxy and returns once `/health` answers; `open_files` sets its limit on open files
    (soft and hard, as a small container would), for tests of what the proxy does at that limit."""
    port = port or free_port()
    log_path = Path(log_path or Path(tempfile.gettempdir()) / f"openforge-proxy-{port}.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {}), "OPENFORGE_ADMIN_KEY": admin_key}
    with open(log_path, "ab") as log:
        process = subprocess.Popen(proxy_command(upstream, store, port, list(extra)), env=full_env,
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   preexec_fn=None if open_files is None else lambda: _limit_open_files(open_files))
    proxy = ProxyProcess(process, port, admin_key, log_path, list(extra), store)
    probe = ProxyClient(proxy.url, admin_key, timeout_s=2, retries=0)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the proxy exited with code {process.returncode}; log:\n{proxy.log_tail()}")
        try:
            probe.health()
            return proxy
        except ProxyClientError:
            time.sleep(0.1)
    stop_proxy(proxy)
    raise RuntimeError(f"the proxy did not answer /health within {timeout_s:.0f} s; log:\n{proxy.log_tail()}")


def _limit_open_files(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


def stop_proxy(proxy: ProxyProcess, grace_s: float = 10.0) -> None:
    """Stops the proxy: SIGTERM (finishes in-flight calls), then SIGKILL."""
    if proxy.process.poll() is None:
        proxy.process.send_signal(signal.SIGTERM)
        try:
            proxy.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            proxy.process.kill()
            proxy.process.wait()


@contextmanager
def serve_proxy(upstream: str, store: str, admin_key: str, **kwargs) -> Iterator[ProxyProcess]:
    """`start_proxy` as a context manager."""
    proxy = start_proxy(upstream, store, admin_key, **kwargs)
    try:
        yield proxy
    finally:
        stop_proxy(proxy)
