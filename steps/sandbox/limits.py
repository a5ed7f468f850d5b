"""A local sandbox's resource limits: the task's `[environment]` cpus and memory_mb and a process cap as
cgroups, the harness's own budget as a cgroup beside them, and the task's storage_mb as a disk of its own.

    limits = Limits.create("of-r0", cpus=1, memory_mb=1024, harness=Budget(memory_mb=1024, cpus=1))
    argv = limits.wrap(["bwrap", ...], harness=True)     # joins the harness's cgroups before it starts
    with HarnessSplit(limits, programs, host_pid, init_pid):  # its tool processes move to the task's cgroups
        ...
    limits.hits()                                         # [{"process": "harness", "by": "memory", "count": 1}]
    limits.remove()
    notes = attach_disk(Path("ROOT/disk.img"), Path("ROOT/upper"), 1024)   # the rollout's changes: 1,024 MiB at most
    detach_disk(Path("ROOT/upper"))

A Harbor task sizes `memory_mb` and `cpus` for its environment, not for an agent harness beside it (Node,
a session store, dozens of tools: OpenClaw alone does not fit in 1 GB with a task), so the harness is not
charged to the task. A sandbox has two groups: the task's (`agent`: the agent's commands, the verifier, the
task's app) with the task's limits, and the harness's with its own budget (`steps.harnesses`, `MEMORY_MB` and
`CPUS` of its module, or the run's `harness_memory_mb`). Their sum bounds the rollout. The harness starts in its
group; its tool processes are the agent's, and `HarnessSplit` moves each of them (with whatever it started) into
the task's group as it appears (every `SPLIT_POLL_S`): a process of the harness's group is the harness's own
only if it is the command itself, or runs one of the harness's own programs and was started by one of the
harness's own processes (never by the sandbox's init, which adopts what a tool left behind). What moved never
comes back: a tool that runs the harness's Node stays the agent's. On cgroup v1 the memory a process used
before it moved moves with it (`memory.move_charge_at_immigrate`); on v2 it stays charged to the harness,
which is why the split is a fair share and the sum the hard bound. A harness killed by its own limit is graded
like any rollout that ended (docs/reliability.md): its tools could have caused it.

cgroup v2 (one unified tree, `memory.max`, `pids.max`, `cpu.max`) where the host has it, else v1's
`memory`, `pids` and `cpu` hierarchies. A controller the host does not offer (or a host where the runner
may not make cgroups) is not enforced, and `Limits.notes` says which: local mode cannot invent limits the
kernel does not give it. The process cap is `OPENFORGE_SANDBOX_PIDS` (default 1024) for each group:
Harbor's task.toml has no field for it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "openforge"
HARNESS_PREFIX = "harness-"  # the harness's group is `harness-NAME` beside the task's `NAME`
DEFAULT_PIDS = 1024
CPU_PERIOD_US = 100_000
CONTROLLERS = ("memory", "pids", "cpu")
SPLIT_POLL_S = 0.02


@dataclass(frozen=True)
class Budget:
    """What one group may use: memory in MiB and CPUs (None: not limited); the process cap is everyone's."""

    memory_mb: int | None
    cpus: float | None


@dataclass
class Group:
    """One cgroup of a sandbox: one folder on cgroup v2, one per controller's hierarchy on v1."""

    process: str  # whose it is: "agent" (the task's) or "harness"
    folders: dict[str, Path] = field(default_factory=dict)  # controller -> folder

    @property
    def procs(self) -> list[Path]:
        """The `cgroup.procs` files a process joins (one per distinct folder)."""
        return [folder / "cgroup.procs" for folder in dict.fromkeys(self.folders.values())]

    def members(self) -> list[int]:
        """The processes in the group now."""
        for path in self.procs[:1]:
            try:
                return [int(pid) for pid in path.read_text().split()]
            except OSError:
                return []
        return []

    def take(self, pid: int) -> None:
        """Moves a process (all its threads) into this group, in every hierarchy; one already gone is ignored."""
        for path in self.procs:
            try:
                path.write_text(str(pid))
            except OSError:
                pass

    def hits(self) -> list[dict]:
        """What the group's limits did: memory (processes the OOM killer killed) and pids (forks refused at the cap).

        cgroup v2 counts both in `memory.events`/`pids.events`; v1 in `memory.oom_control` ("oom_kill N") and
        `pids.events` ("max N")."""
        found = []
        for controller, files, key in (("memory", ("memory.events", "memory.oom_control"), "oom_kill"),
                                       ("pids", ("pids.events",), "max")):
            folder = self.folders.get(controller)
            for name in files if folder is not None else ():
                count = cgroup_counter(folder / name, key)
                if count:
                    found.append({"process": self.process, "by": controller, "count": count})
                    break
        return found


def cgroup_counter(path: Path, key: str) -> int:
    """The number after `key` in a cgroup's flat-keyed file (0 when the file or key is not there)."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


@dataclass
class Limits:
    """The cgroups one sandbox's commands run in: the task's (`agent`) and, for a harness, its own (`harness`), both
    below the rollout's (`rollout`), whose memory limit is their sum."""

    agent: Group = field(default_factory=lambda: Group("agent"))
    harness: Group | None = None
    rollout: Group = field(default_factory=lambda: Group("rollout"))
    notes: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, name: str, *, cpus: float | None, memory_mb: int | None,
               harness: Budget | None = None) -> Limits:
        """Make the sandbox's cgroups and set the limits; what cannot be enforced is noted, never fatal.

        `PARENT/name` is the rollout's, limited to the task's memory plus the harness's; `PARENT/name/agent` has the
        task's memory, CPUs and process cap; `PARENT/name/harness` (with `harness`) its CPUs and process cap and no
        memory limit of its own, so a tool process that used memory before it moved out (charged to the harness on
        cgroup v2, and on v1 where the kernel no longer moves charges) cannot get the harness killed below the sum."""
        limits = cls(harness=Group("harness") if harness is not None else None)
        unified = (CGROUP_ROOT / "cgroup.controllers").is_file()
        pids = int(os.environ.get("OPENFORGE_SANDBOX_PIDS", DEFAULT_PIDS))
        total = (memory_mb or 0) + (harness.memory_mb or 0 if harness is not None else 0)
        groups = [(limits.rollout, name, {"memory": total}),
                  (limits.agent, f"{name}/agent", {"memory": memory_mb, "pids": pids, "cpu": cpus})]
        if harness is not None:
            groups.append((limits.harness, f"{name}/harness", {"pids": pids, "cpu": harness.cpus}))
        for group, path, wanted in groups:
            for controller in CONTROLLERS:
                try:
                    group.folders[controller] = _make(controller, wanted.get(controller), path, unified)
                except OSError as exc:
                    note = (f"the {controller} limit is not enforced in local mode on this host "
                            f"(cgroup {controller}: {exc.strerror or exc})")
                    if note not in limits.notes:
                        limits.notes.append(note)
        if limits.harness is not None and "memory" in limits.agent.folders and not unified:
            try:  # v1, where the kernel still has it: what a tool used in the harness's group moves with it
                (limits.agent.folders["memory"] / "memory.move_charge_at_immigrate").write_text("3")
            except OSError:
                pass
        return limits

    @property
    def groups(self) -> list[Group]:
        """The groups processes run in."""
        return [self.agent, *([self.harness] if self.harness is not None else [])]

    def wrap(self, argv: list[str], harness: bool = False) -> list[str]:
        """`argv` run by a shell that first moves itself into every cgroup of the task's group (or, with `harness`,
        of the harness's), so nothing starts outside them."""
        group = self.harness if harness and self.harness is not None else self.agent
        if not group.folders:
            return argv
        join = 'while [ "$1" != -- ]; do echo $$ > "$1"; shift; done; shift; exec "$@"'
        return ["/bin/sh", "-c", join, "sh", *map(str, group.procs), "--", *argv]

    def hits(self, harness_killed: bool = False) -> list[dict]:
        """What the limits did: processes the OOM killer killed ("memory") and forks refused at a process cap ("pids").

        An OOM kill is the harness's when the harness itself ended by SIGKILL (`harness_killed`) and the rollout had
        one; every other is one of the agent's processes, wherever the kernel counted it (a tool process still in
        the harness's group when it was killed is counted there)."""
        def killed(groups: list[Group]) -> int:
            return sum(hit["count"] for group in groups for hit in group.hits() if hit["by"] == "memory")

        memory = max(killed(self.groups), killed([self.rollout]))  # v1 may count a kill where the limit was hit
        found = []
        if memory and harness_killed:
            found.append({"process": "harness", "by": "memory", "count": 1})
            memory -= 1
        if memory:
            found.append({"process": "agent", "by": "memory", "count": memory})
        return found + [hit for group in reversed(self.groups) for hit in group.hits() if hit["by"] == "pids"]

    def peaks_mb(self) -> dict[str, int]:
        """The most memory each group held at once, in MiB (v2 `memory.peak`, v1 `memory.max_usage_in_bytes`)."""
        peaks = {}
        for group in self.groups:
            folder = group.folders.get("memory")
            for name in ("memory.peak", "memory.max_usage_in_bytes") if folder is not None else ():
                try:
                    peaks[group.process] = int((folder / name).read_text().split()[0]) // (1024 * 1024)
                    break
                except (OSError, ValueError, IndexError):
                    continue
        return peaks

    @staticmethod
    def sweep() -> None:
        """Delete the (empty) cgroups of runners that died without deleting them (named `NAME-PID-N`)."""
        for parent in [CGROUP_ROOT / PARENT, *(CGROUP_ROOT / c / PARENT for c in CONTROLLERS)]:
            if not parent.is_dir():
                continue
            for folder in parent.iterdir():
                owner = folder.name.rsplit("-", 2)
                if (folder.is_dir() and len(owner) == 3 and owner[1].isdigit() and int(owner[1]) != os.getpid()
                        and not Path(f"/proc/{owner[1]}").exists()):
                    for child in (folder / "agent", folder / "harness", folder):
                        try:
                            child.rmdir()
                        except OSError:
                            pass

    def remove(self) -> None:
        """Delete the cgroups (each must be empty: call after the sandbox's processes are gone), children first."""
        for group in [*self.groups, self.rollout]:
            for folder in dict.fromkeys(group.folders.values()):
                try:
                    folder.rmdir()
                except OSError:
                    pass
        self.agent, self.harness, self.rollout = Group("agent"), None, Group("rollout")


def _make(controller: str, value: float | None, name: str, unified: bool) -> Path:
    """Make (or reuse) the cgroup `name` (a path) under `PARENT` and, unless `value` is None, limit `controller` there
    (memory in MiB, pids, CPUs); return its folder."""
    if unified:
        folder = CGROUP_ROOT / PARENT / name
        for above in [CGROUP_ROOT / part for part in reversed(folder.relative_to(CGROUP_ROOT).parents)]:
            above.mkdir(exist_ok=True)  # each cgroup above it hands the controller down to its children
            (above / "cgroup.subtree_control").write_text(f"+{controller}")
        files = {"memory": "memory.max", "pids": "pids.max", "cpu": "cpu.max"}
    else:
        hierarchy = CGROUP_ROOT / controller
        if not hierarchy.is_dir():
            raise FileNotFoundError(2, f"no {controller} hierarchy under {CGROUP_ROOT}")
        folder = hierarchy / PARENT / name
        files = {"memory": "memory.limit_in_bytes", "pids": "pids.max", "cpu": "cpu.cfs_quota_us"}
    folder.mkdir(parents=True, exist_ok=True)
    if value is None or (controller == "memory" and not value):
        return folder
    text = {"memory": str(int(value) * 1024 * 1024), "pids": str(int(value)),
            "cpu": f"{int(value * CPU_PERIOD_US)} {CPU_PERIOD_US}" if unified else str(int(value * CPU_PERIOD_US))}[controller]
    if controller == "cpu" and not unified:
        (folder / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
    (folder / files[controller]).write_text(text)
    if controller == "memory" and not unified and (folder / "memory.memsw.limit_in_bytes").exists():
        (folder / "memory.memsw.limit_in_bytes").write_text(text)  # no escape into swap
    return folder


@dataclass(frozen=True)
class Process:
    """What the split reads of a process: its parent (host pid), its pid inside the sandbox, its program."""

    parent: int
    inner_pid: int | None  # its pid in the sandbox's PID namespace; None on the host or in a namespace nested deeper
    program: str | None  # /proc/PID/exe as the process sees it (inside its own root), None if unreadable


def read_process(pid: int) -> Process | None:
    """`Process` of a host pid; None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
    except OSError:
        return None
    try:
        program = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        program = None
    levels = fields.get("NSpid", "").split()  # this runner's namespace first, then each one nested below it
    return Process(parent=int(fields.get("PPid", "0").strip() or 0),
                   inner_pid=int(levels[1]) if len(levels) == 2 else None, program=program)


def harness_own(pid: int, processes: dict[int, Process], programs: tuple[str, ...], host_pid: int) -> bool:
    """Whether a process of the harness's group is the harness's own (else it is one of the agent's tools).

    Its own: the sandbox's launcher on the host (`host_pid`: the wrapper that becomes bwrap), the sandbox's init
    (pid 1 inside) and the command (pid 2 inside: the harness itself), and any process running one of `programs`
    (path prefixes) whose parent is one of its own other than the init (which adopts what a tool left behind).

    A process in a PID namespace of its own below the sandbox's (a tool's `unshare -p`) has no pid there, so it
    cannot pass for the init or the command.

    >>> procs = {10: Process(1, None, "/usr/bin/bwrap"), 11: Process(10, 1, "/usr/bin/bwrap"),
    ...          12: Process(11, 2, "/opt/h/node"), 13: Process(12, 3, "/usr/bin/bash"),
    ...          14: Process(13, 4, "/opt/h/node"), 15: Process(12, 5, "/opt/h/node"), 16: Process(11, 6, "/opt/h/node")}
    >>> [pid for pid in procs if harness_own(pid, procs, ("/opt/h/",), 10)]
    [10, 11, 12, 15]
    """
    seen = set()
    while pid not in seen:
        seen.add(pid)
        process = processes.get(pid)
        if process is None:
            return False  # not in the group (moved already, or gone)
        if pid == host_pid or process.inner_pid in (1, 2):
            return True
        if process.program is None or not process.program.startswith(programs):
            return False
        parent = processes.get(process.parent)
        if parent is None or parent.inner_pid == 1:
            return False
        pid = process.parent
    return False


class HarnessSplit:
    """While a harness runs (`with` block): every `SPLIT_POLL_S`, the processes of the harness's group that are not
    its own (`harness_own`) move into the task's group, with everything they started. `moved` counts them."""

    def __init__(self, limits: Limits, programs: tuple[str, ...], host_pid: int):
        self.limits, self.programs, self.host_pid = limits, programs, host_pid
        self.moved = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="harness-split", daemon=True)

    def __enter__(self) -> HarnessSplit:
        if self.limits.harness is not None and self.limits.harness.folders and self.limits.agent.folders:
            self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def split_once(self) -> None:
        """One pass: read the harness's group and move what is not its own."""
        harness, agent = self.limits.harness, self.limits.agent
        members = harness.members()
        processes = {pid: process for pid in members if (process := read_process(pid)) is not None}
        for pid in processes:
            if not harness_own(pid, processes, self.programs, self.host_pid):
                agent.take(pid)
                self.moved += 1

    def _watch(self) -> None:
        while not self._stop.wait(SPLIT_POLL_S):
            self.split_once()


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
