"""Writes a run's report and prints the path of its front page.

    python -m steps.report --run demo [--store runs] [--out DIR] [--compare RUN_OR_EVAL ...]

`--store` is the runs' folder or s3:// URL (the run config's `store`, `runs` by default); the report goes to
the run's `reports/` unless `--out` says otherwise. `--compare` (repeatable): another run or eval in the
same store (or its URL), `RUN:N` for its iteration N, `:N` for this run's iteration N.
"""

import argparse
import sys

from steps.report import write_report
from steps.report.data import NoRunError
from steps.contracts import layout
from steps.contracts.config import RunConfig


def main(argv: list[str] | None = None) -> int:
    """Parses the command line, writes the report, prints the index's path (exit 2 when there is no run)."""
    p = argparse.ArgumentParser(prog="python -m steps.report", description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="the run's name")
    p.add_argument("--store", default=RunConfig.store, help="the folder or s3:// URL holding the runs")
    p.add_argument("--out", help="where to write the report (a folder or s3:// URL); default: the run's reports/")
    p.add_argument("--compare", action="append", default=[], help="a run, RUN:ITERATION or :ITERATION to compare with")
    args = p.parse_args(argv)
    if "/" in args.run or args.run in ("", ".", ".."):
        print(f"error: --run {args.run!r}: give a run's name (no slashes); its store goes in --store", file=sys.stderr)
        return 2
    run_url = layout.run_url(args.store, args.run)
    try:
        print(write_report(run_url, args.out, tuple(args.compare)))
    except NoRunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
