"""The local stand-in for a task's container: a layered root seen as `/` through bubblewrap.

Every rollout gets its own sandbox root folder. Its `/` is an overlay stack mounted by the runner at
`ROOT/merged` (`steps/sandbox/root.py`): the host's system folders at the bottom (masked: no file of /etc
that is not world-readable, of /var only apt's and dpkg's state), the task's layer above them (what its
`environment/Dockerfile` did, built once per task and cached), the rollout's own changes on top
(`ROOT/upper`). Each `run()` starts `bwrap` with that root bound as `/`, a fresh `/proc` and `/dev`, new
user (uid 0 inside), PID, IPC, UTS and network namespaces, all capabilities dropped, `--die-with-parent
--new-session`, a clean environment (PATH, HOME=/root, LANG, the Dockerfile's ENV, what the caller passes),
and the task's cpus / memory_mb and a process cap as cgroups, storage_mb as a disk of its own for the upper
(`steps/sandbox/limits.py`, where the host has them). The network is the sandbox's own: loopback only, or a `ProxyTunnel` (`steps/sandbox/network.py`)
whose 127.0.0.1:PORT reaches the recording proxy and nothing else of the host.

Without a container engine the task's layer is built from `environment/Dockerfile` by applying its
WORKDIR, COPY/ADD (local build context), ENV, ARG, SHELL and RUN instructions (`steps/sandbox/build.py`);
RUN steps run as root with a container's usual capabilities, so `apt-get install` and `pip install` land in
the layer, never on the host. FROM is replaced by the host system and USER is ignored, each said so in
`LocalSandbox.notes`:

    from steps.sandbox.local import LocalSandbox
    from steps.tasks import load_task
    task = load_task("steps/tasks/builtin/hello-file")
    box = LocalSandbox.create(Path("/tmp/rollout-1"), task)     # raises SandboxError on a failing RUN
    box.run(["bash", "-c", "echo hello > /app/answer.txt"], timeout_s=60, stdout_path=Path("/tmp/agent.log"))
    grading = box.for_verifier(task)                              # a pristine root with the graded paths only
    grading.copy_in(task.tests_dir, "/tests")
    grading.run(["bash", "/tests/test.sh"], timeout_s=60)
    grading.host_path("/logs/verifier/reward.txt").read_text()
    grading.remove(); box.remove()                                # unmount and delete

A harness installed on the host is brought in read-only with `extra_binds`, e.g.
`[(Path.home() / ".cache/openforge/harnesses", "/opt/openforge/harnesses", True)]`.

Build settings (environment variables of the runner): `OPENFORGE_BUILD_NETWORK` = `host` (default: RUN
steps share the host's network, to reach package mirrors) or `none` (loopback only);
`OPENFORGE_BUILD_WHEELS=DIR` binds DIR read-only at /opt/openforge/wheels during RUN steps with
`PIP_FIND_LINKS` pointing there and `PIP_NO_INDEX=1`, so `pip install` works offline from those wheels.

What local mode does NOT isolate, unlike a real container:
- the kernel (one kernel for all, as with containers); `storage_mb` bounds what the agent writes (its upper
  layer is an ext4 image of that size), not the task's layer;
- the image: programs come from the host's /usr (read-only under the task's layer), not from the task's
  image (FROM), so a task that needs another distribution's packages or another OS does not build;
- the user: uid 0 inside is the runner's uid outside, with no capabilities on host objects;
- process lifetime: each `run()` is its own PID namespace, so a server the agent starts in the
  background is gone when its command ends (and before the verifier runs); a task's own server is its
  `[environment] app`, run beside the agent's command in a sandbox of its own (`steps/sandbox/app.py`);
- build details: .dockerignore, multi-stage builds, ADD from URLs and `RUN --mount` are not supported.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import posixpath
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

from steps.sandbox.app import APP_STATE_DIR, APP_STATE_KEPT, app_beside
from steps.sandbox.base import TESTS_DIR, Bind, HarnessSetup
from steps.sandbox.build import apply_dockerfile
from steps.sandbox.common import (KILL_GRACE_S, MIB, WHEELS_DIR, Bounds, CopyLimitReached, CopyLimits, Output,
                                   RunResult, SandboxError, VerifierRefused, copy_tree, force_remove, kill, links_under,
                                   wait_for)
from steps.sandbox.files import BASE_ENV, SandboxFiles
from steps.sandbox.limits import Budget, HarnessSplit, Limits, attach_disk, detach_disk
from steps.sandbox.network import Loopback, NetworkError, ProxyTunnel, sweep_namespaces
from steps.sandbox.root import (OWNER_FILE, LayerError, ensure_layer, layer_key, make_mask, make_skeleton, mount_root,
                                sweep_leftovers, unmount)
from steps.tasks import Task

# A container runtime's default capabilities, for the Dockerfile's RUN steps only (the agent gets none).
BUILD_CAPS = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID",
              "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_NET_RAW", "CAP_SYS_CHROOT", "CAP_MKNOD", "CAP_AUDIT_WRITE",
              "CAP_SETFCAP")
# Where the verifier writes or reads what the agent never had: a graded symlink may not lead there.
GRADED_LINKS_MAY_NOT_REACH = ("/tests", "/solution", "/logs", "/proc", "/sys", "/dev", "/run", "/tmp")

# Written to bwrap's stderr by the sandbox's first command just before it starts the caller's: what bwrap wrote there
# before it is bwrap's own (a setup error); after it, anything in the sandbox may write there (/proc/1/fd/2).
STARTED = "openforge-sandbox-started"
Network = Union[str, Loopback]  # "none" (loopback only), "host" (builds only), a shared loopback or a tunnel to the proxy


def build_settings() -> dict:
    """The runner's build settings (module docstring); part of a layer's cache key."""
    network = os.environ.get("OPENFORGE_BUILD_NETWORK", "host")
    if network not in ("host", "none"):
        raise SandboxError(f"OPENFORGE_BUILD_NETWORK must be host or none, got {network!r}")
    wheels = os.environ.get("OPENFORGE_BUILD_WHEELS") or None
    if wheels is not None and not Path(wheels).is_dir():
        raise SandboxError(f"OPENFORGE_BUILD_WHEELS={wheels} is not a folder")
    return {"network": network, "wheels": str(Path(wheels).absolute()) if wheels else None}


@dataclass
class LocalSandbox(SandboxFiles):
    """One rollout's sandbox: `root/merged` is its `/`; `workdir` and `env` come from the Dockerfile."""

    root: Path
    workdir: str = "/"
    env: dict[str, str] = field(default_factory=lambda: dict(BASE_ENV))
    notes: list[str] = field(default_factory=list)
    home: str = "/root"  # the agent's HOME, where its harness keeps config and session logs
    layer: Path | None = None  # the task's built layer; None while it is being built
    limits: Limits = field(default_factory=Limits)
    owns_limits: bool = True  # False for a view or sibling sharing another sandbox's cgroups: they outlive it
    image_env: dict[str, str] = field(default_factory=lambda: dict(BASE_ENV))  # + the Dockerfile's ENV: the verifier's base
    build: dict | None = None  # build_settings() while this sandbox builds a layer
    app: str | None = None  # [environment] app: the task's server, run beside the agent (`steps.sandbox.app`)
    bounds: Bounds = field(default_factory=Bounds)  # what it may leave on the host besides its disk
    setup: HarnessSetup | None = None  # the harness `run_harness` runs, and the proxy it reaches

    @property
    def fs(self) -> Path:
        """The host folder that is `/` inside the sandbox."""
        return self.root / "merged"

    @classmethod
    def create(cls, root: Path, task: Task, bounds: Bounds = Bounds(), harness: Budget | None = None,
               setup: HarnessSetup | None = None) -> LocalSandbox:
        """Make a fresh sandbox under `root` (which must not exist or be empty) from the task's layer.

        `bounds`: what its commands may leave on the host (logs, the graded copy); `harness`: the budget of a harness's
        own processes beside the task's (`steps.sandbox.limits`), for `run(..., harness_programs=...)`; `setup`: the
        harness `run_harness` runs (its install, its programs) and the proxy it reaches.

        The layer is built from `environment/Dockerfile` (see module docstring) under the task's build
        timeout when the cache has none for it; its RUN output goes to `root/build.log`. Raises
        `SandboxError` when bwrap is missing, the runner is not root, or a build step fails.
        """
        sweep_leftovers()  # what a killed runner left: mounted roots, network namespaces, cgroups
        sweep_namespaces()
        Limits.sweep()
        root = _fresh_root(root)
        settings = build_settings()
        key = layer_key(task.dockerfile, task.environment_dir, {**settings, "image": task.config.docker_image})
        log = root / "build.log"
        try:  # built in the cache's own folder, so that the finished layer is renamed, never copied
            layer, meta, built = ensure_layer(key, lambda folder: _build_layer(folder / "build", task, settings, folder,
                                                                               log))
        except LayerError as exc:
            raise SandboxError(str(exc)) from None
        if not built:
            log.write_text(f"# the task's layer {key} was built before; reused from {layer}\n")
        box = cls(root=root, workdir=meta["workdir"], env=dict(meta["env"]), notes=list(meta["notes"]), layer=layer,
                  image_env=dict(meta["env"]), app=task.config.app, bounds=bounds, setup=setup)
        try:
            box.notes.extend(attach_disk(root / "disk.img", root / "upper", task.config.resources.storage_mb))
            box._mount()
            box.apply_task_env(task)
            if task.config.workdir:
                box.workdir = posixpath.normpath(posixpath.join("/", task.config.workdir))
                box.host_path(box.workdir).mkdir(parents=True, exist_ok=True)
            resources = task.config.resources
            box.limits = Limits.create(f"{root.name}-{os.getpid()}-{time.monotonic_ns()}", cpus=resources.cpus,
                                       memory_mb=resources.memory_mb, harness=harness)
            box.notes.extend(box.limits.notes)
        except BaseException:
            box.close()
            raise
        return box

    def _mount(self) -> None:
        make_skeleton(self.root / "skeleton")
        make_mask(self.root / "mask")
        self.fs.mkdir()
        try:
            mount_root(self.root, self.layer, self.root / "upper", self.fs)
        except LayerError as exc:
            raise SandboxError(str(exc)) from None
        atexit.register(detach_disk, self.root / "upper")  # a runner that dies of an exception leaves no mount
        atexit.register(unmount, self.fs)  # (atexit runs these last first: the root, then its disk)

    def for_verifier(self, task: Task) -> LocalSandbox:
        """A pristine sandbox for grading: the task's layer, a fresh upper, and only the graded paths of this one.

        The graded paths (`[verifier] graded_paths`, default the workspace) are copied over as the agent left
        them, except symlinks that lead where only the verifier writes or reads (`GRADED_LINKS_MAY_NOT_REACH`), which are
        removed and noted. Everything else the agent changed (site dirs, HOME, /tmp, PATH folders, /etc, a
        conftest.py above /tests...) is simply not there. Call only after the agent's processes are gone.

        The copy is bounded (`Bounds`: files and seconds; bytes: the task's storage_mb, counted as apparent sizes, so
        a sparse file is refused before it is written out): past a bound the rollout is not graded, reward 0 with
        the reason (`VerifierRefused`), never a hang and never an infra error, since only the agent made those files.
        """
        view = LocalSandbox(root=_fresh_root(self.root.parent / f"{self.root.name}-verifier"), workdir=self.workdir,
                       env=dict(self.image_env), layer=self.layer, limits=self.limits, owns_limits=False,
                       image_env=dict(self.image_env),
                       bounds=self.bounds, setup=self.setup)  # the proxy, for a verifier that asks the judge
        storage_mb = task.config.resources.storage_mb
        limits = CopyLimits(files=self.bounds.graded_files, bytes=storage_mb * MIB, seconds=self.bounds.graded_seconds)
        try:  # on a disk of the task's storage_mb too: a sparse file the agent made cannot fill the host's
            view.notes.extend(attach_disk(view.root / "disk.img", view.root / "upper", storage_mb))
            view._mount()
            for path in graded_paths(task, self.workdir):
                source = self.host_path(posixpath.dirname(path)) / posixpath.basename(path)
                target = view._replace(path)
                try:
                    if source.is_symlink():
                        target.symlink_to(os.readlink(source))
                    elif source.is_dir():
                        copy_tree(source, target, limits)
                    elif source.is_file():
                        limits.charge(source.lstat().st_size)
                        shutil.copy2(source, target)
                    view._drop_escaping_links(path)
                except CopyLimitReached as exc:
                    raise VerifierRefused(f"not graded (reward 0): the graded paths hold {exc} (at {path}); the "
                                          f"verifier is given at most {self.bounds.graded_files} files and "
                                          f"{storage_mb} MiB (the task's storage_mb), copied within "
                                          f"{self.bounds.graded_seconds:g} s") from None
                except OSError as exc:  # what the agent left does not fit the task's disk (or cannot be copied)
                    raise VerifierRefused(f"not graded (reward 0): the graded path {path} cannot be brought to the "
                                          f"verifier ({exc.strerror or exc})") from None
            if self.app:  # the app's state as the app left it, never what the agent put at that path
                kept = self.root / APP_STATE_KEPT
                target = view._replace(APP_STATE_DIR)
                copy_tree(kept, target) if kept.is_dir() else target.mkdir()
        except BaseException:
            view.remove()
            raise
        return view

    def sibling(self, suffix: str, storage_mb: int) -> LocalSandbox:
        """A pristine sandbox of this one's layer beside it (`ROOT-suffix`), mounted, on a disk of `storage_mb`:
        the task's app runs in one (`steps.sandbox.app`)."""
        box = LocalSandbox(root=_fresh_root(self.root.parent / f"{self.root.name}-{suffix}"), workdir=self.workdir,
                      env=dict(self.env), layer=self.layer, limits=self.limits, owns_limits=False,
                      image_env=dict(self.image_env),
                      bounds=self.bounds)
        try:
            box.notes.extend(attach_disk(box.root / "disk.img", box.root / "upper", storage_mb))
            box._mount()
        except BaseException:
            box.remove()
            raise
        return box

    def agent_url(self, url: str) -> str:
        """`url` (the proxy's) as the agent reaches it: the sandbox's network is its own, and its one way out is the
        tunnel to the proxy (`run_harness`), whose end inside is 127.0.0.1 at the proxy's port."""
        return on_loopback(url, self._proxy()[1])

    def run_harness(self, argv: Sequence[str], *, timeout_s: float, env: dict[str, str],
                    stdout_path: Path) -> RunResult:
        """Run the harness's command as the agent, in the workspace: its install brought in read-only, its own processes
        in the harness's cgroups (`HarnessSetup`, given to `create`), its network a `ProxyTunnel` to the proxy and
        nothing else of the host."""
        host, port = self._proxy()
        try:
            with ProxyTunnel(f"of-{os.getpid()}-{time.monotonic_ns() % 10**9}", host, port) as tunnel:
                return self.run(argv, timeout_s=timeout_s, env=env, cwd=self.workdir, stdout_path=stdout_path,
                                extra_binds=self.setup.binds, network=tunnel, as_agent=True,
                                harness_programs=self.setup.programs)
        except NetworkError as exc:
            raise SandboxError(str(exc)) from None

    def _proxy(self) -> tuple[str, int]:
        """The proxy's host and port on the host, from the harness's setup."""
        if self.setup is None:
            raise SandboxError("this sandbox was made without a harness (LocalSandbox.create's setup)")
        proxy = urllib.parse.urlsplit(self.setup.proxy_url)
        return proxy.hostname, proxy.port or 80

    def run_verifier_command(self, supervised: list[str], plain: list[str], *, timeout_s: float,
                             env: dict[str, str], stdout_path: Path, judge: bool = False) -> RunResult:
        """`supervised` (test.sh under `steps.grading.verify.SUPERVISOR`): this sandbox's PID namespace holds only the
        verifier's processes, and the supervisor is its init, which nothing inside can kill. `TESTS_DIR` is bound
        read-only: bash reads test.sh as it goes, so a program of the agent's that test.sh runs could otherwise
        rewrite the lines still to come. Its network is loopback only; with `judge`, loopback and a `ProxyTunnel`
        to the proxy, as the agent had (the judge route takes only the judge key the verifier's environment holds)."""
        tests_read_only = [(self.host_path(TESTS_DIR), TESTS_DIR, True)]
        command = self.supervised(supervised, plain)
        if not judge:
            return self.run(command, timeout_s=timeout_s, env=env, stdout_path=stdout_path,
                            extra_binds=tests_read_only, init=True)
        host, port = self._proxy()
        try:
            with ProxyTunnel(f"ofv-{os.getpid()}-{time.monotonic_ns() % 10**9}", host, port) as tunnel:
                return self.run(command, timeout_s=timeout_s, env=env, stdout_path=stdout_path,
                                extra_binds=tests_read_only, network=tunnel, init=True)
        except NetworkError as exc:
            raise SandboxError(str(exc)) from None

    def supervised(self, supervised: list[str], plain: list[str]) -> list[str]:
        """The verifier's command: `supervised`, since this sandbox's PID namespace holds only the verifier's
        processes."""
        return supervised

    def prepare_verifier(self, env: dict[str, str]) -> dict[str, str]:
        """The verifier's environment, once this sandbox is fit to grade in: a pristine root already is.

        (A pod checks and cleans itself here: `steps.sandbox.pod.PodSandbox.prepare_verifier`.)"""
        return env

    def _drop_escaping_links(self, graded: str) -> None:
        """Remove graded symlinks that resolve (inside this sandbox) to a verifier-only place."""
        top = self.host_path(posixpath.dirname(graded)) / posixpath.basename(graded)
        # A graded file (or a path the agent never made) has nothing below it to check.
        for link in [top] if top.is_symlink() else links_under(top) if top.is_dir() else []:
            inside = "/" + str(link.relative_to(self.fs))
            try:
                resolved = "/" + str(self.host_path(inside).relative_to(self.fs))
            except SandboxError:
                resolved = "/proc"  # a symlink loop: treated as escaping
            if any(resolved == p or resolved.startswith(p + "/") for p in GRADED_LINKS_MAY_NOT_REACH):
                target = os.readlink(link)
                link.unlink()
                self.notes.append(f"grading: {inside} was a symlink to {target}, where only the verifier writes; removed")

    def run(self, argv: Sequence[str], *, timeout_s: float, env: dict[str, str] | None = None,
            cwd: str | None = None, stdout_path: Path | None = None, extra_binds: Sequence[Bind] = (),
            network: Network = "none", as_agent: bool = False, init: bool = False,
            until: threading.Event | None = None, harness_programs: tuple[str, ...] = ()) -> RunResult:
        """Run `argv` inside the sandbox; kill its whole process tree at `timeout_s`.

        stdout and stderr go together, through a pipe, to the host file `stdout_path` (appended, at most
        `bounds.log_bytes` in all, `common.Output`; `root/run.log` when None); stdin is empty. `env` is added to the sandbox's environment, `cwd` defaults to the
        Dockerfile's WORKDIR. `network`: "none" (loopback only), a `ProxyTunnel` (loopback plus the proxy),
        or "host" (only while building a layer). `as_agent` marks the agent's own command; it changes nothing
        here, where every command is uid 0 of its own user namespace (in a pod it selects the agent uid, see
        `steps.sandbox.pod`), and, for a task with an `[environment] app`, starts that app beside it first, in the
        same network, and keeps its state for the verifier (`steps.sandbox.app`). `init`: the command is its PID
        namespace's init (pid 1), which nothing inside can kill (the verifier's supervisor). `until`: stop the
        command early once this event is set. `harness_programs`: the command is a harness, run in the harness's
        cgroups, and every process it starts that is not one of these programs (path prefixes) is the agent's, moved
        into the task's (`steps.sandbox.limits.HarnessSplit`). Returns after every process the command started has
        exited. Raises
        `SandboxError` when bubblewrap cannot set the sandbox up (an infrastructure failure, unlike the command's own
        exit code, which is returned).
        """
        if as_agent and self.app and self.build is None:
            with app_beside(self, network, timeout_s) as shared:
                return self._run(argv, timeout_s, env, cwd, stdout_path, extra_binds, shared, init, until,
                                 harness_programs)
        return self._run(argv, timeout_s, env, cwd, stdout_path, extra_binds, network, init, until, harness_programs)

    def _run(self, argv: Sequence[str], timeout_s: float, env: dict[str, str] | None, cwd: str | None,
             stdout_path: Path | None, extra_binds: Sequence[Bind], network: Network, init: bool,
             until: threading.Event | None, harness_programs: tuple[str, ...] = ()) -> RunResult:
        """`run` without the task's app (its arguments as they are)."""
        cwd = cwd or self.workdir
        if not self.host_path(cwd).is_dir():
            raise SandboxError(f"working directory {cwd} does not exist in the sandbox")
        if network == "host" and self.build is None:
            raise SandboxError("only a Dockerfile's RUN steps may share the host's network")
        stdout_path = Path(stdout_path or self.root / "run.log")
        info_read, info_write = os.pipe()
        errors_read, errors_write = os.pipe()  # bwrap's own messages; the command's stderr joins its stdout
        binds = [*extra_binds, *([(self.build["wheels"], WHEELS_DIR, True)] if self.build and self.build["wheels"] else [])]
        started = time.monotonic()
        mounted: list[Path] = []
        try:
            mounted = self._mount_read_only([bind for bind in binds if bind[2] and Path(bind[0]).is_dir()])
            args = self._bwrap_args(argv, cwd, [bind for bind in binds if not (bind[2] and Path(bind[0]).is_dir())],
                                    network, info_write, init, harness=bool(harness_programs))
            args, args_fd = _args_from_fd(args)
            output = Output(stdout_path, self.bounds.log_bytes)
            try:
                process = subprocess.Popen(args, env={**self.env, **(env or {})}, stdin=subprocess.DEVNULL,
                                           stdout=output.fd, stderr=errors_write, pass_fds=(info_write, args_fd),
                                           start_new_session=True)
            except BaseException:
                output.close()
                raise
            finally:
                os.close(args_fd)
            output.started()
        except BaseException:
            for target in reversed(mounted):
                unmount(target)
            os.close(info_read)
            os.close(errors_read)
            raise
        finally:
            os.close(info_write)
            os.close(errors_write)
        init_pid, namespace = _read_info(info_read)
        held = _hold_namespace(init_pid)
        split = HarnessSplit(self.limits, harness_programs, process.pid) if harness_programs else None

        def stop() -> None:
            try:
                if init_pid is not None:
                    _stop(process, init_pid, namespace if held is not None else None)
                process.wait()
            finally:
                if held is not None:
                    os.close(held)
            for target in reversed(mounted):
                unmount(target)

        with output, split or contextlib.nullcontext():
            timed_out = wait_for(process, timeout_s, stop, until)
        with os.fdopen(errors_read, "rb") as errors:  # bwrap's own, until the command starts: then anyone's
            setup_error = errors.read(64 * 1024).decode(errors="replace").strip()
        if STARTED not in setup_error.split():
            setup_error = setup_error or f"it ended with exit code {process.returncode} before the command started"
        else:  # the command started: what came after it (the agent can write to the init's stderr) is no setup error
            setup_error = ""
        if setup_error:
            raise SandboxError(f"bubblewrap could not set up the sandbox: {setup_error.splitlines()[0]}")
        return RunResult(exit_code=process.returncode, timed_out=timed_out,
                         duration_s=round(time.monotonic() - started, 3), output_dropped=output.dropped)

    def _mount_read_only(self, binds: Sequence[Bind]) -> list[Path]:
        """Bring host folders in read-only as overlays whose options name them relatively (`binds/N`), so that
        the sandbox's mount table names no host folder (a bind mount would show its source's path)."""
        mounted: list[Path] = []
        folder = self.root / "binds"
        (folder / "empty").mkdir(parents=True, exist_ok=True)
        try:
            for number, (host, dest, _) in enumerate(binds):
                link = folder / str(number)
                if link.is_symlink():
                    link.unlink()
                link.symlink_to(Path(host).absolute())
                target = self.host_path(posixpath.dirname(dest)) / posixpath.basename(dest)
                if target.is_symlink():  # mount would follow it on the host
                    raise SandboxError(f"cannot bind {host} at {dest} in the sandbox: it is a symlink there")
                try:
                    target.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise SandboxError(f"cannot bind {host} at {dest} in the sandbox: {exc.strerror}") from None
                done = subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                                       f"lowerdir=binds/{number}:binds/empty", str(target)],
                                      cwd=self.root, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    raise SandboxError(f"cannot bind {host} at {dest} in the sandbox: {done.stderr.strip()}")
                mounted.append(target)
        except SandboxError:
            for target in reversed(mounted):
                unmount(target)
            raise
        return mounted

    def _bwrap_args(self, argv: Sequence[str], cwd: str, binds: Sequence[Bind], network: Network,
                    info_fd: int, init: bool = False, harness: bool = False) -> list[str]:
        args = ["bwrap", "--bind", str(self.fs), "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm",
                "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "sandbox",
                "--die-with-parent", "--new-session", "--info-fd", str(info_fd)]
        if self.build is not None:  # a Dockerfile RUN: root with a container's capabilities, as `docker build` runs it
            args += ["--cap-drop", "ALL"] + [arg for cap in BUILD_CAPS for arg in ("--cap-add", cap)]
        else:
            args += ["--unshare-user", "--uid", "0", "--gid", "0", "--cap-drop", "ALL"]
        if network == "none":
            args.append("--unshare-net")
        if init:
            args.append("--as-pid-1")
        for host, dest, read_only in binds:
            if not Path(host).exists():
                raise SandboxError(f"cannot bind {host} into the sandbox: it does not exist")
            args += ["--ro-bind" if read_only else "--bind", str(host), dest]
        # Inside, the command's stderr joins its stdout; what is on bwrap's stderr before STARTED is bwrap's.
        args += ["--chdir", cwd, "--", "/bin/sh", "-c", f'echo {STARTED} >&2; exec "$@" 2>&1', "sh", *argv]
        if isinstance(network, Loopback):
            args = ["nsenter", f"--net={network.netns}", "--", *args]
        return self.limits.wrap(args, harness=harness)

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

    def limit_hits(self, harness_exit_code: int | None = None) -> list[dict]:
        """What the limits did to this sandbox's processes so far (`steps.sandbox.limits.Limits.hits`); an OOM kill is
        the harness's if it ended by SIGKILL (bwrap passes that on as exit code 137)."""
        return self.limits.hits(harness_killed=harness_exit_code == 128 + signal.SIGKILL)

    def peaks_mb(self) -> dict[str, int]:
        """The most memory the harness's and the task's processes held at once, in MiB, where the host counts it."""
        return self.limits.peaks_mb()

    def close(self) -> None:
        """Unmount the sandbox's root and free its cgroups; the agent's changes stay for a look (in ROOT/upper,
        or in the ext4 image ROOT/disk.img where storage_mb is enforced: `debugfs -R 'ls -l /root' disk.img`)."""
        unmount(self.fs)
        if os.path.ismount(self.fs):
            raise SandboxError(f"cannot unmount the sandbox root {self.fs}")
        detach_disk(self.root / "upper")
        if self.owns_limits:  # a sibling (the app's) or the verifier's view runs in the cgroups of the sandbox it serves
            self.limits.remove()

    def remove(self) -> None:
        """Unmount, then delete the sandbox root and everything in it (never the task's cached layer)."""
        self.close()
        shutil.rmtree(self.root, onerror=force_remove)


def on_loopback(url: str, port: int) -> str:
    """`url` with its host and port replaced by 127.0.0.1:`port` (the tunnel's end inside the sandbox).

    >>> on_loopback("http://10.0.0.5:8100/rollouts/r0/v1", 8100)
    'http://127.0.0.1:8100/rollouts/r0/v1'
    """
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc=f"127.0.0.1:{port}"))


def graded_paths(task: Task, workdir: str) -> list[str]:
    """What the verifier sees of the agent's work: `[verifier] graded_paths`, or else the workspace."""
    paths = task.config.graded_paths or (workdir,)
    return sorted({posixpath.normpath(posixpath.join("/", path)) for path in paths})


def _fresh_root(root: Path) -> Path:
    """`root` made absolute and created; it must be new or empty (every sandbox needs a fresh folder)."""
    if shutil.which("bwrap") is None:
        raise SandboxError("bubblewrap is not installed; install it with `apt-get install -y bubblewrap`")
    if os.geteuid() != 0:
        raise SandboxError("local mode's sandbox needs a root runner (it mounts overlays and makes network "
                           "namespaces); run as root, or use pod mode (--isolation pod)")
    root = Path(root).absolute()
    if root.exists() and any(root.iterdir()):
        raise SandboxError(f"sandbox root {root} is not empty; every rollout needs a fresh folder")
    root.mkdir(parents=True, exist_ok=True)
    (root / OWNER_FILE).write_text(str(os.getpid()))
    return root


def _build_layer(build_root: Path, task: Task, settings: dict, layer: Path, log: Path) -> dict:
    """Build the task's layer into `layer` by applying its Dockerfile in a sandbox whose upper it becomes;
    the RUN steps' output goes to `log` (the rollout's build.log)."""
    box = LocalSandbox(root=_fresh_root(build_root), build={**settings, "log": str(log)})
    box._mount()
    try:
        if task.dockerfile is None:
            box.notes.append(f"image {task.config.docker_image} is replaced by the host system in local mode")
        else:
            apply_dockerfile(box, task)
        box.host_path(box.workdir).mkdir(parents=True, exist_ok=True)
    finally:
        box.close()
    for part in ("root", "sys"):
        (build_root / "upper" / part).rename(layer / part)
    shutil.rmtree(build_root, onerror=force_remove)
    return {"workdir": box.workdir, "env": box.env, "notes": box.notes}


def _args_from_fd(argv: list[str]) -> tuple[list[str], int]:
    """`argv` with bubblewrap's options moved into a memory file read with `--args FD` (returned, to pass to the child
    and close), so that the sandbox's init (bwrap, pid 1 inside) shows no host path in its /proc/1/cmdline; the
    command, after `--`, stays on the command line, where bwrap 0.8 wants it."""
    at, end = argv.index("bwrap"), argv.index("--", argv.index("bwrap"))
    fd = os.memfd_create("bwrap-args", 0)
    os.write(fd, b"".join(arg.encode() + b"\0" for arg in argv[at + 1:end]))
    os.lseek(fd, 0, os.SEEK_SET)
    return [*argv[:at], "bwrap", "--args", str(fd), *argv[end:]], fd


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


def _hold_namespace(init_pid: int | None) -> int | None:
    """An open handle on the sandbox's PID namespace, or None when its init is already gone.

    The kernel gives a freed namespace's number to the next one made, often another rollout's sandbox
    starting at that moment; while this handle is open the number stays this sandbox's, so that `_stop`
    never takes a stranger's processes for survivors of this one."""
    if init_pid is None:
        return None
    try:
        return os.open(f"/proc/{init_pid}/ns/pid", os.O_RDONLY)
    except OSError:
        return None


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


def _stop(process: subprocess.Popen, init_pid: int, namespace: str | None) -> None:
    """Kill the sandbox's processes and bwrap itself; return once none of them is left.

    Killing the namespace's init makes the kernel kill every process in the namespace, and lets
    bwrap reap it and exit; bwrap's host process group is the fallback.
    """
    if process.poll() is None:
        kill(init_pid)
        try:
            process.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            kill(-process.pid)
            process.wait()
    if namespace is None:  # not held: its number may be another sandbox's by now; its init's end killed the rest
        return
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline:
        survivors = _namespace_members(namespace)
        if not survivors:
            return
        for pid in survivors:
            kill(pid)
        time.sleep(0.05)
    if _namespace_members(namespace):
        raise SandboxError(f"processes in sandbox namespace {namespace} survived SIGKILL")
