"""The embedded default: the same iteration DAG as local processes on one machine.

    python workflows/submit.py --harness direct            # no Argo server configured: runs here

Per iteration, the steps `workflows.shape` declares, executed in order by `shape.run` (`LocalSteps` says what
each does here), each one the command `workflows.commands` builds, the very line the Argo templates run, as a
subprocess: `plan`, `rollout` x N and `rollout-app` x M (at most `parallel_rollouts` at a time; on exit code 3 only,
attempt K runs as `ID-aK` in its own results folder, with the same sample number), `trajectories`, with an
`eval_every` evaluation's steps beside them (with `fill_batch`, more plans and rollouts before `trajectories` while
too few task groups earned more than one reward: `LocalSteps.fill`), then `update`; `serve` (vLLM on CPU + the recording proxy) runs once
for the whole run and the new weights are swapped into it through the proxy (`POST /weights/update`), where a
cluster starts a fresh serve pod. The run manifest is the cluster's, so `resume` works here too. After each
iteration and each evaluation, failed ones too, the run's report (`steps.report`) is written again and its path
printed; each iteration that succeeded is logged into the run's `trackers` (`steps.tracking`). The update runs on
`$OPENFORGE_TRAIN_PYTHON`, else `.venv-train/bin/python` (veRL lives in its own environment), else this Python.
With `max_staleness` S >= 1 each update runs in the background beside the next iteration's rollouts and is swapped
in when it ends (`run_overlapped`, held back by `shape.last_update_before`, docs/workflows.md).
"""

import ctypes
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

from steps import checkpoint, manifest
from steps.contracts.manifest import EvalRecord, IterationRecord
from steps.evaluate import cell, format_table
from steps.fetch_model import TOKEN_ENV
from steps.metrics import groups_with_signal, harness_killed_warning, harness_kills, iteration_metrics
from steps.net import free_port
from steps.plan import FANOUTS, attempt_id, read_chunk
from steps.proxy.client import ProxyClient, ProxyClientError
from steps.proxy.config import JUDGE_KEY_ENV
from steps.rollout import write_outputs, write_result
from steps.tasks import load_task
from steps.report import write_report
from steps.tracking import Trackers
from steps.contracts import layout
from steps.contracts.rollout import (AGENT_KILLED, AGENT_TIMEOUT, INFRA_ERROR, INFRA_EXIT_CODE, OK, PlannedRollout,
                                     RecordError, RolloutResult, harness_killed, read_plan, read_result)
from workflows import commands, shape
from steps.contracts.config import RunConfig

from workflows.config import REPO_ROOT, TINY_VISION_MODEL

UPSTREAM_KEY = "OPENFORGE_UPSTREAM_API_KEY"  # serve's alone (step_env), as is the judge's (JUDGE_KEY_ENV)
SERVE_ONLY = (UPSTREAM_KEY, JUDGE_KEY_ENV)
# torchrun's variables for a process group (torch.distributed.run; the update sets its own: `steps.update.train
# prepare_runtime`, or torchrun itself with update_gpus > 1)
LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
SERVE_START_TIMEOUT_S = 900
PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL("libc.so.6", use_errno=True)  # loaded here: a forked child of a threaded driver must not load it


def _die_with_driver() -> None:
    """In a child between fork and exec: SIGTERM when the thread that started it ends, even by SIGKILL,
    so nothing a run started outlives its driver."""
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class StepFailed(RuntimeError):
    """A step of the local run failed; the message names it and quotes its output."""


def say(message: str) -> None:
    """One progress line on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def train_python() -> str:
    """The Python that has veRL."""
    candidate = os.environ.get("OPENFORGE_TRAIN_PYTHON") or str(REPO_ROOT / ".venv-train" / "bin" / "python")
    return candidate if Path(candidate).exists() else sys.executable


def run_step(name: str, argv: list[str], env: dict, log: Path) -> str:
    """Runs one step to completion; returns its stdout; raises StepFailed with its log's tail. The step dies
    with the thread that waits for it (the driver's, or a background update's): nothing outlives a run."""
    with open(log, "w") as err:
        done = subprocess.run(argv, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=err, text=True,
                              preexec_fn=_die_with_driver)
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise StepFailed(f"step {name} failed with exit code {done.returncode}; {log}:\n{tail}")
    return done.stdout


def step_env(admin_key: str) -> dict:
    """The steps' environment: this one with the admin key, less the upstream's and the judge's keys, which only serve
    gets (`start_serve`), and the hub token, which only fetch-model gets (`fetch_base_model`): a rollout's harness,
    agent or verifier never sees them. Less a launcher's process-group variables too: a driver started inside one
    (or a process that made its own group) would hand its MASTER_PORT, taken already, to the update's ranks."""
    return {**{k: v for k, v in os.environ.items() if k not in (*SERVE_ONLY, TOKEN_ENV, *LAUNCHER_ENV)},
            "OPENFORGE_ADMIN_KEY": admin_key}


def start_serve(config: RunConfig, model_dir: str, version: int, env: dict, logs: Path) -> tuple[subprocess.Popen, str]:
    """Starts `steps.serve` (vLLM + proxy) and waits until the proxy answers /health."""
    port = free_port()
    argv = commands.serve(config, model_dir, layout.calls_url(config.run_url), version, port=port, python=sys.executable)
    argv += ["--log", str(logs / "vllm.log")]
    # SIGTERM to serve (which then stops vLLM) if this driver dies, even by SIGKILL: nothing outlives a run.
    key = {name: os.environ[name] for name in SERVE_ONLY if name in os.environ}
    process = subprocess.Popen(argv, env={**env, **key}, cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                               stdout=open(logs / "serve.log", "ab"), stderr=subprocess.STDOUT,
                               preexec_fn=_die_with_driver)
    url = f"http://127.0.0.1:{port}"
    proxy = ProxyClient(url, "", timeout_s=2, retries=0)
    deadline = time.monotonic() + SERVE_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StepFailed(f"step serve exited with code {process.returncode}; see {logs / 'serve.log'}")
        try:
            proxy.health()
            return process, url
        except ProxyClientError:
            time.sleep(1)
    process.terminate()
    raise StepFailed(f"step serve did not become ready within {SERVE_START_TIMEOUT_S} s; see {logs / 'vllm.log'}")


def swap_weights(proxy_url: str, admin_key: str, checkpoint: str, version: int) -> None:
    """Serves `checkpoint` from now on: the proxy holds calls, vLLM reloads in place, calls resume."""
    try:
        ProxyClient(proxy_url, admin_key).update_weights(str(Path(checkpoint).resolve()), str(version))
    except ProxyClientError as exc:
        raise StepFailed(f"the weight swap to {checkpoint} failed: {exc}") from None


def run_rollouts(config: RunConfig, iteration: int, planned: list[PlannedRollout], proxy_url: str, env: dict,
                 evaluation: bool = False) -> list[RolloutResult]:
    """Every planned rollout, `parallel_rollouts` at a time; an infra error gets further attempts, each under
    its own id and in its own folder (`attempt_id`), each with the plan's sample number. With `evaluation`,
    those of the evaluation of iteration `iteration`'s checkpoint, in its own results folder."""
    counts = {"done": 0, "failed": 0, "rewards": []}
    folder = layout.eval_rollout_url if evaluation else layout.rollout_url
    label = f"eval {iteration}" if evaluation else f"iteration {iteration}"

    def one(item: PlannedRollout) -> RolloutResult:
        for attempt in range(1, config.rollout_retries + 2):
            rollout_id = attempt_id(item.rollout_id, attempt)
            out = Path(folder(config.run_url, iteration, rollout_id))
            argv = commands.rollout(config, item.task, item.rollout_id, item.sample, proxy_url, str(out),
                                    python=sys.executable, attempt=attempt)
            returncode, stderr = run_rollout_step(argv, env, deadline_s(config, item), out, rollout_id, item,
                                                  config.harness)
            result = step_result(out, rollout_id, item, config.harness, stderr, returncode)
            if returncode != INFRA_EXIT_CODE:
                break
        counts["done"] += 1
        counts["failed"] += result.status == INFRA_ERROR
        if result.status != INFRA_ERROR:
            counts["rewards"].append(result.reward)
        mean = sum(counts["rewards"]) / len(counts["rewards"]) if counts["rewards"] else float("nan")
        say(f"{label}: rollouts {counts['done']}/{len(planned)} done, {counts['failed']} infra errors, "
            f"mean reward {mean:.3f}")
        return result

    with ThreadPoolExecutor(max_workers=config.parallel_rollouts) as pool:
        return list(pool.map(one, planned))


def planned_chunks(folder: str, fanout: str, printed: str, source: str) -> list[PlannedRollout]:
    """One fan-out's planned rollouts, read as Argo's DAG reads them: the plan step printed its chunks' numbers
    (`printed`), and each chunk is a list in the store (`steps.plan.read_chunk`)."""
    try:
        numbers = json.loads(printed)
    except ValueError as exc:
        raise RecordError(f"{source} is not a JSON list of chunk numbers ({exc})") from None
    return [rollout for number in numbers
            for rollout in read_plan(read_chunk(layout.plan_chunk_url(folder, fanout, number)), f"{source} {number}")]


def step_result(out: Path, rollout_id: str, item: PlannedRollout, harness: str, stderr: str,
                returncode: int = INFRA_EXIT_CODE) -> RolloutResult:
    """The rollout step's `OUT/result.json`; an infra error quoting its stderr's end where it wrote none (or one that
    is not a result). A step that died without one, not with the infra error's exit code, ended by the phase it was
    in, as a rollout pod (`steps.ends`): after its agent started, the agent's end (`agent_killed`, reward 0, written
    to OUT, not retried); before, an infra error."""
    try:
        return read_result(out / layout.RESULT_FILE)
    except RecordError as exc:
        why = stderr[-500:] if not (out / layout.RESULT_FILE).exists() else str(exc)
        result = RolloutResult(rollout_id=rollout_id, task=Path(item.task).name, harness=harness, status=INFRA_ERROR,
                               reward=None, sample=item.sample, error=why)
    phase = (out / layout.PHASE_FILE).read_text().strip() if (out / layout.PHASE_FILE).is_file() else "setup"
    if returncode != INFRA_EXIT_CODE and phase in ("agent", "calls", "grading"):
        result.status, result.reward = AGENT_KILLED, 0.0
        result.error = (f"the rollout step died (exit code {returncode}) without a result in its {phase} phase, after "
                        f"its agent started: the agent's end, scored 0; {why}")
        write_result(out, result)
        write_outputs(out, result)
    return result


def deadline_s(config: RunConfig, item: PlannedRollout) -> float:
    """Seconds one local rollout may take in all: the plan's deadline (the agent's and verifier's timeouts and a
    setup margin, as a rollout pod's), and here also the task's build timeout (its layer may be built first) and
    the graded copy's time."""
    return item.deadline_s + load_task(REPO_ROOT / item.task).config.build_timeout_s + config.graded_copy_s


def run_rollout_step(argv: list[str], env: dict, deadline: float, out: Path, rollout_id: str, item: PlannedRollout,
                     harness: str) -> tuple[int, str]:
    """Runs one rollout step; returns its exit code and stderr. Past its deadline it is killed (its sandbox dies
    with it: bubblewrap's --die-with-parent) and its result written here (`past_deadline`). It dies with the driver
    too: none writes into a restarted iteration."""
    try:
        done = subprocess.run(argv, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=deadline,
                              preexec_fn=_die_with_driver)
        return done.returncode, done.stderr
    except subprocess.TimeoutExpired:
        result = past_deadline(out, rollout_id, item, harness, deadline)
    say(f"rollout {rollout_id}: stopped at its deadline of {deadline:g} s ({result.status})")
    return (INFRA_EXIT_CODE if result.status == INFRA_ERROR else 0), result.error


def past_deadline(out: Path, rollout_id: str, item: PlannedRollout, harness: str, deadline: float) -> RolloutResult:
    """The result of a rollout stopped at its deadline, by the phase it was in (`OUT/phase`, which only the rollout
    step writes): its agent's or its grading's is the agent's doing (a harness outliving its timeout, graded files
    too slow to bring over): reward 0, never retried; any other phase (setup, reading the calls) is an infra error."""
    phase = (out / layout.PHASE_FILE).read_text().strip() if (out / layout.PHASE_FILE).is_file() else "setup"
    if phase == "done" and (out / layout.RESULT_FILE).is_file():  # stopped after writing it (whole: renamed in place)
        return read_result(out / layout.RESULT_FILE)
    why = f"the rollout was stopped at its deadline of {deadline:g} s, in its {phase} phase"
    result = RolloutResult(rollout_id=rollout_id, task=Path(item.task).name, harness=harness, status=INFRA_ERROR,
                           reward=None, sample=item.sample, error=why)
    if phase in ("agent", "grading"):
        result.status, result.reward = (AGENT_TIMEOUT if phase == "agent" else OK), 0.0
        result.killed = [{"process": "harness" if phase == "agent" else "verifier", "by": "time", "count": 1}]
    out.mkdir(parents=True, exist_ok=True)
    write_result(out, result)
    write_outputs(out, result)
    return result


def set_aside_earlier_results(config: RunConfig, iteration: int, attempt: int, evaluation: bool = False) -> None:
    """An iteration (or evaluation) started again after an earlier start died or failed: that start's results
    move to `iteration-N-attempt-K` (`results-attempt-K`; kept for inspection), so that only this start's
    results are collected. (A rollout whose id that start registered runs under the next attempt's id: see
    `steps.rollout.register`.)"""
    results_url, aside_url = ((layout.eval_results_url, layout.set_aside_eval_results_url) if evaluation
                              else (layout.results_url, layout.set_aside_results_url))
    results = Path(results_url(config.run_url, iteration))
    if attempt > 0 and results.exists():
        results.rename(aside_url(config.run_url, iteration, attempt - 1))


class LocalSteps:
    """What each step of `workflows.shape` does on this machine, for one iteration's Workflow (`evaluation_run`
    False: its training steps, and `eval-...` those of the evaluation of the checkpoint it serves) or one evaluation's
    (True: its steps evaluate). The serve step's server runs for the whole run (`start_serve`), so here it is only
    there, as are its address (a Service on a cluster) and the gate that waits for it; the isolation steps apply NetworkPolicies on a cluster, while here each rollout's bubblewrap sandbox has
    its own network namespace. Each rollout phase's [start, end] goes into `times`."""

    def __init__(self, config: RunConfig, iteration: int, proxy_url: str, env: dict, logs: Path,
                 attempts: dict[bool, int], times: dict, evaluation_run: bool = False):
        self.config, self.iteration, self.proxy_url, self.env, self.logs = config, iteration, proxy_url, env, logs
        self.attempts, self.times, self.evaluation_run = attempts, times, evaluation_run
        self.planned: dict[str, dict[str, list[PlannedRollout]]] = {}  # plan step -> its outputs (PLANNED, APP_ROLLOUTS)
        self.results: dict[str, list[RolloutResult]] = {}  # rollout step -> its rollouts' results
        self.summary: dict | None = None
        self.filled: list[RolloutResult] = []  # the fill rounds' results (`fill_batch`)

    def actions(self) -> dict[str, Callable[[shape.Step], shape.Outcome]]:
        """The action of every step name the shapes use."""
        actions = dict.fromkeys(("serve", shape.SERVE_ADDRESS, shape.SERVE_READY, *shape.ISOLATION_STEPS), self.there)
        for prefix in ("", "eval-"):
            evaluation = self.evaluation_run or bool(prefix)
            actions[f"{prefix}plan"] = lambda step, evaluation=evaluation: self.plan(step, evaluation)
            for name in shape.ROLLOUT_STEPS:
                actions[f"{prefix}{name}"] = lambda step, evaluation=evaluation: self.rollouts(step, evaluation)
            actions[f"{prefix}trajectories"] = lambda step, evaluation=evaluation: self.trajectories(step, evaluation)
        actions["evaluate"] = self.evaluate
        return actions

    def there(self, step: shape.Step) -> shape.Outcome:
        """A step with nothing to do here."""
        return shape.Outcome(shape.SUCCEEDED)

    def label(self, evaluation: bool) -> str:
        return f"eval {self.iteration}" if evaluation else f"iteration {self.iteration}"

    def plan(self, step: shape.Step, evaluation: bool) -> shape.Outcome:
        """The plan step; its rollouts of tasks with an app in their own list, as on Argo. An earlier start's results
        are set aside first."""
        name = "eval-plan" if evaluation else "plan"
        app_file = self.logs / f"{name}-{self.iteration}-{shape.APP_ROLLOUTS}.json"
        argv = commands.plan(self.config, self.iteration, python=sys.executable, evaluation=evaluation,
                             app_rollouts=str(app_file), chunks=True)
        if not evaluation:
            self.times["rollouts"] = [time.time()]
        chunks = run_step(name, argv, self.env, self.logs / f"{name}-{self.iteration}.log")
        # none written: none planned
        app_chunks = app_file.read_text() if app_file.is_file() else "[]"
        folder = commands.plan_folder(self.config, self.iteration, evaluation)
        self.planned[step.name] = {fanout: planned_chunks(folder, kind, printed, f"the {name} step's {kind}")
                                   for fanout, kind, printed in ((shape.PLANNED, FANOUTS[0], chunks),
                                                                 (shape.APP_ROLLOUTS, FANOUTS[1], app_chunks))}
        set_aside_earlier_results(self.config, self.iteration, self.attempts[evaluation], evaluation=evaluation)
        count = sum(map(len, self.planned[step.name].values()))
        each = f" ({self.config.eval_k} per task)" if evaluation else ""
        say(f"{self.label(evaluation)}: {count} rollouts planned{each} with harness {self.config.harness}")
        return shape.Outcome(shape.SUCCEEDED)

    def rollouts(self, step: shape.Step, evaluation: bool) -> shape.Outcome:
        """A rollout fan-out: Skipped when its plan output is empty; Failed when one of its rollouts is an
        infra_error after its retries, as the fan-out's node on Argo."""
        planned = self.planned[step.plan][step.fanout]
        if not planned:
            return shape.Outcome(shape.SKIPPED)
        self.results[step.name] = results = run_rollouts(self.config, self.iteration, planned, self.proxy_url,
                                                         self.env, evaluation=evaluation)
        if not evaluation:
            self.times["rollouts"] = [self.times["rollouts"][0], time.time()]
        succeeded = [result for result in results if result.status != INFRA_ERROR]
        return shape.Outcome(shape.SUCCEEDED if len(succeeded) == len(results) else shape.FAILED,
                             any_succeeded=bool(succeeded))

    def trajectories(self, step: shape.Step, evaluation: bool) -> shape.Outcome:
        """The trajectories step, into the iteration's (or the evaluation's) tables."""
        started = time.time()
        if evaluation:
            say(f"{self.label(evaluation)}: writing trajectories")
            argv = commands.trajectories(self.config, self.proxy_url,
                                         layout.eval_results_url(self.config.run_url, self.iteration), self.iteration,
                                         python=sys.executable,
                                         out=layout.eval_trajectories_url(self.config.run_url, self.iteration))
            run_step("eval-trajectories", argv, self.env, self.logs / f"eval-trajectories-{self.iteration}.log")
            return shape.Outcome(shape.SUCCEEDED)
        if self.config.fill_batch:
            self.fill()
            if "rollouts" in self.times:  # the fill rounds' rollouts are the iteration's rollouts
                self.times["rollouts"] = [self.times["rollouts"][0], time.time()]
        say(f"iteration {self.iteration}: writing trajectories")
        argv = commands.trajectories(self.config, self.proxy_url,
                                     layout.results_url(self.config.run_url, self.iteration), self.iteration,
                                     python=sys.executable)
        run_step("trajectories", argv, self.env, self.logs / f"trajectories-{self.iteration}.log")
        self.times["trajectories"] = [self.times.get("rollouts", [started])[-1], time.time()]
        return shape.Outcome(shape.SUCCEEDED)

    def fill(self) -> None:
        """`fill_batch` (DAPO's dynamic sampling): while fewer than `tasks_per_iteration` task groups earned more
        than one reward, plans that many more tasks than ran already (the plan step with `--exclude`, printed) and
        rolls them out into the iteration's results, at most `max_fill_rounds` times; stops early when the dataset
        has no task left."""
        for number in range(1, self.config.max_fill_rounds + 1):
            by_task: dict[str, list] = {}
            for result in self.training_results():
                by_task.setdefault(result.task, []).append(result.reward if result.status != INFRA_ERROR else None)
            need = self.config.tasks_per_iteration - groups_with_signal(by_task)
            if need <= 0:
                return
            name = f"plan-fill-{number}"
            argv = commands.plan(self.config, self.iteration, python=sys.executable, tasks=need,
                                 exclude=sorted(by_task))
            printed = run_step(name, argv, self.env, self.logs / f"{name}-{self.iteration}.log")
            planned = read_plan(printed, f"the {name} step's rollouts")
            if not planned:
                say(f"iteration {self.iteration}: fill round {number}: no task left to plan")
                return
            say(f"iteration {self.iteration}: fill round {number}: {need} group(s) short of "
                f"{self.config.tasks_per_iteration} with signal; {len(planned)} more rollouts")
            self.filled += run_rollouts(self.config, self.iteration, planned, self.proxy_url, self.env)

    def evaluate(self, step: shape.Step) -> shape.Outcome:
        """The evaluate step: the evaluation's summary.json, kept in `summary`."""
        argv = commands.evaluate(self.config, self.iteration, python=sys.executable)
        self.summary = json.loads(run_step("evaluate", argv, self.env, self.logs / f"evaluate-{self.iteration}.log"))
        return shape.Outcome(shape.SUCCEEDED)

    def training_results(self) -> list[RolloutResult]:
        """The training rollouts' results, both fan-outs and the fill rounds'."""
        return [result for name in shape.ROLLOUT_STEPS for result in self.results.get(name, [])] + self.filled


def run_dag(steps: list[shape.Step], actions: dict) -> dict[str, shape.Outcome]:
    """`shape.run` here: a DAG that fails raises StepFailed, as a step does."""
    try:
        return shape.run(steps, actions)
    except shape.DagFailed as exc:
        raise StepFailed(str(exc)) from None


def start_evaluation(config: RunConfig, iteration: int) -> EvalRecord | None:
    """The evaluation of iteration `iteration`'s checkpoint recorded Running (`eval-N.json`), or None when the
    manifest has seen it succeed (it is not run again)."""
    earlier = manifest.read_evals(config.run_url).get(iteration)
    if earlier and earlier.status == "Succeeded":
        return None
    entry = EvalRecord(iteration, "local", config.evaluated(iteration)[0], "Running",
                                summary=layout.eval_summary_url(config.run_url, iteration),
                                attempt=0 if earlier is None else earlier.attempt + 1)
    manifest.record_eval(config.run_url, entry)
    return entry


def end_evaluation(config: RunConfig, entry: EvalRecord, summary: dict | None) -> None:
    """The evaluation's record: Succeeded with its overall numbers, said in one line, or Failed without a summary."""
    if summary is None:
        entry.status = "Failed"
        manifest.record_eval(config.run_url, entry)
        return
    succeeded = manifest.eval_record(entry.iteration, "local", entry.checkpoint, "Succeeded", entry.summary)
    succeeded.attempt = entry.attempt
    manifest.record_eval(config.run_url, succeeded)
    overall = summary["overall"]
    say(f"eval {entry.iteration}: {overall['tries']} tries, {overall['missing']} missing, {overall['infra_errors']} "
        f"infra errors, pass@1 {cell(overall['pass_at_1'])}, pass@{config.eval_k} {cell(overall['pass_at_k'])}, "
        f"pass^{config.eval_k} {cell(overall['pass_hat_k'])}; {entry.summary}")


def run_evaluation(config: RunConfig, iteration: int, proxy_url: str, env: dict, logs: Path) -> dict:
    """An evaluation's Workflow here (`shape.evaluation`: its collect, then evaluate), of the checkpoint being
    served (iteration `iteration`'s), in its folder; recorded in the manifest (`eval-N.json`). Returns its summary;
    one that already succeeded is not run again."""
    entry = start_evaluation(config, iteration)
    if entry is None:
        return manifest.read_json(layout.eval_summary_url(config.run_url, iteration))
    steps = LocalSteps(config, iteration, proxy_url, env, logs, {True: entry.attempt}, {}, evaluation_run=True)

    def collect(step: shape.Step) -> shape.Outcome:
        run_dag(shape.collect(config, False), steps.actions())
        return shape.Outcome(shape.SUCCEEDED)

    try:
        # A hub model was fetched before serve started on it (`base_model`): here its step has nothing left to do.
        fetched = {shape.FETCH_MODEL: lambda step: shape.Outcome(shape.SUCCEEDED)}
        run_dag(shape.evaluation(config, iteration), {**steps.actions(), "collect": collect, **fetched})
    except (StepFailed, OSError):
        end_evaluation(config, entry, None)
        raise
    end_evaluation(config, entry, steps.summary)
    if steps.summary is None:
        raise StepFailed(f"eval {iteration}: its evaluate step did not run")
    return steps.summary


def collect_iteration(config: RunConfig, iteration: int, proxy_url: str, env: dict, logs: Path, attempt: int,
                      times: dict) -> list[RolloutResult]:
    """The iteration's collect DAG here (`shape.collect`): plan, rollouts, trajectories, and where it is due the
    evaluation of the checkpoint it serves beside them (a failed one is recorded Failed, said, and does not stop
    the training; the run's report is written again once it ended); returns the rollouts' results, each phase's [start, end] into `times`."""
    evaluation = start_evaluation(config, iteration) if config.evaluates_at(iteration) else None
    steps = LocalSteps(config, iteration, proxy_url, env, logs,
                       {False: attempt, True: evaluation.attempt if evaluation else 0}, times)
    outcomes = run_dag(shape.collect(config, evaluation is not None), steps.actions())
    if evaluation is not None:
        end_evaluation(config, evaluation, steps.summary)
        if steps.summary is None:
            failed = [name for name, outcome in outcomes.items() if outcome.end == shape.FAILED and "eval" in name]
            print(f"warning: eval {iteration} failed ({', '.join(failed) or 'its rollouts'}); the training goes on",
                  file=sys.stderr)
        refresh_report(config.run_url)  # after every evaluation, as after every iteration
    if outcomes["trajectories"].end != shape.SUCCEEDED:
        raise StepFailed(f"iteration {iteration}: no rollout succeeded (every one an infra error after its retries), "
                         f"so there are no trajectories to train on; see {layout.results_url(config.run_url, iteration)}")
    return steps.training_results()


def update_iteration(config: RunConfig, iteration: int, proxy_url: str, admin_key: str, env: dict, logs: Path,
                     times: dict) -> str:
    """update, then the weight swap unless nothing will serve the new weights; returns the checkpoint it wrote,
    each phase's [start, end] into `times`."""
    say(f"iteration {iteration}: veRL update")
    started = time.time()
    checkpoint, next_checkpoint = config.checkpoint_url(iteration), config.checkpoint_url(iteration + 1)
    run_step("update", commands.update(config, layout.run_partition_url(config.run_url, config.run, iteration), checkpoint, next_checkpoint,
                                       python=train_python()), env, logs / f"update-{iteration}.log")
    times["update"] = [started, time.time()]
    if skipped := (manifest.read_metrics(next_checkpoint) or {}).get("skipped"):
        say(f"iteration {iteration}: update skipped ({skipped}: every task's rollouts earned the same reward); "
            "the next iteration serves the same weights")
    # Nothing serves the last update's weights but a final evaluation: without one, the swap (a vLLM restart for a
    # MoE model on CPU) would be thrown away with the serve process.
    if iteration + 1 < config.iterations or config.evaluates_at(config.iterations):
        swap_weights(proxy_url, admin_key, next_checkpoint, iteration + 1)
        times["reload"] = [times["update"][1], time.time()]
    return next_checkpoint


def run_iteration(config: RunConfig, iteration: int, proxy_url: str, admin_key: str, env: dict, logs: Path,
                  attempt: int = 0) -> dict:
    """plan, rollouts, trajectories, update, weight swap, one after the other; returns the iteration's summary."""
    times: dict = {}
    results = collect_iteration(config, iteration, proxy_url, env, logs, attempt, times)
    next_checkpoint = update_iteration(config, iteration, proxy_url, admin_key, env, logs, times)
    return summarize(iteration, results, next_checkpoint, times, manifest.read_staleness(config.run_url, iteration))


def summarize(iteration: int, results: list[RolloutResult], next_checkpoint: str, times: dict,
              staleness: dict | None = None) -> dict:
    """The iteration's line in the run summary: rewards, pass rates, infra errors, the rollouts whose harness a limit
    killed (`harness_killed`, by limit; said in one line when more than a few percent), the update's metrics, the
    staleness of what it trained, each phase's seconds (`timings_s`) and [start, end] (`phase_times`)."""
    by_task: dict[str, list] = {}
    for result in results:
        by_task.setdefault(result.task, []).append(result.reward if result.status != INFRA_ERROR else None)
    k, overall = iteration_metrics(by_task)
    killed = harness_kills(harness_killed(result) for result in results)
    if warning := harness_killed_warning(killed, len(results), f"iteration {iteration}"):
        say(warning)
    return {"iteration": iteration, "rollouts": len(results),
            "infra_errors": sum(r.status == INFRA_ERROR for r in results), "harness_killed": killed,
            "k": k, "metrics": asdict(overall),
            "update": manifest.read_metrics(next_checkpoint), "staleness": staleness,
            "timings_s": {f"{phase}_s": round(end - start, 1) for phase, (start, end) in times.items()},
            "phase_times": {phase: [round(t, 3) for t in span] for phase, span in times.items()},
            "checkpoint": next_checkpoint}


def refresh_report(run_url: str) -> None:
    """Rewrites the run's report (`steps.report`) and says where it is; a report that fails is said in one
    line and never fails the run."""
    try:
        say(f"report: {write_report(run_url)}")
    except Exception as exc:  # noqa: BLE001 - whatever broke the report, the run goes on
        say(f"report not written: {type(exc).__name__}: {exc}")


def base_model(config: RunConfig) -> str:
    """The base checkpoint: a hub model fetched into the run's store (once: `fetch_base_model`); built here (the
    tiny model, or with `TINY_VISION_MODEL` the tiny vision model; no download) when that default folder is missing."""
    if shape.fetches_model(config, 0):
        return fetch_base_model(config)
    path = Path(config.model)
    if not path.exists():
        vision = path == REPO_ROOT / TINY_VISION_MODEL
        if path != REPO_ROOT / RunConfig.model and not vision:
            raise StepFailed(f"model {config.model!r} does not exist; give a local checkpoint folder")
        from steps.tiny_model import build_tiny_model

        say(f"building the tiny {'vision ' if vision else ''}model in {path} (no download)")
        build_tiny_model(path, vision="qwen2_5_vl" if vision else "")
    return str(path)


def fetch_base_model(config: RunConfig) -> str:
    """The hub model's copy in the run (`layout.base_model_url`), fetched by the same step as on Argo
    (`steps.fetch_model`: skipped when the run holds it already), with this machine's `HF_TOKEN` if set."""
    say(f"fetching {config.model} into {layout.base_model_url(config.run_url)} (once per run)")
    logs = Path(layout.logs_url(config.run_url))
    run_step(shape.FETCH_MODEL, commands.fetch_model(config, python=sys.executable), dict(os.environ),
             logs / f"{shape.FETCH_MODEL}.log")
    return config.checkpoint_url(0)


def absolute(config: RunConfig) -> RunConfig:
    """Paths made absolute (steps run from the repository root): the store from here, the model and the
    datasets from here when they exist here, else from the repository root."""
    def resolve(value: str) -> str:
        path = Path(value)
        return value if path.is_absolute() else str(path.resolve() if path.exists() else REPO_ROOT / path)

    model = config.model if config.model.startswith(layout.HUB_SCHEME) else resolve(config.model)
    return replace(config, store=str(Path(config.store).resolve()), model=model,
                   dataset=resolve(config.dataset), eval_dataset=config.eval_dataset and resolve(config.eval_dataset))


def local_store_problem(config: RunConfig) -> str | None:
    """Why this config cannot run here (an s3:// store, a dataset kept elsewhere, an update across nodes), or None."""
    if "://" in config.store:
        return ("the local runner keeps results and checkpoints on this machine: use a local `store` folder "
                "(the cluster workflows take s3:// stores)")
    for key in ("dataset", "eval_dataset"):
        if "://" in getattr(config, key):
            return (f"config key {key!r} is {getattr(config, key)!r}, but the local runner reads its tasks in place: "
                    f"give a folder or list file on this machine (s3:// and harbor:// datasets are for Argo runs)")
    if config.update_nodes > 1:
        return (f"config key 'update_nodes' is {config.update_nodes}, but the local runner runs the update on this "
                f"one machine: set update_nodes: 1 (update_gpus processes run here), or run on Argo")
    return None


def open_run(config: RunConfig, evaluates: dict | None = None) -> tuple[RunConfig, Path] | None:
    """The config with absolute paths and the run's logs folder, its config recorded when new (an eval run's
    with what it evaluates); None, said in one line, when it cannot run here."""
    if problem := local_store_problem(config):
        print(f"error: {problem}", file=sys.stderr)
        return None
    config = absolute(config)
    logs = Path(layout.logs_url(config.run_url))
    logs.mkdir(parents=True, exist_ok=True)
    if manifest.read_run_config(config.run_url) is None:
        manifest.write_run_config(config.run_url, config.to_dict(), evaluates=evaluates)
    return config, logs


class Updates:
    """The updates that run beside the next iterations' rollouts (`max_staleness` >= 1): one at a time, in
    iteration order, each on the checkpoint the one before it wrote; one whose predecessor failed does not run
    (its base is unknown)."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="update")
        self.started: dict[int, Future] = {}

    def start(self, iteration: int, job, skipped=None) -> None:
        """Queues `job`, the update of `iteration`, behind the one before it; `skipped(reason)` is called instead
        of it when that one failed (so the iteration is recorded Failed by its own update, not by another's)."""
        previous = self.started.get(iteration - 1)

        def after_previous():
            if previous is not None and previous.exception() is not None:
                reason = StepFailed(f"update {iteration} not started: the update of iteration {iteration - 1} failed")
                if skipped is not None:
                    skipped(reason)
                raise reason
            return job()

        self.started[iteration] = self.pool.submit(after_previous)

    def wait(self, through: int) -> None:
        """Blocks until the updates of iterations up to `through` are done; raises StepFailed if one failed."""
        for iteration, update in sorted(self.started.items()):
            if iteration <= through and update.exception() is not None:
                raise StepFailed(f"the update of iteration {iteration} failed: {update.exception()}")

    def check(self) -> None:
        """Raises StepFailed if an update that is done failed."""
        self.wait(max((i for i, update in self.started.items() if update.done()), default=-1))

    def close(self) -> None:
        """Waits for the updates still running: a run never stops its update half way."""
        self.pool.shutdown(wait=True)


def finish(config: RunConfig, entry: IterationRecord, summary: dict, trackers: Trackers | None = None) -> None:
    """Records an iteration's success in the manifest, with its update's metrics, staleness and timings, prints its
    summary line and logs its numbers into the run's `trackers`."""
    entry.status, entry.metrics, entry.timings_s = "Succeeded", summary["update"], summary["timings_s"]
    entry.staleness, entry.phase_times = summary["staleness"], summary["phase_times"]
    entry.curriculum = manifest.read_curriculum(config.run_url, entry.iteration)
    entry.eval = summary["eval"] = manifest.eval_numbers(layout.eval_summary_url(config.run_url, entry.iteration)) \
        if config.evaluates_at(entry.iteration) else None
    manifest.record(config.run_url, entry)
    print(json.dumps(summary), flush=True)
    if trackers:
        trackers.log_iteration(entry.iteration)
    checkpoint.retire(config, entry.iteration + 1, manifest.read_evals(config.run_url), say)


def record_failure(config: RunConfig, entry: IterationRecord, exc: Exception) -> None:
    """Records an iteration Failed, with the reason."""
    entry.status, entry.reason = "Failed", str(exc)
    manifest.record(config.run_url, entry)


def failed(config: RunConfig, entry: IterationRecord, exc: Exception) -> int:
    """Records an iteration's failure, says it, reports what its rollouts did; exit code 1."""
    record_failure(config, entry, exc)
    print(f"error: iteration {entry.iteration}: {exc}", file=sys.stderr)
    refresh_report(config.run_url)
    return 1


def stopped(config: RunConfig, exc: Exception) -> int:
    """Says why the run stopped before an iteration started (an earlier update failed, and recorded that
    itself); exit code 1."""
    print(f"error: {exc}", file=sys.stderr)
    refresh_report(config.run_url)
    return 1


def start_entry(config: RunConfig, iteration: int, earlier: IterationRecord | None) -> IterationRecord:
    """The iteration's record as it starts (attempt K+1 after K earlier starts), written."""
    entry = IterationRecord(iteration, "local", config.checkpoint_url(iteration),
                                     config.checkpoint_url(iteration + 1), "Running",
                                     attempt=0 if earlier is None else earlier.attempt + 1)
    manifest.record(config.run_url, entry)
    return entry


def run_synchronous(config: RunConfig, first: int, recorded: dict, proxy_url: str, admin_key: str, env: dict,
                    logs: Path, trackers: Trackers | None = None) -> int:
    """`max_staleness` 0: each iteration's rollouts, then its update, then the next iteration's."""
    for iteration in range(first, config.iterations):
        entry = start_entry(config, iteration, recorded.get(iteration))
        try:
            summary = run_iteration(config, iteration, proxy_url, admin_key, env, logs, entry.attempt)
        except (StepFailed, OSError) as exc:
            return failed(config, entry, exc)  # a failed iteration is reported too: what its rollouts did
        finish(config, entry, summary, trackers)
        refresh_report(config.run_url)
    return 0


def run_overlapped(config: RunConfig, first: int, recorded: dict, proxy_url: str, admin_key: str, env: dict,
                   logs: Path, trackers: Trackers | None = None) -> int:
    """`max_staleness` S >= 1: iteration n+1's rollouts start once iteration n's trajectories are written,
    served by the newest weights there are, while update n runs beside them and is swapped in when done;
    iteration n+S+1's rollouts wait for update n (never more than S versions ahead of what is trained)."""
    updates = Updates()
    try:
        for iteration in range(first, config.iterations):
            times: dict = {}
            try:  # before the iteration starts: one that only waited for a failed update ran nothing
                waited = time.time()
                updates.wait(shape.last_update_before(config, iteration))
                updates.check()
            except StepFailed as exc:
                return stopped(config, exc)
            times["waited"] = [waited, time.time()]
            entry = start_entry(config, iteration, recorded.get(iteration))
            try:
                results = collect_iteration(config, iteration, proxy_url, env, logs, entry.attempt, times)
            except (StepFailed, OSError) as exc:
                return failed(config, entry, exc)
            try:  # its rollouts ran, but its update cannot: its base is one a failed update never wrote
                updates.check()
            except StepFailed as exc:
                return failed(config, entry, StepFailed(f"its update will not run: {exc}"))

            def update(iteration=iteration, entry=entry, times=times, results=results) -> None:
                try:
                    next_checkpoint = update_iteration(config, iteration, proxy_url, admin_key, env, logs, times)
                except (StepFailed, OSError) as exc:
                    record_failure(config, entry, exc)  # said, and reported, by the driver's thread (`Updates.wait`)
                    raise
                staleness = manifest.read_staleness(config.run_url, iteration)
                finish(config, entry, summarize(iteration, results, next_checkpoint, times, staleness), trackers)

            updates.start(iteration, update, skipped=lambda reason, entry=entry: record_failure(config, entry, reason))
            say(f"iteration {iteration}: its update runs in the background"
                + (f", beside iteration {iteration + 1}'s rollouts" if iteration + 1 < config.iterations else ""))
            refresh_report(config.run_url)
        updates.wait(config.iterations)
    except StepFailed as exc:  # the last updates' (each recorded its own failure, or why it did not run)
        updates.close()
        return stopped(config, exc)
    finally:
        updates.close()
    refresh_report(config.run_url)
    return 0


def run_local(config: RunConfig) -> int:
    """Runs (or resumes) the whole run on this machine; prints one JSON summary line per iteration (and one for
    the final checkpoint's evaluation with `eval_every`)."""
    if (opened := open_run(config.with_run_name())) is None:
        return 2
    config, logs = opened
    recorded = manifest.read_iterations(config.run_url)
    done = {i for i, entry in recorded.items() if entry.status == "Succeeded"}
    first = min(set(range(config.iterations)) - done, default=config.iterations)
    final = manifest.read_evals(config.run_url).get(config.iterations)
    final_due = config.evaluates_at(config.iterations) and not (final and final.status == "Succeeded")
    if first == config.iterations and not final_due:
        say(f"run {config.run}: all {config.iterations} iterations are done")
        return 0
    admin_key = secrets.token_urlsafe(24)
    env = step_env(admin_key)
    try:
        model = base_model(config) if first == 0 else config.checkpoint_url(first)
    except StepFailed as exc:  # the model could not be fetched or built: one sentence and its log, no traceback
        print(f"error: run {config.run}: {exc}", file=sys.stderr)
        return 1
    with Trackers.start(config, say) as trackers:  # before vLLM: a tracker that cannot start is said at once
        say(f"run {config.run}: starting vLLM on CPU and the proxy (iteration {first}, {model})")
        try:
            serve, proxy_url = start_serve(config, model, first, env, logs)
        except StepFailed as exc:
            print(f"error: run {config.run}: {exc}", file=sys.stderr)
            return 1
        loop = run_overlapped if config.max_staleness else run_synchronous
        try:
            if code := loop(config, first, recorded, proxy_url, admin_key, env, logs, trackers):
                return code
            if final_due:  # the checkpoint the last update wrote, swapped in already
                try:
                    run_evaluation(config, config.iterations, proxy_url, env, logs)
                except (StepFailed, OSError) as exc:
                    print(f"error: the evaluation of the final checkpoint: {exc}", file=sys.stderr)
                    refresh_report(config.run_url)
                    return 1
                print(json.dumps({"eval": config.iterations, "checkpoint": config.checkpoint_url(config.iterations),
                                  **manifest.eval_numbers(layout.eval_summary_url(config.run_url, config.iterations))}),
                      flush=True)
                trackers.log_evaluation(config.iterations)
                refresh_report(config.run_url)
        finally:
            serve.terminate()
            serve.wait(60)
    say(f"run {config.run} done: {config.iterations} iterations; everything is under {config.run_url}")
    return 0


def run_local_eval(config: RunConfig, evaluates: dict) -> int:
    """Runs (or resumes) an eval run on this machine: serve once, its one evaluation (`run_evaluation`);
    prints the table and the summary as one JSON line on stdout."""
    if (opened := open_run(config, evaluates)) is None:
        return 2
    config, logs = opened
    recorded = manifest.read_evals(config.run_url).get(0)
    if recorded and recorded.status == "Succeeded":
        summary = manifest.read_json(layout.eval_summary_url(config.run_url, 0))
    else:
        env = step_env(secrets.token_urlsafe(24))
        model = config.model if config.upstream else base_model(config)
        say(f"eval {config.run}: starting the proxy in front of {config.upstream or f'vLLM on CPU ({model})'}")
        with Trackers.start(config, say) as trackers:
            serve, proxy_url = start_serve(config, model, 0, env, logs)
            try:
                summary = run_evaluation(config, 0, proxy_url, env, logs)
                trackers.log_evaluation(0)
            except (StepFailed, OSError) as exc:
                print(f"error: eval {config.run}: {exc}", file=sys.stderr)
                refresh_report(config.run_url)
                return 1
            finally:
                serve.terminate()
                serve.wait(60)
        refresh_report(config.run_url)
    print(format_table(summary))
    print(json.dumps(summary), flush=True)
    return 0
