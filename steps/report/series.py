"""The report's numbers per iteration, as pure functions of table rows (docs/report.md defines each).

pass@k and pass^k come from `steps.metrics.iteration_metrics`, as the local runner's summary line: k = the
fewest real tries of a task that has one; infra errors are no tries and are counted apart. A rollout whose harness
a limit killed is a try (it was graded), and is counted apart too (`killed_counts`).
"""

from collections import defaultdict
from dataclasses import asdict

from steps.curriculum import STATES
from steps.metrics import harness_kills, iteration_metrics
from steps.trajectories.collect import HarnessStats
from steps.trajectories.samples import RolloutSamples

DURATIONS = ["setup_s", "agent_s", "verifier_s", "total_s"]
KILLED = "harness killed: "  # before a limit's name: the rollouts whose harness it killed


def _mean(values) -> float | None:
    present = [float(v) for v in values if v is not None and not isinstance(v, bool)]
    return sum(present) / len(present) if present else None


def reward_metrics(rollouts: list[dict]) -> dict:
    """Mean reward, pass@k, pass^k (k, tries) and infra errors of an iteration's rollouts.

    >>> rows = [{"task": "a", "status": "ok", "reward": 1.0}, {"task": "a", "status": "ok", "reward": 0.0},
    ...         {"task": "a", "status": "infra_error", "reward": None}]
    >>> reward_metrics(rows)
    {'k': 2, 'tries': 2, 'passes': 1, 'mean_reward': 0.5, 'pass_at_k': 1.0, 'pass_hat_k': 0.0, 'infra_errors': 1}
    """
    by_task: dict[str, list] = defaultdict(list)
    for row in rollouts:
        by_task[str(row.get("task"))].append(None if row.get("status") == "infra_error" else row.get("reward"))
    k, overall = iteration_metrics(by_task)
    return {"k": k, **asdict(overall), "infra_errors": sum(r.get("status") == "infra_error" for r in rollouts)}


def killed_counts(rollouts: list[dict]) -> dict:
    """The rollouts whose harness a limit killed, by limit (`steps.metrics.harness_kills`, from each row's
    `harness_killed`; every attempt counts, as for infra errors; a row without it, none).

    >>> killed_counts([{"harness_killed": "memory"}, {"harness_killed": "time"}, {"harness_killed": None}, {}])
    {'harness killed: memory': 1, 'harness killed: pids': 0}
    """
    return {f"{KILLED}{limit}": n for limit, n in harness_kills(r.get("harness_killed") for r in rollouts).items()}


def continuity_by_harness(calls: list[dict]) -> dict[str, float | None]:
    """Per harness: the trajectories step's `continuity_rate` (`HarnessStats`, its one owner), from the calls
    table: calls that extended an existing sample token-exactly (`continued`) over the calls that could have
    (every call that went into a sample, but each rollout's first).

    >>> calls = [{"call_index": n, "harness": "codex", "rollout_id": "r", "sample_index": s, "continued": c}
    ...          for n, (s, c) in enumerate([(0, False), (0, True), (1, False), (None, None)])]
    >>> continuity_by_harness(calls)
    {'codex': 0.5}
    """
    used: dict[tuple, list[dict]] = defaultdict(list)
    for call in calls:
        if call.get("sample_index") is not None:
            used[str(call.get("harness")), call["rollout_id"]].append(call)
    stats: dict[str, HarnessStats] = defaultdict(HarnessStats)
    for (harness, _), members in used.items():
        built = RolloutSamples(samples=[], sample_of_call={}, used_calls=len(members),
                               continued_calls={c["call_index"] for c in members if c.get("continued")})
        stats[harness].continuable_calls += built.continuable_calls
        stats[harness].continued_calls += len(built.continued_calls)
    return {harness: s.summary()["continuity_rate"] for harness, s in sorted(stats.items())}


def rollout_means(rollouts: list[dict]) -> dict:
    """Mean calls, response tokens and durations per rollout (infra errors left out).

    >>> rollout_means([{"status": "ok", "num_calls": 2, "response_tokens": 10, "total_s": 3.0},
    ...                {"status": "infra_error", "num_calls": 0, "response_tokens": 0, "total_s": 1.0}])
    {'calls': 2.0, 'tokens': 10.0, 'setup_s': None, 'agent_s': None, 'verifier_s': None, 'total_s': 3.0}
    """
    real = [r for r in rollouts if r.get("status") != "infra_error"]
    return {"calls": _mean(r.get("num_calls") for r in real), "tokens": _mean(r.get("response_tokens") for r in real),
            **{name: _mean(r.get(name) for r in real) for name in DURATIONS}}


def update_metrics(update: dict | None) -> dict:
    """The update's numbers the report plots (None where the update did not record one).

    >>> update_metrics({"logprob_gap": 0.04, "train_s": 2.0, "skipped": "no advantage"})["logprob_gap"]
    0.04
    """
    update = update or {}
    return {name: update.get(name) for name in ("logprob_gap", "loss", "grad_norm", "entropy", "tokens_trained",
                                                 "groups_kept", "groups_dropped")} \
        | {"update_train_s": update.get("train_s"), "update_total_s": update.get("total_s"),
           "update_skipped": update.get("skipped")}


def pool_counts(counts: dict[str, int]) -> str:
    """A curriculum's tasks per state in one cell (`steps.curriculum.TaskPool.summary`), in `STATES` order
    whatever the stored record's (its JSON keys are sorted).

    >>> pool_counts({"learning": 3, "solved": 2, "unseen": 1, "unsolved": 0})
    'learning 3, unseen 1, solved 2, unsolved 0'
    """
    return ", ".join(f"{state} {counts.get(state, 0)}" for state in STATES)


def iteration_summary(rollouts: list[dict], calls: list[dict], update: dict | None) -> dict:
    """One iteration's numbers in one flat dict: what the tables and the comparison show side by side."""
    continuity = continuity_by_harness(calls)
    return {**reward_metrics(rollouts), **killed_counts(rollouts), "rollouts": len(rollouts), **rollout_means(rollouts),
            **{f"continuity {h}": rate for h, rate in continuity.items()}, **update_metrics(update)}
