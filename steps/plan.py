"""Which rollouts one iteration runs: tasks x samples per task, printed as a JSON list or written in chunks.

    python -m steps.plan --dataset steps/tasks/builtin --iteration 0 --tasks-per-iteration 4 \
        --samples-per-task 2 [--seed 0] [--image-prefix ghcr.io/openforge/task-] [--app-rollouts /tmp/app-rollouts.json]
    python -m steps.plan --eval --dataset steps/tasks/builtin --iteration 0 --samples-per-task 3   # an evaluation
    python -m steps.plan ... --chunks s3://b/runs/demo/plans/iteration-0   # the plan to the store, in chunks
    python -m steps.plan ... --curriculum pass_rate --run-url runs/demo --run demo   # tasks by recent pass rate
    python -m steps.plan chunk s3://b/runs/demo/plans/iteration-0/rollouts-3.json   # prints one chunk

Each item is a `steps.contracts.rollout.PlannedRollout` (`plan_json`; read back with `read_plan`): `{"task",
"sample", "rollout_id", "image", "deadline_s", "cpus", "memory_mb", "storage_mb", "gpus", "app"}`: the task folder
(relative to the working folder), the sample number, a rollout id unique within the run, the container image the
rollout runs in (`task_image`: the task's `docker_image`, else `<image-prefix><task name>:<content hash of its
environment folder>`, the image `python workflows/submit.py images --dataset D` builds), the rollout's deadline
in seconds (agent + verifier timeouts + setup margin), the CPUs, memory (MiB), disk (MiB) and GPUs the task's
`[environment]` asks for (Harbor's defaults 1, 2048, 10240, 0 where it is silent), from which the rollout pod's
requests and limits are made (`workflows.iteration.rollout_resources`, which adds the harness's own budget), and
its `[environment] app` command (null without one). The Argo DAG fans out over this list (`withParam`), chunk by
chunk; the local runner reads the same chunks. With `--app-rollouts FILE` the rollouts of tasks with an app go to FILE
(a JSON list) instead of stdout: the DAG runs those in pods with the app as a sidecar container (`workflows.iteration`).
With `--chunks FOLDER` (`layout.plan_url`, both runners') each list goes to the store instead, in chunks of at most
`CHUNK_BYTES` each (`layout.plan_chunk_url`), and stdout (and the `--app-rollouts` file) get the list of those chunks'
numbers alone: Argo keeps only the last 256 KiB of a step's stdout as its result (docs/workflows.md, "Fan-out"), so
no list that grows with the plan passes through one; `python -m steps.plan chunk URL` prints one chunk's list. Each
item's `sample` goes to the rollout step (`--sample`), which writes it into its result, where the trajectory tables
take it from. A retried rollout runs under `attempt_id(rollout_id, K)`: `ID-a2`, `ID-a3`, ..., with the same
sample. Tasks rotate through a seeded shuffle of the dataset, so consecutive iterations see different tasks and a
rerun plans the same rollouts; with `--curriculum pass_rate` they are drawn by their pass rate over the run's last
`--curriculum-window` iterations (`steps.curriculum`, seeded too), and the pool it saw is written beside the plan
(`layout.curriculum_url`). `--exclude TASK` leaves tasks out: the local runner's fill rounds (`fill_batch`) plan more
tasks than the iteration ran already. `--eval` plans an evaluation of the checkpoint iteration N serves instead: every
task of the dataset, in name order, `--samples-per-task` tries each (its k), with ids `ev<N>-<task>-s<i>`, which
never collide with a training rollout's `it<N>-...` in the proxy's store the two share. Broken tasks are skipped
with a warning on stderr; exit code 2 when no task can be loaded. A `--dataset` URL (an Argo run's snapshot in the
store, `steps.datasets`) is read from a temporary copy, and each item's `task` is then its folder in the snapshot.
"""

import argparse
import json
import random
import re
import sys
from collections.abc import Iterable
from pathlib import Path

import fsspec

from steps.contracts import layout
from steps.curriculum import Curriculum, TaskPool, TaskRecord, choose_tasks, read_history, write_pool
from steps.contracts.rollout import PlannedRollout, plan_json
from steps.datasets import is_url, local_copy
from steps.tasks import DatasetError, Task, load_dataset

# Seconds a rollout gets beyond its task's agent and verifier timeouts: registering, sandbox, copying tests.
SETUP_MARGIN_S = 120
# The most tries per task an evaluation plans (its k): beyond it pass@k says no more, and the plan never ends.
MAX_EVAL_K = 100
# Argo's executor keeps the last 256 KiB of a step's stdout as its `outputs.result` and drops the rest
# (workflow/executor/executor.go `CaptureScriptResult`, `maxAnnotationSize = 256 * (1 << 10)`, v3.5 to v3.7), which a
# `withParam` then parses. A chunk of the plan prints at most a quarter of that: a planned rollout is about 250 bytes
# (the builtin tasks' 112 items print 27,937 bytes; a long `app` command makes one larger), so a chunk holds about
# 260 of them, and a plan of 10,000 rollouts is about 40 chunks.
ARGO_RESULT_BYTES = 256 * 1024
CHUNK_BYTES = ARGO_RESULT_BYTES // 4
FANOUTS = ("rollouts", "app-rollouts")  # a plan's two lists: without and with an `[environment] app`


def attempt_id(rollout_id: str, attempt: int) -> str:
    """The id attempt number `attempt` (1, 2, ...) of a planned rollout runs under, for the local runner's
    retries and for a rerun step whose failed attempt holds the planned id in the proxy alike.

    >>> attempt_id("it0-hello-file-s1", 1), attempt_id("it0-hello-file-s1", 3)
    ('it0-hello-file-s1', 'it0-hello-file-s1-a3')
    """
    if attempt < 1:
        raise ValueError(f"attempt must be 1 or more, got {attempt}")
    return rollout_id if attempt == 1 else f"{rollout_id}-a{attempt}"


def planned_id(task_name: str, sample: int, iteration: int, evaluation: bool = False) -> str:
    """The id of a planned rollout: `it<N>-<task>-s<i>`, or `ev<N>-<task>-s<i>` in an evaluation.

    >>> planned_id("hello-file", 1, 0), planned_id("hello-file", 0, 2, evaluation=True)
    ('it0-hello-file-s1', 'ev2-hello-file-s0')
    """
    return f"{'ev' if evaluation else 'it'}{iteration}-{task_name}-s{sample}"


def attempt_of(rollout_id: str) -> tuple[str, int]:
    """The planned id and attempt number K of an id `attempt_id` made (`ID-aK`; K 1 for the plan's own id).

    >>> attempt_of("it0-hello-s1-a3"), attempt_of("it0-hello-s1")
    (('it0-hello-s1', 3), ('it0-hello-s1', 1))
    """
    match = re.search(r"-a(\d+)$", rollout_id)
    return (rollout_id[:match.start()], int(match.group(1))) if match else (rollout_id, 1)


def pick_tasks(tasks: list[Task], iteration: int, count: int, seed: int) -> list[Task]:
    """`count` tasks for `iteration`: consecutive windows over a seeded shuffle, wrapping around.

    >>> from types import SimpleNamespace as T
    >>> tasks = [T(name=n) for n in "abcde"]
    >>> [t.name for t in pick_tasks(tasks, 0, 2, seed=0)], [t.name for t in pick_tasks(tasks, 1, 2, seed=0)]
    (['c', 'b'], ['a', 'e'])
    >>> len(pick_tasks(tasks, 0, 7, seed=0))  # more than the dataset: every task, no repeats
    5
    """
    ordered = sorted(tasks, key=lambda t: t.name)
    random.Random(seed).shuffle(ordered)
    count = min(count, len(ordered))
    start = (iteration * count) % len(ordered) if ordered else 0
    return [ordered[(start + i) % len(ordered)] for i in range(count)]


def task_image(task: Task, image_prefix: str) -> str:
    """The image a task's rollouts run in: its `docker_image` as is, else the one built from its environment
    folder, tagged with that folder's content hash (`Task.image_tag`), so an OpenForge upgrade rebuilds nothing."""
    return task.config.docker_image or f"{image_prefix}{task.name}:{task.image_tag}"


def training_tasks(tasks: list[Task], iteration: int, count: int, seed: int, curriculum: Curriculum | None = None,
                   history: dict[str, TaskRecord] | None = None,
                   exclude: Iterable[str] = ()) -> tuple[list[Task], TaskPool | None]:
    """The `count` tasks an iteration trains on, none of `exclude` (a fill round's: the tasks it ran already):
    without `curriculum`, `pick_tasks`' rotation; with it, `steps.curriculum.choose_tasks` on `history`, and the
    pool it saw.

    >>> from types import SimpleNamespace as T
    >>> tasks = [T(name=n) for n in "abcde"]
    >>> [t.name for t in training_tasks(tasks, 0, 2, 0, exclude=["c"])[0]]
    ['d', 'a']
    >>> chosen, pool = training_tasks(tasks, 0, 2, 0, Curriculum(), {"a": TaskRecord(2, 2), "b": TaskRecord(2, 0)})
    >>> [t.name for t in chosen if t.name in "ab"], pool.summary()["unseen"]  # a and b rest: unseen ones go first
    ([], 3)
    """
    left = [task for task in tasks if task.name not in set(exclude)]
    if curriculum is None:
        return pick_tasks(left, iteration, count, seed), None
    pool = choose_tasks([task.name for task in left], history or {}, count, curriculum, seed, iteration)
    by_name = {task.name: task for task in left}
    return [by_name[name] for name in pool.chosen], pool


def plan(tasks: list[Task], iteration: int, tasks_per_iteration: int, samples_per_task: int, seed: int = 0,
         image_prefix: str = "openforge-task-", root: Path | None = None,
         evaluation: bool = False, chosen: list[Task] | None = None) -> list[PlannedRollout]:
    """The iteration's rollouts, task by task, `samples_per_task` samples each (of `chosen`, else `pick_tasks`');
    with `evaluation`, every task (`tasks_per_iteration` is not used) under `ev<N>-` ids."""
    root = (root or Path.cwd()).resolve()
    planned = []
    if chosen is None:
        chosen = sorted(tasks, key=lambda t: t.name) if evaluation else \
            pick_tasks(tasks, iteration, tasks_per_iteration, seed)
    for task in chosen:
        path = task.path.resolve()
        folder = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
        image = task_image(task, image_prefix)
        deadline = int(task.config.agent_timeout_s + task.config.verifier_timeout_s + SETUP_MARGIN_S)
        resources = task.config.resources
        for sample in range(samples_per_task):
            planned.append(PlannedRollout(task=folder, sample=sample,
                                          rollout_id=planned_id(task.name, sample, iteration, evaluation), image=image,
                                          deadline_s=deadline, cpus=resources.cpus, memory_mb=resources.memory_mb,
                                          storage_mb=resources.storage_mb, gpus=resources.gpus, app=task.config.app))
    return planned


class ChunkError(ValueError):
    """A planned rollout too large for a chunk of the plan."""


def chunks(rollouts: list[PlannedRollout], limit: int = CHUNK_BYTES) -> list[str]:
    """The plan's printed list cut into consecutive lists of whole items, each printed in at most `limit` bytes.

    >>> items = [PlannedRollout("t", i, f"it0-t-s{i}", "img", 480, 1, 2048, 10240, 0) for i in range(5)]
    >>> [len(json.loads(chunk)) for chunk in chunks(items, limit=450)]
    [2, 2, 1]
    """
    found, items, size = [], [], 2  # "[" and "]"
    for rollout in rollouts:
        item = json.dumps(rollout.to_json())
        if len(item) + 2 > limit:
            raise ChunkError(f"planned rollout {rollout.rollout_id} is {len(item)} bytes as JSON, more than a chunk "
                             f"of the plan holds ({limit}); shorten its task's [environment] app command")
        if items and size + len(item) + 2 > limit:  # ", " before it
            found.append(items)
            items, size = [], 2
        size += len(item) + (2 if items else 0)
        items.append(item)
    found += [items] if items else []
    printed = ["[" + ", ".join(chunk) + "]" for chunk in found]
    assert all(len(chunk) <= limit for chunk in printed), "a chunk of the plan outgrew its limit"
    return printed


def write_chunks(folder: str, fanout: str, rollouts: list[PlannedRollout]) -> list[int]:
    """Writes one fan-out's list to `folder` in `chunks` (`layout.plan_chunk_url`); returns the chunks' numbers."""
    fs, root = fsspec.core.url_to_fs(folder)
    fs.makedirs(root, exist_ok=True)
    printed = chunks(rollouts)
    for index, chunk in enumerate(printed):
        with fs.open(layout.plan_chunk_url(root, fanout, index), "w") as f:
            f.write(chunk)
    return list(range(len(printed)))


def read_chunk(url: str) -> str:
    """One chunk of a plan as written (a JSON list of planned rollouts)."""
    with fsspec.open(url, "r") as f:
        return f.read()


def print_chunk(argv: list[str]) -> int:
    """`chunk URL`: prints that chunk's list on stdout, for the rollouts' `withParam`; exit code 2 if unreadable."""
    p = argparse.ArgumentParser(prog="python -m steps.plan chunk", description="Prints one chunk of a plan.")
    p.add_argument("url", help="the chunk (layout.plan_chunk_url)")
    url = p.parse_args(argv).url
    try:
        print(read_chunk(url))
    except OSError as exc:
        print(f"error: chunk {url} of the plan cannot be read: {exc}", file=sys.stderr)
        return 2
    return 0


def chosen_tasks(tasks: list[Task], args: argparse.Namespace) -> tuple[list[Task], TaskPool | None]:
    """The training tasks the command line asks for (`training_tasks`), the earlier iterations' rollouts read from
    the run's store for a curriculum."""
    curriculum = None if args.curriculum == "off" else \
        Curriculum(args.curriculum_window, args.curriculum_min_pass, args.curriculum_max_pass,
                   args.curriculum_pass_reward)
    history = read_history(args.run_url, args.run, args.iteration, curriculum) if curriculum else None
    return training_tasks(tasks, args.iteration, args.tasks_per_iteration, args.seed, curriculum, history,
                          args.exclude)


def main(argv: list[str] | None = None) -> int:
    """Prints the plan as one JSON list on stdout (nothing else goes to stdout: Argo reads it); with `--chunks`,
    the numbers of its chunks in the store; `chunk URL` prints one chunk."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["chunk"]:
        return print_chunk(argv[1:])
    p = argparse.ArgumentParser(prog="python -m steps.plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True)
    p.add_argument("--iteration", type=int, required=True)
    p.add_argument("--tasks-per-iteration", type=int, help="required unless --eval")
    p.add_argument("--samples-per-task", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--image-prefix", default="openforge-task-")
    p.add_argument("--app-rollouts", type=Path, help="write the rollouts of tasks with an [environment] app to this "
                   "file (a JSON list) instead of stdout")
    p.add_argument("--chunks", help="write each list to this folder of the store in chunks (layout.plan_chunk_url) "
                   "and print the chunks' numbers instead")
    p.add_argument("--eval", action="store_true", help="every task of the dataset, --samples-per-task tries each, "
                   "ids ev<N>-<task>-s<i>")
    p.add_argument("--curriculum", choices=("off", "pass_rate"), default="off", help="pass_rate: choose tasks by "
                   "their pass rate in the run's earlier iterations (steps.curriculum); needs --run-url and --run")
    p.add_argument("--curriculum-window", type=int, default=Curriculum.window)
    p.add_argument("--curriculum-min-pass", type=float, default=Curriculum.min_pass)
    p.add_argument("--curriculum-max-pass", type=float, default=Curriculum.max_pass)
    p.add_argument("--curriculum-pass-reward", type=float, default=Curriculum.pass_reward)
    p.add_argument("--run-url", help="the run's folder: its rollouts tables, and where the curriculum's pool goes")
    p.add_argument("--run", help="the run's name (its tables' partition)")
    p.add_argument("--exclude", action="append", default=[], metavar="TASK",
                   help="a task not to plan (repeatable): a fill round's, which ran already this iteration; the "
                   "curriculum's pool is then not written (the iteration's own plan wrote it)")
    args = p.parse_args(argv)
    if args.curriculum != "off" and not (args.run_url and args.run):
        p.error("--curriculum pass_rate needs --run-url and --run (the earlier iterations' rollouts)")
    if args.tasks_per_iteration is None and not args.eval:
        p.error("--tasks-per-iteration is required (or plan an evaluation with --eval)")
    if args.eval and not 1 <= args.samples_per_task <= MAX_EVAL_K:
        p.error(f"--samples-per-task of an evaluation (its k) must be 1 to {MAX_EVAL_K}, got {args.samples_per_task}")
    try:
        with local_copy(args.dataset) as dataset:
            tasks, errors = load_dataset(dataset)
            chosen, pool = (None, None) if args.eval else chosen_tasks(tasks, args)
            rollouts = plan(tasks, args.iteration, args.tasks_per_iteration or 0, args.samples_per_task, args.seed,
                            args.image_prefix, root=dataset if is_url(args.dataset) else None,
                            evaluation=args.eval, chosen=chosen)
            if pool is not None and not args.exclude:
                write_pool(args.run_url, pool)
    except (DatasetError, OSError) as exc:
        print(f"error: dataset {args.dataset} cannot be read: {exc}", file=sys.stderr)
        return 2
    for error in errors:
        print(f"warning: skipping broken task {error.task}: {error.message}", file=sys.stderr)
    if not tasks:
        print(f"error: no task of {args.dataset} could be loaded", file=sys.stderr)
        return 2
    lists = dict(zip(FANOUTS, ([r for r in rollouts if not r.app], [r for r in rollouts if r.app])))
    if args.app_rollouts is None:
        lists = {FANOUTS[0]: rollouts}
    try:
        printed = {fanout: (json.dumps(write_chunks(args.chunks, fanout, items)) if args.chunks else plan_json(items))
                   for fanout, items in lists.items()}
    except ChunkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: the plan cannot be written to {args.chunks}: {exc}", file=sys.stderr)
        return 2
    if args.app_rollouts is not None:
        args.app_rollouts.write_text(printed[FANOUTS[1]])
    print(printed[FANOUTS[0]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
