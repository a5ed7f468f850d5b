"""A sandbox's `/` as a folder of the host: what both kinds (local, pod) do with the files inside.

`SandboxFiles` is mixed into `LocalSandbox` (whose `/` is its mounted root, `ROOT/merged`) and `PodSandbox` (whose
`/` is the pod's own): each says where its `/` is (`fs`) and holds `env`, `notes` and `bounds`; the paths inside are
resolved as the inside would resolve them, so a symlink the agent left cannot lead out.
"""

from __future__ import annotations

import os
import posixpath
import shutil
from collections.abc import Sequence
from pathlib import Path

from steps.contracts.limits import Bounds
from steps.sandbox.common import SandboxError, copy_logs, copy_tree, files_under, force_remove
from steps.tasks import Task

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BASE_ENV = {"PATH": SANDBOX_PATH, "HOME": "/root", "LANG": "C.UTF-8"}


class SandboxFiles:
    """The file operations of a sandbox whose `/` is the host folder `fs`."""

    env: dict[str, str]
    notes: list[str]
    bounds: Bounds

    @property
    def fs(self) -> Path:
        """The host folder that is `/` inside the sandbox."""
        raise NotImplementedError

    def apply_task_env(self, task: Task) -> None:
        """Add the task's `[environment] env` to every command's environment (host templates are noted, not set)."""
        for name, value in task.config.environment_env.items():
            if "${" in value:
                self.notes.append(f"[environment] env {name} is a host template, which OpenForge does not fill in; not set")
            else:
                self.env[name] = value

    def host_path(self, sandbox_path: str) -> Path:
        """The host path of an absolute path inside the sandbox, resolving symlinks as the sandbox would.

        The sandbox's whole `/` is addressed (`fs`); a symlink cannot lead outside it.
        """
        if not sandbox_path.startswith("/"):
            raise SandboxError(f"sandbox path {sandbox_path!r} must be absolute")
        pending = [p for p in sandbox_path.split("/") if p][::-1]
        resolved: list[str] = []
        hops = 0
        while pending:
            part = pending.pop()
            if part == ".":
                continue
            if part == "..":
                resolved = resolved[:-1]
                continue
            candidate = self.fs.joinpath(*resolved, part)
            if candidate.is_symlink():
                hops += 1
                if hops > 40:
                    raise SandboxError(f"too many symlinks under sandbox path {sandbox_path}")
                target = os.readlink(candidate)
                if target.startswith("/"):
                    resolved = []
                pending.extend([p for p in target.split("/") if p][::-1])
                continue
            resolved.append(part)
        return self.fs.joinpath(*resolved)

    def _replace(self, sandbox_path: str) -> Path:
        """Remove whatever is at `sandbox_path` (not following a final symlink); return its host path."""
        path = posixpath.normpath(sandbox_path)
        target = self.host_path(posixpath.dirname(path)) / posixpath.basename(path)
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():
            shutil.rmtree(target, onerror=force_remove)
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def copy_in(self, host_path: Path, sandbox_path: str) -> None:
        """Put a host file or folder at `sandbox_path`, replacing whatever the sandbox had there.

        Use it for `tests/` only after the agent has stopped: until then the verifier is not in the
        sandbox at all. Symlinks the agent may have left on the way are resolved inside the sandbox.
        """
        host_path = Path(host_path)
        if not host_path.exists():
            raise SandboxError(f"cannot copy {host_path} into the sandbox: it does not exist")
        target = self._replace(sandbox_path)
        if host_path.is_dir():
            copy_tree(host_path, target)
        else:
            shutil.copy2(host_path, target)

    def copy_logs_out(self, sandbox_path: str, host_path: Path, first: Sequence[str] = ()) -> list[str]:
        """Copy the regular files of a folder of the sandbox out as logs, at most `bounds.log_bytes` in all, those
        named in `first` (relative paths) first; returns notes on what was cut (`common.copy_logs`). Symlinks, FIFOs
        and devices are not logs and are left behind; a folder that is not there copies nothing."""
        source = self.host_path(sandbox_path)
        if not source.is_dir() or source.is_symlink():
            return []
        files = [(path, Path(host_path) / path.relative_to(source)) for path in files_under(source, first)]
        return copy_logs(files, self.bounds.log_bytes)[1]

    def reset_dir(self, sandbox_path: str) -> Path:
        """Make `sandbox_path` an empty folder (e.g. /logs/verifier before grading); return its host path."""
        target = self._replace(sandbox_path)
        target.mkdir(mode=0o777)
        return target
