"""The local stand-in for a task's container: a folder on the host seen as `/` through bubblewrap.

Every rollout gets its own sandbox root folder; `ROOT/fs` holds the sandbox's own files (`/app`,
`/logs/agent`, `/logs/verifier`, `/tmp`, `/root`...), so a task's absolute paths work unchanged. Each
`run()` starts `bwrap` with that folder bound read-write as `/`, the host's `/usr`, `/bin`, `/lib*`,
`/sbin` and `/etc` bound read-only over it, a fresh `/proc` and `/dev`, new user (uid 0 inside), PID,
IPC and UTS namespaces, all capabilities dropped, `--die-with-parent --new-session`, and a clean
environment (PATH, HOME=/root, LANG, the Dockerfile's ENV, what the caller passes). The network is
shared with the host by default, because a harness must reach the recording proxy on 127.0.0.1;
`network=False` adds `--unshare-net` (loopback only, inside the sandbox).

Without a container engine the workspace is prepared from `environment/Dockerfile` by applying its
WORKDIR, COPY/ADD (local build context), ENV, ARG, SHELL and RUN instructions inside the sandbox;
FROM is replaced by the host system and USER is ignored, each said so in `Sandbox.notes`:

    from steps.sandbox import Sandbox
    from steps.tasks import load_task
    task = load_task("steps/tasks/builtin/hello-file")
    box = Sandbox.create(Path("/tmp/rollout-1"), task)          # raises SandboxError on a failing RUN
    box.run(["bash", "-c", "echo hello > /app/answer.txt"], timeout_s=60, stdout_path=Path("/tmp/agent.log"))
    box.copy_in(task.tests_dir, "/tests")                         # only after the agent has stopped
    box.run(["bash", "/tests/test.sh"], timeout_s=60)
    box.host_path("/logs/verifier/reward.txt").read_text()

A harness installed on the host is brought in read-only with `extra_binds`, e.g.
`[(Path.home() / ".cache/openforge/harnesses", "/opt/openforge/harnesses", True)]`.

What local mode does NOT isolate, unlike a real container:
- the network: the sandbox shares the host's interfaces, including every service on 127.0.0.1
  (unless `network=False`), so anything listening on the host's loopback is reachable;
- the kernel, and the host's CPU, memory and disk: `[environment]` resources are not enforced;
- the image: programs come from the host's /usr and /etc (read-only), not from the task's image, so
  a RUN that installs system packages (apt-get, pip into /usr) fails with a read-only file system;
- the user: uid 0 inside is the invoking host user outside (real root when the runner is root), with
  no capabilities on host objects; /etc is the host's (shadow files are masked, the rest readable);
- process lifetime: each `run()` is its own PID namespace, so a server the agent starts in the
  background is gone when its command ends (and before the verifier runs);
- build details: .dockerignore, multi-stage builds, ADD from URLs and `RUN --mount` are not supported.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from steps.tasks import Task

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BASE_ENV = {"PATH": SANDBOX_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
# Host folders bound read-only (or recreated as the same symlink) at the same place in every sandbox.
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
MASKED_FILES = ("/etc/shadow", "/etc/gshadow")
# Folders every Harbor container has; the Dockerfile adds the rest (WORKDIR /app, ...).
LAYOUT = {"tmp": 0o1777, "root": 0o700, "logs/agent": 0o777, "logs/verifier": 0o777, "logs/artifacts": 0o777}
KILL_GRACE_S = 5.0

Bind = tuple[Path | str, str, bool]  # (host path, path inside the sandbox, read-only)


class SandboxError(RuntimeError):
    """The sandbox cannot be built or used; the message says why in one sentence (plus a log tail)."""


@dataclass(frozen=True)
class RunResult:
    """How one command in the sandbox ended.

    `exit_code` is the command's (127: no such program); after a timeout it is whatever the kill
    left (usually 137), so read `timed_out` first.
    """

    exit_code: int
    timed_out: bool
    duration_s: float


@dataclass
class Sandbox:
    """One rollout's sandbox: `root/fs` is its `/`; `workdir` and `env` come from the Dockerfile."""

    root: Path
    workdir: str = "/"
    env: dict[str, str] = field(default_factory=lambda: dict(BASE_ENV))
    notes: list[str] = field(default_factory=list)
    network: bool = True
    home: str = "/root"  # the agent's HOME, where its harness keeps config and session logs

    @property
    def fs(self) -> Path:
        """The host folder that is `/` inside the sandbox."""
        return self.root / "fs"

    @classmethod
    def create(cls, root: Path, task: Task, *, network: bool = True) -> Sandbox:
        """Make a fresh sandbox under `root` (which must not exist or be empty) and build the task's workspace.

        Applies `environment/Dockerfile` (see module docstring) under the task's build timeout; its RUN
        output goes to `root/build.log`. Raises `SandboxError` when bwrap is missing or a step fails.
        """
        if shutil.which("bwrap") is None:
            raise SandboxError("bubblewrap is not installed; install it with `apt-get install -y bubblewrap`")
        root = Path(root).absolute()
        if root.exists() and any(root.iterdir()):
            raise SandboxError(f"sandbox root {root} is not empty; every rollout needs a fresh folder")
        box = cls(root=root, network=network)
        box._make_layout()
        box.apply_task_env(task)
        if task.dockerfile is None:
            box.notes.append(f"image {task.config.docker_image} is replaced by the host system in local mode")
        else:
            from steps.sandbox_build import apply_dockerfile  # here, not at the top: the builder drives a Sandbox

            apply_dockerfile(box, task)
        if task.config.workdir:
            box.workdir = posixpath.normpath(posixpath.join("/", task.config.workdir))
            box.host_path(box.workdir).mkdir(parents=True, exist_ok=True)
        return box

    def apply_task_env(self, task: Task) -> None:
        """Add the task's `[environment] env` to every command's environment (host templates are noted, not set)."""
        for name, value in task.config.environment_env.items():
            if "${" in value:
                self.notes.append(f"[environment] env {name} is a host template, which OpenForge does not fill in; not set")
            else:
                self.env[name] = value

    def _make_layout(self) -> None:
        self.fs.mkdir(parents=True)
        for name in SYSTEM_DIRS:
            host = Path("/") / name
            if host.is_symlink():
                (self.fs / name).symlink_to(os.readlink(host))
            elif host.is_dir():
                (self.fs / name).mkdir()
        for name, mode in LAYOUT.items():
            (self.fs / name).mkdir(parents=True, exist_ok=True)
            (self.fs / name).chmod(mode)

    def run(self, argv: Sequence[str], *, timeout_s: float, env: dict[str, str] | None = None,
            cwd: str | None = None, stdout_path: Path | None = None, extra_binds: Sequence[Bind] = (),
            network: bool | None = None, as_agent: bool = False) -> RunResult:
        """Run `argv` inside the sandbox; kill its whole process tree at `timeout_s`.

        stdout and stderr go together to the host file `stdout_path` (appended; `root/run.log` when
        None); stdin is empty. `env` is added to the sandbox's environment, `cwd` defaults to the
        Dockerfile's WORKDIR. `as_agent` marks the agent's own command; it changes nothing here, where
        every command is uid 0 of its own user namespace (in a pod it selects the agent uid, see
        `steps.pod`). Returns after every process the command started has exited. Raises
        `SandboxError` when bubblewrap cannot set the sandbox up (an infrastructure failure, unlike
        the command's own exit code, which is returned).
        """
        cwd = cwd or self.workdir
        if not self.host_path(cwd).is_dir():
            raise SandboxError(f"working directory {cwd} does not exist in the sandbox")
        stdout_path = Path(stdout_path or self.root / "run.log")
        info_read, info_write = os.pipe()
        errors_read, errors_write = os.pipe()  # bwrap's own messages; the command's stderr joins its stdout
        args = self._bwrap_args(argv, cwd, extra_binds, self.network if network is None else network, info_write)
        started = time.monotonic()
        with open(stdout_path, "ab") as output:
            try:
                process = subprocess.Popen(args, env={**self.env, **(env or {})}, stdin=subprocess.DEVNULL,
                                           stdout=output, stderr=errors_write, pass_fds=(info_write,),
                                           start_new_session=True)
            finally:
                os.close(info_write)
                os.close(errors_write)
        init_pid, namespace = _read_info(info_read)

        def stop() -> None:
            if init_pid is not None:
                _stop(process, init_pid, namespace)
            process.wait()

        timed_out = wait_for(process, timeout_s, stop)
        with os.fdopen(errors_read, "rb") as errors:
            setup_error = errors.read().decode(errors="replace").strip()
        if setup_error:
            raise SandboxError(f"bubblewrap could not set up the sandbox: {setup_error.splitlines()[0]}")
        return RunResult(exit_code=process.returncode, timed_out=timed_out,
                         duration_s=round(time.monotonic() - started, 3))

    def _bwrap_args(self, argv: Sequence[str], cwd: str, binds: Sequence[Bind], network: bool,
                    info_fd: int) -> list[str]:
        args = ["bwrap", "--bind", str(self.fs), "/"]
        for name in SYSTEM_DIRS:
            host = Path("/") / name
            if host.is_dir() and not host.is_symlink():
                args += ["--ro-bind", str(host), f"/{name}"]
        for masked in MASKED_FILES:
            if Path(masked).is_file():
                args += ["--ro-bind", "/dev/null", masked]
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm",
                 "--unshare-user", "--uid", "0", "--gid", "0", "--unshare-pid", "--unshare-ipc",
                 "--unshare-uts", "--hostname", "sandbox", "--cap-drop", "ALL",
                 "--die-with-parent", "--new-session", "--info-fd", str(info_fd)]
        if not network:
            args.append("--unshare-net")
        for host, dest, read_only in binds:
            if not Path(host).exists():
                raise SandboxError(f"cannot bind {host} into the sandbox: it does not exist")
            args += ["--ro-bind" if read_only else "--bind", str(host), dest]
        # Inside, the command's stderr joins its stdout, so anything left on bwrap's stderr is bwrap's.
        return args + ["--chdir", cwd, "--", "/bin/sh", "-c", 'exec "$@" 2>&1', "sh", *argv]

    def host_path(self, sandbox_path: str) -> Path:
        """The host path of an absolute path inside the sandbox, resolving symlinks as the sandbox would.

        Only the sandbox's own files are addressed (not the host's read-only /usr, /etc); a symlink
        cannot lead outside `root/fs`.
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
            shutil.rmtree(target, onerror=_force_remove)
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

    def copy_out(self, sandbox_path: str, host_path: Path) -> None:
        """Copy a file or folder out of the sandbox (symlinks copied as links, never followed)."""
        source = self.host_path(sandbox_path)
        if source.is_dir():
            copy_tree(source, Path(host_path))
        elif source.is_file():
            Path(host_path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, host_path)
        else:
            raise SandboxError(f"{sandbox_path} does not exist in the sandbox")

    def reset_dir(self, sandbox_path: str) -> Path:
        """Make `sandbox_path` an empty folder (e.g. /logs/verifier before grading); return its host path."""
        target = self._replace(sandbox_path)
        target.mkdir(mode=0o777)
        return target

    def remove(self) -> None:
        """Delete the sandbox root and everything in it."""
        shutil.rmtree(self.root, onerror=_force_remove)


def wait_for(process: subprocess.Popen, timeout_s: float, stop: Callable[[], None]) -> bool:
    """Wait for `process` at most `timeout_s`, then `stop()` what it left (also on an error); True if it timed out."""
    try:
        process.wait(timeout=timeout_s)
        return False
    except subprocess.TimeoutExpired:
        return True
    finally:
        stop()


def _read_info(fd: int) -> tuple[int | None, str | None]:
    """The sandbox's init pid (on the host) and PID namespace ("pid:[N]") from bwrap's --info-fd.

    bwrap writes them and closes the pipe before the command starts; (None, None) if it failed first.
    """
    with os.fdopen(fd, "rb") as stream:
        data = stream.read()
    try:
        info = json.loads(data)
        return int(info["child-pid"]), f"pid:[{info['pid-namespace']}]"
    except (ValueError, KeyError, TypeError):
        return None, None


def _namespace_members(namespace: str) -> list[int]:
    """Live (non-zombie) host pids in a PID namespace."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") != namespace:
                continue
            with open(f"/proc/{entry}/stat") as stat_file:
                state = stat_file.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            members.append(int(entry))
    return members


def _stop(process: subprocess.Popen, init_pid: int, namespace: str) -> None:
    """Kill the sandbox's processes and bwrap itself; return once none of them is left.

    Killing the namespace's init makes the kernel kill every process in the namespace, and lets
    bwrap reap it and exit; bwrap's host process group is the fallback.
    """
    if process.poll() is None:
        _kill(init_pid)
        try:
            process.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            _kill(-process.pid)
            process.wait()
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline:
        survivors = _namespace_members(namespace)
        if not survivors:
            return
        for pid in survivors:
            _kill(pid)
        time.sleep(0.05)
    if _namespace_members(namespace):
        raise SandboxError(f"processes in sandbox namespace {namespace} survived SIGKILL")


def _kill(pid: int) -> None:
    """SIGKILL a pid (negative: a process group), ignoring one that is already gone."""
    try:
        if pid < 0:
            os.killpg(-pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def copy_tree(source: Path, target: Path) -> None:
    """Merge a folder into `target`, keeping modes; symlinks stay links; sockets and FIFOs are skipped."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in os.scandir(source):
        destination = target / entry.name
        if entry.is_symlink():
            if destination.is_symlink() or destination.is_file():
                destination.unlink()
            destination.symlink_to(os.readlink(entry.path))
        elif entry.is_dir():
            copy_tree(Path(entry.path), destination)
        elif entry.is_file():
            shutil.copy2(entry.path, destination)
    shutil.copystat(source, target)


def _force_remove(function, path, _exc_info) -> None:
    """rmtree's error hook: make a read-only folder writable and retry (tasks may chmod things 555)."""
    Path(path).parent.chmod(0o777)
    if not Path(path).is_symlink():
        Path(path).chmod(stat.S_IRWXU)
    function(path)
