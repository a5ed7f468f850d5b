"""The run manifest's records: what it knows of each iteration and of each evaluation, and their JSON forms.

    from steps.contracts.manifest import IterationRecord
    IterationRecord.from_json(IterationRecord(0, "local", status="Succeeded").to_json())

Written by the drivers (`workflows/submit.py`, `workflows/local.py`) and the record step (`python -m
steps.manifest record`), read by the report, the driver resuming a run and its status; `steps.manifest` keeps
them in the store (`manifest/iteration-<N>.json`, `manifest/eval-<N>.json`: `steps.contracts.layout`).
"""

from dataclasses import asdict, dataclass, fields

DONE = ("Succeeded", "Failed", "Error")  # Argo's phases that end a workflow


class StoredRecord:
    """What both records share: a phase (`status`, Argo's) and their JSON form in the store."""

    status: str

    @property
    def done(self) -> bool:
        """True once it has an outcome (success or failure)."""
        return self.status in DONE

    def to_json(self) -> dict:
        """The record as stored: a JSON object of every field."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict):
        """A stored record; a key no field names (a newer writer's) is left out, one it lacks keeps its default.

        >>> IterationRecord.from_json({"iteration": 2, "status": "Failed", "later": 1}).done
        True
        """
        names = {record_field.name for record_field in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in names})


@dataclass
class IterationRecord(StoredRecord):
    """What the manifest knows about one iteration."""

    iteration: int
    workflow: str = ""  # the Argo Workflow's name ("local" for the local runner)
    checkpoint: str = ""  # the checkpoint this iteration served
    next_checkpoint: str = ""  # the checkpoint its update wrote
    status: str = "Pending"  # Pending | Running | Succeeded | Failed | Error (Argo's phases)
    updated: float = 0.0  # unix time of the last write
    metrics: dict | None = None
    attempt: int = 0  # local runner: how many earlier starts of this iteration died or failed
    eval: dict | None = None  # with eval_every: the evaluation of `checkpoint` (`steps.manifest.eval_numbers`)
    timings_s: dict | None = None  # local runner: seconds in rollouts, trajectories, update, reload
    staleness: dict | None = None  # what was trained: versions behind, per sample count; dropped (`read_staleness`)
    phase_times: dict | None = None  # local runner: each phase's [start, end] in unix time (they overlap with S >= 1)
    reason: str | None = None  # local runner: why it Failed (its own step, or an earlier update it needed)
    adapter: str | None = None  # a LoRA run's: the adapter it served with the base (`layout.adapter_name`)
    curriculum: dict | None = None  # with a curriculum: its pool's tasks per state, and chosen (`TaskPool.summary`)


@dataclass
class EvalRecord(StoredRecord):
    """What the manifest knows about one evaluation: of the checkpoint iteration `iteration` serves."""

    iteration: int
    workflow: str = ""  # the Argo Workflow that ran it ("local" for the local runner)
    checkpoint: str = ""  # the checkpoint (or upstream server) evaluated
    status: str = "Pending"  # Argo's phases, as for iterations
    updated: float = 0.0
    summary: str = ""  # its summary.json (steps.evaluate)
    overall: dict | None = None  # the summary's overall numbers, once it succeeded
    attempt: int = 0  # local runner: how many earlier starts of this evaluation died or failed
