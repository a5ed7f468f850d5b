"""Whose end a rollout pod that left no result was: the agent's (scored 0, trained on) or the cluster's (an infra
error, never scored), by the rule of docs/workflows.md, "Retries".

    results = load_results(url) + ended_results(url, retries=config.rollout_retries)

A rollout pod's attempt R of planned rollout P keeps its files in the store's folder `P-rR` (`layout.retry_folder`):
its `result.json`, and its runner's phase record (`layout.PHASE_RECORD`, written by the proxy, which only the runner
can ask of it: `steps.proxy.results.store_phase`): "setup" once it registered, "agent" just before its agent
started. When P's last attempt left a phase record but no result, its pod died:

- its agent had started and the attempt was not retried (R below `rollout_retries`: Argo retries only the cluster's
  ends, `workflows.faults`): the agent ended it (its disk or memory limit, the deadline), `agent_killed`, reward 0;
- it was retried out of attempts (R is the limit), or its agent never started: the cluster's, `infra_error`.

The result written for it names the attempt id the runner ran as, so its recorded calls are trained on like any
failed rollout's. A planned rollout none of whose attempts reached its runner leaves nothing here. The local
runner's folders are attempt ids, not retry folders, and it writes such a result itself (`workflows.local`).
"""

import json
from dataclasses import dataclass

import fsspec

from steps.contracts import layout
from steps.contracts.rollout import AGENT_KILLED, INFRA_ERROR, RolloutResult


@dataclass(frozen=True)
class Attempt:
    """One retry folder of a planned rollout: whether it holds a result, and its phase record (or None)."""

    retry: int
    has_result: bool
    record: dict | None


def planned_attempts(results: str, storage_options: dict | None = None) -> dict[str, list[Attempt]]:
    """Each planned rollout's retry folders under `results` (an iteration's or evaluation's results folder), by
    retry number; a phase record that cannot be read counts as none."""
    fs, root = fsspec.core.url_to_fs(results, **(storage_options or {}))
    root = root.rstrip("/")
    found: dict[tuple[str, int], dict] = {}
    for name in (layout.RESULT_FILE, layout.PHASE_RECORD):
        for path in fs.glob(f"{root}/*/{name}"):
            retry = layout.retry_of_folder(path.rsplit("/", 2)[-2])
            if retry is not None:
                found.setdefault(retry, {})[name] = path
    paths = [files[layout.PHASE_RECORD] for files in found.values() if layout.PHASE_RECORD in files]
    records = fs.cat(paths) if paths else {}  # fsspec's cat of no paths raises
    attempts: dict[str, list[Attempt]] = {}
    for (planned, retry), files in sorted(found.items()):
        record = read_record(records.get(files.get(layout.PHASE_RECORD)))
        attempts.setdefault(planned, []).append(Attempt(retry, layout.RESULT_FILE in files, record))
    return attempts


def read_record(data: bytes | None) -> dict | None:
    """A phase record's JSON object; None for none, or for bytes that are not one.

    >>> read_record(b'{"rollout_id": "t-s0", "phase": "agent"}')["phase"], read_record(b"[1]"), read_record(None)
    ('agent', None, None)
    """
    try:
        record = json.loads(data) if data is not None else None
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("rollout_id"), str) else None


def ended_result(planned: str, attempts: list[Attempt], retries: int) -> RolloutResult | None:
    """The result of planned rollout `planned` whose last attempt (of `attempts`, in retry order) died without one:
    `agent_killed` (reward 0) or `infra_error` by the rule above; None when that attempt has a result or no record.

    >>> agent = {"rollout_id": "it0-t-s0-a2", "retry": 1, "phase": "agent", "task": "t", "harness": "direct", "sample": 0}
    >>> ended_result("it0-t-s0", [Attempt(0, True, None), Attempt(1, False, agent)], retries=3).status
    'agent_killed'
    >>> ended_result("it0-t-s0", [Attempt(1, False, agent)], retries=1).status
    'infra_error'
    >>> ended_result("it0-t-s0", [Attempt(1, False, {**agent, "phase": "setup"})], retries=3).status
    'infra_error'
    """
    last = attempts[-1]
    if last.has_result or last.record is None:
        return None
    record = last.record
    sample = record.get("sample")
    result = RolloutResult(rollout_id=record["rollout_id"], task=str(record.get("task") or ""),
                           harness=str(record.get("harness") or ""), status=INFRA_ERROR, reward=None,
                           sample=sample if isinstance(sample, int) and not isinstance(sample, bool) else None)
    where = f"the pod of {planned}'s attempt {last.retry + 1} (retry {last.retry}) ended without a result"
    if record.get("phase") != "agent":
        result.error = f"{where} before its agent started: the cluster's end, an infra error"
    elif last.retry >= retries:
        result.error = f"{where} after its agent started, and it was retried out of attempts ({retries} retries): " \
                       f"the cluster's end, an infra error"
    else:
        result.status, result.reward = AGENT_KILLED, 0.0
        result.error = f"{where} after its agent started, and Argo did not retry it: the agent's end (its disk or " \
                       f"memory limit, or the deadline), scored 0"
    return result


def ended_results(results: str, retries: int, storage_options: dict | None = None) -> list[RolloutResult]:
    """The results written for the planned rollouts under `results` whose last attempt's pod died without one
    (`ended_result`); `retries` is the run's `rollout_retries`."""
    found = (ended_result(planned, attempts, retries)
             for planned, attempts in planned_attempts(results, storage_options).items())
    return [result for result in found if result is not None]
