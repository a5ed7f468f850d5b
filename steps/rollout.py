"""One rollout: a harness works one task with its model calls going through the recording proxy, then
the task's verifier grades what it left behind.

    OPENFORGE_ADMIN_KEY=... python -m steps.rollout --task steps/tasks/builtin/hello-file \
        --harness codex --proxy-url http://127.0.0.1:8100 --rollout-id it0-hello-file-s0 --sample 0 --out runs/r0

Steps: register the rollout with the proxy, its task and plan's sample number as metadata (the harness
gets that rollout's key, never the admin key; attempt K of a rollout runs as `ID-aK`, and a rerun step
whose failed attempt holds its id takes the next free one: `steps.plan.attempt_id`);
build a fresh sandbox from the task's environment; run the harness headless on the instruction under
the task's agent timeout; close the rollout; copy `tests/` in (the agent never saw it) and run the
verifier; write `OUT/result.json`, which names the id the rollout ran under and its sample, and beside it
its status and reward as one-word files `OUT/status`, `OUT/reward` ("none" without one: the Argo node's
output parameters; written by the runner after the agent stopped, in a folder the agent cannot write). Exit code 0
for `ok` and `agent_timeout`, 3 for `infra_error` (the workflow retries only those; an infrastructure
failure is never scored as a reward of 0).

With `--send-result`, the runner also hands `result.json` to the proxy, which writes it to the store (a rollout pod
holds no store credentials and reaches nothing but the proxy and the Kubernetes API: docs/workflows.md, "Network
isolation"); a result the proxy does not take makes the rollout an infra_error.

`--isolation pod` is for a Kubernetes rollout pod, which already runs the task's image: no bubblewrap and
no Dockerfile replay, the workspace is the pod's working folder (the image's WORKDIR), the harness runs
as an unprivileged uid (`--agent-uid`, when the runner is root) and the task folder must be root-only
(`steps/sandbox/pod.py`). Run it with `python -P` (or PYTHONSAFEPATH=1) so the workspace is not on the runner's
import path.
"""

import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from steps.harnesses import ALL_HARNESSES as HARNESSES, Endpoint, InstallError, allowance, default_prefix
from steps.harnesses.base import SYSTEM_PATH
from steps.plan import attempt_id
from steps.proxy.client import ProxyClient, ProxyClientError
from steps.sandbox.common import MIB, Bounds, copy_logs
from steps.sandbox.limits import Budget
from steps.sandbox.pod import AGENT_UID
from steps.sandbox import ISOLATIONS, HarnessSetup, Sandbox, SandboxError, open_sandbox, prepare_runner
from steps.tasks import Task, TaskError, load_task
from steps.grading.verify import run_verifier
from steps.contracts.calls import CallRecord
from steps.contracts.layout import PHASE_FILE, RESULT_FILE, REWARD_FILE, STATUS_FILE  # in OUT: the step's output
from steps.contracts.rollout import AGENT_TIMEOUT, INFRA_ERROR, INFRA_EXIT_CODE, NO_REWARD, OK, RolloutResult

MAX_ATTEMPTS = 20  # ids a rollout tries when earlier attempts of its step registered theirs
# What a verifier that asks the judge finds in its environment: the judge route's OpenAI base URL, its key (this
# rollout's grading only) and the judge model's name (`judged`).
JUDGE_ENV = {"url": "OPENFORGE_JUDGE_URL", "key": "OPENFORGE_JUDGE_KEY", "model": "OPENFORGE_JUDGE_MODEL"}


class InfraError(Exception):
    """Something other than the agent failed; the rollout is retried, never scored."""


@dataclass
class RolloutSpec:
    """What one rollout runs: the step's inputs."""

    task: Path
    harness: str
    proxy_url: str
    rollout_id: str  # the plan's; attempt K runs as `attempt_id(rollout_id, K)`
    out: Path
    model_name: str = "tiny"  # the served model's name, which the harness asks for
    sample: int | None = None  # the plan's sample number: which member of its task's group this rollout is
    attempt: int = 1
    admin_key: str = field(default="", repr=False)
    agent_timeout_s: float | None = None  # None: the task's own [agent] timeout_sec
    metadata: dict = field(default_factory=dict)
    isolation: str = "bwrap"  # one of ISOLATIONS
    agent_uid: int = AGENT_UID  # pod mode, root runner: the uid the harness runs as
    bounds: Bounds = field(default_factory=Bounds)  # what the rollout may leave on the host (logs, the graded copy)
    harness_memory_mb: int = 0  # the harness's own memory beside the task's; 0: its module's MEMORY_MB
    send_result: str = ""  # "iteration" or "evaluation": result.json also goes to the proxy, into the store


def proxy_client(spec: RolloutSpec) -> ProxyClient:
    """The proxy's admin API as this rollout calls it."""
    return ProxyClient(spec.proxy_url, spec.admin_key)


def register(spec: RolloutSpec, metadata: dict) -> tuple[str, dict]:
    """Registers the rollout with the proxy: (the id it got, the proxy's answer with its key and URLs).

    Attempt K registers as `attempt_id(ID, K)`. A rerun step finds that id taken by the attempt that
    failed (Argo reruns a step with the same parameters, and the proxy's store keeps that attempt's
    registration and calls): it takes the next attempt's id instead, and its result names the id it ran under."""
    client = proxy_client(spec)
    for attempt in range(spec.attempt, spec.attempt + MAX_ATTEMPTS):
        rollout_id = attempt_id(spec.rollout_id, attempt)
        try:
            return rollout_id, client.register(rollout_id, metadata)
        except ProxyClientError as exc:
            if exc.status != 409:
                raise InfraError(str(exc)) from None
    raise InfraError(f"rollout ids {attempt_id(spec.rollout_id, spec.attempt)} to {rollout_id} are all taken in the proxy")


def in_sandbox(env: dict[str, str], box: Sandbox) -> dict[str, str]:
    """The harness environment as the sandbox sees it: host paths under the sandbox root lose that prefix."""
    root = str(box.fs)
    if root == "/":  # a pod: the runner and the agent see the same paths
        return dict(env)
    return {key: value.replace(root, "") for key, value in env.items()}


def install_harness(spec: RolloutSpec) -> tuple[Path, HarnessSetup]:
    """The harness's program, and the harness and proxy as a sandbox brings them in; an infra error if it is not
    installed."""
    harness = HARNESSES[spec.harness]
    try:
        exe = harness.install(default_prefix(spec.harness, harness.VERSION))
    except InstallError as exc:
        raise InfraError(f"the harness is not installed: {exc}") from None
    return exe, HarnessSetup(binds=tuple(harness.binds()), programs=tuple(harness.programs(exe)),
                             proxy_url=spec.proxy_url)


def run_agent(spec: RolloutSpec, task: Task, box: Sandbox, exe: Path, rollout: dict, result: RolloutResult) -> bool:
    """Runs the harness in the sandbox; returns True if it ran out of time.

    The harness is given the proxy as the sandbox's inside reaches it (`Sandbox.agent_url`: locally a tunnel's end
    at 127.0.0.1, in a pod the proxy itself).
    """
    harness = HARNESSES[spec.harness]
    urls = {key: box.agent_url(rollout[key]) for key in ("openai_base_url", "anthropic_base_url")}
    endpoint = Endpoint(**urls, api_key=rollout["api_key"], model=spec.model_name)
    env = in_sandbox(harness.prepare(box.host_path(box.home), Path(box.workdir), endpoint), box)
    env["PATH"] = harness_path(env.get("PATH", ""), box.env.get("PATH", ""))
    log = spec.out / "harness.log"
    result.paths["harness_log"] = str(log)
    timeout_s = spec.agent_timeout_s or task.config.agent_timeout_s
    command = harness.command(task.instruction, Path(box.workdir), exe)
    try:
        run = box.run_harness(command, timeout_s=timeout_s, env=env, stdout_path=log)
    except SandboxError as exc:
        raise InfraError(f"the harness could not be started in the sandbox: {exc}") from None
    result.harness_exit_code = run.exit_code
    result.killed = (box.limit_hits(None if run.timed_out else run.exit_code) +
                     ([{"process": "harness", "by": "time", "count": 1}] if run.timed_out else []))
    result.peak_memory_mb = box.peaks_mb()
    if run.output_dropped:
        box.notes.append(f"harness.log: the harness's output was cut at {spec.bounds.log_bytes} bytes "
                         f"({run.output_dropped} more were dropped)")
    kept = spec.out / "harness-logs"  # the harness's own event logs, kept with the result, as logs (bounded)
    written, cuts = copy_logs(((path, kept / path.name) for path in harness.log_paths(box.host_path(box.home))),
                              spec.bounds.log_bytes)
    if written:
        result.paths["harness_logs"] = [str(path) for path in written]
    box.notes.extend(f"harness-logs: {cut}" for cut in cuts)
    result.notes = list(box.notes)
    result.durations["agent_s"] = round(run.duration_s, 3)
    if run.exit_code in (126, 127) and not run.timed_out:
        raise InfraError(f"the harness could not start (exit code {run.exit_code}); see {log}")
    return run.timed_out


def harness_path(harness: str, image: str) -> str:
    """The harness's PATH inside the sandbox: its own folders first (Node's), then the image's PATH as its
    Dockerfile's ENV left it (as `docker exec` keeps a container's), then the rest of the harness's.

    >>> harness_path("/opt/node/bin:/usr/bin:/bin", "/opt/venv/bin:/usr/local/bin:/usr/bin:/bin")
    '/opt/node/bin:/opt/venv/bin:/usr/local/bin:/usr/bin:/bin'
    """
    system = set(SYSTEM_PATH.split(":"))
    parts = [p for p in harness.split(":") if p and p not in system] + image.split(":") + harness.split(":")
    return ":".join(dict.fromkeys(p for p in parts if p))


def record_calls(spec: RolloutSpec, result: RolloutResult) -> None:
    """Closes the rollout's session and counts what the proxy recorded; no answered model call is an infra error."""
    client = proxy_client(spec)
    try:
        client.close(spec.rollout_id)
        calls = [CallRecord.from_json(call) for call in client.calls(spec.rollout_id).calls]
    except ProxyClientError as exc:
        raise InfraError(str(exc)) from None
    result.num_calls = len(calls)
    result.weight_versions = sorted({str(call.weight_version) for call in calls if call.weight_version is not None})
    # An external upstream's call without token ids counts what that upstream said it sampled.
    result.response_tokens = sum(len(call.response_token_ids) if call.response_token_ids is not None
                                 else (call.usage or {}).get("completion_tokens") or 0 for call in calls)
    answered = [call for call in calls if call.status == "ok"]
    if not answered:
        failed = next((call.error["message"] for call in calls if call.error), None)
        reason = f"{len(calls)} failed, the first with: {failed}" if failed else f"exit code {result.harness_exit_code}"
        raise InfraError(f"the harness made no model call that was answered ({reason}); "
                         f"see {result.paths.get('harness_log')}")


def grade(spec: RolloutSpec, task: Task, box: Sandbox, result: RolloutResult, timed_out: bool) -> None:
    """Runs the verifier and sets status and reward; a verifier left without a (trusted) reward scores 0. A task whose
    verifier asks a judge (`[verifier] judge`) gets one for its grading alone (`judged`)."""
    if task.config.judge:
        with judged(spec, box) as env:
            verdict = run_verifier(box, task, spec.out / "verifier", env=env, judge=True)
    else:
        verdict = run_verifier(box, task, spec.out / "verifier")
    result.durations["verifier_s"] = round(verdict.duration_s, 3)
    result.paths["verifier_output"] = str(verdict.output_dir)
    result.notes = list(box.notes)
    result.rewards = verdict.rewards
    if verdict.reward is None:  # graded in a pristine root: what broke it can only be the agent's work
        result.error = f"the verifier wrote no reward, so the rollout scores 0: {verdict.error}"
    reward = 0.0 if timed_out or verdict.reward is None else verdict.reward
    result.status, result.reward = (AGENT_TIMEOUT if timed_out else OK), reward


@contextlib.contextmanager
def judged(spec: RolloutSpec, box: Sandbox):
    """The rollout's judge while its verifier runs: opened with the proxy once the agent's session is closed, its URL,
    model and key given as the verifier's environment (`JUDGE_ENV`: never the agent's, never a file), closed when
    grading ends. A judge that failed on its side or the proxy's (`steps.proxy.judge`), or that cannot be opened or
    closed, makes the rollout an infra error: a reward resting on it is never scored."""
    client = proxy_client(spec)
    try:
        judge = client.open_judge(spec.rollout_id)
    except ProxyClientError as exc:
        raise InfraError(f"the verifier's judge could not be opened ({exc})") from None
    try:
        yield {JUDGE_ENV["url"]: box.agent_url(judge["openai_base_url"]), JUDGE_ENV["key"]: judge["api_key"],
               JUDGE_ENV["model"]: judge["model"]}
    finally:
        try:
            failed = client.close_judge(spec.rollout_id)["failed"]
        except ProxyClientError as exc:
            raise InfraError(f"the verifier's judge could not be closed ({exc})") from None
    if failed:
        first = failed[0]
        raise InfraError(f"the judge failed while the verifier graded ({len(failed)} calls; the first, call "
                         f"{first['call_index']}: {first['status']} {first['message']}), so the rollout is not scored")


def harness_budget(spec: RolloutSpec) -> Budget:
    """The harness's own budget beside the task's (`steps.harnesses.allowance`)."""
    return Budget(*allowance(spec.harness, spec.harness_memory_mb))


def enter(out: Path, phase: str) -> None:
    """Writes the rollout's phase (setup, agent, calls, grading, done) to `OUT/phase`, for a runner that has to stop it
    at its deadline and write its result (`workflows.local.past_deadline`): OUT is the runner's, out of the agent's
    reach."""
    with contextlib.suppress(OSError):  # a full disk: the result says so later
        (out / PHASE_FILE).write_text(phase)


def run_rollout(spec: RolloutSpec) -> RolloutResult:
    """Runs one rollout end to end and writes `OUT/result.json`; never raises for a failed rollout.

    Any exception, the runner's own bugs included, makes the rollout an `infra_error`: it is retried,
    never scored. When `result.json` cannot be written (a full disk) the result says so, and no
    `result.json` is left in `OUT` (`write_result`)."""
    started = time.monotonic()
    result = RolloutResult(rollout_id=attempt_id(spec.rollout_id, spec.attempt), task=spec.task.name,
                           harness=spec.harness, status=INFRA_ERROR, reward=None, sample=spec.sample,
                           metadata=spec.metadata)
    try:
        spec.out.mkdir(parents=True, exist_ok=True)
        enter(spec.out, "setup")
        if spec.harness not in HARNESSES:
            raise InfraError(f"unknown harness {spec.harness!r}; choose from {', '.join(HARNESSES)}")
        # Registered before the task is read (its name is its folder's), so that a task that cannot be read is
        # still an infra error the proxy takes the result of (`send_result`), counted like any other.
        taken, rollout = register(spec, {**spec.metadata, "task": spec.task.name, "harness": spec.harness,
                                         "sample": spec.sample})
        spec = replace(spec, rollout_id=taken)
        result.rollout_id = taken
        report_phase(spec, "setup")
        task = load_task(spec.task)
        result.task = task.name
        exe, harness = install_harness(spec)
        box = open_sandbox(spec.isolation, spec.out, task, bounds=spec.bounds, harness=harness,
                           budget=harness_budget(spec), agent_uid=spec.agent_uid)
        result.notes = list(box.notes)
        result.durations["setup_s"] = round(time.monotonic() - started, 3)
        try:
            report_phase(spec, "agent")
            enter(spec.out, "agent")
            timed_out = run_agent(spec, task, box, exe, rollout, result)
            enter(spec.out, "calls")
            record_calls(spec, result)
            enter(spec.out, "grading")
            grade(spec, task, box, result, timed_out)
        finally:
            box.close()  # unmounted; ROOT/upper keeps what the agent changed
    except (InfraError, SandboxError, TaskError) as exc:
        result.status, result.reward, result.error = INFRA_ERROR, None, str(exc)
    except OSError as exc:  # e.g. a pod whose runner may not write /logs: the setup's fault, never the agent's
        result.status, result.reward, result.error = INFRA_ERROR, None, f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - a bug in the runner: retried like any infrastructure failure
        result.status, result.reward = INFRA_ERROR, None
        result.error = f"the rollout runner crashed ({type(exc).__name__}: {exc})"
    result.durations["total_s"] = round(time.monotonic() - started, 3)
    enter(spec.out, "done")
    unwritten = write_result(spec.out, result)
    if unwritten:
        earlier = f"; before that: {result.error}" if result.error else ""
        result.status, result.reward = INFRA_ERROR, None
        result.error = f"{spec.out / RESULT_FILE} could not be written ({unwritten}){earlier}"
    elif spec.send_result:
        send_result(spec, result)
    write_outputs(spec.out, result)
    return result


def send_result(spec: RolloutSpec, result: RolloutResult) -> None:
    """Hands `OUT/result.json` to the proxy, which writes it to the store (`steps.proxy.results`): a rollout pod
    reaches nothing but the proxy and the Kubernetes API. A result that cannot be sent makes the rollout an
    infra_error (retried; the proxy refuses a rollout it never opened, as one that failed before registering)."""
    try:
        proxy_client(spec).send_result(result.to_json(), retry=spec.attempt - 1,
                                       evaluation=spec.send_result == "evaluation")
    except ProxyClientError as exc:
        earlier = f"; before that: {result.error}" if result.error and result.status == INFRA_ERROR else ""
        result.status, result.reward = INFRA_ERROR, None
        result.error = f"the result could not be sent to the proxy ({exc}){earlier}"
        write_result(spec.out, result)


def report_phase(spec: RolloutSpec, phase: str) -> None:
    """With `--send-result`, tells the proxy the rollout's phase (setup, agent), which it writes to the store beside
    where the result goes (`steps.proxy.results.store_phase`): a pod that dies without a result after its agent
    started is the agent's end, scored 0, and before that the cluster's (`steps.ends`). The agent never starts
    without its record stored: one that cannot be sent is an infra_error."""
    if not spec.send_result:
        return
    try:
        proxy_client(spec).send_phase(spec.rollout_id, phase, retry=spec.attempt - 1,
                                      evaluation=spec.send_result == "evaluation")
    except ProxyClientError as exc:
        raise InfraError(f"the rollout's {phase} phase could not be recorded by the proxy ({exc})") from None


def output_values(result: RolloutResult) -> dict[str, str]:
    """The result's status and reward as the one-line files beside it: only the runner's own values (a status
    of three words, a reward as a number), never text the agent wrote.

    >>> output_values(RolloutResult("r", "t", "direct", "ok", 1.0))
    {'status': 'ok', 'reward': '1'}
    >>> output_values(RolloutResult("r", "t", "direct", "infra_error", None))
    {'status': 'infra_error', 'reward': 'none'}
    """
    reward = NO_REWARD if result.reward is None else f"{float(result.reward):g}"
    return {STATUS_FILE: result.status, REWARD_FILE: reward}


def write_outputs(out: Path, result: RolloutResult) -> None:
    """Writes `OUT/status` and `OUT/reward` (`output_values`); one that cannot be written is left absent, and
    its reader (Argo) takes its default."""
    for name, value in output_values(result).items():
        try:
            (out / name).write_text(value)  # no newline: Argo shows the file's bytes as the value
        except OSError:
            with contextlib.suppress(OSError):
                (out / name).unlink()


def write_result(out: Path, result: RolloutResult) -> str | None:
    """Writes `OUT/result.json` whole or not at all: a temporary file, flushed to disk, renamed over it.

    Returns None, or why it could not be written; then no `result.json` is left in `OUT`, not even an
    earlier attempt's, so no reader takes an old result (or half a file) for this rollout's."""
    path, partial = out / RESULT_FILE, out / f".{RESULT_FILE}.{os.getpid()}.partial"
    try:
        with open(partial, "w") as handle:
            json.dump(result.to_json(), handle, indent=2)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, path)
        return None
    except (OSError, TypeError, ValueError) as exc:  # TypeError/ValueError: metadata json cannot encode
        for leftover in (partial, path):
            with contextlib.suppress(OSError):
                leftover.unlink()
        return f"{type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    """Runs the rollout named on the command line; prints its result as one JSON line."""
    p = argparse.ArgumentParser(prog="python -m steps.rollout", description=__doc__.split("\n\n")[0])
    p.add_argument("--task", type=Path, required=True)
    p.add_argument("--harness", required=True, help=", ".join(HARNESSES))
    p.add_argument("--proxy-url", required=True)
    p.add_argument("--rollout-id", required=True, help="the plan's id; attempt K runs as ID-aK")
    p.add_argument("--sample", type=int, help="the plan's sample number: which of its task's rollouts this is")
    p.add_argument("--attempt", type=int, default=1, help="which attempt of the rollout this is (1, 2, ...)")
    p.add_argument("--retry", type=int, help="instead of --attempt: Argo's retry number ({{retries}}, 0 on the "
                   "first try), attempt N+1")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model-name", default="tiny", help="the served model's name, which the harness asks for "
                   "(the proxy serves its own whatever the name)")
    p.add_argument("--agent-timeout", type=float, help="seconds, instead of the task's [agent] timeout_sec")
    p.add_argument("--metadata", type=json.loads, default={}, help="JSON object stored with the rollout")
    p.add_argument("--isolation", choices=ISOLATIONS, default="bwrap",
                   help="bwrap: a bubblewrap sandbox from the task's Dockerfile (default); pod: this Kubernetes pod")
    p.add_argument("--agent-uid", type=int, default=AGENT_UID, help="pod mode: the unprivileged uid the harness runs as")
    p.add_argument("--send-result", choices=("iteration", "evaluation"),
                   help="also hand result.json to the proxy, which writes it to the store as an iteration's (or "
                        "its evaluation's) result for --retry (a rollout pod: steps/proxy/results.py)")
    limits = p.add_argument_group("limits", "what the rollout may take and leave behind (docs/reliability.md, Limits)")
    limits.add_argument("--harness-memory-mb", type=int, default=0,
                        help="the harness's own memory beside the task's memory_mb (0: its module's MEMORY_MB)")
    limits.add_argument("--log-mb", type=int, default=Bounds.log_bytes // MIB, help="each log the rollout keeps, MiB")
    limits.add_argument("--graded-max-files", type=int, default=Bounds.graded_files,
                        help="files and folders of the graded paths brought to the verifier; more scores 0")
    limits.add_argument("--graded-copy-s", type=float, default=Bounds.graded_seconds,
                        help="seconds that copy may take; longer scores 0")
    args = p.parse_args(argv)
    admin_key = os.environ.get("OPENFORGE_ADMIN_KEY")
    if not admin_key:
        p.error("set OPENFORGE_ADMIN_KEY to the proxy's admin key")
    if args.retry is not None:
        args.attempt = args.retry + 1
    if args.attempt < 1 or (args.sample is not None and args.sample < 0):
        p.error("--attempt must be 1 or more (--retry 0 or more) and --sample 0 or more")
    if min(args.log_mb, args.graded_max_files, args.graded_copy_s) <= 0 or args.harness_memory_mb < 0:
        p.error("--log-mb, --graded-max-files and --graded-copy-s must be more than 0, --harness-memory-mb 0 or more")
    problem = prepare_runner(args.isolation)
    if problem:
        p.error(problem)
    spec = RolloutSpec(task=args.task, harness=args.harness, proxy_url=args.proxy_url, rollout_id=args.rollout_id,
                       out=args.out, model_name=args.model_name, sample=args.sample, attempt=args.attempt,
                       admin_key=admin_key, agent_timeout_s=args.agent_timeout,
                       metadata=args.metadata, isolation=args.isolation, agent_uid=args.agent_uid,
                       bounds=Bounds(log_bytes=args.log_mb * MIB, graded_files=args.graded_max_files,
                                     graded_seconds=args.graded_copy_s),
                       harness_memory_mb=args.harness_memory_mb, send_result=args.send_result or "")
    try:
        result = run_rollout(spec)
    except Exception as exc:  # noqa: BLE001 - run_rollout catches its own; this is a bug outside its guard
        result = RolloutResult(rollout_id=attempt_id(spec.rollout_id, spec.attempt), task=spec.task.name,
                               harness=spec.harness, status=INFRA_ERROR, reward=None, sample=spec.sample,
                               metadata=spec.metadata,
                               error=f"the rollout runner crashed ({type(exc).__name__}: {exc})")
        unwritten = write_result(spec.out, result)
        if unwritten:
            result.error += f"; {spec.out / RESULT_FILE} could not be written ({unwritten})"
        write_outputs(spec.out, result)
    if not (spec.out / RESULT_FILE).is_file():
        print(f"steps.rollout: infra_error: {' '.join(str(result.error).split())}", file=sys.stderr)  # one line
    print(json.dumps({k: getattr(result, k) for k in ("rollout_id", "task", "sample", "harness", "status", "reward",
                                                      "num_calls", "error")}))
    return INFRA_EXIT_CODE if result.status == INFRA_ERROR else 0


if __name__ == "__main__":
    sys.exit(main())
