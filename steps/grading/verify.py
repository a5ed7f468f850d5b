"""Running a task's verifier (and its oracle) in a sandbox, and reading the reward it writes.

The verifier is Harbor's, run where the agent cannot reach it: in a pristine root of the task's built
environment that holds, of the agent's work, only the graded paths (`LocalSandbox.for_verifier`; in a pod, the
pod itself after the agent uid's processes are gone), with a fresh environment (`verifier_env`). `tests/`
is copied to `/tests` only now; `/logs/verifier` starts empty; `bash /tests/test.sh` runs under
`[verifier] timeout_sec`; the reward is `/logs/verifier/reward.json`
(its "reward" entry) or else `/logs/verifier/reward.txt` (one number). A verifier that times out or
writes no readable reward (or one that is not trusted, see SUPERVISOR) has failed: `VerifierResult.reward`
is None and `error` says why. Grading runs where only the agent's work can reach it, so `steps.rollout`
scores such a rollout 0 (and `steps.tasks check`, running the oracle, reports the task broken).

    from steps.grading.verify import run_oracle, run_verifier
    run_oracle(sandbox, task, Path("out/oracle.txt"))
    verdict = run_verifier(sandbox, task, Path("out/verifier"))
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from steps.sandbox import RunResult, Sandbox, VerifierRefused
from steps.sandbox.base import SOLUTION_DIR, TESTS_DIR, VERIFIER_DIR
from steps.tasks import Task

REWARD_FILES = ("reward.json", "reward.txt")  # in /logs/verifier; reward.json wins


# Runs test.sh, then checks that it ended on its own and left nothing running, with shell builtins only (it
# must not fork: what it counts are the verifier's processes). Anything of the verifier's still alive when
# test.sh ends (e.g. the agent's program it ran, left in the background) could write the reward file after
# test.sh did, so the reward is then not trusted; nor when test.sh was killed. Exit 201/202 say which. It runs
# as its PID namespace's init, which nothing inside can kill (a test.sh may `kill -KILL -1` to clean up).
SUPERVISOR = r"""bash /tests/test.sh
status=$?
others=0
for proc in /proc/[0-9]*; do
  pid=${proc#/proc/}
  { [ "$pid" = 1 ] || [ "$pid" = "$$" ]; } && continue
  read -r line < "$proc/stat" 2>/dev/null || continue
  state=${line##*) }; state=${state%% *}
  case "$state" in Z|X) ;; *) others=$((others + 1)) ;; esac
done
if [ "$others" -gt 0 ]; then
  echo "openforge: $others processes were still running when test.sh ended: its reward is not trusted" >&2
  exit 201
fi
if [ "$status" -ge 128 ]; then
  echo "openforge: test.sh ended with status $status (a signal): its reward is not trusted" >&2
  exit 202
fi
exit "$status"
"""
UNTRUSTED = {201: "processes of the verifier (the agent's program, say) were still running when test.sh ended",
             202: "test.sh was killed (ended with a signal's status)"}


class RewardError(ValueError):
    """The verifier's reward files are missing or unreadable; the message says which and why."""


@dataclass(frozen=True)
class VerifierResult:
    """What one verifier run produced. `reward` is None when the verifier crashed (see `error`)."""

    reward: float | None
    rewards: dict[str, float]
    error: str | None
    exit_code: int
    timed_out: bool
    duration_s: float
    output_dir: Path  # test-stdout.txt and a copy of /logs/verifier


def parse_reward(reward_json: str | None, reward_txt: str | None) -> dict[str, float]:
    """The rewards in a verifier's reward.json (preferred) or reward.txt; always has a "reward" key.

    >>> parse_reward(None, "1\\n")
    {'reward': 1.0}
    >>> parse_reward('{"reward": 0.5, "tests_passed": 3, "note": "x"}', None)
    {'reward': 0.5, 'tests_passed': 3.0}
    >>> parse_reward('{"accuracy": 1}', None)
    {'accuracy': 1.0, 'reward': 1.0}
    >>> parse_reward(None, "yes")
    Traceback (most recent call last):
    ...
    steps.grading.verify.RewardError: reward.txt must hold one number, got 'yes'
    """
    if reward_json is not None:
        try:
            data = json.loads(reward_json)
        except ValueError:
            raise RewardError("reward.json is not valid JSON") from None
        if not isinstance(data, dict):
            raise RewardError("reward.json must be a JSON object such as {\"reward\": 1}")
        rewards = {k: float(v) for k, v in data.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        if "reward" not in rewards and len(rewards) == 1:
            rewards["reward"] = next(iter(rewards.values()))
        if "reward" in rewards:
            return rewards
        if reward_txt is None:
            raise RewardError("reward.json has no numeric \"reward\" entry")
        return {**rewards, **parse_reward(None, reward_txt)}
    if reward_txt is None:
        raise RewardError("the verifier wrote neither reward.txt nor reward.json")
    try:
        value = float(reward_txt.strip())
    except ValueError:
        raise RewardError(f"reward.txt must hold one number, got {reward_txt.strip()[:40]!r}") from None
    if not math.isfinite(value):
        raise RewardError(f"reward.txt must hold a finite number, got {reward_txt.strip()!r}")
    return {"reward": value}


def read_reward(verifier_dir: Path) -> dict[str, float]:
    """`parse_reward` on the reward files in a host copy of /logs/verifier (symlinks refused)."""
    texts = []
    for name in REWARD_FILES:
        path = verifier_dir / name
        if path.is_symlink():
            raise RewardError(f"{name} is a symlink, not a file the verifier wrote")
        texts.append(path.read_text(errors="replace") if path.is_file() else None)
    return parse_reward(*texts)


def verifier_env(sandbox: Sandbox, task: Task) -> dict[str, str]:
    """The verifier's whole environment: the image's (BASE_ENV and the Dockerfile's ENV), fresh, plus `[verifier] env`.

    Nothing of the agent's environment or of the runner's. Python neither reads a user site nor puts the
    working folder (the agent's workspace) or a script's folder first on its path.
    """
    return {**sandbox.image_env, "HOME": "/root", "TMPDIR": "/tmp", "PYTHONNOUSERSITE": "1", "PYTHONSAFEPATH": "1",
            "PYTHONDONTWRITEBYTECODE": "1", **task.config.verifier_env}


def run_verifier(sandbox: Sandbox, task: Task, output_dir: Path, env: dict[str, str] | None = None,
                 judge: bool = False) -> VerifierResult:
    """Grade in a pristine root (`sandbox.for_verifier`): copy `tests/` in, run `tests/test.sh`, read its reward.

    Call only after the agent's processes have stopped. `output_dir` (on the host) receives the
    verifier's stdout+stderr as `test-stdout.txt` and a copy of the sandbox's /logs/verifier. `env` is added to
    the verifier's own; `judge`: the verifier reaches the proxy's judge route (`env` then holds its URL and key:
    `steps.rollout.grade`).
    """
    output_dir.mkdir(parents=True, exist_ok=True)
    try:
        grading = sandbox.for_verifier(task)
        env = grading.prepare_verifier({**verifier_env(grading, task), **(env or {})})
    except VerifierRefused as exc:
        if "grading" in locals() and grading is not sandbox:
            grading.remove()
        return VerifierResult(reward=None, rewards={}, error=str(exc), exit_code=-1, timed_out=False,
                              duration_s=0.0, output_dir=output_dir)
    try:
        grading.reset_dir(VERIFIER_DIR)
        grading.copy_in(task.tests_dir, TESTS_DIR)
        run = grading.run_verifier_command(["bash", "-c", SUPERVISOR], ["bash", f"{TESTS_DIR}/test.sh"],
                                           timeout_s=task.config.verifier_timeout_s, env=env,
                                           stdout_path=output_dir / "test-stdout.txt", judge=judge)
        # The reward files first: past the log cap, whatever else the verifier (or the agent's program it ran) left
        # there is cut, never the reward. A /logs/verifier the verifier removed copies nothing (no reward, below).
        grading.notes.extend(f"{VERIFIER_DIR}: {note}" for note in
                             grading.copy_logs_out(VERIFIER_DIR, output_dir, first=REWARD_FILES))
    finally:
        if grading is not sandbox:
            sandbox.notes.extend(grading.notes)
            grading.remove()
    rewards, error = {}, None
    if run.timed_out:
        error = f"the verifier did not finish within its timeout of {task.config.verifier_timeout_s:g} s"
    elif run.exit_code in UNTRUSTED or run.exit_code >= 128:
        error = f"the reward is not trusted: {UNTRUSTED.get(run.exit_code, f'the verifier was killed (exit code {run.exit_code})')}"
    else:
        try:
            rewards = read_reward(output_dir)
        except RewardError as exc:
            error = f"{exc} (test.sh exit code {run.exit_code})"
    return VerifierResult(reward=rewards.get("reward"), rewards=rewards, error=error, exit_code=run.exit_code,
                          timed_out=run.timed_out, duration_s=run.duration_s, output_dir=output_dir)


def run_oracle(sandbox: Sandbox, task: Task, stdout_path: Path) -> RunResult:
    """Run the task's `solution/solve.sh` as the agent would act: in the workspace, under the agent timeout, with
    the task's app beside it (`steps.sandbox.app`)."""
    if task.solution_dir is None:
        raise ValueError(f"task {task.name} has no solution/solve.sh")
    sandbox.copy_in(task.solution_dir, SOLUTION_DIR)
    return sandbox.run(["bash", f"{SOLUTION_DIR}/solve.sh"], timeout_s=task.config.agent_timeout_s,
                       env=task.config.solution_env, stdout_path=stdout_path, as_agent=True)
