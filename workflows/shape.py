"""The shape of a run, said once: each Workflow's steps, what each one waits for, its fan-outs, which failures it
outlives, and the rule by which iterations overlap.

    from workflows import shape
    [step.name for step in shape.collect(config, evaluation=False)]
    # ['isolate-rollouts', 'isolate-serve', 'serve', 'serve-address', 'serve-ready', 'plan', 'rollout', 'rollout-app',
    #  'trajectories']

Two runners read it. `workflows/iteration.py` and `workflows/evaluation.py` render each step as an Argo DAG task
(`depends` written from `needs`, `withParam` from `fanout`, `continueOn` from `keep_going`); `workflows/local.py`
executes the same steps in order with `run`, deciding from the same `needs` whether each one runs. The driver on
Argo (`workflows/submit.py`) and the local runner both overlap iterations by `last_update_before`.

What a step's `needs` mean is Argo's enhanced depends logic (argo-workflows docs, "Enhanced Depends Logic", v3.5):
a bare task name holds when that task Succeeded, was Skipped or is a Daemoned step that started; `X.AnySucceeded`
when at least one pod of the fan-out `X` succeeded; `X.Succeeded`, `X.Failed`, `X.Errored`, `X.Skipped` when the
task ended so. A failure that a later step's `needs` names (`AnySucceeded`, `Failed`, ...) or that a step outlives
with `continueOn` (`keep_going`) does not fail its DAG; any other failure does. `run` applies the same rules to
the local steps' outcomes, so a difference between the two runners is one in this module, in one place.
"""

from collections.abc import Callable
from dataclasses import dataclass

from steps.contracts import layout
from steps.contracts.config import RunConfig

# A step's end, as Argo names it in `depends`.
SUCCEEDED, FAILED, ERRORED, SKIPPED, OMITTED = "Succeeded", "Failed", "Errored", "Skipped", "Omitted"
ANY_SUCCEEDED = "AnySucceeded"
DONE = ()  # a bare name: Succeeded, Skipped or (a daemon) Daemoned
ENDED = (SUCCEEDED, FAILED, SKIPPED)  # a fan-out ran to its end, whatever its pods did, or had no item
HANDLED = (SUCCEEDED, FAILED, ERRORED)  # the step ended, whatever its end
FINISHED = (SUCCEEDED, FAILED)

# A plan's two lists go to the store in chunks (`steps.plan --chunks`); the plan step outputs their chunks' numbers.
PLANNED = "result"  # the plan's standard output: the chunks of its rollouts without an app, as a JSON list
APP_ROLLOUTS = "app-rollouts"  # the plan's output parameter: the chunks of the rollouts of tasks with an app
ROLLOUT_STEPS = ("rollout", "rollout-app")  # the rollout fan-outs: without and with the task's app as a sidecar
ISOLATION_STEPS = ("isolate-rollouts", "isolate-serve")  # the NetworkPolicies a Workflow applies before its rollouts
# The serve's stable address, a Service owned by the Workflow (its ClusterIP the step's output), and the gate that
# waits until a serve answers there. The rollouts wait for these, never for the serve daemon's own node: a retry
# that starts the serve again deletes that node's DAG descendants with it (docs/workflows.md, "The serve's address").
SERVE_ADDRESS, SERVE_READY = "serve-address", "serve-ready"
FETCH_MODEL = "fetch-model"  # a hub `model` into the run's store, before the first serve (steps.fetch_model)


@dataclass(frozen=True)
class Need:
    """What a step waits for from an earlier one: that it ended in one of `results` (empty: a bare name)."""

    step: str
    results: tuple[str, ...] = DONE

    def term(self, alone: bool) -> str:
        """This need in a `depends` expression; several results are bracketed unless the need stands alone.

        >>> Need("rollout", (ANY_SUCCEEDED,)).term(alone=False), Need("record", HANDLED).term(alone=True)
        ('rollout.AnySucceeded', 'record.Succeeded || record.Failed || record.Errored')
        """
        if not self.results:
            return self.step
        text = " || ".join(f"{self.step}.{result}" for result in self.results)
        return text if alone or len(self.results) == 1 else f"({text})"

    def holds(self, outcome: "Outcome") -> bool:
        """Whether the earlier step's outcome meets this need (Argo's meaning of each result)."""
        if not self.results:
            return outcome.end in (SUCCEEDED, SKIPPED)
        return any(outcome.any_succeeded if result == ANY_SUCCEEDED else outcome.end == result
                   for result in self.results)


@dataclass(frozen=True)
class Step:
    """One step of a DAG: it runs once its `needs` hold (all of them, or with `either` any one)."""

    name: str
    needs: tuple[Need, ...] = ()
    either: bool = False
    fanout: str = ""  # a fan-out: one pod per rollout in the chunks this output of the plan step `plan` lists
    plan: str = ""
    keep_going: bool = False  # its failure does not fail its DAG (Argo's continueOn failed and error)
    only_if_failed: bool = False  # an exit handler's step that runs only when the Workflow did not succeed

    @property
    def depends(self) -> str:
        """The step's Argo `depends` expression ('' for none).

        >>> Step("evaluate", (Need("eval-rollout", ENDED), Need("eval-rollout-app", ENDED))).depends
        '(eval-rollout.Succeeded || eval-rollout.Failed || eval-rollout.Skipped) && (eval-rollout-app.Succeeded || eval-rollout-app.Failed || eval-rollout-app.Skipped)'
        """
        terms = [need.term(alone=len(self.needs) == 1) for need in self.needs]
        return (" || " if self.either else " && ").join(terms)

    def ready(self, outcomes: dict[str, "Outcome"]) -> bool:
        """Whether the step runs, given the outcomes of the steps before it."""
        held = [need.holds(outcomes[need.step]) for need in self.needs]
        return not held or (any(held) if self.either else all(held))


@dataclass(frozen=True)
class Outcome:
    """How a step ended: `end` as Argo names it; for a fan-out, whether any of its items succeeded."""

    end: str
    any_succeeded: bool = False


def isolation(config: RunConfig) -> tuple[str, ...]:
    """The isolation steps the Workflow has (none without `network_policy`)."""
    return ISOLATION_STEPS if config.network_policy else ()


def fanout(prefix: str, isolate: tuple[str, ...], keep_going: bool = False) -> list[Step]:
    """plan -> [rollout x N, rollout-app x M] -> trajectories, named `<prefix>plan`, ... Either fan-out may be empty
    (skipped). No rollout starts before the isolation exists: its agent never has the cluster's network. A rollout
    that still fails after its retries is left out of the tables, not fatal: trajectories needs one that succeeded.
    With `keep_going`, a failed plan or trajectories step does not fail the DAG either (an evaluation's)."""
    plan, rollout, app_rollout, trajectories = (f"{prefix}{step}" for step in ("plan", *ROLLOUT_STEPS, "trajectories"))
    after = tuple(Need(name) for name in (SERVE_READY, plan, *isolate))
    return [Step(plan, keep_going=keep_going),
            Step(rollout, after, fanout=PLANNED, plan=plan),
            Step(app_rollout, after, fanout=APP_ROLLOUTS, plan=plan),
            Step(trajectories, (Need(rollout, (ANY_SUCCEEDED,)), Need(app_rollout, (ANY_SUCCEEDED,))), either=True,
                 keep_going=keep_going)]


def collect(config: RunConfig, evaluation: bool) -> list[Step]:
    """The `collect` DAG: [isolation], serve (a daemon: it stops when this DAG ends), serve-address -> serve-ready
    (its Service, and a serve answering there), plan -> rollouts ->
    trajectories; with `evaluation`, the evaluation of the served checkpoint beside them on the same serve:
    eval-plan -> eval-rollouts -> eval-trajectories, and evaluate once every eval rollout has ended. A failed
    evaluation is recorded as failed (the driver's `mark`) and does not stop the iteration's update."""
    isolate = isolation(config)
    evaluate = Step("evaluate", (Need("eval-rollout", ENDED), Need("eval-rollout-app", ENDED)), keep_going=True)
    return [*(Step(name) for name in isolate), Step("serve"), Step(SERVE_ADDRESS),
            Step(SERVE_READY, (Need(SERVE_ADDRESS),)), *fanout("", isolate),
            *(fanout("eval-", isolate, keep_going=True) + [evaluate] if evaluation else [])]


def fetches_model(config: RunConfig, iteration: int) -> bool:
    """Whether the Workflow of iteration `iteration` (an eval run's: 0) first fetches the hub `model` into the run:
    when its serve starts on the base model, that is iteration 0 (with `max_staleness` S, every iteration up to S,
    which may start before iteration 0 ended; the step does nothing when the run holds the model already).

    >>> [fetches_model(RunConfig(model="hf://Qwen/Qwen3-8B", max_staleness=1), i) for i in range(3)]
    [True, True, False]
    >>> fetches_model(RunConfig(model="s3://b/models/q"), 0)
    False
    """
    return config.model.startswith(layout.HUB_SCHEME) and not config.upstream and iteration <= config.max_staleness


def update_waits(config: RunConfig, iteration: int) -> bool:
    """Whether iteration `iteration`'s update first waits for the checkpoint the previous update writes: with
    `max_staleness` >= 1 its rollouts ran beside that update, and it never trains on an unknown base."""
    return config.max_staleness > 0 and iteration > 0


def fetch(config: RunConfig, iteration: int) -> tuple[list[Step], tuple[Need, ...]]:
    """([fetch-model] when `fetches_model`, what `collect` then waits for)."""
    if not fetches_model(config, iteration):
        return [], ()
    return [Step(FETCH_MODEL)], (Need(FETCH_MODEL),)


def iteration(config: RunConfig, iteration: int) -> list[Step]:
    """The outer DAG of iteration `iteration`: [fetch-model], collect, [wait-checkpoint], update. Across nodes, any
    earlier update JobSet of the iteration is deleted first (`clean-update`): one JobSet at a time writes the
    checkpoint."""
    before = "wait-checkpoint" if update_waits(config, iteration) else "collect"
    update = [Step("clean-update", (Need(before),)), Step("update", (Need("clean-update"),))] \
        if config.update_nodes > 1 else [Step("update", (Need(before),))]
    fetching, after = fetch(config, iteration)
    return [*fetching, Step("collect", after),
            *([Step("wait-checkpoint", (Need("collect"),))] if before != "collect" else []), *update]


def evaluation(config: RunConfig, iteration: int) -> list[Step]:
    """An evaluation Workflow's outer DAG: [fetch-model], collect, then evaluate whether or not every rollout
    succeeded (a rollout failed after its retries is an infra error to count)."""
    fetching, after = fetch(config, iteration)
    return [*fetching, Step("collect", after), Step("evaluate", (Need("collect", FINISHED),))]


def sft(config: RunConfig) -> list[Step]:
    """An SFT run's one Workflow (docs/training.md): [fetch-model] (a hub student), `sft-samples` from the recorded
    run, then `sft`, which writes the checkpoint iteration 1 would serve.

    >>> [(step.name, step.depends) for step in sft(RunConfig(model="s3://b/models/m"))]
    [('sft-samples', ''), ('sft', 'sft-samples')]
    """
    fetching, after = fetch(config, 0)
    return [*fetching, Step("sft-samples", after), Step("sft", (Need("sft-samples"),))]


def exit_handler(delete_update: bool = False) -> list[Step]:
    """The exit handler: `record`, then `report`, which may fail without changing the record or the Workflow's
    phase; with `delete_update`, a Workflow that did not succeed deletes its update JobSet (`delete-update`)."""
    return [Step("record"), Step("report", (Need("record", HANDLED),), keep_going=True),
            *([Step("delete-update", only_if_failed=True)] if delete_update else [])]


def last_update_before(config: RunConfig, iteration: int) -> int:
    """The last iteration whose update must have ended before iteration `iteration`'s rollouts start: the one
    before it when synchronous (`max_staleness` 0) or when it evaluates the checkpoint it serves; else
    `max_staleness` S further back, so that no rollout is more than S versions ahead of what is trained.

    >>> [last_update_before(RunConfig(max_staleness=1, iterations=4), i) for i in range(4)]
    [-2, -1, 0, 1]
    >>> [last_update_before(RunConfig(iterations=3), i) for i in range(3)]
    [-1, 0, 1]
    """
    if config.max_staleness == 0 or config.evaluates_at(iteration):
        return iteration - 1
    return iteration - config.max_staleness - 1


class DagFailed(RuntimeError):
    """A step failed and nothing after it outlives that: the DAG fails (its first such failure, as raised)."""


def run(steps: list[Step], actions: dict[str, Callable[[Step], Outcome]]) -> dict[str, Outcome]:
    """Executes `steps` in their order (each one's needs are earlier steps): a step whose needs hold runs its
    action, else it is Omitted; returns every outcome. An action ends its step by returning its Outcome, or by
    raising (the step Failed). A failed step fails the DAG at once (its exception raised again, or `DagFailed`)
    unless it keeps going or a later step's needs name one of its other ends (it is then handled there)."""
    outcomes: dict[str, Outcome] = {}
    for step in steps:
        if not step.ready(outcomes):
            outcomes[step.name] = Outcome(OMITTED)
            continue
        try:
            outcomes[step.name] = actions[step.name](step)
        except Exception as exc:
            outcomes[step.name] = Outcome(FAILED)
            if not (step.keep_going or handled(step, steps)):
                raise
        if outcomes[step.name].end == FAILED and not (step.keep_going or handled(step, steps)):
            raise DagFailed(f"step {step.name} failed")
    return outcomes


def handled(step: Step, steps: list[Step]) -> bool:
    """Whether a step of `steps` waits on an end of `step` other than success, so that its failure is expected."""
    return any(need.step == step.name and set(need.results) - {SUCCEEDED} for later in steps for need in later.needs)
