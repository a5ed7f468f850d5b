"""The curriculum task pool: which tasks an iteration trains on, by each task's recent pass rate.

    from steps.curriculum import Curriculum, choose_tasks, read_history
    settings = Curriculum(window=4)
    pool = choose_tasks(["a", "b", "c"], read_history("runs/demo", "demo", 5, settings), 2, settings, seed=0, iteration=5)

A task whose rollouts of the last `window` iterations always passed (`solved`) or never did (`unsolved`) gives a GRPO
group with one reward, which carries no gradient; `choose_tasks` prefers the others (`learning`, pass rate strictly
between `min_pass` and `max_pass`), weighted by p (1 - p), the variance of a pass: tasks near a pass rate of 0.5
first. A task with no rollout in the window (`unseen`: never tried, or rested for `window` iterations) weighs as one
at 0.5, so new tasks are tried and resting ones come back. Only when too few tasks are learning or unseen are resting
ones chosen. A pass is a reward of at least `pass_reward` (`steps.metrics.SUCCESS`, 1, as in pass@k, by default; a
task graded with partial credit may set less); an infra error is no try.
The choice is drawn from `seed` and the iteration alone, so a rerun plans the same tasks. The plan step
(`steps.plan --curriculum pass_rate`) runs it on both runners and writes the pool (`TaskPool`) beside the plan
(`layout.curriculum_url`), where the manifest and the report read it.
"""

import json
import random
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import fsspec

from steps.contracts import layout
from steps.contracts.table_files import TrajectoryFileError, read_table
from steps.contracts.tables import SchemaError
from steps.metrics import SUCCESS

STATES = ("learning", "unseen", "solved", "unsolved")  # a task's state in the pool
UNSEEN_WEIGHT = 0.25  # an unseen task weighs as a task at pass rate 0.5: p (1 - p) at its largest


@dataclass(frozen=True)
class Curriculum:
    """The run's curriculum settings (`curriculum_window`, `curriculum_min_pass`, `curriculum_max_pass`,
    `curriculum_pass_reward`)."""

    window: int = 4
    min_pass: float = 0.0
    max_pass: float = 1.0
    pass_reward: float = SUCCESS


@dataclass
class TaskRecord:
    """One task's rollouts in the window: tries (infra errors left out) and passes."""

    tries: int = 0
    passes: int = 0

    @property
    def pass_rate(self) -> float | None:
        """passes / tries; None when untried."""
        return self.passes / self.tries if self.tries else None


@dataclass
class TaskPool:
    """The pool as one iteration's plan saw it: each task's record and state, the tasks chosen, and the counts
    the manifest and the report show (`summary`)."""

    iteration: int
    window: int
    min_pass: float
    max_pass: float
    pass_reward: float
    tasks: dict[str, dict] = field(default_factory=dict)  # name -> {"tries", "passes", "pass_rate", "state"}
    chosen: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        """Tasks per state in the pool, and per state among those chosen.

        >>> pool = TaskPool(0, 4, 0.0, 1.0, 1.0, {"a": {"state": "unseen"}, "b": {"state": "solved"}}, ["a"])
        >>> pool.summary()
        {'learning': 0, 'unseen': 1, 'solved': 1, 'unsolved': 0, 'chosen': {'learning': 0, 'unseen': 1, 'solved': 0, 'unsolved': 0}}
        """
        def count(names: Iterable[str]) -> dict[str, int]:
            states = [self.tasks[name]["state"] for name in names]
            return {state: states.count(state) for state in STATES}

        return {**count(self.tasks), "chosen": count(self.chosen)}

    def to_json(self) -> dict:
        """The pool as stored (`layout.curriculum_url`)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "TaskPool":
        """A stored pool."""
        return cls(**data)


def tally(rows: Iterable[tuple[str, float | None]], pass_reward: float = SUCCESS) -> dict[str, TaskRecord]:
    """Each task's tries and passes (a reward of at least `pass_reward`) from (task, reward) pairs; a reward of
    None (an infra error) is no try.

    >>> {name: (r.tries, r.passes) for name, r in tally([("a", 1.0), ("a", 0.2), ("a", None), ("b", 0.0)]).items()}
    {'a': (2, 1), 'b': (1, 0)}
    >>> tally([("a", 1.0), ("a", 0.6), ("a", 0.2)], pass_reward=0.5)["a"].passes
    2
    """
    records: dict[str, TaskRecord] = {}
    for task, reward in rows:
        if reward is None:
            continue
        record = records.setdefault(task, TaskRecord())
        record.tries += 1
        record.passes += reward >= pass_reward
    return records


def state(record: TaskRecord | None, curriculum: Curriculum) -> str:
    """A task's state: `unseen` without tries, `unsolved` at or below `min_pass`, `solved` at or above `max_pass`,
    else `learning`.

    >>> [state(r, Curriculum()) for r in (None, TaskRecord(4, 0), TaskRecord(4, 4), TaskRecord(4, 1))]
    ['unseen', 'unsolved', 'solved', 'learning']
    """
    if record is None or not record.tries:
        return "unseen"
    if record.pass_rate <= curriculum.min_pass:
        return "unsolved"
    return "solved" if record.pass_rate >= curriculum.max_pass else "learning"


def choose_tasks(names: list[str], history: dict[str, TaskRecord], count: int, curriculum: Curriculum, seed: int,
                 iteration: int) -> TaskPool:
    """`count` of the task `names` for `iteration` (fewer when there are fewer), drawn without replacement with
    weight p (1 - p) for a learning task at pass rate p and `UNSEEN_WEIGHT` for an unseen one; resting tasks
    (solved, unsolved) only when those run out, in a seeded order. Deterministic in (`seed`, `iteration`).

    >>> history = {"half": TaskRecord(4, 2), "solved": TaskRecord(4, 4), "unsolved": TaskRecord(4, 0)}
    >>> sorted(choose_tasks(["half", "new", "solved", "unsolved"], history, 2, Curriculum(), 0, 3).chosen)
    ['half', 'new']
    >>> len(choose_tasks(["half", "solved"], history, 2, Curriculum(), 0, 3).chosen)  # resting ones fill in
    2
    """
    rng = random.Random(seed * 1_000_003 + iteration)
    pool = TaskPool(iteration, curriculum.window, curriculum.min_pass, curriculum.max_pass, curriculum.pass_reward)
    weights: dict[str, float] = {}
    for name in sorted(set(names)):
        record = history.get(name)
        pool.tasks[name] = {"tries": record.tries if record else 0, "passes": record.passes if record else 0,
                            "pass_rate": record.pass_rate if record else None, "state": state(record, curriculum)}
        if pool.tasks[name]["state"] == "learning":
            weights[name] = record.pass_rate * (1 - record.pass_rate)
        elif pool.tasks[name]["state"] == "unseen":
            weights[name] = UNSEEN_WEIGHT
    # Efraimidis and Spirakis's weighted sampling without replacement: the largest keys u^(1/w) are the sample.
    keys = {name: rng.random() ** (1 / weight) for name, weight in weights.items()}
    preferred = sorted(keys, key=lambda name: keys[name], reverse=True)
    resting = sorted(name for name in pool.tasks if name not in weights)
    rng.shuffle(resting)
    pool.chosen = (preferred + resting)[:count]
    return pool


def read_history(run_url: str, run: str, iteration: int, curriculum: Curriculum) -> dict[str, TaskRecord]:
    """Each task's tries and passes over the rollouts tables of the `curriculum.window` iterations before
    `iteration` (those written: an iteration without a table adds nothing)."""
    rows: list[tuple[str, float | None]] = []
    for earlier in range(max(0, iteration - curriculum.window), iteration):
        try:
            table = read_table(layout.run_partition_url(run_url, run, earlier), "rollouts")
        except (TrajectoryFileError, SchemaError):
            continue
        rows += zip(table.column("task").to_pylist(), table.column("reward").to_pylist())
    return tally(rows, curriculum.pass_reward)


def write_pool(run_url: str, pool: TaskPool) -> str:
    """Writes the pool beside the iteration's plan (`layout.curriculum_url`); returns where."""
    url = layout.curriculum_url(run_url, pool.iteration)
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "w") as handle:
        handle.write(json.dumps(pool.to_json(), indent=1) + "\n")
    return url


def read_pool(run_url: str, iteration: int) -> TaskPool | None:
    """The pool an iteration's plan wrote; None when it wrote none (no curriculum) or it cannot be read."""
    try:
        with fsspec.open(layout.curriculum_url(run_url, iteration), "r") as handle:
            return TaskPool.from_json(json.loads(handle.read()))
    except (OSError, ValueError, TypeError):
        return None
