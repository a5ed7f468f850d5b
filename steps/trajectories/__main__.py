"""Writes one run-iteration's trajectory tables (calls, rollouts, samples, behaviour) as Parquet.

    OPENFORGE_ADMIN_KEY=... python -m steps.trajectories --proxy-url http://127.0.0.1:8100 \
        --results runs/it0 --out s3://bucket/trajectories --run demo --iteration 0 --model runs/tiny-model

`--results` holds one folder per rollout with its `result.json` (with `--rollout-retries`, also the rollouts whose pod
died without one: `steps.ends`); calls come from the proxy's admin
route, or with `--store URL` straight from the proxy's store. Files land in
`{out}/run={run}/iteration={iteration}/`. Prints a JSON summary (rows per table, per harness the
continuity rate and samples per rollout, the records `skipped`, each named with its rollout, and the
`untrainable_calls`: answered calls in no sample (an external upstream gave no token ids, or their image
tokens do not match their images' grids under `--model`'s config), kept in `calls` only, and the
`staleness`, also written as `_staleness.json` beside the tables: how many versions behind the one trained,
the iteration's, the samples' calls were served, and with `--max-staleness S` how many samples, more than S
behind, were left out), and `harness_killed`: the rollouts whose harness a limit killed, by limit
(`steps.metrics.harness_kills`; graded all the same, so said on stderr in one line when more than a few percent);
progress and a warning per skipped record go to stderr. A bad record never stops the iteration
(docs/trajectories.md, "Bad records"). Exit code 2 on a usage error or results or calls that cannot be
gathered at all.
"""

import argparse
import json
import os
import sys
import time

from steps.trajectories.collect import (
    CollectError,
    all_results,
    collect,
    fetch_calls_http,
    fetch_calls_store,
)
from steps.manifest import write_json
from steps.metrics import harness_killed_warning, harness_kills
from steps.contracts.rollout import harness_killed
from steps.trajectories.vision import load_grid
from steps.contracts.layout import staleness_url
from steps.contracts.table_files import partition_url, write_tables


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line, with the proxy's admin key required only when calls come over HTTP."""
    p = argparse.ArgumentParser(prog="python -m steps.trajectories", description=__doc__.split("\n\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--proxy-url", help="the recording proxy (admin key from OPENFORGE_ADMIN_KEY)")
    source.add_argument("--store", help="the proxy's store URL, read directly (local folder or s3://)")
    p.add_argument("--results", required=True, help="folder or URL with one <rollout>/result.json per rollout")
    p.add_argument("--out", required=True, help="folder or URL (s3://...) under which the tables are written")
    p.add_argument("--run", default="default", help="run name, the first partition level")
    p.add_argument("--iteration", type=int, default=0, help="iteration number, the second partition level")
    p.add_argument("--model", default=None,
                   help="the served checkpoint (folder or URL): its config gives the image tokens each call's images "
                        "are checked against; without it a call with images is in no sample")
    p.add_argument("--max-pixels", type=int, default=0,
                   help="the pixel cap serving gave the image processor, if not the checkpoint's own")
    p.add_argument("--max-staleness", type=int, default=None, metavar="S",
                   help="leave out of `samples` each sample with a call more than S weight versions behind the "
                        "one trained (the iteration's); default: none is left out")
    p.add_argument("--rollout-retries", type=int, default=None, metavar="N",
                   help="the run's rollout_retries: a rollout pod that died without a result after its agent started, "
                        "not retried, scores 0 and is trained on; retried out of attempts, or before its agent "
                        "started, an infra error (steps.ends); without it such a pod gives no row")
    args = p.parse_args(argv)
    args.admin_key = os.environ.get("OPENFORGE_ADMIN_KEY", "")
    if args.proxy_url and not args.admin_key:
        p.error("set OPENFORGE_ADMIN_KEY to the proxy's admin key (or read calls with --store)")
    if args.max_staleness is not None and args.max_staleness < 0:
        p.error("--max-staleness must be a whole number >= 0 (versions a sample may be behind the one trained)")
    return args


def main(argv: list[str] | None = None) -> int:
    """Collects results and calls, writes the four tables, prints the summary."""
    args = parse_args(argv)
    started = time.monotonic()
    try:
        grid = load_grid(args.model, args.max_pixels) if args.model else None
    except ValueError as exc:
        print(f"error: --model: {exc}", file=sys.stderr)
        return 2
    try:
        results = all_results(args.results, args.rollout_retries)
        ids = [r.rollout_id for r in results]
        print(f"trajectories: {len(ids)} rollout results; fetching their calls", file=sys.stderr, flush=True)
        calls, skipped = (fetch_calls_store(args.store, ids) if args.store
                          else fetch_calls_http(args.proxy_url, args.admin_key, ids))
        for bad in skipped:
            print(f"trajectories: warning: rollout {bad['rollout_id']}: stored record {bad['record']} skipped: "
                  f"{bad['error']}", file=sys.stderr, flush=True)
        rows, harnesses = collect(results, calls, args.run, args.iteration, args.max_staleness, grid)
        killed = harness_kills(harness_killed(result) for result in results)
        if warning := harness_killed_warning(killed, len(results), f"iteration {args.iteration}"):
            print(f"trajectories: {warning}", file=sys.stderr, flush=True)
        if rows.untrainable_calls:
            print(f"trajectories: {rows.untrainable_calls} answered calls are in no training sample (no token ids, or "
                  f"image tokens that do not match their images): kept in the calls table, each with why in "
                  f"`untrainable`", file=sys.stderr, flush=True)
        tables = rows.tables()
        partition = partition_url(args.out, args.run, args.iteration)
        files = write_tables(tables, partition)
        staleness = rows.staleness.summary()
        write_json(staleness_url(partition), staleness)
        if staleness["dropped"]:
            print(f"trajectories: {staleness['dropped']} samples of {staleness['dropped_rollouts']} rollouts dropped: "
                  f"a call more than {args.max_staleness} versions behind version {args.iteration}",
                  file=sys.stderr, flush=True)
    except CollectError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    summary = {"partition": partition, "files": files, "staleness": staleness,
               "rows": {name: table.num_rows for name, table in tables.items()},
               "harnesses": harnesses, "harness_killed": killed, "skipped": skipped + rows.skipped,
               "untrainable_calls": rows.untrainable_calls,
               "seconds": round(time.monotonic() - started, 3)}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
