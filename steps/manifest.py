"""A run's manifest in the store: its config and, per iteration, the workflow, checkpoints and outcome.

    python -m steps.manifest record --run-url s3://openforge/runs/demo --iteration 0 \
        --workflow openforge-demo-it0 --status Succeeded --checkpoint s3://.../base \
        --next-checkpoint s3://openforge/runs/demo/checkpoints/iteration-1

Layout under the run's URL (`workflows.layout`): `manifest/run.json` (the run config, written once by
the driver) and `manifest/iteration-<N>.json` (one `IterationRecord` each). One file per iteration means the driver
and the Argo exit handler never rewrite each other's iterations. The driver (`workflows/submit.py`)
reads it to resume a run after it died; the exit handler of each iteration's workflow writes the
iteration's final status with this command.
"""

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, fields

import fsspec

from workflows import layout

DONE = ("Succeeded", "Failed", "Error")


@dataclass
class IterationRecord:
    """What the manifest knows about one iteration."""

    iteration: int
    workflow: str = ""  # the Argo Workflow's name ("local" for the local runner)
    checkpoint: str = ""  # the checkpoint this iteration served
    next_checkpoint: str = ""  # the checkpoint its update wrote
    status: str = "Pending"  # Pending | Running | Succeeded | Failed | Error (Argo's phases)
    updated: float = 0.0  # unix time of the last write
    metrics: dict | None = None
    attempt: int = 0  # local runner: how many earlier starts of this iteration died or failed

    @property
    def done(self) -> bool:
        """True once the iteration has an outcome (success or failure)."""
        return self.status in DONE


def write_json(url: str, data: dict) -> None:
    """Writes `data` as JSON to a local path or s3:// URL, creating folders as needed."""
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "w") as f:
        f.write(json.dumps(data, indent=2, sort_keys=True))


def write_run_config(run_url: str, config: dict) -> None:
    """Records the run's config (once, when the run starts)."""
    write_json(layout.run_config_url(run_url), config)


def read_run_config(run_url: str) -> dict | None:
    """The run's recorded config, or None when the run has no manifest."""
    fs, path = fsspec.core.url_to_fs(layout.run_config_url(run_url))
    if not fs.exists(path):
        return None
    with fs.open(path, "r") as f:
        return json.loads(f.read())


def record(run_url: str, entry: IterationRecord) -> None:
    """Writes one iteration's record, stamped with the current time."""
    entry.updated = time.time()
    write_json(layout.iteration_record_url(run_url, entry.iteration), asdict(entry))


def read_iterations(run_url: str) -> dict[int, IterationRecord]:
    """Every recorded iteration by number (empty when none is recorded)."""
    fs, path = fsspec.core.url_to_fs(layout.manifest_url(run_url))
    if not fs.exists(path):
        return {}
    known = {f.name for f in fields(IterationRecord)}
    out = {}
    for name in fs.glob(layout.iteration_records_glob(run_url)):
        with fs.open(name, "r") as f:
            raw = json.loads(f.read())
        entry = IterationRecord(**{k: v for k, v in raw.items() if k in known})
        out[entry.iteration] = entry
    return dict(sorted(out.items()))


def read_metrics(checkpoint_url: str) -> dict | None:
    """The update's `metrics.json` next to the checkpoint it wrote, or None when there is none."""
    fs, path = fsspec.core.url_to_fs(layout.metrics_url(checkpoint_url))
    if not fs.exists(path):
        return None
    with fs.open(path, "r") as f:
        return json.loads(f.read())


def main(argv: list[str] | None = None) -> int:
    """`record`: writes one iteration's outcome (what the exit handler of an iteration's workflow runs)."""
    p = argparse.ArgumentParser(prog="python -m steps.manifest", description=__doc__.split("\n\n")[0])
    commands = p.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="write one iteration's record")
    rec.add_argument("--run-url", required=True)
    rec.add_argument("--iteration", type=int, required=True)
    rec.add_argument("--workflow", required=True)
    rec.add_argument("--status", required=True)
    rec.add_argument("--checkpoint", default="")
    rec.add_argument("--next-checkpoint", default="")
    args = p.parse_args(argv)
    entry = IterationRecord(iteration=args.iteration, workflow=args.workflow, status=args.status,
                            checkpoint=args.checkpoint, next_checkpoint=args.next_checkpoint)
    record(args.run_url, entry)
    print(json.dumps(asdict(entry)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
