"""What a rollout and its grading need of a sandbox, whichever kind runs it: the `Sandbox` protocol.

Two kinds implement it side by side: `LocalSandbox` (`steps/sandbox/local.py`, bubblewrap over the task's layer
built from its Dockerfile) and `PodSandbox` (`steps/sandbox/pod.py`, the Kubernetes rollout pod, which already
runs the task's image). `steps.sandbox.open_sandbox` picks one; nothing above it asks which it got.

The life of one: opened for a task; the harness's command runs as the agent (`run_harness`), the agent reaching
the proxy at `agent_url`; what a limit did is read back (`limit_hits`, `peaks_mb`); then the verifier gets a
sandbox fit to grade in (`for_verifier`, `prepare_verifier`), where `tests/` is copied in only now and the
verifier's command runs (`run_verifier_command`); `close` ends it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from steps.sandbox.common import RunResult
from steps.tasks import Task

# Where the verifier's own files are, in every sandbox: filled only after the agent has stopped.
TESTS_DIR = "/tests"
SOLUTION_DIR = "/solution"
VERIFIER_DIR = "/logs/verifier"

Bind = tuple[Path | str, str, bool]  # (host path, path inside the sandbox, read-only)


@dataclass(frozen=True)
class HarnessSetup:
    """The harness a rollout runs and the proxy it calls, as a sandbox that brings them in needs them (a local one;
    a rollout pod already holds its harness, and its network reaches the proxy)."""

    binds: tuple[Bind, ...]  # the harness's install, brought in read-only (`binds()` of its module)
    programs: tuple[str, ...]  # what runs as the harness's own processes (`programs(exe)`); the rest is the agent's
    proxy_url: str  # the recording proxy, as the runner reaches it


class Sandbox(Protocol):
    """One rollout's sandbox: where the agent's commands and then the verifier run, for one task."""

    workdir: str  # the agent's workspace, inside
    home: str  # the agent's HOME, inside, where its harness keeps config and session logs
    env: dict[str, str]  # every command's environment: the image's ENV and the task's [environment] env
    image_env: dict[str, str]  # the image's ENV alone: the verifier's base
    notes: list[str]  # what this sandbox did differently from a container of the task's image, for result.json

    @property
    def fs(self) -> Path:
        """The host folder that is `/` inside."""
        ...

    def host_path(self, sandbox_path: str) -> Path:
        """The host path of an absolute path inside, resolving symlinks as the inside would."""
        ...

    def agent_url(self, url: str) -> str:
        """`url` (the recording proxy's) as the agent reaches it from inside."""
        ...

    def run(self, argv: Sequence[str], *, timeout_s: float, env: dict[str, str] | None = None,
            cwd: str | None = None, stdout_path: Path | None = None, as_agent: bool = False) -> RunResult:
        """Run `argv` inside (as the agent with `as_agent`, e.g. the task's oracle); kill all it started at its end
        or at `timeout_s`. stdout and stderr go together to `stdout_path`."""
        ...

    def run_harness(self, argv: Sequence[str], *, timeout_s: float, env: dict[str, str],
                    stdout_path: Path) -> RunResult:
        """Run the harness's command as the agent, with the harness and the way to the proxy it was opened with."""
        ...

    def limit_hits(self, harness_exit_code: int | None = None) -> list[dict]:
        """What the limits killed so far: `[{"process": "harness" | "agent", "by": ..., "count": N}]`."""
        ...

    def peaks_mb(self) -> dict[str, int]:
        """The most memory the harness's and the agent's processes held at once, in MiB, where it is known."""
        ...

    def for_verifier(self, task: Task) -> Sandbox:
        """Where the verifier runs, once the agent's processes are gone: only the graded paths of the agent's work
        reach it. Raises `VerifierRefused` (graded 0) when they cannot be brought over within bounds."""
        ...

    def prepare_verifier(self, env: dict[str, str]) -> dict[str, str]:
        """Make this (the verifier's) sandbox fit to grade in; return the verifier's environment. Raises
        `VerifierRefused` (graded 0) when the agent changed what the verifier would run."""
        ...

    def run_verifier_command(self, supervised: list[str], plain: list[str], *, timeout_s: float,
                             env: dict[str, str], stdout_path: Path, judge: bool = False) -> RunResult:
        """Run the verifier as this sandbox's root, `TESTS_DIR` beyond the reach of what it runs: `supervised`
        (test.sh under a supervisor that counts what is left running) where the verifier's processes are alone
        in their PID namespace, else `plain`. `judge`: it may reach the proxy (its judge route: a task's
        `[verifier] judge`), as `agent_url` gives it."""
        ...

    def reset_dir(self, sandbox_path: str) -> Path:
        """Make `sandbox_path` an empty folder; return its host path."""
        ...

    def copy_in(self, host_path: Path, sandbox_path: str) -> None:
        """Put a host file or folder at `sandbox_path`, replacing what was there (`tests/`, after the agent)."""
        ...

    def copy_logs_out(self, sandbox_path: str, host_path: Path, first: Sequence[str] = ()) -> list[str]:
        """Copy a folder's regular files out as logs, within the log cap, `first` first; returns notes on cuts."""
        ...

    def close(self) -> None:
        """End it; what the agent left stays where the kind keeps it, for a look."""
        ...

    def remove(self) -> None:
        """End it and delete what it holds on the host."""
        ...
