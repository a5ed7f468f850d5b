"""List a dataset's tasks, or check that every task's oracle passes its own verifier.

    .venv/bin/python -m steps.tasks list steps/tasks/builtin
    .venv/bin/python -m steps.tasks check steps/tasks/builtin --jobs 2 [--work-dir DIR]

DATASET is a task folder, a folder of task folders, or a .txt/.yaml file listing task folders.
`check` builds each task's workspace in a fresh local sandbox (bubblewrap; the Dockerfile's FROM
image is replaced by the host system), runs `solution/solve.sh`, then `tests/test.sh`, and prints one
line per task as it finishes: ok, skipped (no oracle), or broken with the reason. Both commands exit
1 when any task is broken, 2 when the dataset itself cannot be read. Logs of broken tasks stay in
the work folder (a temporary one, removed when everything passes, unless --work-dir is given).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from steps.tasks import DatasetError, Task, TaskError, load_dataset
from steps.grading.check import BROKEN, OK, CheckResult, check_dataset


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run `list` or `check`, return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m steps.tasks", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", help="print each task with its difficulty, category and timeouts")
    listing.add_argument("dataset")
    check = commands.add_parser("check", help="run every oracle through its verifier in a sandbox")
    check.add_argument("dataset")
    check.add_argument("--jobs", type=int, default=1, help="tasks checked in parallel (default 1)")
    check.add_argument("--work-dir", type=Path, help="where sandboxes and logs go (default: a temporary folder)")
    args = parser.parse_args(argv)
    try:
        tasks, errors = load_dataset(args.dataset)
    except DatasetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.command == "list":
        return list_tasks(tasks, errors)
    return check_tasks(tasks, errors, args.jobs, args.work_dir)


def list_tasks(tasks: list[Task], errors: list[TaskError]) -> int:
    """Print one line per task (broken ones with their error); 1 if any is broken."""
    for task in tasks:
        config = task.config
        print(f"{task.name:<28} {task.difficulty or '-':<7} {task.category or '-':<18} "
              f"agent {config.agent_timeout_s:g} s, verifier {config.verifier_timeout_s:g} s"
              f"{'' if task.solution_dir else ', no oracle'}"
              f"{', ignores ' + ', '.join(config.ignored_fields) if config.ignored_fields else ''}")
    for error in errors:
        print(f"{error.task:<28} BROKEN  {error.message}")
    print(f"{len(tasks) + len(errors)} tasks, {len(errors)} broken")
    return 1 if errors else 0


def check_tasks(tasks: list[Task], errors: list[TaskError], jobs: int, work_dir: Path | None) -> int:
    """Check every task with progress lines and a summary; 1 if any is broken."""
    total = len(tasks) + len(errors)
    keep = work_dir is not None
    work_dir = work_dir or Path(tempfile.mkdtemp(prefix="openforge-check-"))
    print(f"checking {total} tasks, {jobs} at a time, in {work_dir} "
          f"(local mode: each Dockerfile's FROM image is replaced by the host system)", flush=True)
    done: list[CheckResult] = []

    def progress(result: CheckResult) -> None:
        done.append(result)
        timing = f" ({result.duration_s:.1f} s)" if result.duration_s else ""
        reason = f": {result.reason}" if result.reason else ""
        details = "".join(f"\n    | {line}" for line in result.details.splitlines())
        print(f"[{len(done):>{len(str(total))}}/{total}] {result.status:<7} {result.task}{timing}{reason}{details}",
              flush=True)

    results = check_dataset(tasks, errors, work_dir, jobs, progress)
    counts = {status: sum(r.status == status for r in results) for status in (OK, BROKEN, "skipped")}
    print(f"{total} tasks: {counts[OK]} ok, {counts[BROKEN]} broken, {counts['skipped']} skipped")
    if counts[BROKEN]:
        print(f"logs of broken tasks are in {work_dir}")
    elif not keep:
        shutil.rmtree(work_dir, ignore_errors=True)
    return 1 if counts[BROKEN] else 0


if __name__ == "__main__":
    sys.exit(main())
