"""Rollout metrics as pure functions: mean reward, pass@k and pass^k, per task and overall.

A try passes when its reward is at least `success` (`SUCCESS`, 1.0, by default). A reward of None is an
infrastructure failure (a harness that never started, a verifier that crashed): it is not a try at
all, so it neither passes nor fails. pass@k and pass^k use the unbiased estimators over n tries
with c passes, as in the Codex paper (pass@k) and tau-bench (pass^k):

    pass@k = 1 - C(n - c, k) / C(n, k)     at least one of k tries passes
    pass^k = C(c, k) / C(n, k)             all k tries pass

Overall numbers are macro averages: every task weighs the same, whatever its number of tries.

A rollout whose harness a limit killed (its memory or its processes; `result.json`'s `killed`) is still graded
and counted as a try, so the kills are counted beside these numbers (`harness_kills`), and an iteration or an
evaluation with more than a few percent of them says so in one line (`harness_killed_warning`).

    python -m pytest --doctest-modules steps/metrics.py
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from math import comb

SUCCESS = 1.0  # the verifier's full reward: a pass
# The limits whose kills of a harness are counted, each always (0 when none). The agent timeout ("time") is not one:
# each such rollout has the status agent_timeout already, and running out of time is the agent's own doing.
HARNESS_LIMITS = ("memory", "pids")
AGENT_TIMEOUT = "time"
KILLED_WARNING_SHARE = 0.05  # of an iteration's (or evaluation's) rollouts: more whose harness was killed is said


def mean_reward(rewards: Sequence[float | None]) -> float | None:
    """Mean of the rewards of real tries (None, an infra failure, is left out); None when there are none.

    >>> mean_reward([1.0, 0.0, 0.5, None])
    0.5
    >>> mean_reward([None]) is None
    True
    """
    tries = [r for r in rewards if r is not None]
    return sum(tries) / len(tries) if tries else None


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k tries drawn from n (c of them passing) passes.

    >>> pass_at_k(n=10, c=0, k=3)
    0.0
    >>> pass_at_k(n=10, c=1, k=1)
    0.1
    >>> round(pass_at_k(n=10, c=2, k=3), 4)  # 1 - C(8,3)/C(10,3) = 1 - 56/120
    0.5333
    >>> pass_at_k(n=5, c=3, k=3)  # fewer than k failures: any 3 tries include a pass
    1.0
    """
    _check(n, c, k)
    return (comb(n, k) - comb(n - c, k)) / comb(n, k)  # one division of exact integers


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Probability that all k tries drawn from n (c of them passing) pass: pass^k.

    >>> pass_hat_k(n=10, c=10, k=3)
    1.0
    >>> round(pass_hat_k(n=10, c=5, k=2), 4)  # C(5,2)/C(10,2) = 10/45
    0.2222
    >>> pass_hat_k(n=4, c=2, k=3)  # not enough passes for 3 all-passing tries
    0.0
    >>> pass_hat_k(n=10, c=4, k=1) == pass_at_k(n=10, c=4, k=1)
    True
    """
    _check(n, c, k)
    return comb(c, k) / comb(n, k)


def _check(n: int, c: int, k: int) -> None:
    if not 0 <= c <= n:
        raise ValueError(f"passes c must be between 0 and the number of tries n={n}, got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be between 1 and the number of tries n={n}, got {k}")


@dataclass(frozen=True)
class TaskMetrics:
    """One task's (or the dataset's) numbers; pass@k and pass^k are None with fewer than k tries."""

    tries: int
    passes: int
    mean_reward: float | None
    pass_at_k: float | None
    pass_hat_k: float | None


def task_metrics(rewards: Sequence[float | None], k: int, success: float = SUCCESS) -> TaskMetrics:
    """The metrics of one task's rewards (None = infra failure, not a try).

    >>> task_metrics([1.0, 0.0, 1.0, None], k=2)
    TaskMetrics(tries=3, passes=2, mean_reward=0.6666666666666666, pass_at_k=1.0, pass_hat_k=0.3333333333333333)
    >>> task_metrics([1.0], k=2).pass_at_k is None
    True
    """
    tries = [r for r in rewards if r is not None]
    passes = sum(r >= success for r in tries)
    enough = len(tries) >= k
    return TaskMetrics(tries=len(tries), passes=passes, mean_reward=mean_reward(tries),
                       pass_at_k=pass_at_k(len(tries), passes, k) if enough else None,
                       pass_hat_k=pass_hat_k(len(tries), passes, k) if enough else None)


def groups_with_signal(rewards_by_task: Mapping[str, Sequence[float | None]]) -> int:
    """Task groups whose tries earned more than one reward: those a group baseline learns from (the update drops
    the others, `steps.update.samples.signal_groups`). An infra error (None) is no try.

    >>> groups_with_signal({"a": [1.0, 0.0], "b": [1.0, 1.0, None], "c": [None, None], "d": [0.2, 0.4]})
    2
    """
    return sum(len({r for r in rewards if r is not None}) > 1 for rewards in rewards_by_task.values())


def dataset_metrics(rewards_by_task: Mapping[str, Sequence[float | None]], k: int,
                    success: float = SUCCESS) -> tuple[dict[str, TaskMetrics], TaskMetrics]:
    """Per-task metrics and their macro average over tasks (tasks lacking a value are left out of its mean).

    >>> per_task, overall = dataset_metrics({"a": [1, 1, 1], "b": [0, 1, 0], "c": [None, None]}, k=2)
    >>> per_task["b"].pass_at_k, per_task["c"].tries
    (0.6666666666666666, 0)
    >>> overall
    TaskMetrics(tries=6, passes=4, mean_reward=0.6666666666666666, pass_at_k=0.8333333333333333, pass_hat_k=0.5)
    """
    per_task = {name: task_metrics(rewards, k, success) for name, rewards in rewards_by_task.items()}
    values = per_task.values()

    def average(field: str) -> float | None:
        present = [getattr(m, field) for m in values if getattr(m, field) is not None]
        return sum(present) / len(present) if present else None

    overall = TaskMetrics(tries=sum(m.tries for m in values), passes=sum(m.passes for m in values),
                          mean_reward=average("mean_reward"), pass_at_k=average("pass_at_k"),
                          pass_hat_k=average("pass_hat_k"))
    return per_task, overall


def iteration_metrics(rewards_by_task: Mapping[str, Sequence[float | None]],
                      success: float = SUCCESS) -> tuple[int, TaskMetrics]:
    """k and the overall metrics of one iteration's (or evaluation's) rollouts, as the local runner's summary
    line and the run report show them: k is the fewest real tries of any task that has one (a task whose
    every try was an infra failure is left out of k and of the means, so one broken task does not collapse it).

    >>> k, overall = iteration_metrics({"a": [1, 0, 1, 0], "b": [None, None, None, None]})
    >>> k, overall.pass_at_k, overall.pass_hat_k, overall.tries
    (4, 1.0, 0.0, 4)
    >>> iteration_metrics({})[0]
    1
    """
    tries = [n for rewards in rewards_by_task.values() if (n := sum(r is not None for r in rewards))]
    k = min(tries, default=1)
    return k, dataset_metrics(rewards_by_task, k, success)[1]


def harness_kills(causes: Iterable[str | None]) -> dict[str, int]:
    """Rollouts whose harness a limit killed, by limit: `causes` holds each rollout's
    `steps.contracts.rollout.harness_killed` (None: not killed, or a result that predates the field). Every limit of
    `HARNESS_LIMITS` is there, 0 when none; a cause the runner may add later is counted under its own name; the agent
    timeout is left out.

    >>> harness_kills(["memory", None, "memory", "time", "pids"])
    {'memory': 2, 'pids': 1}
    >>> harness_kills([None, None])
    {'memory': 0, 'pids': 0}
    """
    counts = dict.fromkeys(HARNESS_LIMITS, 0)
    for cause in causes:
        if cause is not None and cause != AGENT_TIMEOUT:
            counts[str(cause)] = counts.get(str(cause), 0) + 1
    return counts


def harness_killed_warning(kills: Mapping[str, int], rollouts: int, what: str) -> str | None:
    """One line when more than `KILLED_WARNING_SHARE` of `what`'s `rollouts` had their harness killed by a limit
    (`harness_kills`), naming the config key that raises the harness's allowance; None otherwise.

    >>> print(harness_killed_warning({"memory": 3, "pids": 0}, 16, "iteration 2"))
    warning: iteration 2: a limit killed the harness in 3 of 16 rollouts (memory 3, pids 0); each was graded as the harness left it (most score 0): raise harness_memory_mb, the harness's memory beside the task's memory_mb (docs/reliability.md#limits)
    >>> harness_killed_warning({"memory": 1, "pids": 0}, 100, "iteration 2") is None
    True
    """
    killed = sum(kills.values())
    if not killed or killed <= KILLED_WARNING_SHARE * rollouts:
        return None
    causes = ", ".join(f"{cause} {n}" for cause, n in kills.items())
    return (f"warning: {what}: a limit killed the harness in {killed} of {rollouts} rollouts ({causes}); each was "
            "graded as the harness left it (most score 0): raise harness_memory_mb, the harness's memory beside the "
            "task's memory_mb (docs/reliability.md#limits)")
