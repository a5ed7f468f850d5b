"""A rollout pod that dies without a result (docs/workflows.md, "Retries"): after its agent started and not retried,
the agent ended it (its disk or memory limit, the deadline) and it scores 0 and is trained on; retried out of
attempts, or dead before its agent started, it is an infra error, never scored. The real runner sends its phases
to a real proxy, which writes them to the store (`steps.proxy.results.store_phase`); the pod's death is the runner's
process group killed with SIGKILL (what the kubelet does to a pod's containers past its limits or deadline); the
collector is `python -m steps.trajectories` and `steps.evaluate`'s summary. The local runner agrees
(`workflows.local.step_result`).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from steps.contracts import layout
from steps.contracts.rollout import PlannedRollout
from steps.evaluate import summarize
from steps.plan import attempt_of
from steps.proxy.client import ProxyClient, ProxyClientError
from steps.tasks import BUILTIN_DATASET
from steps.trajectories.collect import all_results
from test_rollout import ADMIN_KEY
from workflows import local
from workflows.config import load_config

RETRIES = 2  # the run's rollout_retries: retry numbers 0, 1 and 2


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """The run folder the proxy writes rollout pods' results and phases to (iteration 0's)."""
    return tmp_path_factory.mktemp("ends") / "run"


@pytest.fixture(scope="module")
def ends_proxy(proxy, scripted, run):
    """A real proxy in front of the scripted model, writing results and phases under `run`."""
    return proxy(scripted.url, extra=["--run-url", str(run), "--iteration", "0"])


def attempt_id(planned: str, retry: int) -> str:
    """The attempt id the proxy gives a planned rollout's pod at Argo's retry `retry` when no earlier pod of it was
    rerun: `planned`, then `planned-a2`, ... (`steps.plan.attempt_of` reads it back)."""
    return planned if retry == 0 else f"{planned}-a{retry + 1}"


def phase_record(run: Path, planned: str, retry: int, evaluation: bool = False) -> dict | None:
    """What the store holds as the runner's phase of retry `retry` of `planned` (None: nothing)."""
    where = layout.eval_result_url if evaluation else layout.result_url
    path = Path(layout.beside_result(where(str(run), 0, attempt_id(planned, retry)), layout.PHASE_RECORD))
    return json.loads(path.read_text()) if path.is_file() else None


def kill_pod_once_the_agent_runs(proxy, run: Path, planned: str, retry: int, tmp_path: Path) -> str:
    """Runs the real rollout runner as a pod's would (`--send-result`, `--retry`) on an agent that hangs, and kills
    its whole process tree once its agent started and made a model call; returns the runner's stderr."""
    argv = [sys.executable, "-m", "steps.rollout", "--task", str(BUILTIN_DATASET / "hello-file"), "--harness",
            "direct", "--proxy-url", proxy.url, "--rollout-id", planned, "--sample", "0", "--retry", str(retry),
            "--out", str(tmp_path / f"out-{retry}"), "--model-name", "tiny", "--send-result", "iteration"]
    runner = subprocess.Popen(argv, env={**os.environ, "OPENFORGE_ADMIN_KEY": ADMIN_KEY}, start_new_session=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    attempt = attempt_id(planned, retry)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and runner.poll() is None:
            record = phase_record(run, planned, retry)
            if record and record["phase"] == "agent" and proxy.calls(attempt):
                break
            time.sleep(0.2)
        assert runner.poll() is None, f"the runner ended by itself: {runner.communicate()}"
    finally:
        os.killpg(runner.pid, signal.SIGKILL)  # the pod's death: its every process, no chance to write a result
    _, stderr = runner.communicate()
    unmount_under(tmp_path)
    return stderr


def unmount_under(folder: Path) -> None:
    """Unmounts what the killed runner's local sandbox left mounted under `folder` (a pod's mounts die with it)."""
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for point in sorted((m for m in mounts if m.startswith(f"{folder}/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def test_a_pod_the_agent_killed_scores_0_and_is_trained_on(ends_proxy, scripted, run, tmp_path):
    scripted.set_commands(["dd if=/dev/zero of=fill bs=1M count=8 2>/dev/null; sleep 300"])  # fills, then hangs
    planned = f"it0-hello-file-s{uuid.uuid4().hex[:4]}"
    kill_pod_once_the_agent_runs(ends_proxy, run, planned, 0, tmp_path)
    results = Path(layout.results_url(str(run), 0))
    folder = results / attempt_id(planned, 0)
    assert not (folder / layout.RESULT_FILE).exists(), "the killed runner sent no result"
    assert phase_record(run, planned, 0)["phase"] == "agent"

    out = tmp_path / "tables"
    argv = [sys.executable, "-m", "steps.trajectories", "--proxy-url", ends_proxy.url, "--results", str(results),
            "--out", str(out), "--run", "r", "--iteration", "0"]
    env = {**os.environ, "OPENFORGE_ADMIN_KEY": ADMIN_KEY}
    done = subprocess.run([*argv, "--rollout-retries", str(RETRIES)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    partition = out / "run=r" / "iteration=0"
    rollouts = {row["rollout_id"]: row for row in pq.read_table(partition / "rollouts.parquet").to_pylist()}
    assert (rollouts[planned]["status"], rollouts[planned]["reward"]) == ("agent_killed", 0.0)
    samples = [row for row in pq.read_table(partition / "samples.parquet").to_pylist() if row["rollout_id"] == planned]
    assert samples and all(row["reward"] == 0.0 for row in samples), "its recorded calls are trained on, with reward 0"

    # The control: the collector as it was, without the run's retry limit, drops the rollout (the hole).
    before = subprocess.run([*argv, "--out", str(tmp_path / "old")], env=env, capture_output=True, text=True)
    if before.returncode == 2:  # its was the only rollout of the folder
        assert "no rollout results" in before.stderr, before.stderr
    else:
        assert before.returncode == 0, before.stderr
        old = pq.read_table(tmp_path / "old" / "run=r" / "iteration=0" / "rollouts.parquet").to_pylist()
        assert planned not in {row["rollout_id"] for row in old}


def test_a_pod_retried_out_of_attempts_is_an_infra_error_not_trained_on(ends_proxy, scripted, run, tmp_path):
    scripted.set_commands(["sleep 300"])
    planned = f"it0-hello-file-s{uuid.uuid4().hex[:4]}"
    kill_pod_once_the_agent_runs(ends_proxy, run, planned, RETRIES, tmp_path)  # the last attempt Argo makes
    ended = {r.rollout_id: r for r in all_results(layout.results_url(str(run), 0), RETRIES)}
    result = ended[f"{planned}-a{RETRIES + 1}"]
    assert (result.status, result.reward) == ("infra_error", None), result.error
    # The control: the same end one attempt earlier was not retried, so it was the agent's.
    ended = {r.rollout_id: r for r in all_results(layout.results_url(str(run), 0), RETRIES + 1)}
    assert ended[f"{planned}-a{RETRIES + 1}"].status == "agent_killed"


def pod_init(root: Path) -> int | None:
    """The pid of the simulated pod's first process (pid 1 of its PID namespace, `test_pod_rollout.POD_SCRIPT`'s
    shell), found by the pod root its `unshare` was given; None before it runs."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == "unshare" and \
                    f"ROOT={root}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                children = (entry / "task" / entry.name / "children").read_text().split()
                return int(children[0]) if children else None
        except (OSError, IndexError, ValueError):
            continue
    return None


@pytest.mark.slow  # builds a simulated rollout pod (tests/test_pod_rollout.py): a few seconds
def test_a_rollout_pod_killed_after_its_agent_started_scores_0(ends_proxy, scripted, run, tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("the simulated rollout pod needs root and unshare (tests/test_pod_rollout.py)")
    from test_pod_rollout import run_in_pod

    scripted.set_commands(["sleep 300"])
    results = Path(layout.results_url(str(run), 0))
    earlier = set(results.glob("pod-*")) if results.is_dir() else set()
    ended: dict = {}

    def pod() -> None:
        try:
            run_in_pod(ends_proxy, BUILTIN_DATASET / "hello-file", "direct", tmp_path)
        except AssertionError as exc:  # it finds no result.json: the pod died
            ended["error"] = str(exc)

    thread = threading.Thread(target=pod)
    thread.start()
    deadline, folder = time.monotonic() + 180, None
    while time.monotonic() < deadline and thread.is_alive() and folder is None:
        for found in set(results.glob("pod-*")) - earlier if results.is_dir() else ():
            record = json.loads((found / layout.PHASE_RECORD).read_text())
            if record["phase"] == "agent" and ends_proxy.calls(record["rollout_id"]):
                folder = found
        time.sleep(0.2)
    init = pod_init(tmp_path / "pod")
    assert folder is not None and init is not None, f"the pod's agent never ran: {ended}"
    os.kill(init, signal.SIGKILL)  # the pod's death: every process of its PID namespace, and its mounts
    thread.join(60)
    assert "no result.json" in ended.get("error", ""), ended
    planned, _ = attempt_of(folder.name)
    [result] = [r for r in all_results(str(results), RETRIES) if r.rollout_id == planned]
    assert (result.status, result.reward, result.task, result.sample) == ("agent_killed", 0.0, "hello-file", 0)


def register_and_report(proxy, planned: str, retry: int, phases: tuple[str, ...], evaluation: bool = False) -> dict:
    """What a runner leaves before its pod dies: its registration as attempt retry+1, then its phases."""
    attempt = attempt_id(planned, retry)
    rollout = proxy.register(attempt, {"task": "hello-file", "harness": "direct", "sample": 0})
    for phase in phases:
        proxy.client.send_phase(attempt, phase, retry, evaluation=evaluation)
    return rollout


def test_a_pod_dead_before_its_agent_started_is_an_infra_error(ends_proxy, run):
    planned = f"it0-hello-file-s{uuid.uuid4().hex[:4]}"
    register_and_report(ends_proxy, planned, 0, ("setup",))
    found = [r for r in all_results(layout.results_url(str(run), 0), RETRIES) if r.rollout_id == planned]
    assert [(r.status, r.reward) for r in found] == [("infra_error", None)]
    register_and_report(ends_proxy, f"{planned}x", 0, ("setup", "agent"))  # the control: its agent had started
    found = [r for r in all_results(layout.results_url(str(run), 0), RETRIES) if r.rollout_id == f"{planned}x"]
    assert [(r.status, r.reward) for r in found] == [("agent_killed", 0.0)]


def test_an_evaluation_scores_the_agents_end_as_a_try_and_counts_the_clusters_as_infra(ends_proxy, run):
    tries = {f"ev0-t{n}-s0": n for n in range(3)}
    register_and_report(ends_proxy, "ev0-t0-s0", 0, ("setup", "agent"), evaluation=True)  # the agent's end
    register_and_report(ends_proxy, "ev0-t1-s0", RETRIES, ("setup", "agent"), evaluation=True)  # out of attempts
    register_and_report(ends_proxy, "ev0-t2-s0", 0, ("setup",), evaluation=True)  # before its agent
    results = [r for r in all_results(layout.eval_results_url(str(run), 0), RETRIES)
               if r.rollout_id.split("-a")[0] in tries]
    summary = summarize(results, k=1, planned={try_id: "hello-file" for try_id in tries})
    overall = summary["overall"]  # the cluster's ends stay `missing` failures too: no infra error raises a number
    assert (overall["tries"], overall["infra_errors"], overall["missing"], summary["missing"]) == \
        (3, 2, 2, ["ev0-t1-s0", "ev0-t2-s0"])
    assert [r.status for r in results if r.rollout_id == "ev0-t0-s0"] == ["agent_killed"]
    # The control: without the store's phases, all three vanish alike, the agent's end one of the missing.
    without = summarize([], k=1, planned={try_id: "hello-file" for try_id in tries})
    assert (without["overall"]["infra_errors"], without["overall"]["missing"]) == (0, 3)


def test_the_agent_cannot_write_or_remove_its_phase(ends_proxy, run):
    planned = f"it0-hello-file-s{uuid.uuid4().hex[:4]}"
    rollout = register_and_report(ends_proxy, planned, 0, ("setup",))
    agent = ProxyClient(ends_proxy.url, rollout["api_key"], retries=0)  # all the agent holds: its rollout's key
    for method, path in (("PUT", f"/rollouts/{planned}/phase?retry=0&phase=agent"),
                         ("PUT", f"/rollouts/{planned}/phase?retry=0&phase=setup"),
                         ("DELETE", f"/rollouts/{planned}/phase?retry=0")):
        with pytest.raises(ProxyClientError) as refused:
            agent.request(method, path)
        assert refused.value.status in (401, 404, 405), (method, path, refused.value)
    assert phase_record(run, planned, 0)["phase"] == "setup"
    # The control: the admin key (the runner's) does write it.
    ends_proxy.client.send_phase(planned, "agent", 0)
    assert phase_record(run, planned, 0)["phase"] == "agent"


PLANNED = PlannedRollout(task="steps/tasks/builtin/hello-file", sample=0, rollout_id="it0-hello-file-s0", image="",
                         deadline_s=480, cpus=1, memory_mb=1024, storage_mb=1024, gpus=0)


@pytest.mark.parametrize("phase, status", [("agent", "agent_killed"), ("grading", "agent_killed"),
                                           ("setup", "infra_error")])
def test_the_local_runner_reads_a_dead_step_the_same_way(phase, status, tmp_path, monkeypatch):
    def dies(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True)
        (out / layout.PHASE_FILE).write_text(phase)
        return subprocess.CompletedProcess(argv, -signal.SIGKILL, "", "Killed")

    monkeypatch.setattr(local.subprocess, "run", dies)
    config = load_config(None, [f"store={tmp_path}", "run=r", f"rollout_retries={RETRIES}", "harness=direct"])
    [result] = local.run_rollouts(config, 0, [PLANNED], "http://proxy:8100", {})
    assert (result.rollout_id, result.status) == ("it0-hello-file-s0", status), "never retried: a kill is not exit 3"
    written = Path(layout.result_url(config.run_url, 0, "it0-hello-file-s0"))
    if status == "agent_killed":  # in the results folder, as the trajectories step reads it: trained on, reward 0
        assert [(r.status, r.reward) for r in all_results(str(written.parent.parent), RETRIES)] == [(status, 0.0)]
    else:  # the control: an infra error, as before, in no result the trajectories step reads
        assert result.reward is None and not written.exists()
