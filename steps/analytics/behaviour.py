"""Per-rollout behaviour from its recorded calls, and means per group of rollouts.

    from steps.analytics import rollout_behaviour, summarize_behaviour
    behaviour = rollout_behaviour(client.calls(rollout_id).calls, "codex")   # a RolloutBehaviour
    summarize_behaviour(rows, by=["harness", "iteration"])                   # rows: the behaviour table's

Nothing an agent controls can make these raise: records that are not call records, requests or responses
that cannot be read (`store_error`), malformed tool arguments and unknown harnesses are counted
(`unreadable`) or read as absent.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, fields

from steps.analytics import metrics
from steps.contracts.rollout import RolloutResult
from steps.metrics import SUCCESS
from steps.analytics.tools import ordered_records, read_calls
from steps.harnesses import ALL_HARNESSES as HARNESSES

EXCLUDED_STATUSES = ("infra_error",)  # not the agent's doing: left out of every mean, as in evaluations


@dataclass(frozen=True)
class RolloutBehaviour:
    """One rollout's behaviour; the fields are the `behaviour` table's metric columns (docs/analytics.md)."""

    calls: int  # recorded model calls
    turns: int  # calls whose request offered tools: the agent's turns (not titles or summaries)
    failed_calls: int  # calls whose status is not ok
    tool_calls: int
    tool_counts: str  # JSON object: tool name -> calls
    tools_offered: int
    tools_used: int  # distinct offered tools called
    tool_coverage: float | None
    shell_calls: int
    shell_share: float | None
    changes: int
    self_verified: bool | None
    plan_completion: float | None
    tool_failures: int
    repeated_after_failure: int
    changed_after_failure: int
    response_tokens: int
    tokens_per_call: float | None
    finish_reasons: str  # JSON object: finish reason -> calls
    unreadable: int  # records, requests or responses that could not be read


METRICS = [f.name for f in fields(RolloutBehaviour)]
COUNT_COLUMNS = ("tool_counts", "finish_reasons")  # JSON objects, averaged per key


def rollout_behaviour(records: list[dict], harness: str) -> RolloutBehaviour:
    """The behaviour of one rollout from its recorded calls (in any order) and its harness's name."""
    records = records if isinstance(records, list) else []
    module = HARNESSES.get(harness) if isinstance(harness, str) else None
    calls, _ = ordered_records(records)
    read = read_calls(records, module)
    uses = read.uses
    failures, repeated, changed = metrics.error_recovery(uses)
    tokens, per_call = metrics.response_tokens(calls)
    return RolloutBehaviour(
        calls=len(calls), turns=read.turns, failed_calls=sum(c.get("status") != "ok" for c in calls),
        tool_calls=len(uses), tool_counts=json.dumps(metrics.tool_counts(uses)),
        tools_offered=len(read.offered), tools_used=len({u.name for u in uses} & read.offered),
        tool_coverage=metrics.tool_coverage(uses, read.offered),
        shell_calls=sum(u.kind == "shell" for u in uses), shell_share=metrics.shell_share(uses),
        changes=metrics.changes(uses), self_verified=metrics.self_verified(uses),
        plan_completion=None if module is None else metrics.plan_completion(uses, module.plan_items),
        tool_failures=failures, repeated_after_failure=repeated, changed_after_failure=changed,
        response_tokens=tokens, tokens_per_call=per_call,
        finish_reasons=json.dumps(metrics.finish_reasons(calls)), unreadable=read.unreadable)


def weight_version(records: list[dict]) -> str | None:
    """The weight version a rollout's calls ran on; several, comma-separated in call order, when it changed
    mid-rollout.

    >>> weight_version([{"call_index": 1, "weight_version": 10}, {"call_index": 0, "weight_version": "9"}])
    '9,10'
    """
    calls, _ = ordered_records(records if isinstance(records, list) else [])
    found = dict.fromkeys(str(c["weight_version"]) for c in calls if c.get("weight_version") is not None)
    return ",".join(found) if found else None


def unreadable_rollout(records: list) -> RolloutBehaviour:
    """The behaviour of a rollout whose records could not be read at all: every record unreadable."""
    empty = {f.name: None if f.type.endswith("None") else "{}" if f.name in COUNT_COLUMNS else 0
             for f in fields(RolloutBehaviour)}
    return RolloutBehaviour(**{**empty, "unreadable": len(records) if isinstance(records, list) else 1})


def behaviour_row(keys: dict, result: RolloutResult, records: list[dict]) -> dict:
    """One `behaviour` table row: the rollout's keys, its status, reward and weight version, its behaviour.
    A rollout whose records break the readers in a way not foreseen gives a row of unreadables, not a
    failed trajectories step."""
    try:
        behaviour = rollout_behaviour(records, result.harness)
    except Exception:  # noqa: BLE001 (one rollout's records must not fail the table of all)
        behaviour = unreadable_rollout(records)
    return {**keys, "status": result.status, "reward": result.reward,
            "weight_version": weight_version(records), **asdict(behaviour)}


def passed(row: dict) -> bool:
    """Whether a rollout passed: its reward is the verifier's full reward.

    >>> passed({"reward": 1.0}), passed({"reward": 0.5}), passed({"reward": None})
    (True, False, False)
    """
    reward = row.get("reward")
    return isinstance(reward, (int, float)) and reward >= SUCCESS


DIGITS = 4  # means are rounded, so that the same rows give the same text whatever their order


def _mean(values: list) -> float | None:
    values = [float(v) for v in values if isinstance(v, (int, float))]
    return round(sum(values) / len(values), DIGITS) if values else None


def group_order(group: tuple) -> tuple:
    """A sort key for a group's values: numbers as numbers, before text, before missing values.

    >>> sorted([(10,), (2,), ("b",), (None,), (1,)], key=group_order)
    [(1,), (2,), (10,), ('b',), (None,)]
    """
    return tuple((2, "") if v is None else (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool)
                 else (1, str(v)) for v in group)


def _count_means(rows: list[dict], column: str) -> dict[str, float]:
    """A JSON-count column's mean per key over the rows (a row without the key counts 0)."""
    totals: dict[str, float] = defaultdict(float)
    for row in rows:
        try:
            counts = json.loads(row.get(column) or "{}")
        except (TypeError, ValueError):
            counts = {}
        for key, value in (counts.items() if isinstance(counts, dict) else ()):
            totals[str(key)] += value if isinstance(value, (int, float)) else 0
    ordered = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))
    return {key: round(total / len(rows), DIGITS) for key, total in ordered}


def summarize_behaviour(rows: list[dict], by: list[str]) -> list[dict]:
    """Per group of `by` columns: `rollouts`, the mean of every metric over the rollouts that have a value
    (a share for yes/no ones), `pass_rate`, and `recovery_rate`: the share passing among rollouts that had a
    failed tool result. Tool and finish-reason counts are means per rollout. Infra errors are left out.

    >>> rows = [{"harness": "codex", "reward": 1.0, "self_verified": True, "tool_failures": 1, "calls": 4},
    ...         {"harness": "codex", "reward": 0.0, "self_verified": None, "tool_failures": 0, "calls": 2}]
    >>> summary = summarize_behaviour(rows, ["harness"])[0]
    >>> summary["rollouts"], summary["calls"], summary["self_verified"], summary["recovery_rate"]
    (2, 3.0, 1.0, 1.0)
    """
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        if row.get("status") not in EXCLUDED_STATUSES:
            groups[tuple(row.get(key) for key in by)].append(row)
    summaries = []
    for group, members in sorted(groups.items(), key=lambda kv: group_order(kv[0])):
        failing = [row for row in members if (row.get("tool_failures") or 0) > 0]
        summary = {**dict(zip(by, group)), "rollouts": len(members),
                   "pass_rate": _mean([passed(row) for row in members]),
                   "recovery_rate": _mean([passed(row) for row in failing])}
        for name in METRICS:
            if name in COUNT_COLUMNS:
                summary[name] = _count_means(members, name)
            else:
                summary[name] = _mean([row.get(name) for row in members])
        summaries.append(summary)
    return summaries
