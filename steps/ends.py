"""Whose end a rollout pod that left no result was: the agent's (scored 0, trained on) or the cluster's (an infra
error, never scored), by the rule of docs/workflows.md, "Retries".

    results = load_results(url) + ended_results(url, retries=config.rollout_retries)

Each attempt of planned rollout P runs under the attempt id the proxy gave it (`P`, `P-a2`, ...:
`steps.plan.attempt_of`) and keeps its files in that id's folder of the store: its `result.json`, and its runner's
phase record (`layout.PHASE_RECORD`, written by the proxy, which only the runner can ask of it:
`steps.proxy.results.store_phase`): "setup" once it registered, "agent" just before its agent started, each with
Argo's retry number R of that pod (`{{retries}}`). When P's last attempt left a phase record but no result, its pod
died:

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
from steps.plan import attempt_of


@dataclass(frozen=True)
class Attempt:
    """One attempt folder of a planned rollout: its attempt number, whether it holds a result, and its phase record
    (or None)."""

    attempt: int
    has_result: bool
    record: dict | None

    @property
    def retry(self) -> int | None:
        """Argo's retry number of the attempt's pod, as its runner reported it (None without a record)."""
        retry = (self.record or {}).get("retry")
        return retry if isinstance(retry, int) and not isinstance(retry, bool) else None


def planned_attempts(results: str, storage_options: dict | None = None) -> dict[str, list[Attempt]]:
    """Each planned rollout's attempt folders under `results` (an iteration's or evaluation's results folder), by
    attempt number; a phase record that cannot be read counts as none."""
    fs, root = fsspec.core.url_to_fs(results, **(storage_options or {}))
    root = root.rstrip("/")
    found: dict[tuple[str, int], dict] = {}
    for name in (layout.RESULT_FILE, layout.PHASE_RECORD):
        for path in fs.glob(f"{root}/*/{name}"):
            found.setdefault(attempt_of(path.rsplit("/", 2)[-2]), {})[name] = path
    paths = [files[layout.PHASE_RECORD] for files in found.values() if layout.PHASE_RECORD in files]
    records = fs.cat(paths) if paths else {}  # fsspec's cat of no paths raises
    attempts: dict[str, list[Attempt]] = {}
    for (planned, attempt), files in sorted(found.items()):
        record = read_record(records.get(files.get(layout.PHASE_RECORD)))
        attempts.setdefault(planned, []).append(Attempt(attempt, layout.RESULT_FILE in files, record))
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
    """The result of planned rollout `planned` whose last attempt (of `attempts`, in attempt order) died without one:
    `agent_killed` (reward 0) or `infra_error` by the rule above; None when that attempt has a result or no record.

    >>> agent = {"rollout_id": "it0-t-s0-a2", "retry": 1, "phase": "agent", "task": "t", "harness": "direct", "sample": 0}
    >>> ended_result("it0-t-s0", [Attempt(1, True, None), Attempt(2, False, agent)], retries=3).status
    'agent_killed'
    >>> ended_result("it0-t-s0", [Attempt(2, False, agent)], retries=1).status
    'infra_error'
    >>> ended_result("it0-t-s0", [Attempt(2, False, {**agent, "phase": "setup"})], retries=3).status
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
    where = f"the pod of {planned}'s attempt {last.attempt} (retry {last.retry}) ended without a result"
    if record.get("phase") != "agent":
        result.error = f"{where} before its agent started: the cluster's end, an infra error"
    elif last.retry is None or last.retry >= retries:
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
