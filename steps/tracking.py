"""Experiment tracking: a run's config once, then per iteration the numbers its report plots, in W&B, MLflow or
TensorBoard (the run's `trackers`; docs/tracking.md).

    from steps.tracking import Trackers
    with Trackers.start(config, say) as trackers:  # each of config.trackers; one that fails is said, left out
        trackers.log_iteration(3)                  # iteration 3's numbers, read from the store as the report does
        trackers.log_evaluation(4)                 # an evaluation that ended no iteration (the final checkpoint's)

The driver calls it, locally (`workflows.local`) and on a cluster (`workflows.submit`), once an iteration has
succeeded. The numbers are the report's own, never recomputed: `steps.report.index.summaries` (rewards, pass@k and
pass^k, losses, grad norm, logprob gap, continuity, staleness, harness kills, phase and rollout times), the behaviour
analytics' means per harness and the evaluation's overall numbers. Each library is imported only when its tracker
starts: `missing_libraries` is what the config check asks first.
"""

import hashlib
import importlib.util
import json
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import fsspec

from steps.contracts import layout
from steps.contracts.config import RunConfig

if TYPE_CHECKING:  # the report's reader (plotly and all) is imported when a tracker logs, not by every config check
    from steps.report.data import Run

TRACKERS = ("wandb", "mlflow", "tensorboard")
# Where a tracker's credentials come from on a cluster: each env its library reads, and the key of the Secret the
# config names (`wandb_secret`, `mlflow_secret`) that the driver's pod takes it from. MLflow's client sends a token as
# a bearer header, or a username and password as basic auth (its `basic-auth` server app).
CREDENTIALS = {"wandb": (("WANDB_API_KEY", "api-key"),),
               "mlflow": (("MLFLOW_TRACKING_TOKEN", "token"), ("MLFLOW_TRACKING_USERNAME", "username"),
                          ("MLFLOW_TRACKING_PASSWORD", "password"))}
RUN_TAG = "openforge.run_key"  # the MLflow tag (`run_key`) that finds a run's MLflow run again when its driver resumes


def missing_libraries(trackers: tuple[str, ...] | list[str]) -> list[str]:
    """The trackers whose library this Python cannot import (checked without importing it).

    >>> missing_libraries([])
    []
    """
    return [name for name in trackers if importlib.util.find_spec(name) is None]


def run_key(config: RunConfig) -> str:
    """The run's id in the trackers, the same for every driver of the run (its URL's hash: W&B ids and MLflow search
    filters take no quotes or slashes).

    >>> run_key(RunConfig(run="demo", store="s3://b/runs"))
    'c6e9ce1a82f8fc57'
    """
    return hashlib.sha256(config.run_url.encode()).hexdigest()[:16]


def metric_name(group: str, key: str) -> str:
    """A number's name in the trackers: its group, a slash, the report's name with anything but letters, digits and
    `_.-` made one underscore (every tracker accepts that).

    >>> metric_name("train", "harness killed: memory"), metric_name("behaviour/codex", "pass_rate")
    ('train/harness_killed_memory', 'behaviour/codex/pass_rate')
    """
    return f"{group}/{re.sub(r'[^A-Za-z0-9_.-]+', '_', key).strip('_')}"


def _numbers(group: str, values: dict) -> dict[str, float]:
    """The numeric values (not bools), named; a mapping of numbers (tool counts) one level down."""
    out = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out |= _numbers(metric_name(group, str(key)), value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[metric_name(group, str(key))] = float(value)
    return out


def iteration_numbers(run: "Run", n: int) -> dict[str, float]:
    """Iteration `n`'s numbers as the report has them: `train/...` (the iterations table and plots),
    `behaviour/<harness>/...` (the behaviour means) and `eval/...` (an evaluation at `n`, its overall numbers)."""
    from steps.analytics import summarize_behaviour
    from steps.report.index import summaries

    out = _numbers("train", summaries(run, n).get(n, {}))
    it = run.iterations.get(n)
    for means in summarize_behaviour(it.behaviour or [], ["harness"]) if it else []:
        out |= _numbers(f"behaviour/{means.pop('harness')}", means)
    return out | _numbers("eval", (run.evals.get(n) or {}).get("overall") or {})


def report_link(config: RunConfig) -> str:
    """Where the run's report opens: at `report_url_base` when set, else its URL or path in the store."""
    return layout.browsable_url(layout.report_index_url(config.run_url), config.store, config.report_url_base)


def config_params(config: dict) -> dict[str, str]:
    """The run's config as flat text values (what MLflow's params and TensorBoard's text take).

    >>> config_params({"iterations": 2, "trackers": ["wandb"], "run": "demo"})
    {'iterations': '2', 'trackers': '["wandb"]', 'run': 'demo'}
    """
    return {key: value if isinstance(value, str) else json.dumps(value) for key, value in config.items()}


class Tracker(Protocol):
    """One tracking library's side: the run's config and report link once, numbers per step, then close."""

    where: str  # where it logs, said when it starts (a URL, a folder; never a credential)

    def log_config(self, config: dict, report: str) -> None: ...

    def log(self, step: int, numbers: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def local_folder(url: str) -> tuple[str, str | None]:
    """A folder a library can write to for `url`: `url` itself when it is local, else a temporary folder whose
    files are copied to `url` (returned second) after each write."""
    if "://" not in url or url.startswith("file://"):
        path = url.removeprefix("file://")
        Path(path).mkdir(parents=True, exist_ok=True)
        return path, None
    return tempfile.mkdtemp(prefix="openforge-tracking-"), url


class WandbTracker:
    """A W&B run with an id fixed by the run's URL, so a resumed driver goes on logging into the same one."""

    def __init__(self, config: RunConfig):
        import wandb

        folder, _ = local_folder(layout.tracking_url(config.run_url))  # W&B keeps its own copy of what it sends
        self.run = wandb.init(project=config.tracker_project, name=config.run, dir=folder, resume="allow",
                              id=run_key(config),
                              settings=wandb.Settings(console="off", silent=True, x_disable_stats=True,
                                                      x_save_requirements=False))
        self.where = self.run.url or folder

    def log_config(self, config: dict, report: str) -> None:
        self.run.config.update(config, allow_val_change=True)
        self.run.summary["report"] = report

    def log(self, step: int, numbers: dict[str, float]) -> None:
        self.run.log(numbers, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """An MLflow run in the experiment `tracker_project` at `mlflow_tracking_uri`, tagged with `run_key` (found again
    by that tag when the driver resumes) and the run's URL. Its client alone: no process-wide active run."""

    def __init__(self, config: RunConfig):
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=config.mlflow_tracking_uri)
        experiment = self.client.get_experiment_by_name(config.tracker_project)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(config.tracker_project)
        found = self.client.search_runs([experiment_id], f"tags.`{RUN_TAG}` = '{run_key(config)}'", max_results=1)
        tags = {RUN_TAG: run_key(config), "openforge.run_url": config.run_url}
        self.run_id = found[0].info.run_id if found else \
            self.client.create_run(experiment_id, run_name=config.run, tags=tags).info.run_id
        self.where = f"{config.mlflow_tracking_uri} run {self.run_id}"

    def log_config(self, config: dict, report: str) -> None:
        from mlflow.entities import Param, RunTag

        known = self.client.get_run(self.run_id).data.params  # a param once logged cannot change (a resumed run's)
        params = [Param(k, v[:6000]) for k, v in config_params(config).items() if k not in known]
        self.client.log_batch(self.run_id, params=params, tags=[RunTag("report", report)])

    def log(self, step: int, numbers: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in numbers.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class TensorBoardTracker:
    """TensorBoard event files under `tensorboard_dir` (else the run's `tracking/tensorboard`), written with
    tensorboard's own writer (no torch, no TensorFlow); in an object store, copied there after every write."""

    def __init__(self, config: RunConfig):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        target = config.tensorboard_dir or layout.tensorboard_url(config.run_url)
        self.folder, self.remote = local_folder(target)
        self.writer = EventFileWriter(self.folder)
        self.where = target

    def _write(self, step: int, values: list) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        self.writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=values)))
        self.writer.flush()
        if self.remote:
            fs, path = fsspec.core.url_to_fs(self.remote)
            for file in Path(self.folder).iterdir():
                fs.put_file(str(file), f"{path.rstrip('/')}/{file.name}")

    def log_config(self, config: dict, report: str) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.types_pb2 import DT_STRING

        def text(tag: str, value: str) -> Summary.Value:
            return Summary.Value(tag=tag, tensor=TensorProto(dtype=DT_STRING, string_val=[value.encode()]),
                                 metadata=SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text")))

        table = "\n".join(f"    {k}: {v}" for k, v in sorted(config_params(config).items()))  # Markdown code block
        self._write(0, [text("config", table), text("report", report)])

    def log(self, step: int, numbers: dict[str, float]) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._write(step, [Summary.Value(tag=k, simple_value=v) for k, v in numbers.items()])

    def close(self) -> None:
        self.writer.close()


STARTERS: dict[str, Callable[[RunConfig], Tracker]] = {"wandb": WandbTracker, "mlflow": MlflowTracker,
                                                       "tensorboard": TensorBoardTracker}


def _why(exc: Exception) -> str:
    r"""An exception as the end of one line: its type and its message on one line, at most 300 characters.

    >>> _why(ValueError("no such\n  experiment"))
    'ValueError: no such experiment'
    """
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]


MAX_FAILURES = 3  # steps in a row a tracker failed to log before it is left out of the run


class Trackers:
    """The run's trackers that started. A tracker that fails to start, or to take the config, is said in one line
    and left out. One that fails to log a step (its server restarting, a network blip) is said in one line and
    tries again at the next step, logging the steps it missed first, in order, and at `close`; after
    `MAX_FAILURES` steps in a row it is left out. The run goes on either way."""

    def __init__(self, config: RunConfig, started: dict[str, Tracker], say: Callable[[str], None]):
        self.config, self.started, self.say = config, started, say
        self.missed: dict[str, list[tuple[int, bool]]] = {}  # by tracker: the steps it failed to log, in order

    @classmethod
    def start(cls, config: RunConfig, say: Callable[[str], None]) -> "Trackers":
        """Starts each of `config.trackers` and logs the run's config and report link into it."""
        trackers = cls(config, {}, say)
        for name in config.trackers:
            try:
                tracker = STARTERS[name](config)
            except Exception as exc:  # noqa: BLE001 - whatever the library raised, the run goes on without it
                say(f"tracking: {name} did not start, the run goes on without it: {_why(exc)}")
                continue
            trackers.started[name] = tracker
            say(f"tracking: {name} logs this run to {tracker.where}")
        trackers._each("log the config", lambda t: t.log_config(config.to_dict(), report_link(config)))
        return trackers

    def _each(self, what: str, call: Callable[[Tracker], None]) -> None:
        for name, tracker in list(self.started.items()):
            try:
                call(tracker)
            except Exception as exc:  # noqa: BLE001 - a tracker that broke is left out; the run goes on
                self.say(f"tracking: {name} could not {what} and is left out: {_why(exc)}")
                del self.started[name]

    def _read(self, what: str, n: int, evaluation: bool) -> dict[str, float] | None:
        """Step `n`'s numbers from the store, or None (said in one line) when they cannot be read."""
        from steps.report.data import load_run

        try:
            run = load_run(self.config.run_url, only=n)
        except Exception as exc:  # noqa: BLE001 - a store that did not answer costs this step's numbers, not the run
            self.say(f"tracking: {what} not logged, its numbers could not be read: {_why(exc)}")
            return None
        if evaluation:
            return _numbers("eval", (run.evals.get(n) or {}).get("overall") or {})
        return iteration_numbers(run, n)

    def _log(self, n: int | None, evaluation: bool = False) -> None:
        """Logs step `n` (None, at `close`: only the steps missed) into every tracker, each first catching up on the
        steps it missed; a tracker that fails keeps what it has not logged for the next time."""
        what = f"{'evaluation' if evaluation else 'iteration'} {n}"
        numbers = None if n is None else self._read(what, n, evaluation)
        if n is not None and numbers is None:
            return
        read: dict[tuple[int, bool], dict[str, float] | None] = {} if n is None else {(n, evaluation): numbers}
        for name, tracker in list(self.started.items()):
            missed = self.missed.get(name, [])
            due, done = [*missed, *([] if n is None else [(n, evaluation)])], 0
            try:
                for step in due:
                    if step not in read:  # a missed step's numbers, read again from the store
                        read[step] = self._read(f"step {step[0]}", *step)
                    if read[step] is not None:
                        tracker.log(step[0], read[step])
                    done += 1
            except Exception as exc:  # noqa: BLE001 - a tracker that broke costs its own steps, never the run
                left = due[done:]
                steps = ", ".join(str(step) for step, _ in left)
                if n is None or len(left) >= MAX_FAILURES:
                    self.say(f"tracking: {name} could not log step(s) {steps} and is left out: {_why(exc)}")
                    del self.started[name]
                    self.missed.pop(name, None)
                else:
                    self.missed[name] = left
                    self.say(f"tracking: {name} could not log {what}, tries again at the next step: {_why(exc)}")
                continue
            if self.missed.pop(name, None):
                self.say(f"tracking: {name} logs again; it caught up on step(s) "
                         f"{', '.join(str(step) for step, _ in missed)}")

    def log_iteration(self, n: int) -> None:
        """Logs iteration `n`'s numbers (and its evaluation's), read from the store, at step `n`."""
        self._log(n)

    def log_evaluation(self, n: int) -> None:
        """Logs the evaluation at `n` that ended no iteration (the final checkpoint's, an eval run's) at step `n`."""
        self._log(n, evaluation=True)

    def close(self) -> None:
        """Logs the steps any tracker missed, then ends every tracker's run (W&B and MLflow mark it finished;
        TensorBoard's file is closed)."""
        if self.missed:
            self._log(None)
        self._each("close", lambda t: t.close())
        self.started = {}

    def __enter__(self) -> "Trackers":
        return self

    def __exit__(self, *_) -> None:
        self.close()

