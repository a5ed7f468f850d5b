"""The rollout pod as the sandbox: on Kubernetes the pod already runs the task's image, so nothing is
built and nothing is bound; commands are plain subprocesses of the runner.

    from steps.pod import PodSandbox
    box = PodSandbox.create(Path("/tmp/rollout"), task)         # workdir: [environment] workdir or the pod's cwd
    box.run(argv, timeout_s=300, env={...}, stdout_path=log, as_agent=True)   # as uid 10001, then everything it left is killed
    run_verifier(box, task, Path("/tmp/rollout/verifier"))      # as root; tests/ copied to /tests only now

The pod's `/` is the sandbox's `/` (`host_path("/app")` is `/app`), so `steps.tasks.verify` grades in the
pod exactly as it grades in a bubblewrap sandbox. The workspace is the image's WORKDIR, which is the
pod's working folder when the template sets none (or `[environment] workdir`).

When the runner is root, the agent's command runs as an unprivileged uid (`AGENT_UID`, no supplementary
groups, `no_new_privs` so setuid programs cannot raise it back) that owns only its workspace, `/logs/agent`
and a fresh HOME: it cannot read the runner's `/proc/<pid>/environ` (the admin key), root-only files such
as the tasks' verifiers (the init container keeps them in a 0700 folder), or signal the runner. When
the command ends or times out, every process of that uid is killed before the verifier runs. A runner
that is not root cannot switch users: the agent then runs as the runner's uid, is NOT uid-isolated, and
only its session is killed; `notes` (and so result.json) says so.

What the pod does not isolate is in docs/rollouts.md (network, the node's kernel, what the image itself
leaves readable).
"""

from __future__ import annotations

import ctypes
import os
import posixpath
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from steps.sandbox import KILL_GRACE_S, Bind, RunResult, Sandbox, SandboxError, _kill, wait_for
from steps.tasks import Task

AGENT_UID = 10001
AGENT_LOGS = "/logs/agent"
# Never the workspace, whatever the image's WORKDIR says: handing these (or, for the trees, anything inside
# them) to the agent uid would break the pod or give it OpenForge's own files.
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/openforge", "/proc", "/root", "/sbin", "/sys",
                "/usr")
SYSTEM_FOLDERS = frozenset({"/", "/home", "/logs", "/opt", "/run", "/srv", "/tmp", "/var"})
PR_SET_NO_NEW_PRIVS = 38


@dataclass
class PodSandbox(Sandbox):
    """The pod's own file system as a `Sandbox`; `agent_uid` is None when the runner is not root."""

    agent_uid: int | None = AGENT_UID

    @property
    def fs(self) -> Path:
        """The pod's `/` is the sandbox's `/`."""
        return Path("/")

    @classmethod
    def create(cls, root: Path, task: Task, *, agent_uid: int = AGENT_UID) -> PodSandbox:
        """The pod as `task`'s sandbox; `root` (the rollout's output folder) becomes root-only.

        Raises `SandboxError` when the workspace is a system folder or, with a root runner, when the task
        folder (its verifier and oracle) is readable by the agent uid.
        """
        root = Path(root).absolute()
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o700)  # harness.log and, later, the verifier's output: not for the agent
        workdir = posixpath.normpath(posixpath.join("/", task.config.workdir or os.getcwd()))
        if workdir in SYSTEM_FOLDERS or any(workdir == tree or workdir.startswith(tree + "/") for tree in SYSTEM_TREES):
            raise SandboxError(f"the workspace would be {workdir}, a system folder the agent must not own; give the "
                               "image a WORKDIR such as /app or set [environment] workdir")
        box = cls(root=root, workdir=workdir, agent_uid=agent_uid if os.geteuid() == 0 else None)
        box.apply_task_env(task)
        box.notes.append("pod mode: the pod's image is the environment (environment/Dockerfile is not replayed, "
                         "its ENV is not passed to the agent)")
        if box.agent_uid is None:
            box.notes.append(f"the runner is not root, so the agent runs as the runner's own uid {os.geteuid()}: it is "
                             "NOT uid-isolated (it can read the runner's files and /proc/<pid>/environ)")
            print(f"warning: {box.notes[-1]}", file=sys.stderr)
        elif not hidden_from(task.path, box.agent_uid):
            raise SandboxError(f"the task folder {task.path} (verifier and oracle) is readable by the agent uid "
                               f"{box.agent_uid}; keep tasks in a root-only folder (mode 0700), as the rollout pod's "
                               "init container does")
        Path(workdir).mkdir(parents=True, exist_ok=True)
        for folder in (AGENT_LOGS, "/logs/verifier", "/logs/artifacts"):
            Path(folder).mkdir(parents=True, exist_ok=True)
        box.home = tempfile.mkdtemp(prefix="openforge-agent-home-", dir="/tmp")
        return box

    def run(self, argv: Sequence[str], *, timeout_s: float, env: dict[str, str] | None = None,
            cwd: str | None = None, stdout_path: Path | None = None, extra_binds: Sequence[Bind] = (),
            network: object = None, as_agent: bool = False) -> RunResult:
        """Run `argv` in the pod; kill what it started when it ends or at `timeout_s`.

        `as_agent`: as the agent uid (when the runner is root), after handing it the workspace,
        `/logs/agent` and HOME; otherwise as the runner (the verifier runs as root). stdout and
        stderr go together to `stdout_path` (appended); stdin is empty; the environment is only the
        sandbox's plus `env`. `extra_binds` and `network` mean nothing here: the pod already holds
        the harness and has one network. A program that cannot be executed gives exit code 127/126,
        as in a shell.
        """
        cwd = cwd or self.workdir
        if not Path(cwd).is_dir():
            raise SandboxError(f"working directory {cwd} does not exist in the pod")
        uid = self.agent_uid if as_agent else None
        if uid is not None:
            for path in (self.workdir, AGENT_LOGS, self.home):
                give(Path(path), uid)
        user = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
        started = time.monotonic()
        with open(stdout_path or self.root / "run.log", "ab") as output:
            try:
                process = subprocess.Popen(list(argv), env={**self.env, **(env or {})}, cwd=cwd, stdin=subprocess.DEVNULL,
                                           stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
                                           preexec_fn=_no_new_privileges, **user)
            except OSError as exc:
                output.write(f"cannot execute {argv[0]}: {exc}\n".encode())
                return RunResult(exit_code=127 if isinstance(exc, FileNotFoundError) else 126, timed_out=False,
                                 duration_s=round(time.monotonic() - started, 3))
        timed_out = wait_for(process, timeout_s, lambda: _stop(process, uid))
        return RunResult(exit_code=process.returncode, timed_out=timed_out,
                         duration_s=round(time.monotonic() - started, 3))

    def for_verifier(self, task: Task) -> PodSandbox:
        """The pod itself: the agent uid's processes are gone and it could write only its own places."""
        return self

    def close(self) -> None:
        """Nothing to unmount: the pod's `/` is its own."""

    def remove(self) -> None:
        """Nothing to delete: the pod goes away with its files."""


def give(path: Path, uid: int) -> None:
    """Make `path` and everything under it owned by `uid` (links themselves, never their targets)."""
    os.lchown(path, uid, uid)
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(folder, name), uid, uid)


def hidden_from(path: Path, uid: int) -> bool:
    """Whether `uid` (with gid `uid` and no other group) cannot reach `path`: some folder on the way
    is closed to it.

    >>> hidden_from(Path("/root/anything"), 10001) == (os.stat("/root").st_mode & 0o001 == 0)
    True
    """
    for folder in [path, *path.parents]:
        try:
            st = folder.stat()
        except OSError:
            continue
        if st.st_uid == uid:
            continue
        allowed = 0o010 if st.st_gid == uid else 0o001
        if not st.st_mode & allowed:
            return True
    return False


def _no_new_privileges() -> None:
    """In the child before exec: setuid programs can no longer raise its privileges."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def _status(pid: str) -> dict[str, str]:
    """/proc/PID/status as a dict ({} when the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return dict(line.rstrip("\n").split(":\t", 1) for line in status if ":\t" in line)
    except OSError:
        return {}


def _live(belongs: Callable[[dict[str, str]], bool]) -> list[int]:
    """Live (non-zombie) pids whose status satisfies `belongs`."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            status = _status(entry)
            if status and status.get("State", "Z")[0] not in "ZX" and belongs(status):
                pids.append(int(entry))
    return pids


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` at once: a child that becomes `uid` and sends kill(-1), which a
    forking agent cannot outrun (it reaches every process the sender may signal, all of that uid)."""
    child = os.fork()
    if child == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(child, 0)


def _stop(process: subprocess.Popen, uid: int | None) -> None:
    """Kill the command and everything it started: every process of the agent uid, or (without one)
    every process of its session; return once none is left."""
    if uid is not None:
        def members() -> list[int]:
            return _live(lambda status: status["Uid"].split()[0] == str(uid))
    else:
        def members() -> list[int]:
            return _live(lambda status: status.get("NSsid", "").split()[-1:] == [str(process.pid)])
    deadline = time.monotonic() + KILL_GRACE_S
    while True:
        survivors = members() + ([process.pid] if process.poll() is None else [])
        if not survivors:
            return
        if time.monotonic() > deadline:
            raise SandboxError(f"processes {survivors[:5]} of the command survived SIGKILL")
        if uid is not None:
            _kill_uid(uid)
        for pid in survivors:
            _kill(pid)
        time.sleep(0.05)
