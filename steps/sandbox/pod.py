"""The rollout pod as the sandbox: on Kubernetes the pod already runs the task's image, so nothing is
built and nothing is bound; commands are plain subprocesses of the runner.

    from steps.sandbox.pod import PodSandbox
    box = PodSandbox.create(Path("/tmp/rollout"), task)         # workdir: [environment] workdir or the pod's cwd
    box.run(argv, timeout_s=300, env={...}, stdout_path=log, as_agent=True)   # as uid 10001, then everything it left is killed
    run_verifier(box, task, Path("/tmp/rollout/verifier"))      # as root; tests/ copied to /tests only now

The pod's `/` is the sandbox's `/` (`host_path("/app")` is `/app`), so `steps.grading.verify` grades in the
pod exactly as it grades in a bubblewrap sandbox. The workspace is the image's WORKDIR, which is the
pod's working folder when the template sets none (or `[environment] workdir`).

When the runner is root, the agent's command runs as an unprivileged uid (`AGENT_UID`, no supplementary
groups, `no_new_privs` so setuid programs cannot raise it back) that owns only its workspace, `/logs/agent`
and a fresh HOME: it cannot read the runner's `/proc/<pid>/environ` (the admin key), root-only files such
as the tasks' verifiers (the init container keeps them in a 0700 folder), or signal the runner. When
the command ends or times out, every process of that uid is killed before the verifier runs. A runner
that is not root cannot switch users: the agent then runs as the runner's uid, is NOT uid-isolated, and
only its session is killed; `notes` (and so result.json) says so.

Before the agent starts, everything the verifier would execute or load (its PATH with the programs linked
there, Python's sys.path, /etc, the library folders; `/`, `/logs` and every folder above those) is closed to
the agent uid: write bits for group and other removed, anything it owns given to root; notes say what was
changed. Once it has stopped, `prepare_verifier(env)` checks that no process of that uid is left and
that none of those paths is open to it (else `VerifierRefused`: graded 0, never an infra error), removes
what it left in the scratch folders (/tmp, /var/tmp, /dev/shm) and in /tests, /solution and /logs/verifier,
and returns the verifier's environment with a fresh, empty, root-owned HOME and TMPDIR:

    try:
        env = box.prepare_verifier(env)            # then run_verifier(box, task, out, env)
    except VerifierRefused as exc:                 # reward 0, status ok, str(exc) in notes
        ...

A task with an `[environment] app` (a GUI task's site) gets it as the rollout pod's sidecar container
(`workflows.iteration`), in the same image and on the same loopback: the agent reaches it at 127.0.0.1 only. The
sidecar writes what the verifier grades on a volume of its own, at `APP_STATE_DIR` there; this container mounts
that volume read-only at `APP_LIVE`, which the init container made root-only (0700), so the agent uid can
neither read nor write it. `create` waits until the sidecar's ready file appears there (`SandboxError` after
`APP_START_TIMEOUT_S`: an infra error, retried, never a 0). When the agent's command ends and its processes are
gone, `run` keeps a copy of that state as ROOT/`APP_STATE_KEPT`; the verifier grades that copy, placed at
`APP_STATE_DIR` in this container (`for_verifier`), never the live folder, which the still running app (or
anything the agent set in motion through it) may change afterwards. This is what `steps.sandbox.app` does
locally, where the app is stopped at that moment instead.

What the pod does not isolate is in docs/rollouts.md (network, the node's kernel, what the image itself
leaves readable).
"""

from __future__ import annotations

import ctypes
import json
import os
import posixpath
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from steps.sandbox.app import APP_STATE_DIR, APP_STATE_KEPT, READY_FILE
from steps.sandbox.base import SOLUTION_DIR, TESTS_DIR, VERIFIER_DIR
from steps.sandbox.common import (KILL_GRACE_S, Bounds, Output, RunResult, SandboxError, VerifierRefused, copy_tree,
                                  force_remove, kill, wait_for)
from steps.sandbox.files import BASE_ENV, SandboxFiles
from steps.sandbox.limits import cgroup_counter
from steps.tasks import Task

AGENT_UID = 10001
AGENT_LOGS = "/logs/agent"
# The app sidecar's state volume (its APP_STATE_DIR) as this container mounts it: read-only, root-only.
APP_LIVE = Path("/var/lib/openforge/app-live")
APP_STATE = Path(APP_STATE_DIR)  # where the verifier finds the state as it was when the agent's command ended
# The sidecar starts with this container (after the init containers), so its browser or X display may still be
# starting on a loaded node: longer than the local START_TIMEOUT_S, well inside the rollout's setup margin
# (`steps.plan.SETUP_MARGIN_S`, part of the pod's deadline).
APP_START_TIMEOUT_S = 60.0
# Never the workspace, whatever the image's WORKDIR says: handing these (or, for the trees, anything inside
# them) to the agent uid would break the pod or give it OpenForge's own files.
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/openforge", "/proc", "/root", "/sbin", "/sys",
                "/usr")
SYSTEM_FOLDERS = frozenset({"/", "/home", "/logs", "/opt", "/run", "/srv", "/tmp", "/var"})
PR_SET_NO_NEW_PRIVS = 38
# What the verifier may execute or load besides its PATH and Python's sys.path (found per rollout): the
# system's configuration (ld.so.preload, pip.conf, ...) and shared libraries.
VERIFIER_TREES = ("/etc", "/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib")
# Where the agent keeps scratch files, which a verifier might read as its own: what it left there is removed.
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
# Only the verifier's, filled after the agent has stopped: whatever the agent left there is removed.
VERIFIER_ONLY = (TESTS_DIR, SOLUTION_DIR, VERIFIER_DIR)
FOLDER_WRITE = 0o022  # the group and other write bits, the two an unprivileged uid could hold here
MOUNTINFO = "/proc/self/mountinfo"
# What the rollout template, Kubernetes and Argo put in the runner's environment, never the image's ENV
# (workflows/iteration.py: the rollout template's env; the kubelet's service variables; Argo's executor's).
RUNNER_ENV = frozenset({"PYTHONPATH", "PYTHONSAFEPATH", "LD_LIBRARY_PATH"})
RUNNER_ENV_PREFIXES = ("OPENFORGE_", "KUBERNETES_", "ARGO_")


@dataclass(frozen=True)
class VerifierPaths:
    """What the verifier trusts: every entry under `trees`, and `folders` themselves (not what is below),
    except what lies in `agent_owned` (the agent's own folders, its workspace the graded files)."""

    trees: tuple[str, ...]
    folders: tuple[str, ...]
    agent_owned: tuple[str, ...] = ()


@dataclass
class PodSandbox(SandboxFiles):
    """The pod's own file system as a `Sandbox`; `agent_uid` is None when the runner is not root."""

    root: Path  # the rollout's output folder, root-only
    workdir: str = "/"
    env: dict[str, str] = field(default_factory=lambda: dict(BASE_ENV))
    notes: list[str] = field(default_factory=list)
    home: str = "/root"  # the agent's HOME: a fresh folder under /tmp (`create`)
    image_env: dict[str, str] = field(default_factory=lambda: dict(BASE_ENV))  # the container's, less the runner's
    bounds: Bounds = field(default_factory=Bounds)  # what it may leave on the host (logs)
    agent_uid: int | None = AGENT_UID
    verifier_paths: VerifierPaths = field(default_factory=lambda: VerifierPaths((), ()))
    app_live: Path | None = None  # the app sidecar's state, read-only here (`APP_LIVE`); None without an app
    hits: list[dict] = field(default_factory=list)  # what the pod's memory limit did to the agent's command

    @property
    def fs(self) -> Path:
        """The pod's `/` is the sandbox's `/`."""
        return Path("/")

    @classmethod
    def create(cls, root: Path, task: Task, *, agent_uid: int = AGENT_UID, bounds: Bounds = Bounds()) -> PodSandbox:
        """The pod as `task`'s sandbox; `root` (the rollout's output folder) becomes root-only.

        Raises `SandboxError` when the workspace is a system folder, when the task has an app (a GUI task's
        site) and its sidecar is not ready within `APP_START_TIMEOUT_S`, or, with a root runner, when the task
        folder (its verifier and oracle) or the app's state is reachable by the agent uid.
        """
        root = Path(root).absolute()
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o700)  # harness.log and, later, the verifier's output: not for the agent
        workdir = posixpath.normpath(posixpath.join("/", task.config.workdir or os.getcwd()))
        if workdir in SYSTEM_FOLDERS or any(workdir == tree or workdir.startswith(tree + "/") for tree in SYSTEM_TREES):
            raise SandboxError(f"the workspace would be {workdir}, a system folder the agent must not own; give the "
                               "image a WORKDIR such as /app or set [environment] workdir")
        if task.config.app:  # else every rollout of it would silently score 0
            wait_for_app(APP_LIVE, APP_START_TIMEOUT_S)
        env = image_env(os.environ)
        box = cls(root=root, workdir=workdir, agent_uid=agent_uid if os.geteuid() == 0 else None,
                  app_live=APP_LIVE if task.config.app else None, bounds=bounds, env=dict(env), image_env=env)
        box.apply_task_env(task)
        box.notes.append("pod mode: the pod's image is the environment (environment/Dockerfile is not replayed; "
                         "its ENV reaches the agent and the verifier as the container has it)")
        if not runner_protected():
            box.notes.append("pod mode: the runner cannot keep the OOM killer off itself (its container lacks the "
                             "SYS_RESOURCE capability): an agent that fills the pod's memory may take the runner with it")
        if box.agent_uid is None:
            box.notes.append(f"the runner is not root, so the agent runs as the runner's own uid {os.geteuid()}: it is "
                             "NOT uid-isolated (it can read the runner's files and /proc/<pid>/environ)")
            print(f"warning: {box.notes[-1]}", file=sys.stderr)
        elif not hidden_from(task.path, box.agent_uid):
            raise SandboxError(f"the task folder {task.path} (verifier and oracle) is readable by the agent uid "
                               f"{box.agent_uid}; keep tasks in a root-only folder (mode 0700), as the rollout pod's "
                               "init container does")
        elif box.app_live is not None and not hidden_from(box.app_live, box.agent_uid):
            raise SandboxError(f"the app's state {box.app_live} is reachable by the agent uid {box.agent_uid}; mount "
                               "the sidecar's state volume read-only there, made root-only (mode 0700) before the app "
                               "starts, as the rollout pod's init container does")
        Path(workdir).mkdir(parents=True, exist_ok=True)
        for folder in (AGENT_LOGS, "/logs/verifier", "/logs/artifacts"):
            Path(folder).mkdir(parents=True, exist_ok=True)
        box.home = tempfile.mkdtemp(prefix="openforge-agent-home-", dir="/tmp")
        if box.app_live is not None:  # the verifier reads the app's state there: the agent must not own the way
            APP_STATE.parent.mkdir(parents=True, exist_ok=True)
        if box.agent_uid is not None:
            also = (str(APP_STATE.parent),) if box.app_live is not None else ()
            box.verifier_paths = verifier_paths({**box.env, **task.config.verifier_env}, agent_areas(box), also=also)
            closed = close(box.verifier_paths, box.agent_uid)
            if closed:
                box.notes.append(f"pod mode: {len(closed)} paths the verifier loads were open to the agent uid and "
                                 f"were closed before it ran (write bits removed, owner root), e.g. {closed[0]}")
        return box

    def run(self, argv: Sequence[str], *, timeout_s: float, env: dict[str, str] | None = None,
            cwd: str | None = None, stdout_path: Path | None = None, as_agent: bool = False) -> RunResult:
        """Run `argv` in the pod; kill what it started when it ends or at `timeout_s`.

        `as_agent`: as the agent uid (when the runner is root), after handing it the workspace,
        `/logs/agent` and HOME; otherwise as the runner (the verifier runs as root). stdout and
        stderr go together to `stdout_path` (appended); stdin is empty; the environment is only the
        sandbox's plus `env`. A program that cannot be executed gives exit code 127/126, as in a shell. With a
        task's app, the agent's command is followed, once everything it left is killed, by a copy of the app's state
        (`keep_app_state`): what the verifier grades.
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
        with Output(Path(stdout_path or self.root / "run.log"), self.bounds.log_bytes) as output:
            try:
                process = subprocess.Popen(list(argv), env={**self.env, **(env or {})}, cwd=cwd, stdin=subprocess.DEVNULL,
                                           stdout=output.fd, stderr=output.fd, start_new_session=True,
                                           preexec_fn=_no_new_privileges, **user)
            except OSError as exc:
                os.write(output.fd, f"cannot execute {argv[0]}: {exc}\n".encode())
                return RunResult(exit_code=127 if isinstance(exc, FileNotFoundError) else 126, timed_out=False,
                                 duration_s=round(time.monotonic() - started, 3))
            output.started()
            if as_agent and runner_protected():
                expose(process.pid)
            kills = oom_kills()
            timed_out = wait_for(process, timeout_s, lambda: _stop(process, uid))
        if as_agent and (killed := oom_kills() - kills):  # the one cgroup of the container: whose was it?
            self.hits.append({"process": "harness" if process.returncode == -signal.SIGKILL else "agent",
                              "by": "memory", "count": killed})
        if as_agent and self.app_live is not None:
            self.keep_app_state()
        return RunResult(exit_code=process.returncode, timed_out=timed_out,
                         duration_s=round(time.monotonic() - started, 3), output_dropped=output.dropped)

    def run_harness(self, argv: Sequence[str], *, timeout_s: float, env: dict[str, str],
                    stdout_path: Path) -> RunResult:
        """Run the harness's command as the agent (`run` with `as_agent`), in the workspace: the pod already holds the
        harness (the init containers put it there), and its one cgroup holds the task's and the harness's budget
        together (`workflows.iteration` adds the harness's to the pod's limits)."""
        return self.run(argv, timeout_s=timeout_s, env=env, cwd=self.workdir, stdout_path=stdout_path, as_agent=True)

    def agent_url(self, url: str) -> str:
        """`url` itself: the agent shares the pod's network, which reaches the proxy (the NetworkPolicies allow it)."""
        return url

    def peaks_mb(self) -> dict[str, int]:
        """Nothing per process: the pod's one cgroup is the container's (its metrics are the cluster's)."""
        return {}

    def limit_hits(self, harness_exit_code: int | None = None) -> list[dict]:
        """What the pod's memory limit did while the agent's command ran: an OOM kill of the container's cgroup is
        the harness's when the harness itself ended by SIGKILL, else one of the agent's processes'."""
        return list(self.hits)

    def keep_app_state(self) -> None:
        """Copy the app sidecar's live state to ROOT/`APP_STATE_KEPT` (root-only), replacing an earlier copy."""
        kept = self.root / APP_STATE_KEPT
        if kept.exists():
            shutil.rmtree(kept, onerror=force_remove)
        try:
            copy_tree(self.app_live, kept)
        except OSError as exc:  # the volume is the sidecar's, never the agent's: not the agent's fault
            raise SandboxError(f"the app's state {self.app_live} could not be copied ({exc.strerror or exc})") from None

    def for_verifier(self, task: Task) -> PodSandbox:
        """The pod itself: the agent uid's processes are gone and it could write only its own places. With a
        task's app, its state as it was when the agent's command ended (ROOT/`APP_STATE_KEPT`) is put at
        `APP_STATE_DIR`, replacing whatever is there (empty if the agent never ran)."""
        if self.app_live is not None:
            target = self._replace(str(APP_STATE))
            kept = self.root / APP_STATE_KEPT
            copy_tree(kept, target) if kept.is_dir() else target.mkdir()
        return self

    def close(self) -> None:
        """Nothing to unmount: the pod's `/` is its own."""

    def run_verifier_command(self, supervised: list[str], plain: list[str], *, timeout_s: float,
                             env: dict[str, str], stdout_path: Path, judge: bool = False) -> RunResult:
        """`plain`, as root: the pod's processes include the runner's, so test.sh is not supervised here (what it left
        running is killed with its session when it ends); `TESTS_DIR` stays root's to write. The pod's network
        reaches the proxy either way, so `judge` changes nothing: the judge key in `env` is what opens the route."""
        return self.run(plain, timeout_s=timeout_s, env=env, stdout_path=stdout_path)

    def prepare_verifier(self, env: dict[str, str]) -> dict[str, str]:
        """Make the pod fit to grade once the agent has stopped; return `env` with a fresh HOME and TMPDIR.

        Every process of the agent uid must be gone (`SandboxError` otherwise); what the agent left in
        `/tmp`, `/var/tmp`, `/dev/shm`, `/tests`, `/solution` and `/logs/verifier` is removed; HOME and
        TMPDIR are new empty root-owned folders. Raises `VerifierRefused` (grade 0, never retried) when an
        entry the verifier would execute or load (its PATH, Python's sys.path, `/etc`, the libraries, `/`
        and every folder above them: see `verifier_paths`) is owned by or writable to the agent uid.
        """
        if self.agent_uid is not None:
            _kill_uid(self.agent_uid)
            left = _live(lambda status: status["Uid"].split()[0] == str(self.agent_uid))
            if left:
                raise SandboxError(f"processes {left[:5]} of the agent uid {self.agent_uid} are still alive; "
                                   "the verifier must not run beside them")
            extra = verifier_paths({"PATH": env.get("PATH", "")}, agent_areas(self), probe_python=False)
            paths = VerifierPaths(tuple(dict.fromkeys(self.verifier_paths.trees + extra.trees)),
                                  tuple(dict.fromkeys(self.verifier_paths.folders + extra.folders)), extra.agent_owned)
            found = open_to(paths, self.agent_uid)
            if found:
                raise VerifierRefused(f"not graded (reward 0): the agent uid {self.agent_uid} owns or may write "
                                      f"{len(found)} paths the verifier would execute or load, e.g. {found[0]}")
            for folder in SCRATCH:
                remove_owned(Path(folder), self.agent_uid)
        for folder in VERIFIER_ONLY:
            if os.path.lexists(folder):
                self._replace(folder)  # the agent's copy, whatever it is (a link is removed, not followed)
        fresh = {name: tempfile.mkdtemp(prefix=f"openforge-verifier-{name.lower()}-", dir="/tmp")
                 for name in ("HOME", "TMPDIR")}
        for folder in fresh.values():
            os.chmod(folder, 0o755)  # root's; readable for a verifier that drops privileges
        return {**env, **fresh}

    def remove(self) -> None:
        """Nothing to delete: the pod goes away with its files."""


def image_env(environ: dict[str, str]) -> dict[str, str]:
    """The image's ENV as this container has it: its environment without what the rollout template, Kubernetes and
    Argo add for the runner (`RUNNER_ENV`, `RUNNER_ENV_PREFIXES`: the admin key among them).

    >>> image_env({"PATH": "/opt/venv/bin:/usr/bin", "GREETING": "hi", "OPENFORGE_ADMIN_KEY": "k", "PYTHONSAFEPATH": "1",
    ...            "KUBERNETES_SERVICE_HOST": "10.0.0.1", "ARGO_TEMPLATE": "{}"})
    {'PATH': '/opt/venv/bin:/usr/bin', 'GREETING': 'hi'}
    """
    return {name: value for name, value in environ.items()
            if name not in RUNNER_ENV and not name.startswith(RUNNER_ENV_PREFIXES)}


def protect_runner() -> bool:
    """Keep the OOM killer off the runner (`oom_score_adj` -1000), so that an agent filling the pod's memory never
    takes the runner, and so the rollout's result, with it: Kubernetes 1.28+ on cgroup v2 sets `memory.oom.group`
    on every container (kubernetes/kubernetes#117793), which kills all of its processes together except those at
    -1000 (the kernel's cgroup-v2 documentation, memory.oom.group). Needs CAP_SYS_RESOURCE (the rollout template
    adds it to the runner's container; the agent's uid never holds it); False without it. Called once by the pod
    rollout step's `main` (never in a process that lives on, such as a test's)."""
    try:
        Path("/proc/self/oom_score_adj").write_text("-1000")
        return True
    except OSError:
        return False


def runner_protected() -> bool:
    """Whether `protect_runner` took."""
    try:
        return Path("/proc/self/oom_score_adj").read_text().strip() == "-1000"
    except OSError:
        return False


def expose(pid: int) -> None:
    """The agent's command, started by a protected runner, first in line for the OOM killer (`oom_score_adj` 1000):
    set by the runner, whose privilege also makes 1000 the least the command (and everything it starts) may set."""
    try:
        Path(f"/proc/{pid}/oom_score_adj").write_text("1000")
    except OSError:
        pass


def oom_kills() -> int:
    """Processes the OOM killer has killed in this container's memory cgroup: `oom_kill` of cgroup v2's
    `memory.events` (the container's own cgroup is / of its cgroup namespace), or of v1's `memory.oom_control`;
    0 where neither is readable."""
    return max(cgroup_counter(Path("/sys/fs/cgroup/memory.events"), "oom_kill"),
               cgroup_counter(Path("/sys/fs/cgroup/memory/memory.oom_control"), "oom_kill"))


def wait_for_app(live: Path, timeout_s: float) -> None:
    """Return once the app sidecar's ready file is in `live`; `SandboxError` (an infra error) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (live / READY_FILE).exists():
        if time.monotonic() >= deadline:
            raise SandboxError(f"the task's [environment] app was not ready within {timeout_s:g} s: in a pod it runs "
                               f"as the rollout pod's sidecar container `app`, which creates {live / READY_FILE} once "
                               "it listens (see that container's log; docs/tasks.md#gui-tasks)")
        time.sleep(0.2)


def give(path: Path, uid: int) -> None:
    """Make `path` and everything under it owned by `uid` (links themselves, never their targets)."""
    os.lchown(path, uid, uid)
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(folder, name), uid, uid)


def agent_areas(box: PodSandbox) -> tuple[str, ...]:
    """The folders the agent owns by design: its workspace (the graded files), logs, HOME and scratch."""
    return (box.workdir, AGENT_LOGS, box.home, *SCRATCH)


def _inside(path: str, folders: Sequence[str]) -> bool:
    return any(path == folder or path.startswith(folder.rstrip("/") + "/") for folder in folders)


def python_path(python: str, env: dict[str, str]) -> list[str]:
    """`sys.path` of `python` (run as the verifier's environment would run it, from `/`), or [] if it fails.

    Call it only before the agent has run: it executes the site folders' `.pth` files."""
    try:
        done = subprocess.run([python, "-c", "import json, sys; print(json.dumps(sys.path))"], env=env, cwd="/",
                              capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        return [entry for entry in json.loads(done.stdout) if isinstance(entry, str) and entry.startswith("/")]
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return []


def verifier_paths(env: dict[str, str], agent_owned: Sequence[str], probe_python: bool = True,
                   also: Sequence[str] = ()) -> VerifierPaths:
    """What the verifier would execute or load, as trees and folders (see `VerifierPaths`).

    Trees: every folder on `env`'s PATH, with the real targets of the programs linked there; `sys.path`
    of each `python3`/`python` on that PATH (when `probe_python`); `VERIFIER_TREES`; `also` (what else it
    reads as given: the folder of the app's state). Folders: `/`, `/tests`'s
    and `/logs`'s parents (where pytest looks for `conftest.py`, `pytest.ini`, ...), and every folder above
    a tree (renaming one swaps everything below it). Paths inside `agent_owned` (the workspace: what is
    graded) are left out.
    """
    search = [folder for folder in env.get("PATH", "").split(":") if folder.startswith("/")]
    trees = [*search, *VERIFIER_TREES, *also]
    for folder in search:
        for entry in _entries(folder):
            if entry.is_symlink():
                trees.append(os.path.realpath(entry.path))
    if probe_python:
        for name in ("python3", "python"):
            exe = shutil.which(name, path=env.get("PATH", ""))
            if exe:
                trees += python_path(exe, {**env, "PYTHONNOUSERSITE": "1"})
    trees = [os.path.realpath(tree) for tree in trees if os.path.lexists(tree)]
    trees = [tree for tree in dict.fromkeys(trees) if not _inside(tree, agent_owned)]
    folders = {"/", "/logs"}
    for tree in trees:
        parent = os.path.dirname(tree)
        while parent != "/":
            folders.add(parent)
            parent = os.path.dirname(parent)
    return VerifierPaths(tuple(trees), tuple(sorted(f for f in folders if not _inside(f, agent_owned))),
                         tuple(agent_owned))


def _entries(folder: str) -> list[os.DirEntry]:
    try:
        return list(os.scandir(folder))
    except OSError:
        return []


def _read_only_mounts() -> tuple[list[str], list[str]]:
    """(read-only, writable) mount points of this process, from /proc/self/mountinfo."""
    read_only, writable = [], []
    try:
        with open(MOUNTINFO) as mounts:
            for line in mounts:
                fields = line.split()
                point = fields[4].encode().decode("unicode_escape")
                (read_only if "ro" in fields[5].split(",") else writable).append(point)
    except OSError:
        pass
    return read_only, writable


def _walk(paths: VerifierPaths) -> Iterator[str]:
    """Every path to check: the folders, and each tree with all below it, skipping read-only mounts
    (nobody can change them) but not the writable mounts inside those."""
    read_only, writable = _read_only_mounts()

    def on_read_only(path: str) -> bool:
        mount = max((m for m in read_only + writable if _inside(path, [m])), key=len, default="/")
        return mount in read_only

    yield from paths.folders
    roots: list[str] = []
    for tree in paths.trees:
        if not on_read_only(tree):
            roots.append(tree)
        roots += [m for m in writable if _inside(m, [tree]) and m != tree and on_read_only(os.path.dirname(m))]
    for root in dict.fromkeys(roots):
        yield root
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if os.path.join(folder, d) not in read_only
                       and not _inside(os.path.join(folder, d), paths.agent_owned)]
            for name in dirs + files:
                yield os.path.join(folder, name)


def _open(st: os.stat_result, uid: int) -> bool:
    """Whether `uid` (gid `uid`, no other group) owns the entry or may change it."""
    if st.st_uid == uid:
        return True
    if stat.S_ISLNK(st.st_mode):
        return False  # a link's own mode means nothing; only its folder can replace it
    return bool(st.st_mode & 0o002 or (st.st_gid == uid and st.st_mode & 0o020))


def lock(paths: VerifierPaths, uid: int) -> list[str]:
    """Before the agent runs: close every path of `paths` that `uid` owns or may write (owner root, no group/
    other write bits), so nothing the verifier loads can be the agent's; returns the paths it found open."""
    changed = []
    for path in _walk(paths):
        try:
            st = os.lstat(path)
            if not _open(st, uid):
                continue
            if st.st_uid == uid or st.st_gid == uid:
                os.lchown(path, 0 if st.st_uid == uid else -1, 0 if st.st_gid == uid else -1)
            if not stat.S_ISLNK(st.st_mode):
                os.chmod(path, stat.S_IMODE(st.st_mode) & ~FOLDER_WRITE)
            changed.append(path)
        except OSError:
            changed.append(path)  # left as it was: `close` finds it still open, unless it is gone
    return changed


def close(paths: VerifierPaths, uid: int) -> list[str]:
    """`lock`, then make sure nothing of `paths` is still open to `uid` (`SandboxError` otherwise, naming it)."""
    changed = lock(paths, uid)
    still = [path for path in changed if _still_open(path, uid)]  # nothing else changes before the agent runs
    if still:
        raise SandboxError(f"{still[0]} (which the verifier would load) stays open to the agent uid {uid} after "
                           "chmod and chown; the image must not leave it writable")
    return changed


def _still_open(path: str, uid: int) -> bool:
    try:
        return _open(os.lstat(path), uid)
    except OSError:
        return False


def open_to(paths: VerifierPaths, uid: int) -> list[str]:
    """After the agent ran: every path of `paths` that `uid` owns or may write (should be none after `lock`)."""
    found = []
    for path in _walk(paths):
        try:
            if _open(os.lstat(path), uid):
                found.append(path)
        except OSError:
            continue
    return found


def remove_owned(folder: Path, uid: int) -> None:
    """Remove every entry under `folder` owned by `uid` (with all below it), links without following them."""
    for entry in _entries(str(folder)):
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid == uid:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
        elif entry.is_dir(follow_symlinks=False):
            remove_owned(Path(entry.path), uid)


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
            kill(pid)
        time.sleep(0.05)
