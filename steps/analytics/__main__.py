"""Prints the behaviour analytics of a run's trajectories, one line per group.

    python -m steps.analytics --trajectories runs/demo/trajectories [--by harness,iteration] [--json]

`--trajectories` is a trajectories folder or URL (every `behaviour.parquet` below it is read: a whole
run's partitions, or one); `--by` names the columns to group by (any key of the behaviour table: `run`,
`iteration`, `task`, `harness`, `weight_version`, `status`, ...). Means are over the rollouts that have
a value; infra errors are left out (docs/analytics.md).
"""

from __future__ import annotations

import argparse
import json
import posixpath
import sys

import fsspec

from steps.analytics.behaviour import METRICS, summarize_behaviour
from steps.contracts.layout import table_url
from steps.contracts.table_files import TrajectoryFileError, read_table
from steps.contracts.tables import BEHAVIOUR, SchemaError

SHOWN = ["rollouts", "pass_rate", "calls", "turns", "tool_calls", "tool_coverage", "shell_share",
         "self_verified", "plan_completion", "tool_failures", "recovery_rate", "repeated_after_failure",
         "tokens_per_call"]
GROUPABLE = [name for name in BEHAVIOUR.names if name not in METRICS]  # the keys, status, reward, weight_version


def behaviour_rows(url: str) -> list[dict]:
    """Every row of every behaviour table (`behaviour.parquet`) at or below `url`."""
    fs, root = fsspec.core.url_to_fs(url)
    root = root.rstrip("/")
    found = sorted(set(fs.glob(table_url(f"{root}/**", "behaviour"))) | set(fs.glob(table_url(root, "behaviour"))))
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    rows = []
    for path in found:
        folder = posixpath.dirname(path)
        partition = folder if protocol in ("file", "local") else f"{protocol}://{folder}"
        rows += read_table(partition, "behaviour").to_pylist()
    return rows


def cell(value) -> str:
    """A summary value as the table prints it."""
    if value is None:
        return "-"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def table(summaries: list[dict], by: list[str]) -> str:
    """The summaries as aligned text columns."""
    header = by + SHOWN
    lines = [header] + [[cell(s.get(name)) for name in header] for s in summaries]
    widths = [max(len(line[n]) for line in lines) for n in range(len(header))]
    return "\n".join("  ".join(text.rjust(width) for text, width in zip(line, widths)) for line in lines)


def main(argv: list[str] | None = None) -> int:
    """Print the behaviour summaries of the trajectories named in `argv`; 2 when there are none to read."""
    p = argparse.ArgumentParser(prog="python -m steps.analytics", description=__doc__.split("\n\n")[0])
    p.add_argument("--trajectories", required=True, help="a trajectories folder or URL")
    p.add_argument("--by", default="harness", help="comma-separated columns to group by (default: harness)")
    p.add_argument("--json", action="store_true", help="print the summaries as one JSON list instead")
    args = p.parse_args(argv)
    by = [name.strip() for name in args.by.split(",") if name.strip()]
    unknown = [name for name in by if name not in GROUPABLE]
    if unknown:
        p.error(f"--by: {unknown[0]!r} is not a column to group by; use any of {', '.join(GROUPABLE)}")
    try:
        rows = behaviour_rows(args.trajectories)
    except (TrajectoryFileError, SchemaError, OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not rows:
        print(f"error: no behaviour table at or below {args.trajectories} (the trajectories step writes one "
              f"into each partition).", file=sys.stderr)
        return 2
    summaries = summarize_behaviour(rows, by)
    print(json.dumps(summaries) if args.json else table(summaries, by))
    return 0


if __name__ == "__main__":
    sys.exit(main())
