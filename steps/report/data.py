"""What the report reads of a run, from wherever it is (a local folder or s3://), each part optional.

`load_run` gathers the manifest (config, iteration records), each iteration's trajectory tables (calls,
rollouts, samples, behaviour when present) or else its `result.json` files, the update's `metrics.json`
beside each checkpoint and the evaluations' `summary.json`. Anything missing is noted in `Run.notes` and
the page says so; nothing missing stops the report.
"""

import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import fsspec

from steps import manifest
from steps.proxy.store import judge_store_url
from steps.trajectories.collect import CollectError, fetch_calls_store
from steps.contracts import layout
from steps.contracts.rollout import RecordError, RolloutResult, harness_killed, parse_result
from steps.contracts.table_files import TrajectoryFileError, read_table
from steps.contracts.tables import SchemaError

# The calls table without its token arrays: what the index's figures need (1,000 rollouts stay small).
CALL_COLUMNS = ["rollout_id", "harness", "call_index", "status", "finish_reason", "sample_index", "continued",
                "weight_version", "total_s", "error"]
BEHAVIOUR_TABLE = "behaviour"


class NoRunError(ValueError):
    """There is no run where the report was asked to look (the message says where, and what to give)."""


@dataclass(frozen=True)
class StoredResult:
    """A rollout's `result.json` and where it was read from: the files it names are read from that folder only."""

    result: RolloutResult
    url: str


@dataclass
class Iteration:
    """One iteration (or one evaluation) of a run: its rows as dicts, whatever of them exists."""

    number: int
    record: dict | None = None  # the manifest's iteration record
    update: dict | None = None  # the update's metrics.json (the checkpoint it wrote)
    rollouts: list[dict] = field(default_factory=list)
    calls: list[dict] = field(default_factory=list)
    behaviour: list[dict] | None = None  # None: no behaviour table in the partition
    results: dict[str, StoredResult] = field(default_factory=dict)  # result.json by rollout id
    partition: str | None = None  # where its tables are (samples are read per rollout page)
    results_url: str = ""


@dataclass
class Run:
    """A run as the report sees it."""

    name: str
    url: str
    config: dict | None
    iterations: dict[int, Iteration]
    evals: dict[int, dict]  # summary.json by iteration
    eval_iterations: dict[int, Iteration]
    notes: list[str] = field(default_factory=list)
    evaluates: dict | None = None  # an eval run's: what it evaluates (`manifest.read_evaluates`)

    @property
    def is_eval(self) -> bool:
        """An eval run (its manifest says what it evaluates); its one evaluation is at iteration 0."""
        return self.evaluates is not None or (not self.iterations and bool(self.evals))


def read_json(url: str) -> dict | None:
    """A JSON file, or None when it is missing or not JSON."""
    fs, path = fsspec.core.url_to_fs(url)
    try:
        return json.loads(fs.cat_file(path))
    except (FileNotFoundError, ValueError):
        return None


def numbered(url: str, pattern: str) -> list[int]:
    """The N of every entry under `url` named like `pattern` (one group of digits), in order."""
    fs, path = fsspec.core.url_to_fs(url)
    try:
        names = [entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(path, detail=False)]
    except FileNotFoundError:
        return []
    return sorted({int(m.group(1)) for name in names if (m := re.fullmatch(pattern, name))})


def _table_rows(partition: str, name: str, columns: list[str] | None, notes: list[str]) -> list[dict] | None:
    """A table's rows, or None (and a note) when it cannot be read; a missing file is no note."""
    try:
        table = read_table(partition, name)
    except TrajectoryFileError as exc:
        if "does not exist" not in str(exc):
            notes.append(str(exc))
        return None
    except SchemaError as exc:
        notes.append(str(exc))
        return None
    return table.select(columns).to_pylist() if columns else table.to_pylist()


def read_results(results_url: str, notes: list[str]) -> dict[str, StoredResult]:
    """Every `<rollout>/result.json` below `results_url`, by rollout id (unreadable ones left out). A result may
    name another id than its folder (a rerun that found its id taken runs under the next attempt's); where two
    claim the same id, the one in the folder of that name is kept and the other noted, never taking it over."""
    fs, root = fsspec.core.url_to_fs(results_url)
    paths = sorted(fs.glob(f"{root.rstrip('/')}/*/{layout.RESULT_FILE}"))
    out = {}
    for path, data in (fs.cat(paths, on_error="omit") if paths else {}).items():
        try:
            result = StoredResult(parse_result(data, path), fs.unstrip_protocol(path))
        except RecordError:
            continue
        rollout_id = result.result.rollout_id
        if rollout_id in out:
            own = path.rsplit("/", 2)[-2] == rollout_id
            kept, dropped = (result, out[rollout_id]) if own else (out[rollout_id], result)
            notes.append(f"{dropped.url} names rollout {rollout_id!r}, as {kept.url} does: left out")
            result = kept
        out[rollout_id] = result
    return out


def rollout_row(result: RolloutResult) -> dict:
    """A rollouts-table row from a `result.json` (an iteration whose tables are not written yet)."""
    return {"rollout_id": result.rollout_id, "task": result.task, "sample": result.sample,
            "harness": result.harness, "status": result.status, "reward": result.reward,
            "harness_killed": harness_killed(result), "error": result.error, "num_calls": result.num_calls,
            "response_tokens": result.response_tokens, **{k: result.durations.get(k) for k in
                                                          ("setup_s", "agent_s", "verifier_s", "total_s")}}


def load_iteration(number: int, partition: str, results_url: str, notes: list[str]) -> Iteration:
    """One iteration's tables, or its result.json files where the rollouts table is not there."""
    it = Iteration(number, partition=partition, results_url=results_url)
    it.results = read_results(results_url, notes)
    rollouts = _table_rows(partition, "rollouts", None, notes)
    if rollouts is None and it.results:
        notes.append(f"{partition} has no rollouts table (not written yet): its rollouts are read from their "
                     "result.json files, without calls or samples tables.")
    it.rollouts = rollouts if rollouts is not None else [rollout_row(r.result) for r in it.results.values()]
    it.calls = _table_rows(partition, "calls", CALL_COLUMNS, notes) or []
    it.behaviour = _table_rows(partition, BEHAVIOUR_TABLE, None, notes)  # None: not written (older runs)
    return it


def load_run(run_url: str, only: int | None = None) -> Run:
    """Everything the report shows of the run at `run_url`; with `only`, of its iteration (and evaluation) `only`
    alone (what the experiment trackers log once it ended, `steps.tracking`)."""
    run_url = run_url.rstrip("/")
    config = manifest.read_run_config(run_url)
    name = (config or {}).get("run") or run_url.rsplit("/", 1)[-1]
    notes = [] if config is not None else [f"{layout.run_config_url(run_url)} is missing: the run's config is unknown."]
    records = {i: r.to_json() for i, r in manifest.read_iterations(run_url).items()}
    numbers = set(records) | set(numbered(layout.run_partitions_url(layout.trajectories_url(run_url), name), r"iteration=(\d+)")) \
        | set(numbered(layout.all_results_url(run_url), r"iteration-(\d+)"))
    iterations = {}
    for n in sorted(numbers if only is None else numbers & {only}):
        it = load_iteration(n, layout.run_partition_url(run_url, name, n), layout.results_url(run_url, n), notes)
        it.record = records.get(n)
        it.update = read_json(layout.metrics_url(layout.checkpoint_url(run_url, n + 1, "")))
        iterations[n] = it
    evals, eval_iterations = {}, {}
    for n in numbered(layout.evals_url(run_url), r"iteration-(\d+)"):
        if only is not None and n != only:
            continue
        if (summary := read_json(layout.eval_summary_url(run_url, n))) is not None:
            evals[n] = summary
        eval_iterations[n] = load_iteration(n, layout.partition_url(layout.eval_trajectories_url(run_url, n), name, n),
                                            layout.eval_results_url(run_url, n), notes)
    return Run(name, run_url, config, iterations, evals, eval_iterations, notes, manifest.read_evaluates(run_url))


def samples_by_rollout(partition: str | None) -> dict[str, list[dict]]:
    """An iteration's training samples (the samples table's rows) by rollout, in sample order."""
    if partition is None:
        return {}
    try:
        rows = read_table(partition, "samples").to_pylist()
    except (TrajectoryFileError, SchemaError):
        return {}
    out: dict[str, list[dict]] = {}
    for row in sorted(rows, key=lambda r: r["sample_index"]):
        out.setdefault(row["rollout_id"], []).append(row)
    return out


def calls_in_chunks(run_url: str, rollout_ids: list[str], chunk: int = 8, judge: bool = False):
    """Yields (rollout_id, its call records from the proxy's store, or None when there is no store), a few
    rollouts' records in memory at a time; with `judge`, the records of its judge's calls instead (the store's
    `judge/` folder: what a `[verifier] judge = true` task's verifier asked, never trained on)."""
    store = layout.calls_url(run_url)
    store = judge_store_url(store) if judge else store
    # The store's reader runs its own event loop: in a thread of its own, so that a caller inside a running
    # loop (a notebook, a browser driver) can write a report too.
    with ThreadPoolExecutor(max_workers=1) as reader:
        for start in range(0, len(rollout_ids), chunk):
            ids = rollout_ids[start:start + chunk]
            try:
                found, _ = reader.submit(fetch_calls_store, store, ids).result()
            except CollectError:
                found = {}
            for rollout_id in ids:
                yield rollout_id, found.get(rollout_id)
