"""Checking a dataset: every task's oracle must pass its own verifier in a fresh sandbox.

A task is `ok` when its environment builds, `solution/solve.sh` exits 0 within the agent timeout and
the verifier then writes a reward of 1. Otherwise it is `broken`, with the reason: a load error, a
failed build, an oracle that failed or timed out, a verifier that crashed, or a reward other than 1.
A task without `solution/solve.sh` is `skipped`, and so is one whose verifier asks a judge model (`[verifier] judge`:
only a run's proxy serves one). The CLI is `python -m steps.tasks check DATASET`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from steps.sandbox import LocalSandbox, Sandbox, SandboxError
from steps.tasks import Task, TaskError
from steps.grading.verify import run_oracle, run_verifier

OK, BROKEN, SKIPPED = "ok", "broken", "skipped"
TAIL_LINES = 8


@dataclass(frozen=True)
class CheckResult:
    """The verdict on one task of a dataset."""

    task: str
    status: str  # OK, BROKEN or SKIPPED
    reason: str = ""  # one sentence when broken or skipped
    details: str = ""  # the end of the log that explains it (oracle, verifier or build output)
    duration_s: float = 0.0
    log_dir: Path | None = None  # oracle.txt, verifier/, build.log
    notes: list[str] = field(default_factory=list)  # what local mode changed (FROM, USER...)


def check_task(task: Task, work_dir: Path) -> CheckResult:
    """Build the task's sandbox under `work_dir`, run its oracle, then its verifier.

    The logs stay in `work_dir` (oracle.txt, verifier/), and so does the sandbox of a broken task
    (`work_dir/sandbox`, with build.log), for inspection.
    """
    started = time.monotonic()
    if task.solution_dir is None:
        return CheckResult(task.name, SKIPPED, "no solution/solve.sh to check")
    if task.config.judge:  # its reward is the run's judge model's, which only a run's proxy reaches
        return CheckResult(task.name, SKIPPED, "its verifier asks a judge model ([verifier] judge), which only a "
                                               "run's proxy serves")

    def verdict(status: str, reason: str = "", details: str = "", notes: Sequence[str] = ()) -> CheckResult:
        return CheckResult(task.name, status, reason, details, round(time.monotonic() - started, 2), work_dir,
                           list(notes))

    try:
        sandbox = LocalSandbox.create(work_dir / "sandbox", task)
    except SandboxError as exc:
        reason, _, output = str(exc).partition("\n")
        return verdict(BROKEN, f"environment build failed: {reason}", output.strip("\n"))
    try:
        status, reason, details = _oracle_then_verifier(sandbox, task, work_dir)
    except SandboxError as exc:
        status, reason, details = BROKEN, f"sandbox failed: {exc}", ""
    if status == OK:
        sandbox.remove()
    else:
        sandbox.close()  # unmounted; ROOT/upper/root holds what the oracle left
    return verdict(status, reason, details, sandbox.notes)


def _oracle_then_verifier(sandbox: Sandbox, task: Task, work_dir: Path) -> tuple[str, str, str]:
    """(status, reason, log tail) of running the oracle and then the verifier in `sandbox`."""
    oracle = run_oracle(sandbox, task, work_dir / "oracle.txt")
    if oracle.timed_out:
        return BROKEN, f"oracle timed out after {task.config.agent_timeout_s:g} s", _tail(work_dir / "oracle.txt")
    if oracle.exit_code != 0:
        return BROKEN, f"oracle failed with exit code {oracle.exit_code}", _tail(work_dir / "oracle.txt")
    result = run_verifier(sandbox, task, work_dir / "verifier")
    verifier_log = _tail(result.output_dir / "test-stdout.txt")
    if result.reward is None:
        return BROKEN, f"verifier crashed: {result.error}", verifier_log
    if result.reward != 1:
        return BROKEN, f"reward {result.reward:g} != 1: the verifier rejects the oracle's work", verifier_log
    return OK, "", ""


def check_dataset(tasks: list[Task], errors: list[TaskError], work_dir: Path, jobs: int = 1,
                  progress: Callable[[CheckResult], None] = lambda result: None) -> list[CheckResult]:
    """Check every task, `jobs` at a time; load errors become broken results. Calls `progress` as each ends."""
    results = [CheckResult(error.task, BROKEN, f"load error: {error.message}") for error in errors]
    for result in results:
        progress(result)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(_check_safely, task, work_dir / _folder_name(task.name)) for task in tasks]
        for future in as_completed(futures):
            results.append(future.result())
            progress(results[-1])
    return results


def _check_safely(task: Task, work_dir: Path) -> CheckResult:
    """`check_task`, with an unexpected failure (disk full, permissions...) reported as broken, not raised."""
    try:
        return check_task(task, work_dir)
    except OSError as exc:
        return CheckResult(task.name, BROKEN, f"could not be checked: {exc}", log_dir=work_dir)


def _folder_name(task_name: str) -> str:
    """A task name ("org/name" in Harbor's registry) as a single folder name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "__", task_name)


def _tail(path: Path) -> str:
    """The last lines of a log; "" when there is none."""
    if not path.is_file():
        return ""
    return "\n".join(path.read_text(errors="replace").rstrip().splitlines()[-TAIL_LINES:])
