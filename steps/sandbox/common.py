"""What every kind of sandbox (local, pod) and the layer builder share: errors, how a command ended,
stopping processes, a command's output read through a pipe up to a cap, and copying folders without recursion,
within limits.

Nothing a sandbox's processes can write reaches the host unbounded (docs/reliability.md, "Limits"): a command's
stdout and stderr go into a pipe that a thread of the runner reads (`Output`), keeping `Bounds.log_bytes` and
dropping the rest (the command never blocks on it, and its `/proc/<pid>/fd/1` is a pipe, not a host file it
could reopen); files are copied out as logs up to a byte budget, reading no more than that budget of a sparse
file (`copy_logs`); graded folders are copied whole or refused past a count of files, a number of bytes and a
time (`copy_tree` with `CopyLimits`).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from steps.contracts.limits import MIB, Bounds  # noqa: F401 - the sandbox's limits, its API too

KILL_GRACE_S = 5.0
WHEELS_DIR = "/opt/openforge/wheels"
DRAIN_S = 5.0  # after a command ended, how long its output may keep arriving (from what it left) before the pipe is shut


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
    output_dropped: int = 0  # bytes of output past the log cap, read and dropped (`Output`)


class Output:
    """A command's stdout and stderr: a pipe whose write end the command gets (`fd`), read by a thread of the
    runner that appends at most `cap` bytes to `path` (counting what the file already holds) and drops the rest,
    noting the cut at the file's end. The command never blocks on a full pipe and never holds a host file.

        with Output(Path("harness.log"), 16 * MIB) as output:           # read from here on
            process = subprocess.Popen(argv, stdout=output.fd, stderr=output.fd)
            output.started()
            process.wait()
        output.dropped                                                   # bytes past the cap
    """

    def __init__(self, path: Path, cap: int):
        self.path, self.cap = Path(path), cap
        self.dropped = 0
        self._read, self.fd = os.pipe()
        self._stop_at: float | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._drain, name=f"output-{self.path.name}", daemon=True)
        self._thread.start()

    def __enter__(self) -> Output:
        return self

    def started(self) -> None:
        """The command holds the write end now: the runner's own copy is closed, so the pipe ends with the command."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Wait for the pipe to end (once every writer is gone), at most `DRAIN_S` more: a writer that escaped the
        kill cannot hold the runner."""
        self.started()
        self._stop_at = time.monotonic() + DRAIN_S
        self._thread.join()

    def _drain(self) -> None:
        with os.fdopen(self._read, "rb", buffering=0) as pipe, open(self.path, "ab") as out:
            room = max(0, self.cap - out.tell())
            while self._stop_at is None or time.monotonic() < self._stop_at:
                if not select.select([pipe], [], [], 0.2)[0]:
                    continue
                chunk = pipe.read(1 << 16)
                if not chunk:
                    break
                kept = chunk[:room]
                if kept:
                    out.write(kept)
                    room -= len(kept)
                self.dropped += len(chunk) - len(kept)
            if self.dropped:
                out.write(f"\n[openforge: output cut at {self.cap} bytes; {self.dropped} more bytes were read and "
                          f"dropped]\n".encode())


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


class CopyLimitReached(Exception):
    """A copy went past one of its `CopyLimits`; the message says which, in one sentence."""


@dataclass
class CopyLimits:
    """How much one copy may bring over: entries (files, folders, links), apparent bytes, seconds; None: no limit."""

    files: int | None = None
    bytes: int | None = None
    seconds: float | None = None
    copied_files: int = 0
    copied_bytes: int = 0
    started: float = field(default_factory=time.monotonic)

    def charge(self, size: int = 0) -> None:
        """Counts one more entry of `size` bytes in; raises `CopyLimitReached` past a limit (the time included)."""
        self.copied_files += 1
        self.copied_bytes += size
        if self.files is not None and self.copied_files > self.files:
            raise CopyLimitReached(f"more than {self.files} files and folders")
        if self.bytes is not None and self.copied_bytes > self.bytes:
            raise CopyLimitReached(f"more than {self.bytes} bytes (counted as the files' apparent sizes)")
        if self.seconds is not None and time.monotonic() - self.started > self.seconds:
            raise CopyLimitReached(f"not copied within {self.seconds:g} s ({self.copied_files} entries by then)")


def copy_tree(source: Path, target: Path, limits: CopyLimits | None = None) -> None:
    """Merge a folder into `target`, keeping modes; symlinks stay links; sockets and FIFOs are skipped.

    Walks with a stack of its own, not by recursion: an agent's folders may be nested thousands deep. With `limits`,
    raises `CopyLimitReached` as soon as the copy goes past one (what was copied so far stays)."""
    limits = limits or CopyLimits()
    pending, folders = [(Path(source), Path(target))], []
    while pending:
        source, target = pending.pop()
        target.mkdir(parents=True, exist_ok=True)
        folders.append((source, target))
        for entry in os.scandir(source):
            destination = target / entry.name
            if entry.is_symlink():
                limits.charge()
                if destination.is_symlink() or destination.is_file():
                    destination.unlink()
                destination.symlink_to(os.readlink(entry.path))
            elif entry.is_dir():
                limits.charge()
                pending.append((Path(entry.path), destination))
            elif entry.is_file():
                limits.charge(entry.stat(follow_symlinks=False).st_size)
                shutil.copy2(entry.path, destination)
    for source, target in reversed(folders):  # innermost first: a folder's mode may forbid writing into it
        shutil.copystat(source, target)


def files_under(top: Path, first: Iterable[str] = ()) -> list[Path]:
    """The regular files below `top` (never through a symlink), those named in `first` (relative paths) first."""
    found, pending = [], [Path(top)]
    while pending:
        for entry in os.scandir(pending.pop()):
            if entry.is_dir(follow_symlinks=False):
                pending.append(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                found.append(Path(entry.path))
    every = set(found)
    leading = [path for path in (Path(top) / name for name in first) if path in every]
    return leading + sorted(every.difference(leading))


def copy_logs(files: Iterable[tuple[Path, Path]], cap: int, max_files: int = 1000) -> tuple[list[Path], list[str]]:
    """Copy files as logs, each (source, destination): `cap` bytes in all, at most `max_files` files; a file past the
    budget is cut (only the kept bytes are read, so a sparse file of 1 TB costs what is kept). Symlinks, FIFOs and
    devices are not logs and are skipped. Returns the destinations written and notes naming each cut with the file's
    apparent and allocated sizes."""
    written, notes, room = [], [], cap
    for source, destination in files:
        if len(written) == max_files:
            notes.append(f"only the first {max_files} files were kept")
            break
        try:
            handle = open(source, "rb", opener=lambda name, flags: os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK))
        except OSError:  # gone, a symlink, a FIFO that no one writes: not a log
            continue
        with handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                continue
            destination.parent.mkdir(parents=True, exist_ok=True)
            kept = min(info.st_size, room)
            with open(destination, "wb") as out:
                while out.tell() < kept and (chunk := handle.read(min(1 << 20, kept - out.tell()))):
                    out.write(chunk)
            room -= kept
            written.append(destination)
            if kept < info.st_size:
                notes.append(f"{destination.name}: kept {kept} of its {info.st_size} bytes ({info.st_blocks * 512} "
                             f"allocated); {cap} bytes of such logs are kept")
    return written, notes


def force_remove(function, path, _exc_info) -> None:
    """rmtree's error hook: make a read-only folder writable and retry (tasks may chmod things 555)."""
    Path(path).parent.chmod(0o777)
    if not Path(path).is_symlink():
        Path(path).chmod(stat.S_IRWXU)
    function(path)
