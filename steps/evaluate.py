"""An evaluation's numbers from its rollout results: per task and overall, as a table and as summary.json.

    python -m steps.evaluate --results runs/demo/evals/iteration-0/results --k 3 \
        --out runs/demo/evals/iteration-0/summary.json [--harness direct --dataset steps/tasks/builtin \
        --checkpoint runs/tiny-model --model tiny --iteration 0]

`--results` holds one `<rollout_id>/result.json` per rollout attempt (`steps.rollout`'s OUT). The planned
tries are rebuilt from `--dataset` as `steps.plan --eval` plans them: `ev<N>-<task>-s<i>`, k per task, its
attempts `...-aK`. A planned try is one try when an attempt of it finished (`ok`, `agent_timeout`, or
`agent_killed`: its pod died without a result after its agent started, unretried, reward 0, `steps.ends`; its
last finished attempt counts); one with no finished attempt (every attempt an infra error, or a killed rollout that
wrote nothing) is `missing` and counts as a failed try (reward 0), so that no try that ends badly or vanishes
can raise a number; every `infra_error` attempt is counted as an infra error. Broken tasks the plan skipped
are listed in `skipped_tasks`. Per task and overall: tries, passes, pass@1, pass@k, pass^k (unbiased
estimators, `steps.metrics`), mean reward, infra errors, the tries whose harness a limit killed (`harness_killed`:
graded all the same, so counted, and by limit in the summary's `harness_killed`; the agent timeout is not one),
mean model calls, response tokens and seconds per try (over the finished tries). The overall pass rates and mean
reward are macro averages (each task weighs the same); calls, tokens and seconds are per try over all tasks. The table goes to stderr, the summary as one JSON
line to stdout and to `--out`. Exit code 2 for a bad `--k` (1 to `steps.plan.MAX_EVAL_K`, 100) or when there
are no results to read.
"""

import argparse
import json
import re
import sys
from collections.abc import Sequence

from steps import metrics
from steps.manifest import write_json
from steps.plan import MAX_EVAL_K, attempt_of, planned_id
from steps.contracts.rollout import INFRA_ERROR, RolloutResult, harness_killed
from steps.datasets import local_copy
from steps.tasks import DatasetError, load_dataset
from steps.trajectories.collect import CollectError, all_results

COLUMNS = ("tries", "pass_at_1", "pass_at_k", "pass_hat_k", "mean_reward", "missing", "infra_errors",
           "harness_killed", "mean_calls", "mean_tokens", "mean_duration_s")


def mean(values: Sequence[float | None]) -> float | None:
    """The mean of the values that are there; None when none is.

    >>> mean([2, None, 4]), mean([None]) is None
    (3.0, True)
    """
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def counted_tries(results: list[RolloutResult]) -> tuple[list[RolloutResult], list[RolloutResult]]:
    """(the tries, the infra errors) among rollout results: per planned rollout, its last attempt that
    finished is its one try; every infra_error attempt is an infra error.

    >>> results = [RolloutResult(rollout_id, "a", "direct", status, None) for rollout_id, status in
    ...            [("ev0-a-s0", "infra_error"), ("ev0-a-s0-a2", "ok"), ("ev0-a-s1", "agent_timeout"),
    ...             ("ev0-b-s0", "infra_error")]]
    >>> tries, infra = counted_tries(results)
    >>> [r.rollout_id for r in tries], [r.rollout_id for r in infra]
    (['ev0-a-s0-a2', 'ev0-a-s1'], ['ev0-a-s0', 'ev0-b-s0'])
    """
    finished: dict[str, tuple[int, RolloutResult]] = {}
    infra = []
    for result in results:
        planned, attempt = attempt_of(result.rollout_id)
        if result.status == INFRA_ERROR:
            infra.append(result)
        elif planned not in finished or attempt > finished[planned][0]:
            finished[planned] = (attempt, result)
    return [finished[planned][1] for planned in sorted(finished)], infra


def costs(tries: list[RolloutResult]) -> dict:
    """Mean model calls, response tokens and seconds per try (None without tries).

    >>> costs([RolloutResult("r", "t", "direct", "ok", 1.0, num_calls=2, response_tokens=10,
    ...                      durations={"total_s": 3.0}), RolloutResult("q", "t", "direct", "ok", 1.0, num_calls=4)])
    {'mean_calls': 3.0, 'mean_tokens': 5.0, 'mean_duration_s': 3.0}
    """
    return {"mean_calls": mean([r.num_calls for r in tries]),
            "mean_tokens": mean([r.response_tokens for r in tries]),
            "mean_duration_s": mean([r.durations.get("total_s") for r in tries])}


def planned_tries(results: list[RolloutResult], k: int, planned: dict[str, str] | None) -> dict[str, str]:
    """Every planned try's id and task: `planned` (the plan rebuilt from the dataset) with any try the results
    name beside it; without a plan, the tries the results name, and `k` tries of each of their tasks.

    >>> planned_tries([RolloutResult("ev0-b-s0-a2", "b", "direct", "ok", 1.0)], k=2, planned=None)
    {'ev0-b-s0': 'b', 'ev0-b-s1': 'b'}
    """
    tries = dict(planned or {})
    for result in results:
        try_id, _ = attempt_of(result.rollout_id)
        tries.setdefault(try_id, result.task)
        sample = re.search(r"-s\d+$", try_id)
        if planned is None and sample:  # a try that wrote nothing is then known only as one of its task's k
            for other in range(k):
                tries.setdefault(f"{try_id[:sample.start()]}-s{other}", result.task)
    return tries


def summarize(results: list[RolloutResult], k: int, planned: dict[str, str] | None = None) -> dict:
    """The numbers of summary.json (`k`, `tasks`, `overall`, `missing`, `harness_killed`) from rollout results
    (`result.json`s) and the plan (`planned`: planned rollout id -> task; see `planned_tries` without one). A
    planned try with no finished attempt (every attempt an infra error, or none wrote a result) is `missing` and
    scores as a failed try (reward 0): a try that ends as an infra error or vanishes never raises a number. A try
    whose harness a limit killed is graded like any other and counted (`harness_killed`, per task and overall).

    >>> ok = lambda task, s, reward: RolloutResult(f"ev0-{task}-s{s}", task, "direct", "ok", reward, num_calls=1,
    ...                                            response_tokens=5, durations={"total_s": 2.0})
    >>> results = [ok("a", 0, 1.0), ok("a", 1, 1.0), ok("b", 0, 0.0), ok("b", 1, 1.0),
    ...            RolloutResult("ev0-b-s2", "b", "direct", "infra_error", None)]
    >>> summary = summarize(results, k=2, planned={f"ev0-{t}-s{s}": t for t in "ab" for s in range(3)})
    >>> summary["tasks"]["b"]["tries"], summary["tasks"]["b"]["missing"], summary["tasks"]["b"]["pass_at_k"]
    (3, 1, 0.6666666666666666)
    >>> {key: summary["overall"][key] for key in ("tries", "passes", "missing", "infra_errors")}
    {'tries': 6, 'passes': 3, 'missing': 2, 'infra_errors': 1}
    >>> summary["missing"]
    ['ev0-a-s2', 'ev0-b-s2']
    >>> summary["overall"]["harness_killed"], summary["harness_killed"]
    (0, {'memory': 0, 'pids': 0})
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    finished, infra = counted_tries(results)
    planned = planned_tries(results, k, planned)
    done = {attempt_of(r.rollout_id)[0] for r in finished}
    missing = sorted(try_id for try_id in planned if try_id not in done)
    tasks = sorted(set(planned.values()) | {r.task for r in finished})
    by_task = {task: [r.reward for r in finished if r.task == task] +
               [0.0 for try_id in missing if planned[try_id] == task] for task in tasks}
    per_task, overall = metrics.dataset_metrics(by_task, k)
    per_task_1, overall_1 = metrics.dataset_metrics(by_task, 1)

    def row(m: metrics.TaskMetrics, at_1: metrics.TaskMetrics, rows: list[RolloutResult],
            infra_rows: list[RolloutResult], missed: list[str]) -> dict:
        return {"tries": m.tries, "passes": m.passes, "pass_at_1": at_1.pass_at_k, "pass_at_k": m.pass_at_k,
                "pass_hat_k": m.pass_hat_k, "mean_reward": m.mean_reward, "missing": len(missed),
                "infra_errors": len(infra_rows), "harness_killed": sum(killed(rows).values()), **costs(rows)}

    return {"k": k,
            "tasks": {task: row(per_task[task], per_task_1[task], [r for r in finished if r.task == task],
                                [r for r in infra if r.task == task], [m for m in missing if planned[m] == task])
                      for task in tasks},
            "overall": row(overall, overall_1, finished, infra, missing), "missing": missing,
            "harness_killed": killed(finished)}


def killed(tries: list[RolloutResult]) -> dict[str, int]:
    """The tries whose harness a limit killed, by limit (`steps.metrics.harness_kills`).

    >>> memory = [{"process": "harness", "by": "memory", "count": 1}]
    >>> killed([RolloutResult("r", "t", "direct", "ok", 0.0, killed=memory),
    ...         RolloutResult("q", "t", "direct", "ok", 1.0)])
    {'memory': 1, 'pids': 0}
    """
    return metrics.harness_kills(harness_killed(result) for result in tries)


def printable(text: str) -> str:
    """`text` with control characters escaped, so that no name can redraw or break the table.

    >>> printable("fix-bug\\x1b[2J\\n")
    'fix-bug\\\\x1b[2J\\\\n'
    """
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def cell(value: object) -> str:
    """One number as the table shows it: counts whole, rates and means with 3 decimals, '-' for none.

    >>> cell(3), cell(0.66666), cell(None), cell(12.34567)
    ('3', '0.667', '-', '12.346')
    """
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:.3f}"


def format_table(summary: dict) -> str:
    """The summary as an aligned text table: one row per task, then the overall row."""
    k = summary["k"]
    header = ["task", "tries", "pass@1", f"pass@{k}", f"pass^{k}", "reward", "missing", "infra", "killed", "calls",
              "tokens", "seconds"]
    # .get: a summary.json written before a column (harness_killed) shows '-' there
    rows = [[printable(task), *(cell(numbers.get(c)) for c in COLUMNS)] for task, numbers in summary["tasks"].items()]
    rows.append(["overall", *(cell(summary["overall"].get(c)) for c in COLUMNS)])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join([cells[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(cells[1:], widths[1:]))])

    rule = "-" * len(line(header))
    table = [line(header), rule, *map(line, rows[:-1]), rule, line(rows[-1])]
    if summary.get("missing"):
        table.append(f"warning: {len(summary['missing'])} planned tries have no finished attempt (every attempt an "
                     "infra error, or none wrote a result); each counts as a failed try")
    if warning := metrics.harness_killed_warning(summary.get("harness_killed") or {}, summary["overall"]["tries"],
                                                 "evaluation"):
        table.append(warning)
    if summary.get("skipped_tasks"):
        names = ", ".join(printable(name) for name in summary["skipped_tasks"])
        table.append(f"warning: {len(summary['skipped_tasks'])} broken tasks were skipped (not evaluated): {names}")
    return "\n".join(table)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; `--k` is checked here, so that a bad one is one sentence."""
    p = argparse.ArgumentParser(prog="python -m steps.evaluate", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", required=True, help="folder or URL with one <rollout>/result.json per attempt")
    p.add_argument("--k", required=True, help="tries per task that pass@k and pass^k are computed for")
    p.add_argument("--out", required=True, help="where summary.json goes (folder path or s3:// URL of the file)")
    p.add_argument("--harness", default="", help="recorded in summary.json")
    p.add_argument("--dataset", default="", help="recorded in summary.json")
    p.add_argument("--checkpoint", default="", help="the checkpoint (or upstream) evaluated; recorded in summary.json")
    p.add_argument("--model", default="", help="the model name served; recorded in summary.json")
    p.add_argument("--iteration", type=int, default=0, help="the iteration whose checkpoint this evaluates")
    p.add_argument("--rollout-retries", type=int, default=None, metavar="N",
                   help="the run's rollout_retries: a rollout pod that died without a result after its agent started, "
                        "not retried, is a failed try; retried out of attempts, or before its agent started, an infra "
                        "error (steps.ends)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Reads the results, writes summary.json, prints the table (stderr) and the summary (stdout)."""
    args = parse_args(argv)
    if not args.k.isdigit() or not 1 <= int(args.k) <= MAX_EVAL_K:
        print(f"error: --k must be a whole number from 1 to {MAX_EVAL_K} (tries per task), got {args.k[:40]!r}",
              file=sys.stderr)
        return 2
    try:
        results = all_results(args.results, args.rollout_retries)
        tasks, broken = ([], [])
        if args.dataset:  # an Argo run's is its snapshot in the store: only the task names are used
            with local_copy(args.dataset) as dataset:
                tasks, broken = load_dataset(dataset)
    except (CollectError, DatasetError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # The plan the rollouts ran (steps.plan --eval): a try that wrote no result is still counted.
    planned = {planned_id(task.name, sample, args.iteration, evaluation=True): task.name
               for task in tasks for sample in range(int(args.k))} if args.dataset else None
    summary = {"k": int(args.k), "harness": args.harness, "dataset": args.dataset, "checkpoint": args.checkpoint,
               "model": args.model, "iteration": args.iteration, **summarize(results, int(args.k), planned),
               "skipped_tasks": {error.task: error.message for error in broken}}
    write_json(args.out, summary)
    print(format_table(summary), file=sys.stderr)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
