"""How long a local rollout's sandbox takes to start: the first rollout of a task (its layer built) against
every later one (the cached layer mounted), side by side in one run.

    python benchmarks/sandbox_start.py [--repeats 5] [--task steps/tasks/builtin/find-large-files]

Each repeat builds the task's layer into a fresh cache folder (`OPENFORGE_CACHE`, so nothing is reused
across repeats) with `LocalSandbox.create`, removes that sandbox, then creates and removes a second sandbox of
the same task from the layer just built. Prints the median (min-max) of each and their ratio, and one JSON
line. Needs root (overlay mounts), as local rollouts do. Builds run with `OPENFORGE_BUILD_NETWORK=none`.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from steps.sandbox import LocalSandbox  # noqa: E402
from steps.tasks import load_task  # noqa: E402


def timed_create(root: Path, task) -> float:
    """Seconds `LocalSandbox.create` took (the sandbox is removed afterwards, untimed)."""
    started = time.perf_counter()
    box = LocalSandbox.create(root, task)
    elapsed = time.perf_counter() - started
    box.remove()
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--task", type=Path, default=Path("steps/tasks/builtin/find-large-files"))
    args = parser.parse_args()
    task = load_task(args.task)
    os.environ["OPENFORGE_BUILD_NETWORK"] = "none"
    first, later = [], []
    with tempfile.TemporaryDirectory(prefix="sandbox-start-") as work:
        for repeat in range(args.repeats):
            os.environ["OPENFORGE_CACHE"] = f"{work}/cache-{repeat}"
            first.append(timed_create(Path(work, f"first-{repeat}"), task))
            later.append(timed_create(Path(work, f"later-{repeat}"), task))
            print(f"repeat {repeat + 1}/{args.repeats}: first {first[-1]:.3f} s, later {later[-1]:.3f} s",
                  file=sys.stderr, flush=True)
    summary = {"task": task.name, "repeats": args.repeats,
               "first_s": {"median": statistics.median(first), "min": min(first), "max": max(first)},
               "later_s": {"median": statistics.median(later), "min": min(later), "max": max(later)}}
    summary["ratio_first_over_later"] = summary["first_s"]["median"] / summary["later_s"]["median"]
    print(f"| task | first rollout (layer built) | later rollouts (layer cached) | ratio |\n|---|---:|---:|---:|\n"
          f"| {task.name} | {summary['first_s']['median']:.3f} s ({min(first):.3f}-{max(first):.3f}) | "
          f"{summary['later_s']['median']:.3f} s ({min(later):.3f}-{max(later):.3f}) | "
          f"{summary['ratio_first_over_later']:.1f}x |")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
