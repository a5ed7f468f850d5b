"""A run's manifest in the store: its config and, per iteration, the workflow, checkpoints and outcome.

    python -m steps.manifest record --run-url s3://openforge/runs/demo --iteration 0 \
        --workflow openforge-demo-it0 --status Succeeded --checkpoint s3://.../base \
        --next-checkpoint s3://openforge/runs/demo/checkpoints/iteration-1

    python -m steps.manifest record-eval --run-url s3://openforge/runs/demo --iteration 0 \
        --workflow openforge-demo-eval0 --status Succeeded --checkpoint s3://.../base \
        --summary s3://openforge/runs/demo/evals/iteration-0/summary.json

Layout under the run's URL (`steps.contracts.layout`): `manifest/run.json` (the run config, written once by
the driver; an eval run's has one more field, `eval`, saying what it evaluates), `manifest/iteration-<N>.json`
(one `IterationRecord` each) and `manifest/eval-<N>.json` (one `EvalRecord` per evaluation): both records, and their
JSON forms, are `steps.contracts.manifest`'s. One file per
iteration and per evaluation means the driver and the Argo exit handlers never rewrite each other's records. The driver (`workflows/submit.py`)
reads it to resume a run after it died; the exit handler of each iteration's workflow writes the
iteration's final status with this command.
"""

import argparse
import json
import sys
import time
import fsspec

from steps.metrics import harness_kills
from steps.contracts import layout
from steps.contracts.manifest import EvalRecord, IterationRecord
from steps.contracts.table_files import TrajectoryFileError, read_table
from steps.contracts.tables import SchemaError
from steps.curriculum import read_pool

EVAL_FIELD = "eval"  # in an eval run's run.json: what it evaluates ({"checkpoint", "run", "iteration", "upstream"})
SFT_FIELD = "sft"  # in an SFT run's run.json: what it learned from ({"from", "min_reward"}), docs/training.md


def write_json(url: str, data: dict) -> None:
    """Writes `data` as JSON to a local path or s3:// URL, creating folders as needed."""
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "w") as f:
        f.write(json.dumps(data, indent=2, sort_keys=True))


def read_json(url: str) -> dict | None:
    """The JSON object at a local path or s3:// URL, or None when there is no such file."""
    fs, path = fsspec.core.url_to_fs(url)
    if not fs.exists(path):
        return None
    with fs.open(path, "r") as f:
        return json.loads(f.read())


def write_run_config(run_url: str, config: dict, evaluates: dict | None = None, sft: dict | None = None) -> None:
    """Records the run's config (once, when the run starts); an eval run's with what it evaluates, an SFT run's
    with what it learned from."""
    write_json(layout.run_config_url(run_url), {**config, **({EVAL_FIELD: evaluates} if evaluates else {}),
                                                **({SFT_FIELD: sft} if sft else {})})


def read_run_config(run_url: str) -> dict | None:
    """The run's recorded config (without an eval run's `eval` field or an SFT run's `sft`), or None when the run
    has no manifest."""
    stored = read_json(layout.run_config_url(run_url))
    return None if stored is None else {k: v for k, v in stored.items() if k not in (EVAL_FIELD, SFT_FIELD)}


def read_sft(run_url: str) -> dict | None:
    """What an SFT run learned from (its run.json's `sft` field); None for any other run or no run."""
    return (read_json(layout.run_config_url(run_url)) or {}).get(SFT_FIELD)


def read_evaluates(run_url: str) -> dict | None:
    """What an eval run evaluates (its run.json's `eval` field); None for a training run or no run."""
    return (read_json(layout.run_config_url(run_url)) or {}).get(EVAL_FIELD)


def record(run_url: str, entry: IterationRecord) -> None:
    """Writes one iteration's record, stamped with the current time; a LoRA run's names the adapter it served."""
    entry.updated = time.time()
    entry.adapter = entry.adapter or served_adapter(entry.checkpoint, entry.iteration)
    write_json(layout.iteration_record_url(run_url, entry.iteration), entry.to_json())


def served_adapter(checkpoint: str, iteration: int) -> str | None:
    """The adapter iteration `iteration` serves when its checkpoint is a LoRA adapter (its `adapter_config.json`
    is there: every LoRA iteration after 0), as the proxy names it (`layout.adapter_name`); else None."""
    if not checkpoint or iteration == 0:
        return None
    fs, path = fsspec.core.url_to_fs(layout.adapter_config_url(checkpoint))
    return layout.adapter_name(iteration) if fs.exists(path) else None


def read_iterations(run_url: str) -> dict[int, IterationRecord]:
    """Every recorded iteration by number (empty when none is recorded)."""
    fs, path = fsspec.core.url_to_fs(layout.manifest_url(run_url))
    if not fs.exists(path):
        return {}
    out = {}
    for name in fs.glob(layout.iteration_records_glob(run_url)):
        with fs.open(name, "r") as f:
            entry = IterationRecord.from_json(json.loads(f.read()))
        out[entry.iteration] = entry
    return dict(sorted(out.items()))


def record_eval(run_url: str, entry: EvalRecord) -> None:
    """Writes one evaluation's record, stamped with the current time."""
    entry.updated = time.time()
    write_json(layout.eval_record_url(run_url, entry.iteration), entry.to_json())


def read_evals(run_url: str) -> dict[int, EvalRecord]:
    """Every recorded evaluation by the iteration whose checkpoint it evaluates (empty when none)."""
    fs, path = fsspec.core.url_to_fs(layout.manifest_url(run_url))
    if not fs.exists(path):
        return {}
    out = {}
    for name in fs.glob(layout.eval_records_glob(run_url)):
        with fs.open(name, "r") as f:
            entry = EvalRecord.from_json(json.loads(f.read()))
        out[entry.iteration] = entry
    return dict(sorted(out.items()))


def eval_numbers(summary_url: str) -> dict | None:
    """An evaluation's overall numbers with its k and where its summary.json is; None before it exists."""
    summary = read_json(summary_url)
    return None if summary is None else {"summary": summary_url, "k": summary["k"], **summary["overall"]}


def eval_record(iteration: int, workflow: str, checkpoint: str, status: str, summary_url: str) -> EvalRecord:
    """An evaluation's record; once it succeeded, with its summary's overall numbers and k."""
    numbers = eval_numbers(summary_url) if status == "Succeeded" else None
    return EvalRecord(iteration=iteration, workflow=workflow, checkpoint=checkpoint, status=status,
                      summary=summary_url, overall={k: v for k, v in numbers.items() if k != "summary"} if numbers else None)


def read_staleness(run_url: str, iteration: int) -> dict | None:
    """The trajectories step's staleness figures for the iteration (`steps.trajectories.staleness`), or None
    before they exist."""
    config = read_run_config(run_url) or {}
    if not config.get("run"):
        return None
    return read_json(layout.staleness_url(layout.run_partition_url(run_url, config["run"], iteration)))


def read_harness_killed(run_url: str, iteration: int) -> tuple[int, dict[str, int]] | None:
    """The iteration's rollouts (every attempt) and those whose harness a limit killed, by limit
    (`steps.metrics.harness_kills`), from its rollouts table; None before the table is written (or when it cannot
    be read). A table written before the column reads with no kill."""
    config = read_run_config(run_url) or {}
    if not config.get("run"):
        return None
    try:
        table = read_table(layout.run_partition_url(run_url, config["run"], iteration), "rollouts")
    except (TrajectoryFileError, SchemaError):
        return None
    return table.num_rows, harness_kills(table.column("harness_killed").to_pylist())


def read_curriculum(run_url: str, iteration: int) -> dict | None:
    """The curriculum's pool as the iteration's plan saw it, summed up (`steps.curriculum.TaskPool.summary`); None
    without a curriculum."""
    pool = read_pool(run_url, iteration)
    return pool.summary() if pool is not None else None


def read_metrics(checkpoint_url: str) -> dict | None:
    """The update's `metrics.json` next to the checkpoint it wrote, or None when there is none."""
    return read_json(layout.metrics_url(checkpoint_url))


def main(argv: list[str] | None = None) -> int:
    """`record`: writes one iteration's outcome (what the exit handler of an iteration's workflow runs);
    `record-eval`: one evaluation's, with its overall numbers when it succeeded (an eval workflow's)."""
    p = argparse.ArgumentParser(prog="python -m steps.manifest", description=__doc__.split("\n\n")[0])
    commands = p.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="write one iteration's record")
    rec.add_argument("--run-url", required=True)
    rec.add_argument("--iteration", type=int, required=True)
    rec.add_argument("--workflow", required=True)
    rec.add_argument("--status", required=True)
    rec.add_argument("--checkpoint", default="")
    rec.add_argument("--next-checkpoint", default="")
    ev = commands.add_parser("record-eval", help="write one evaluation's record")
    for flag in ("--run-url", "--workflow", "--status", "--summary"):
        ev.add_argument(flag, required=True)
    ev.add_argument("--iteration", type=int, required=True)
    ev.add_argument("--checkpoint", default="")
    args = p.parse_args(argv)
    if args.command == "record-eval":
        evaluation = eval_record(args.iteration, args.workflow, args.checkpoint, args.status, args.summary)
        record_eval(args.run_url, evaluation)
        print(json.dumps(evaluation.to_json()))
        return 0
    entry = IterationRecord(iteration=args.iteration, workflow=args.workflow, status=args.status,
                            checkpoint=args.checkpoint, next_checkpoint=args.next_checkpoint,
                            staleness=read_staleness(args.run_url, args.iteration),
                            curriculum=read_curriculum(args.run_url, args.iteration))
    record(args.run_url, entry)
    print(json.dumps(entry.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
