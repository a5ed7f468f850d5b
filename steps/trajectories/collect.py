"""Gathering a run-iteration's rollout results and recorded calls into the four trajectory tables.

Results come from `{results}/*/result.json` (one folder per rollout, as `steps.rollout` writes them);
calls come from the proxy's admin route or straight from its store. Infra-error rollouts keep their
row in `rollouts` (and their calls in `calls`) but give no training samples. Every row's `task` and
`sample` are the ones its result names (the plan's, carried by the rollout step), never re-derived.

No bad record stops an iteration (docs/trajectories.md, "Bad records"): the store's reader skips what it
cannot read, a call whose fields do not fit the tables is left out of `calls` and `samples`, and a
rollout whose calls the proxy fails to give (a 5xx) keeps its row but gives no samples; each is named
on stderr and in the summary's `skipped`, with its rollout.
"""

import asyncio
import json
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from typing import Annotated

import fsspec
import msgspec
import pyarrow as pa

from steps.analytics import behaviour_row
from steps.ends import ended_results
from steps.contracts.calls import CallRecord
from steps.plan import attempt_of
from steps.proxy.client import ProxyClient, ProxyClientError
from steps.proxy.store import CallStore
from steps.trajectories.samples import RolloutSamples, build_samples, image_names
from steps.trajectories.vision import ImageGrid
from steps.trajectories.staleness import Staleness, versions_behind
from steps.contracts.tables import (
    BEHAVIOUR,
    CALL_TIMINGS,
    CALLS,
    ROLLOUT_DURATIONS,
    ROLLOUTS,
    SAMPLES,
    SampleRow,
)
from steps.contracts.layout import RESULT_FILE
from steps.contracts.rollout import AGENT_KILLED, AGENT_TIMEOUT, OK, RecordError, RolloutResult, harness_killed, parse_result

# infra_error rollouts are never trained on; agent_killed ones (a pod the agent ended, `steps.ends`) are, with reward 0
TRAINABLE_STATUSES = (OK, AGENT_TIMEOUT, AGENT_KILLED)
TokenId = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]  # the tables' int32 columns


class _Error(msgspec.Struct):
    message: str | None = None


class _ImageRef(msgspec.Struct):
    sha256: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
    width: Annotated[int, msgspec.Meta(gt=0)]
    height: Annotated[int, msgspec.Meta(gt=0)]


class _CallFields(msgspec.Struct):
    """What the tables take of a recorded call: a call whose fields do not fit is left out, named."""

    call_index: TokenId
    dialect: str | None = None
    stream: bool | None = None
    status: str | None = None
    prompt_token_ids: list[TokenId] | None = None
    response_token_ids: list[TokenId] | None = None
    response_logprobs: list[float] | None = None
    finish_reason: str | None = None
    weight_version: str | int | float | None = None
    replica: TokenId | None = None
    adapter: str | None = None
    timings: dict[str, float | None] | None = None
    error: _Error | None = None
    images: list[_ImageRef] | None = None
    untrainable: str | None = None


class CollectError(RuntimeError):
    """Results or calls that could not be gathered."""


def load_results(results: str, storage_options: dict | None = None) -> list[RolloutResult]:
    """Every `result.json` one folder below `results`, ordered by rollout id."""
    fs, root = fsspec.core.url_to_fs(results, **(storage_options or {}))
    paths = sorted(fs.glob(f"{root.rstrip('/')}/*/{RESULT_FILE}"))
    if not paths:
        raise CollectError(f"no rollout results under {results} (expected {results}/<rollout>/{RESULT_FILE}).")
    contents = fs.cat(paths)
    loaded: dict[str, tuple[str, RolloutResult]] = {}
    for path in paths:
        try:
            result = parse_result(contents[path], path)
        except RecordError as exc:
            raise CollectError(f"{exc}.") from None
        rollout_id = result.rollout_id
        if rollout_id in loaded:
            raise CollectError(f"{path} and {loaded[rollout_id][0]} are both results of rollout {rollout_id!r}.")
        loaded[rollout_id] = (path, result)
    return [loaded[rollout_id][1] for rollout_id in sorted(loaded)]


def all_results(results: str, rollout_retries: int | None) -> list[RolloutResult]:
    """`load_results`, and with `rollout_retries` (the run's) a result for each planned rollout whose last attempt's
    pod died without one (`steps.ends`: the agent's end scores 0, the cluster's is an infra error); ordered by id."""
    ended = [] if rollout_retries is None else ended_results(results, rollout_retries)
    try:
        loaded = load_results(results)
    except CollectError:
        if not ended:
            raise
        loaded = []
    ids = {result.rollout_id for result in loaded}
    return sorted(loaded + [result for result in ended if result.rollout_id not in ids], key=lambda r: r.rollout_id)


def fetch_calls_http(proxy_url: str, admin_key: str, rollout_ids: list[str],
                     workers: int = 16) -> tuple[dict[str, list[dict]], list[dict]]:
    """Each rollout's recorded calls from the proxy's `GET /rollouts/{id}/calls`, and the stored records
    skipped ({"rollout_id", "record", "error"}; a rollout whose calls the proxy failed to give is one)."""
    client = ProxyClient(proxy_url, admin_key)

    def one(rollout_id: str) -> tuple[list[dict], list[dict]]:
        try:
            answer = client.calls(rollout_id)
            return answer.calls, [{"rollout_id": rollout_id, **s} for s in answer.skipped]
        except ProxyClientError as err:
            if err.status == 404:  # never registered (an infra error before the harness started)
                return [], []
            if err.status is not None and err.status >= 500:  # this rollout's calls, not the whole iteration
                return [], [{"rollout_id": rollout_id, "record": "all its calls", "error": str(err)}]
            raise CollectError(str(err)) from None

    with ThreadPoolExecutor(workers) as pool:
        answers = list(pool.map(one, rollout_ids))
    return dict(zip(rollout_ids, (calls for calls, _ in answers))), [s for _, skipped in answers for s in skipped]


def fetch_calls_store(store_url: str, rollout_ids: list[str]) -> tuple[dict[str, list[dict]], list[dict]]:
    """Each rollout's recorded calls read straight from the proxy's store (local folder or s3://), and the
    stored records skipped ({"rollout_id", "record", "error"})."""
    fs, root = fsspec.core.url_to_fs(store_url)
    if not fs.exists(f"{root.rstrip('/')}/rollouts"):
        raise CollectError(f"{store_url} is not a proxy store (it has no rollouts/ folder).")
    store = CallStore(store_url)

    async def gather() -> list:
        return await asyncio.gather(*(store.read_calls(rid) for rid in rollout_ids))

    stored = asyncio.run(gather())
    skipped = [{"rollout_id": rid, **s} for rid, calls in zip(rollout_ids, stored) for s in calls.skipped]
    return {rid: calls.calls for rid, calls in zip(rollout_ids, stored)}, skipped


def fitting_calls(rollout_id: str, calls: list[dict]) -> tuple[list[CallRecord], list[dict]]:
    """The calls (stored records, as the store gives them) whose fields fit the tables, each index once, read
    as `CallRecord`s; and the rest as skipped records, named."""
    kept, skipped, seen = [], [], set()
    for n, call in enumerate(calls):
        try:
            index = msgspec.convert(call, _CallFields).call_index
        except msgspec.ValidationError as exc:
            where = call.get("call_index", f"number {n}") if isinstance(call, dict) else f"number {n}"
            skipped.append({"rollout_id": rollout_id, "record": f"call {where}", "error": f"does not fit the tables: {exc}"})
            continue
        if index in seen:
            skipped.append({"rollout_id": rollout_id, "record": f"call {index}", "error": "repeats a call index"})
            continue
        seen.add(index)
        kept.append(CallRecord.from_json(call))
    return kept, skipped


def planned_sample(result: RolloutResult) -> int | None:
    """The plan's sample number as the result names it; None for a result that names none (or one past the column).

    >>> [planned_sample(RolloutResult("r", "t", "direct", "ok", 1.0, sample=s)) for s in (3, None, 2**40)]
    [3, None, None]
    """
    sample = result.sample
    return sample if sample is not None and 0 <= sample < 2**31 else None


@dataclass
class Rows:
    """Column lists for the four tables, filled rollout by rollout."""

    calls: dict = field(default_factory=lambda: {name: [] for name in CALLS.names})
    rollouts: dict = field(default_factory=lambda: {name: [] for name in ROLLOUTS.names})
    samples: dict = field(default_factory=lambda: {name: [] for name in SAMPLES.names})
    behaviour: dict = field(default_factory=lambda: {name: [] for name in BEHAVIOUR.names})
    skipped: list[dict] = field(default_factory=list)  # calls left out: {"rollout_id", "record", "error"}
    untrainable_calls: int = 0  # answered calls in no sample (no token ids, image tokens off their grids): in `calls`
    staleness: Staleness | None = None  # the samples' versions behind the trained one, and those dropped

    def tables(self) -> dict[str, pa.Table]:
        """The filled columns as tables of the documented schemas."""
        return {"calls": pa.table(self.calls, schema=CALLS), "rollouts": pa.table(self.rollouts, schema=ROLLOUTS),
                "samples": pa.table(self.samples, schema=SAMPLES),
                "behaviour": pa.table(self.behaviour, schema=BEHAVIOUR)}


def add_calls(rows: Rows, keys: dict, calls: list[CallRecord], built: RolloutSamples | None) -> None:
    """One `calls` row per recorded call, linked to the sample it went into."""
    for call in calls:
        timings, sampled = call.timings or {}, call.sampling or {}
        index = None if built is None else built.sample_of_call.get(call.call_index)
        values = {**keys, "call_index": call.call_index, "dialect": call.dialect,
                  "stream": call.stream, "status": call.status,
                  "prompt_token_ids": call.prompt_token_ids, "response_token_ids": call.response_token_ids,
                  "response_logprobs": call.response_logprobs, "finish_reason": call.finish_reason,
                  "weight_version": None if call.weight_version is None else str(call.weight_version),
                  "replica": call.replica, "adapter": call.adapter,
                  **{name: sampled.get(name) for name in ("temperature", "top_p", "top_k")},
                  **{name: timings.get(name) for name in CALL_TIMINGS},
                  "error": (call.error or {}).get("message"), "sample_index": index,
                  "continued": None if index is None else call.call_index in built.continued_calls,
                  "images": image_names(call),
                  "untrainable": call.untrainable or (None if built is None else built.untrainable.get(call.call_index))}
        for name in CALLS.names:
            rows.calls[name].append(values[name])


def add_samples(rows: Rows, keys: dict, built: RolloutSamples, reward: float | None) -> None:
    """One `samples` row per training sample; each weighs 1/(samples of its rollout) in the loss."""
    weight = 1.0 / len(built.samples) if built.samples else 0.0
    for index, sample in enumerate(built.samples):
        row = SampleRow(**keys, sample_index=index, prompt_token_ids=sample.prompt_token_ids,
                        response_token_ids=sample.response_token_ids, response_mask=sample.response_mask,
                        response_logprobs=sample.response_logprobs, reward=reward, loss_weight=weight,
                        num_calls=len(sample.call_indices), call_indices=sample.call_indices,
                        weight_versions=sample.weight_versions, images=sample.images)
        for name in SAMPLES.names:
            rows.samples[name].append(getattr(row, name))


def add_rollout(rows: Rows, keys: dict, result: RolloutResult, built: RolloutSamples | None) -> None:
    """One `rollouts` row from a rollout's result.json."""
    values = {**keys, "status": result.status, "reward": result.reward,
              "rewards": json.dumps(result.rewards, sort_keys=True), "error": result.error,
              **{name: result.durations.get(name) for name in ROLLOUT_DURATIONS},
              "harness_exit_code": result.harness_exit_code, "harness_killed": harness_killed(result),
              "num_calls": result.num_calls,
              "response_tokens": result.response_tokens, "weight_versions": result.weight_versions,
              "num_samples": 0 if built is None else len(built.samples)}
    for name in ROLLOUTS.names:
        rows.rollouts[name].append(values[name])


def fresh_samples(rollout_id: str, built: RolloutSamples, staleness: Staleness) -> RolloutSamples:
    """`built` without its samples more than `max_staleness` versions behind (each counted in `staleness`); the
    calls of a dropped sample stay in `calls`, in no sample.

    >>> from steps.trajectories.samples import Sample
    >>> built = RolloutSamples([Sample([1], weight_versions=["0"]), Sample([2], weight_versions=["1"])],
    ...                        {0: 0, 1: 1}, {1}, 2)
    >>> kept = fresh_samples("r", built, Staleness(trained_version=2, max_staleness=1))
    >>> [s.prompt_token_ids for s in kept.samples], kept.sample_of_call, kept.continued_calls
    ([[2]], {1: 0}, {1})
    """
    renumbered = {}
    for index, sample in enumerate(built.samples):
        if staleness.count(rollout_id, versions_behind(staleness.trained_version, sample.weight_versions)):
            renumbered[index] = len(renumbered)
    if len(renumbered) == len(built.samples):
        return built
    of_call = {call: renumbered[index] for call, index in built.sample_of_call.items() if index in renumbered}
    return RolloutSamples(samples=[built.samples[i] for i in renumbered], sample_of_call=of_call,
                          continued_calls={c for c in built.continued_calls if c in of_call}, used_calls=built.used_calls,
                          untrainable=built.untrainable)


def superseded_attempts(results: list[RolloutResult]) -> set[str]:
    """Trainable results of one planned rollout but its last attempt's (`ID-aK`, highest K): a group member
    is trained on once, even when an attempt that finished was retried anyway (it wrote its result, then its
    step failed).

    >>> sorted(superseded_attempts([RolloutResult(rid, "t", "direct", "ok", 1.0) for rid in ("r", "r-a2", "q")]))
    ['r']
    """
    attempts = defaultdict(list)
    for result in results:
        if result.status in TRAINABLE_STATUSES:
            planned, attempt = attempt_of(result.rollout_id)
            attempts[planned].append((attempt, result.rollout_id))
    return {rollout_id for found in attempts.values() for _, rollout_id in sorted(found)[:-1]}


@dataclass
class HarnessStats:
    """Per-harness drift telemetry: how often a call continued a sample, and samples per rollout."""

    rollouts: int = 0
    calls: int = 0
    continuable_calls: int = 0
    continued_calls: int = 0
    samples: int = 0

    def summary(self) -> dict:
        """The figures printed and logged per harness."""
        rate = self.continued_calls / self.continuable_calls if self.continuable_calls else None
        return {"rollouts": self.rollouts, "calls": self.calls, "samples": self.samples,
                "continuity_rate": None if rate is None else round(rate, 4),
                "samples_per_rollout": round(self.samples / self.rollouts, 4) if self.rollouts else None}


def collect(results: list[RolloutResult], calls: dict[str, list[dict]], run: str, iteration: int,
            max_staleness: int | None = None, grid: ImageGrid | None = None) -> tuple[Rows, dict]:
    """The four tables' rows and per-harness statistics for one run-iteration; with `max_staleness`, a sample
    more than that many versions behind the one trained (`iteration`'s) is left out of `samples`, counted in
    the rows' `staleness`; `grid` (the served checkpoint's image tokens) checks each call's images."""
    rows, stats = Rows(staleness=Staleness(trained_version=iteration, max_staleness=max_staleness)), \
        defaultdict(HarnessStats)
    superseded = superseded_attempts(results)
    for n, result in enumerate(results, 1):
        rid = result.rollout_id
        keys = {"run": run, "iteration": iteration, "rollout_id": rid, "task": result.task,
                "sample": planned_sample(result), "harness": result.harness}
        trainable = result.status in TRAINABLE_STATUSES and rid not in superseded
        if rid in superseded:
            print(f"trajectories: warning: rollout {rid} is not trained on: a later attempt of the same planned "
                  f"rollout finished too", file=sys.stderr, flush=True)
        stored, skipped = fitting_calls(rid, calls.get(rid, []))
        rows.skipped += skipped
        rows.untrainable_calls += sum(1 for call in stored if call.untrainable)
        for bad in skipped:
            print(f"trajectories: warning: rollout {rid}: {bad['record']} left out: {bad['error']}",
                  file=sys.stderr, flush=True)
        built = fresh_samples(rid, build_samples(stored, grid), rows.staleness) if trainable else None
        for index, why in ({} if built is None else built.untrainable).items():
            rows.untrainable_calls += 1
            print(f"trajectories: warning: rollout {rid}: call {index} is in no sample: {why}", file=sys.stderr, flush=True)
        if trainable and len(stored) < result.num_calls:
            print(f"trajectories: warning: rollout {rid} counted {result.num_calls} calls but "
                  f"{len(stored)} are stored and readable", file=sys.stderr, flush=True)
        add_calls(rows, keys, stored, built)
        add_rollout(rows, keys, result, built)
        # Behaviour reads every call the store gave, also those left out of `calls` for their token fields.
        for name, value in behaviour_row(keys, result, calls.get(rid, [])).items():
            rows.behaviour[name].append(value)
        if built is not None:
            add_samples(rows, keys, built, result.reward)
            harness = stats[result.harness]
            harness.rollouts += 1
            harness.calls += built.used_calls
            harness.continuable_calls += built.continuable_calls
            harness.continued_calls += len(built.continued_calls)
            harness.samples += len(built.samples)
        if n % 100 == 0 or n == len(results):
            print(f"trajectories: {n}/{len(results)} rollouts merged", file=sys.stderr, flush=True)
    return rows, {name: s.summary() for name, s in sorted(stats.items())}
