"""What every kind of sandbox (local, pod) and the layer builder share: errors, how a command ended,
stopping processes, and copying folders without recursion."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

KILL_GRACE_S = 5.0
WHEELS_DIR = "/opt/openforge/wheels"


class SandboxError(RuntimeError):
    """The sandbox cannot be built or used; the message says why in one sentence (plus a log tail)."""


class VerifierRefused(Exception):
    """The agent changed what the verifier would execute or load: the rollout is graded 0 (it is the agent's
    doing, so never an infra_error, which would be retried); the message says what was found."""


@dataclass(frozen=True)
class RunResult:
    """How one command in the sandbox ended.

    `exit_code` is the command's (127: no such program); after a timeout it is whatever the kill
    left (usually 137), so read `timed_out` first.
    """

    exit_code: int
    timed_out: bool
    duration_s: float


def wait_for(process: subprocess.Popen, timeout_s: float, stop: Callable[[], None],
             until: threading.Event | None = None) -> bool:
    """Wait for `process` at most `timeout_s` (or until `until` is set), then `stop()` what it left (also on an
    error); True if it timed out."""
    try:
        deadline = time.monotonic() + timeout_s
        while until is not None and not until.is_set() and process.poll() is None:
            if time.monotonic() >= deadline:
                return True
            until.wait(0.1)
        if until is not None:
            return False
        process.wait(timeout=timeout_s)
        return False
    except subprocess.TimeoutExpired:
        return True
    finally:
        stop()


def kill(pid: int) -> None:
    """SIGKILL a pid (negative: a process group), ignoring one that is already gone."""
    try:
        if pid < 0:
            os.killpg(-pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def links_under(top: Path) -> list[Path]:
    """Every symlink below the folder `top` (a stack, not recursion: folders may be nested thousands deep)."""
    links, pending = [], [top]
    while pending:
        for entry in os.scandir(pending.pop()):
            if entry.is_symlink():
                links.append(Path(entry.path))
            elif entry.is_dir():
                pending.append(Path(entry.path))
    return links


def copy_tree(source: Path, target: Path) -> None:
    """Merge a folder into `target`, keeping modes; symlinks stay links; sockets and FIFOs are skipped.

    Walks with a stack of its own, not by recursion: an agent's folders may be nested thousands deep."""
    pending, folders = [(Path(source), Path(target))], []
    while pending:
        source, target = pending.pop()
        target.mkdir(parents=True, exist_ok=True)
        folders.append((source, target))
        for entry in os.scandir(source):
            destination = target / entry.name
            if entry.is_symlink():
                if destination.is_symlink() or destination.is_file():
                    destination.unlink()
                destination.symlink_to(os.readlink(entry.path))
            elif entry.is_dir():
                pending.append((Path(entry.path), destination))
            elif entry.is_file():
                shutil.copy2(entry.path, destination)
    for source, target in reversed(folders):  # innermost first: a folder's mode may forbid writing into it
        shutil.copystat(source, target)


def force_remove(function, path, _exc_info) -> None:
    """rmtree's error hook: make a read-only folder writable and retry (tasks may chmod things 555)."""
    Path(path).parent.chmod(0o777)
    if not Path(path).is_symlink():
        Path(path).chmod(stat.S_IRWXU)
    function(path)
