"""A local sandbox's resource limits: the task's `[environment]` cpus and memory_mb and a process cap as
cgroups, and its storage_mb as a disk of its own.

    limits = Limits.create("of-r0", cpus=1, memory_mb=1024)      # None fields: not limited
    argv = limits.wrap(["bwrap", ...])                             # the command joins the cgroups before it starts
    limits.remove()
    notes = attach_disk(Path("ROOT/disk.img"), Path("ROOT/upper"), 1024)   # the rollout's changes: 1,024 MiB at most
    detach_disk(Path("ROOT/upper"))

cgroup v2 (one unified tree, `memory.max`, `pids.max`, `cpu.max`) where the host has it, else v1's
`memory`, `pids` and `cpu` hierarchies. A controller the host does not offer (or a host where the runner
may not make cgroups) is not enforced, and `Limits.notes` says which: local mode cannot invent limits the
kernel does not give it. The process cap is `OPENFORGE_SANDBOX_PIDS` (default 1024) for every task:
Harbor's task.toml has no field for it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "openforge"
DEFAULT_PIDS = 1024
CPU_PERIOD_US = 100_000


@dataclass
class Limits:
    """The cgroups one sandbox's commands run in; `procs` are the `cgroup.procs` files a command joins."""

    folders: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def procs(self) -> list[Path]:
        return [folder / "cgroup.procs" for folder in self.folders]

    @classmethod
    def create(cls, name: str, *, cpus: float | None, memory_mb: int | None) -> Limits:
        """Make the sandbox's cgroups and set the limits; what cannot be enforced is noted, never fatal."""
        pids = int(os.environ.get("OPENFORGE_SANDBOX_PIDS", DEFAULT_PIDS))
        wanted = {"memory": memory_mb * 1024 * 1024 if memory_mb else None, "pids": pids,
                  "cpu": int(cpus * CPU_PERIOD_US) if cpus else None}
        limits = cls()
        unified = (CGROUP_ROOT / "cgroup.controllers").is_file()
        for controller, value in wanted.items():
            if value is None:
                continue
            try:
                limits._set(controller, value, name, unified)
            except OSError as exc:
                limits.notes.append(f"the {controller} limit is not enforced in local mode on this host "
                                    f"(cgroup {controller}: {exc.strerror or exc})")
        return limits

    def _set(self, controller: str, value: int, name: str, unified: bool) -> None:
        if unified:
            parent = CGROUP_ROOT / PARENT
            parent.mkdir(exist_ok=True)
            (CGROUP_ROOT / "cgroup.subtree_control").write_text(f"+{controller}")
            (parent / "cgroup.subtree_control").write_text(f"+{controller}")
            folder = parent / name
            files = {"memory": ("memory.max", str(value)), "pids": ("pids.max", str(value)),
                     "cpu": ("cpu.max", f"{value} {CPU_PERIOD_US}")}
        else:
            hierarchy = CGROUP_ROOT / controller
            if not hierarchy.is_dir():
                raise FileNotFoundError(2, f"no {controller} hierarchy under {CGROUP_ROOT}")
            folder = hierarchy / PARENT / name
            files = {"memory": ("memory.limit_in_bytes", str(value)), "pids": ("pids.max", str(value)),
                     "cpu": ("cpu.cfs_quota_us", str(value))}
        folder.mkdir(parents=True, exist_ok=True)
        if controller == "cpu" and not unified:
            (folder / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
        file_name, text = files[controller]
        (folder / file_name).write_text(text)
        if controller == "memory" and not unified and (folder / "memory.memsw.limit_in_bytes").exists():
            (folder / "memory.memsw.limit_in_bytes").write_text(text)  # no escape into swap
        if folder not in self.folders:
            self.folders.append(folder)

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run by a shell that first moves itself into every cgroup, so nothing starts outside them."""
        if not self.folders:
            return argv
        join = 'while [ "$1" != -- ]; do echo $$ > "$1"; shift; done; shift; exec "$@"'
        return ["/bin/sh", "-c", join, "sh", *map(str, self.procs), "--", *argv]

    @staticmethod
    def sweep() -> None:
        """Delete the (empty) cgroups of runners that died without deleting them (named `NAME-PID-N`)."""
        for parent in [CGROUP_ROOT / PARENT, *(CGROUP_ROOT / c / PARENT for c in ("memory", "pids", "cpu"))]:
            if not parent.is_dir():
                continue
            for folder in parent.iterdir():
                owner = folder.name.rsplit("-", 2)
                if (folder.is_dir() and len(owner) == 3 and owner[1].isdigit() and int(owner[1]) != os.getpid()
                        and not Path(f"/proc/{owner[1]}").exists()):
                    try:
                        folder.rmdir()
                    except OSError:
                        pass

    def remove(self) -> None:
        """Delete the cgroups (each must be empty: call after the sandbox's processes are gone)."""
        for folder in self.folders:
            try:
                folder.rmdir()
            except OSError:
                pass
        self.folders = []


def attach_disk(image: Path, mountpoint: Path, size_mb: int) -> list[str]:
    """Mount a fresh ext4 file system of `size_mb` MiB (a sparse file `image`) at `mountpoint`.

    Everything the agent writes lands there (the sandbox's upper layer), so filling it is the agent's own
    ENOSPC, never the runner's full disk. Returns notes: empty, or why the limit is not enforced (no loop
    devices, no mkfs.ext4), in which case `mountpoint` is left a plain folder.
    """
    mountpoint.mkdir(parents=True, exist_ok=True)
    if shutil.which("mkfs.ext4") is None:
        return ["storage_mb is not enforced in local mode on this host (no mkfs.ext4)"]
    with open(image, "wb") as handle:
        handle.truncate(size_mb * 1024 * 1024)
    steps = [["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "nodiscard", str(image)],
             ["mount", "-o", "loop,nosuid,nodev", str(image), str(mountpoint)]]
    for argv in steps:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            image.unlink(missing_ok=True)
            reason = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
            return [f"storage_mb is not enforced in local mode on this host ({argv[0]}: {reason})"]
    return []


def detach_disk(mountpoint: Path) -> None:
    """Unmount the disk at `mountpoint` (if one is mounted there); its image keeps what was written."""
    if os.path.ismount(mountpoint):
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, check=False)
