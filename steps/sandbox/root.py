"""The layered root of a local sandbox: the host system as the base, the task's built layer, the rollout's own.

A sandbox's `/` is a stack of overlayfs mounts, made by the runner (root) on the host at `ROOT/merged`:

    /             lower: the task's layer `root/` and a skeleton (the Harbor folders)    upper: ROOT/upper/root
    /usr, /etc... lower: the task's layer `sys/usr`, a mask, the host's /usr            upper: ROOT/upper/sys/usr

- **The task's layer** is what `environment/Dockerfile` changed, anywhere (`apt-get install` into /usr and
  /var, `pip install` into /usr/local, files into /app or /opt). It is built once per task into the cache
  (`$OPENFORGE_CACHE/layers/<key>`, key = the Dockerfile, its build context, the host's package list and the
  build settings), then only ever mounted read-only: every rollout of the task starts from it in milliseconds,
  and nothing a build or a rollout does reaches the host's own files.
- **The mask** hides what the host must not show a sandbox: every file of /etc that is not world-readable
  (shadow files, private keys), and all of /var but what apt and dpkg need (their state and caches; /var/log,
  /var/tmp and the rest are empty).
- **The rollout's upper** holds everything the agent changes; the verifier gets a fresh upper of its own
  over the same layer, with only the graded paths copied over (`steps/sandbox/local.py`).

The mount options name layers by paths relative to `ROOT` (a link `ROOT/layer` to the cache), so nothing a
sandbox can read (`/proc/self/mountinfo`) names a host folder.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

LAYER_FORMAT = "2"  # bump when a layer's layout changes: old layers are then rebuilt
# The host folders a sandbox sees (read-only below its own changes), each where the host has it.
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "var")
# Folders every Harbor container has; the Dockerfile adds the rest (WORKDIR /app, ...).
LAYOUT = {"tmp": 0o1777, "root": 0o700, "logs/agent": 0o777, "logs/verifier": 0o777, "logs/artifacts": 0o777,
          "opt": 0o755, "srv": 0o755, "home": 0o755, "mnt": 0o755, "media": 0o755, "run": 0o755}
# What of the host's /var a sandbox sees: apt's and dpkg's state, so that `apt-get install` works.
VAR_KEPT = {"lib": {"dpkg", "apt", "ucf", "python", "pam", "misc"}, "cache": {"apt", "debconf", "ldconfig"}}
VAR_EMPTY = ("log", "tmp", "spool", "mail", "backups")
# Inside a user namespace apt cannot drop to its _apt user; in the sandbox it stays root.
APT_SANDBOX_CONF = ("apt/apt.conf.d/00openforge-sandbox", 'APT::Sandbox::User "root";\n')


class LayerError(RuntimeError):
    """A layer cannot be built or mounted; the message says why in one sentence."""


def system_dirs() -> list[str]:
    """The host folders (not links) that each get an overlay of their own."""
    return [name for name in SYSTEM_DIRS if (Path("/") / name).is_dir() and not (Path("/") / name).is_symlink()]


def cache_dir() -> Path:
    """Where built task layers are kept: `$OPENFORGE_CACHE/layers` (default `~/.cache/openforge/layers`)."""
    return Path(os.environ.get("OPENFORGE_CACHE", Path.home() / ".cache" / "openforge")) / "layers"


def layer_key(dockerfile: Path | None, context: Path, settings: dict) -> str:
    """The cache key of a task's layer: what its build reads, and what it is built on.

    The Dockerfile, every file of the build context (path, mode, bytes), the host's dpkg package list
    (a layer's /var/lib/dpkg/status is a copy of it) and the build settings.
    """
    digest = hashlib.sha256(f"openforge-layer {LAYER_FORMAT}\n".encode())
    digest.update(json.dumps(settings, sort_keys=True).encode())
    for path in (dockerfile, Path("/var/lib/dpkg/status")):
        digest.update(path.read_bytes() if path is not None and path.is_file() else b"-")
    if context.is_dir():
        for path in sorted(context.rglob("*")):
            info = path.lstat()
            digest.update(f"\n{path.relative_to(context)} {info.st_mode:o} ".encode())
            if stat.S_ISLNK(info.st_mode):
                digest.update(os.readlink(path).encode())
            elif stat.S_ISREG(info.st_mode):
                digest.update(path.read_bytes())
    return digest.hexdigest()[:24]


def make_skeleton(folder: Path) -> None:
    """The lowest layer of `/`: the Harbor folders, mount points for the system folders, the host's links."""
    folder.mkdir(parents=True)
    for name in SYSTEM_DIRS:
        host = Path("/") / name
        if host.is_symlink():
            (folder / name).symlink_to(os.readlink(host))
        elif host.is_dir():
            (folder / name).mkdir()
    for name, mode in LAYOUT.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        (folder / name).chmod(mode)


def make_mask(folder: Path) -> None:
    """The layer that hides host files from every sandbox (see the module docstring)."""
    folder.mkdir(parents=True)
    etc = folder / "etc"
    etc.mkdir()
    for dirpath, dirnames, filenames in os.walk("/etc"):
        relative = Path(dirpath).relative_to("/etc")
        for name in [*dirnames, *filenames]:
            try:
                mode = os.lstat(Path(dirpath) / name).st_mode
            except OSError:
                continue
            if not stat.S_ISLNK(mode) and not mode & stat.S_IROTH:
                _whiteout(etc / relative / name)
        dirnames[:] = [d for d in dirnames if os.stat(Path(dirpath) / d, follow_symlinks=False).st_mode & stat.S_IROTH]
    conf = etc / APT_SANDBOX_CONF[0]
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(APT_SANDBOX_CONF[1])
    var = folder / "var"
    var.mkdir()
    if Path("/var").is_dir():
        for entry in os.scandir("/var"):
            kept = VAR_KEPT.get(entry.name)
            if entry.name in VAR_EMPTY and entry.is_dir(follow_symlinks=False):
                _opaque_dir(var / entry.name)
            elif kept is not None and entry.is_dir(follow_symlinks=False):
                for inner in os.scandir(entry.path):
                    if inner.name not in kept:
                        _whiteout(var / entry.name / inner.name)
            elif kept is None and not entry.is_symlink():
                _whiteout(var / entry.name)


def _whiteout(path: Path) -> None:
    """An overlayfs whiteout: the name is hidden in every layer below."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() and not path.is_symlink():
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(0, 0))


def _opaque_dir(path: Path) -> None:
    """An empty folder that hides what the layers below hold at that path."""
    path.mkdir(parents=True, exist_ok=True)
    os.setxattr(path, "trusted.overlay.opaque", b"y")


def mount_root(root: Path, layer: Path | None, upper: Path, merged: Path) -> None:
    """Mount a sandbox's `/` at `merged`: the overlay stack of the module docstring, `upper` on top.

    `layer` is a built task layer (None while building one: then `upper` becomes that layer). `upper` holds
    the changes (`root/`, `sys/NAME/`) and overlayfs's work folders (`work/`, which must be on the same file
    system: `upper` may be a disk of its own). Every path in the mount options is relative to `root`, which
    must hold `upper`, `merged`, `skeleton` and `mask`.
    """
    names = {"upper": upper, "merged": merged}
    for name, path in names.items():
        if path.parent != root:
            raise LayerError(f"{name} folder {path} must be directly inside the sandbox root {root}")
    if layer is not None and not (root / "layer").is_symlink():
        (root / "layer").symlink_to(layer)
    if not (root / "host").is_symlink():
        (root / "host").symlink_to("/")
    work = upper / "work"
    lower = ["layer/root"] if layer is not None else []
    script = [_overlay([*lower, "skeleton"], f"{upper.name}/root", f"{upper.name}/work/root", merged.name)]
    for name in system_dirs():
        lowers = [f"layer/sys/{name}"] if layer is not None else []
        if (root / "mask" / name).is_dir():
            lowers.append(f"mask/{name}")
        script.append(_overlay([*lowers, f"host/{name}"], f"{upper.name}/sys/{name}", f"{upper.name}/work/sys/{name}",
                               f"{merged.name}/{name}"))
    for folder in [upper / "root", work / "root"] + [p / "sys" / n for p in (upper, work) for n in system_dirs()]:
        folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["sh", "-ec", "\n".join(script)], cwd=root, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        unmount(merged)
        raise LayerError(f"cannot mount the sandbox's layered root: {done.stderr.strip().splitlines()[-1:]}")


def _overlay(lowers: list[str], upper: str, work: str, target: str) -> str:
    return f"mount -t overlay overlay -o 'lowerdir={':'.join(lowers)},upperdir={upper},workdir={work}' '{target}'"


def unmount(merged: Path) -> None:
    """Unmount a sandbox root and everything mounted under it (lazily: a straggler cannot keep it busy)."""
    if merged == Path("/"):
        raise LayerError("refusing to unmount /")
    if merged.is_dir() and os.path.ismount(merged):
        subprocess.run(["umount", "-R", "-l", str(merged)], capture_output=True, check=False)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_layer(key: str, build: Callable[[Path], dict]) -> tuple[Path, dict, bool]:
    """The cached layer `key` with its metadata, built by `build(folder) -> metadata` when missing.

    Concurrent rollouts of one task wait for one build (a file lock); a failed build leaves nothing in
    the cache. Returns (layer folder, metadata, whether this call built it).
    """
    final = cache_dir() / key
    with _locked(cache_dir() / f"{key}.lock"):
        meta_path = final / "meta.json"
        if meta_path.is_file():
            return final, json.loads(meta_path.read_text()), False
        staging = cache_dir() / f"{key}.building-{os.getpid()}-{time.monotonic_ns()}"
        try:
            staging.mkdir(parents=True)
            meta = build(staging)
            (staging / "meta.json").write_text(json.dumps(meta))
            if final.exists():
                shutil.rmtree(final)
            staging.rename(final)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        return final, meta, True


OWNER_FILE = "owner"  # in a sandbox root: the pid of the runner that mounted it


def sweep_leftovers() -> list[str]:
    """Unmount sandbox roots (and their disks) whose runner died without unmounting them (a SIGKILL skips
    its exit handlers); return what was swept. A root is this module's when its folder holds `OWNER_FILE`."""
    swept = []
    try:
        with open("/proc/self/mountinfo") as table:
            points = [line.split()[4] for line in table]
    except OSError:
        return swept
    for point in dict.fromkeys(points):
        path = Path(point.replace("\\040", " "))
        if path.name not in ("merged", "upper") or not (path.parent / OWNER_FILE).is_file():
            continue
        try:
            owner = int((path.parent / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if owner != os.getpid() and not Path(f"/proc/{owner}").exists():
            subprocess.run(["umount", "-R", "-l", str(path)], capture_output=True, check=False)
            swept.append(str(path))
    return swept
