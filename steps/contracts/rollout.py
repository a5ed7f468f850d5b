"""A rollout's two records: what the plan step asks for (`PlannedRollout`) and what the rollout step wrote
(`RolloutResult`, its `result.json`), each with its JSON form and one reader.

    rollouts = read_plan(plan_step_stdout)  # the plan step's printed list, typed
    result = read_result(Path("runs/demo/results/iteration-0/it0-hello-file-s0/result.json"))

The plan step prints `plan_json(rollouts)`; the Argo DAG fans out over that list (`withParam`, where the
rollout template names `deadline_s` `deadline`) and the local runner reads it with `read_plan`. The rollout
step writes `result.to_json()` and every reader takes it back with `read_result` (or `RolloutResult.from_json`
for a file read some other way, as from the store): nobody else spells the fields.
"""

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

INFRA_EXIT_CODE = 3  # the rollout step's exit code for an infra_error: the only one Argo and the local runner retry
OK, AGENT_TIMEOUT, INFRA_ERROR = "ok", "agent_timeout", "infra_error"  # a result's status
# A rollout whose runner died after its agent started, unretried, with no result (its pod's or process's end was the
# agent's: its disk or memory limit, the deadline): reward 0, written by the collector (`steps.ends`), never a runner.
AGENT_KILLED = "agent_killed"
STATUSES = (OK, AGENT_TIMEOUT, INFRA_ERROR, AGENT_KILLED)
NO_REWARD = "none"  # OUT/reward of a rollout without one (infra_error), and Argo's default when none was written


class RecordError(ValueError):
    """A stored plan or result that is not one: the message names the file (or source) and what is wrong."""


@dataclass(frozen=True)
class PlannedRollout:
    """One rollout of an iteration: the `rollout` step's inputs, one item of the plan step's printed list."""

    task: str  # the task folder, relative to the working folder
    sample: int
    rollout_id: str
    image: str
    deadline_s: int  # the Argo rollout template's `deadline` parameter
    cpus: int
    memory_mb: int
    storage_mb: int
    gpus: int
    app: str | None = None  # the task's [environment] app: the rollout pod's sidecar runs it

    def to_json(self) -> dict:
        """The item as the plan step prints it.

        >>> PlannedRollout("t", 0, "it0-t-s0", "img", 480, 1, 2048, 10240, 0).to_json()["deadline_s"]
        480
        """
        return asdict(self)

    @classmethod
    def from_json(cls, item: object, source: str = "the plan") -> "PlannedRollout":
        """One printed item back; a `RecordError` naming the missing or unknown fields otherwise.

        >>> try:
        ...     PlannedRollout.from_json({"task": "t", "sample": 0, "deadline": 480})
        ... except RecordError as exc:
        ...     print(exc)
        the plan: an item lacks rollout_id, image, deadline_s, cpus, memory_mb, storage_mb, gpus; has unknown deadline
        """
        if not isinstance(item, dict):
            raise RecordError(f"{source}: an item is {type(item).__name__}, not a JSON object")
        names = [f.name for f in fields(cls)]
        missing = [name for name in names if name not in item and name != "app"]
        unknown = sorted(set(item) - set(names))
        wrong = ([f"lacks {', '.join(missing)}"] if missing else []) + \
            ([f"has unknown {', '.join(unknown)}"] if unknown else [])
        if wrong:
            raise RecordError(f"{source}: an item {'; '.join(wrong)}")
        return cls(**item)


def plan_json(rollouts: list[PlannedRollout]) -> str:
    """The plan step's printed form: one JSON list of items."""
    return json.dumps([rollout.to_json() for rollout in rollouts])


def read_plan(text: str, source: str = "the plan") -> list[PlannedRollout]:
    """The plan step's printed list, typed.

    >>> planned = PlannedRollout("t", 0, "it0-t-s0", "img", 480, 1, 2048, 10240, 0)
    >>> [r.rollout_id for r in read_plan(plan_json([planned]))]
    ['it0-t-s0']
    """
    try:
        items = json.loads(text)
    except ValueError as exc:
        raise RecordError(f"{source} is not JSON ({exc})") from None
    if not isinstance(items, list):
        raise RecordError(f"{source} is a JSON {type(items).__name__}, not a list of planned rollouts")
    return [PlannedRollout.from_json(item, source) for item in items]


@dataclass
class RolloutResult:
    """`OUT/result.json`: the rollout step's output, read by the trajectories step, the evaluation, the local
    runner and the run report (`read_result`)."""

    rollout_id: str  # the id it ran under (an attempt's, `ID-aK`, after a retry)
    task: str  # the task's name
    harness: str
    status: str  # one of STATUSES ("" in a file that leaves it out)
    reward: float | None
    rewards: dict = field(default_factory=dict)
    num_calls: int = 0
    error: str | None = None
    harness_exit_code: int | None = None
    durations: dict = field(default_factory=dict)
    weight_versions: list = field(default_factory=list)
    response_tokens: int = 0
    paths: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    sample: int | None = None  # the plan's sample number, as the step was given it
    metadata: dict = field(default_factory=dict)
    # What a limit killed: [{"process": "harness" | "agent", "by": "memory" | "pids" | "time", "count": N}]; a
    # rollout whose harness was killed is still graded (docs/rollouts.md, "The harness's own budget").
    killed: list = field(default_factory=list)
    peak_memory_mb: dict = field(default_factory=dict)  # {"harness": MiB, "agent": MiB}: the most each held at once

    def to_json(self) -> dict:
        """The record as `result.json` holds it."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: object, source: str = "a result") -> "RolloutResult":
        """A `result.json`'s object back. Only `rollout_id` is required: a field an older writer left out takes its
        default (an empty `status` and `task`, no reward), and a field this reader does not know is ignored; a
        field of the wrong type is a `RecordError`.

        >>> RolloutResult.from_json({"rollout_id": "it0-t-s0", "status": "ok", "reward": 1}).killed
        []
        >>> for data in ({"status": "ok"}, {"rollout_id": "r", "reward": "1"}):
        ...     try:
        ...         RolloutResult.from_json(data, "r/result.json")
        ...     except RecordError as exc:
        ...         print(exc)
        r/result.json is not a rollout result: it has no rollout_id
        r/result.json is not a rollout result: its reward is '1', not a number or null
        """
        if not isinstance(data, dict):
            raise RecordError(f"{source} is not a rollout result: a JSON {type(data).__name__}, not an object")
        if not isinstance(data.get("rollout_id"), str) or not data["rollout_id"]:
            raise RecordError(f"{source} is not a rollout result: it has no rollout_id")
        values = {"task": "", "harness": "", "status": "", "reward": None}
        for f in fields(cls):
            if f.name not in data or data[f.name] is None and f.name in _NOT_NULL:
                continue
            value, kind = data[f.name], _KINDS[f.name]
            if not isinstance(value, kind) or isinstance(value, bool) and bool not in kind:
                raise RecordError(f"{source} is not a rollout result: its {f.name} is {value!r}, "
                                  f"not {_json_kinds(kind)}")
            values[f.name] = value
        return cls(**values)


# The JSON types each field may hold in a file (None where the field may be null).
_KINDS: dict[str, tuple[type, ...]] = {
    "rollout_id": (str,), "task": (str,), "harness": (str,), "status": (str,), "reward": (int, float, type(None)),
    "rewards": (dict,), "num_calls": (int,), "error": (str, type(None)), "harness_exit_code": (int, type(None)),
    "durations": (dict,), "weight_versions": (list,), "response_tokens": (int,), "paths": (dict,), "notes": (list,),
    "sample": (int, type(None)), "metadata": (dict,), "killed": (list,), "peak_memory_mb": (dict,)}
# Fields whose null in a file means "left out": the record keeps its default.
_NOT_NULL = {"task", "harness", "status", "rewards", "num_calls", "durations", "weight_versions", "response_tokens",
             "paths", "notes", "metadata", "killed", "peak_memory_mb"}


def _json_kinds(kinds: tuple[type, ...]) -> str:
    """The JSON names of Python types, for an error: "a number or null"."""
    names = {str: "a string", int: "a number", float: "a number", type(None): "null", dict: "an object", list: "a list"}
    return " or ".join(dict.fromkeys(names[kind] for kind in kinds))


def harness_killed(result: RolloutResult) -> str | None:
    """What killed a rollout's harness: "memory", "pids" or "time"; None if nothing did (or the result predates
    the field).

    >>> result = RolloutResult("r", "t", "direct", "ok", 0.0)
    >>> result.killed = [{"process": "agent", "by": "memory", "count": 2},
    ...                  {"process": "harness", "by": "memory", "count": 1}]
    >>> harness_killed(result), harness_killed(RolloutResult("r", "t", "direct", "ok", 1.0))
    ('memory', None)
    """
    return next((kill.get("by") for kill in result.killed
                 if isinstance(kill, dict) and kill.get("process") == "harness"), None)


def read_result(path: Path | str) -> RolloutResult:
    """A rollout's `result.json`, typed; a `RecordError` naming the file when it is not one."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"{path} could not be read ({type(exc).__name__}: {exc})") from None
    return parse_result(text, str(path))


def parse_result(text: str | bytes, source: str) -> RolloutResult:
    """A `result.json`'s text (as read from the store), typed; a `RecordError` naming `source` when it is not one."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RecordError(f"{source} is not a rollout result: not JSON ({exc})") from None
    return RolloutResult.from_json(data, source)
