"""Where an agent and its verifier run: a task's environment, isolated.

One concept, two kinds side by side: `Sandbox` (`base.py`) is what a rollout and its grading need of one;
`LocalSandbox` (`local.py`) is the layered bubblewrap sandbox a runner without containers uses (its docstring says
what it isolates); `PodSandbox` (`pod.py`) is a Kubernetes rollout pod, which already runs the task's image.
`open_sandbox` picks one, and is the one place that asks which. `build` applies a task's Dockerfile to a local layer
(`dockerfile` reads it); `root`, `network` and `limits` are the local sandbox's overlay root, its tunnel to the proxy,
and its cgroups and disk; `app` runs a task's app beside the agent; `files` is what both kinds do with the files
inside; `common` is what they all share.
"""

import sys
from pathlib import Path

from steps.sandbox.base import Bind, HarnessSetup, Sandbox
from steps.sandbox.common import Bounds, RunResult, SandboxError, VerifierRefused
from steps.sandbox.limits import Budget
from steps.sandbox.local import LocalSandbox
from steps.sandbox.pod import PodSandbox, protect_runner
from steps.tasks import Task

__all__ = ["ISOLATIONS", "Bind", "HarnessSetup", "LocalSandbox", "PodSandbox", "RunResult", "Sandbox", "SandboxError",
           "VerifierRefused", "open_sandbox", "prepare_runner"]

ISOLATIONS = ("bwrap", "pod")  # a bubblewrap sandbox built from the Dockerfile, or the Kubernetes pod itself


def prepare_runner(isolation: str) -> str | None:
    """Readies this process, the rollout step's runner, for sandboxes of `isolation`; returns why it cannot run one, or
    None. Called once by the step's `main`, never in a process that lives on (a test's): a pod's runner keeps the OOM
    killer off itself (`pod.protect_runner`; `PodSandbox.create` notes it when the container does not allow it)."""
    if isolation != "pod":
        return None
    if not sys.flags.safe_path:
        return ("run pod mode with python -P (or PYTHONSAFEPATH=1): the working folder is the agent's workspace "
                "and must not be on the runner's import path")
    protect_runner()
    return None


def open_sandbox(isolation: str, out: Path, task: Task, *, bounds: Bounds, harness: HarnessSetup,
                 budget: Budget | None, agent_uid: int) -> Sandbox:
    """The sandbox of one rollout whose output folder is `out`: "bwrap", a fresh bubblewrap sandbox in `out/sandbox`
    with the harness brought in (`harness`) and its own budget beside the task's (`budget`); "pod", this pod, with the
    agent as `agent_uid` (when the runner is root). Raises `SandboxError` when it cannot be made."""
    if isolation == "pod":
        return PodSandbox.create(out, task, agent_uid=agent_uid, bounds=bounds)
    if isolation == "bwrap":
        return LocalSandbox.create(out / "sandbox", task, bounds, budget, harness)
    raise SandboxError(f"isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
