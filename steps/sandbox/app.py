"""A task's app: the environment's own server (the web app of a GUI task), run beside the agent in a sandbox of
its own that shares only the agent's loopback network, as a sidecar container shares a pod's.

A task names it in task.toml, `[environment] app = "python3 /opt/site/app.py"` (a bash command, run in the
task's built environment). When the agent's command runs (`LocalSandbox.run(..., as_agent=True)`; the oracle runs as
the agent does), the app starts first, in a second pristine root of the task's layer (`LocalSandbox.sibling`), in the
network namespace the agent's command then joins: the agent reaches it at 127.0.0.1 and nothing else of it.
The app writes what the verifier grades under `APP_STATE_DIR`, a folder only its own root has, and creates
`APP_STATE_DIR/ready` once it listens; only then does the agent's command start. When that command ends the
app is stopped, its `APP_STATE_DIR` is kept as ROOT/`APP_STATE_KEPT`, and the verifier finds exactly that at
`APP_STATE_DIR` (`LocalSandbox.for_verifier`), replacing whatever the agent left at that path. The agent never sees
the app's files or processes (another mount and PID namespace), so it cannot write the app's state to fake a
success: it can only change it the way a browser does, through the app. The app's output goes to ROOT/app.log.

A pod runs no app (`steps.sandbox.pod`): there the app is a sidecar container of the rollout pod (docs/tasks.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Iterator

from steps.sandbox.common import MIB, CopyLimitReached, CopyLimits, SandboxError, copy_tree, force_remove
from steps.sandbox.network import Loopback

APP_STATE_DIR = "/var/lib/openforge/app"  # the app's own folder for what the verifier grades
APP_STATE_KEPT = "app-state"  # ROOT/app-state: that folder as the app left it, for the verifier
READY_FILE = "ready"
START_TIMEOUT_S = 30.0
STOP_GRACE_S = 10.0  # the app outlives the agent's command by at most this (it is stopped when that ends)
APP_STORAGE_MB = 256


@contextlib.contextmanager
def app_beside(box, network, timeout_s: float) -> Iterator[Loopback]:
    """Run `box.app` beside a command of `box` for the `with` block; yield the network that command must join.

    `network` is the command's: "none" gets a loopback namespace of its own for the two, a `ProxyTunnel` is
    shared as it is. Raises `SandboxError` when the app does not create its ready file within START_TIMEOUT_S.
    """
    if network == "host":
        raise SandboxError("a task's app never runs on the host's network")
    with contextlib.ExitStack() as stack:
        if not isinstance(network, Loopback):
            network = stack.enter_context(Loopback(f"of-{os.getpid()}-app-{time.monotonic_ns() % 10**9}"))
        app = box.sibling("app", APP_STORAGE_MB)
        stack.callback(app.remove)
        state = app.host_path(APP_STATE_DIR)
        state.mkdir(parents=True, exist_ok=True)
        stop = threading.Event()
        thread = threading.Thread(target=app.run, args=(["bash", "-c", box.app],), daemon=True, kwargs=dict(
            timeout_s=timeout_s + START_TIMEOUT_S + STOP_GRACE_S, network=network, stdout_path=box.root / "app.log",
            until=stop))
        thread.start()
        stack.callback(thread.join)
        stack.callback(stop.set)
        _wait_ready(state / READY_FILE, thread, box.root / "app.log")
        try:
            yield network
        finally:
            stop.set()
            thread.join()
            keep_state(box, state)


def keep_state(box, state) -> None:
    """Copy the app's state to ROOT/`APP_STATE_KEPT` for the verifier, within the bounds of a graded copy (its files,
    its seconds, the app's disk in apparent bytes); past them nothing is kept (the verifier finds the state empty,
    the rollout is graded on that) and the note says why: what the app was made to write is the agent's doing."""
    kept = box.root / APP_STATE_KEPT
    if kept.exists():
        shutil.rmtree(kept, onerror=force_remove)
    limits = CopyLimits(files=box.bounds.graded_files, bytes=APP_STORAGE_MB * MIB, seconds=box.bounds.graded_seconds)
    try:
        copy_tree(state, kept, limits)
    except CopyLimitReached as exc:
        shutil.rmtree(kept, onerror=force_remove)
        box.notes.append(f"the app's state was not kept for the verifier: it holds {exc}")


def _wait_ready(ready, thread: threading.Thread, log) -> None:
    """Return once the app has created its ready file; raise `SandboxError` if it ended or took too long."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready.exists():
        if not thread.is_alive():
            raise SandboxError(f"the task's app ended before it was ready; see {log}")
        if time.monotonic() >= deadline:
            raise SandboxError(f"the task's app was not ready within {START_TIMEOUT_S:g} s; see {log}")
        time.sleep(0.05)
