"""Rollouts that overlap the update (`max_staleness: S`): the staleness of a sample, its drop, and the loop.

- The pure logic (`steps.trajectories.staleness`, `collect`'s drop) on recorded-call dicts, with a control.
- A rollout whose calls span a real weight swap (the real proxy in front of the session's vLLM, new weights
  loaded in place) carries two versions; `python -m steps.trajectories --max-staleness` drops its samples more
  than S behind and counts them, and keeps them with a larger S (the control).
- `workflows.local.Updates`, the background updates of the embedded default: in order, each after the one
  before it, none on the base a failed one left unknown.
- One slow run of the embedded default with S=1 (real vLLM, real veRL): killed while update 0 runs beside
  iteration 1's rollouts, then resumed; in the resumed run rollouts n+1 start before update n ends, and the
  manifest holds each iteration's staleness.
"""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import pytest

from proxy_process import serve_proxy
from test_local_run import wait_for
from steps.tiny_model import build_tiny_model
from steps.trajectories.collect import collect
from steps.contracts.table_files import partition_url, read_table
from steps.trajectories.staleness import Staleness, versions_behind
from steps.contracts import layout
from steps.contracts.rollout import RolloutResult
from workflows import local
from workflows.argo import node_id
from workflows.config import load_config
from workflows.local import StepFailed, Updates

REPO = Path(__file__).resolve().parents[1]
ADMIN = "test-admin-key"


def call(index: int, prompt: list[int], response: list[int], version: str) -> dict:
    return {"call_index": index, "status": "ok", "prompt_token_ids": prompt, "response_token_ids": response,
            "response_logprobs": [-0.5] * len(response), "weight_version": version}


def result(rollout_id: str) -> RolloutResult:
    return RolloutResult.from_json({"rollout_id": rollout_id, "task": "t", "sample": 0, "status": "ok", "reward": 1.0,
                                    "harness": "direct"})


def test_a_sample_more_than_s_behind_is_dropped_and_counted_and_kept_under_a_larger_s():
    # r0: one sample whose calls were served by versions 0 then 1 (it spanned a swap); r1: version 2 only.
    calls = {"r0": [call(0, [1, 2], [3], "0"), call(1, [1, 2, 3, 4], [5], "1")], "r1": [call(0, [7], [8], "2")]}
    rows, _ = collect([result("r0"), result("r1")], calls, "run", 2, max_staleness=1)
    tables = rows.tables()
    assert tables["samples"].column("rollout_id").to_pylist() == ["r1"]
    assert tables["calls"].column("sample_index").to_pylist() == [None, None, 0]  # r0's calls kept, in no sample
    assert rows.staleness.summary() == {"trained_version": 2, "max_staleness": 1, "samples": 1, "max_behind": 0,
                                        "mean_behind": 0.0, "behind": {"0": 1}, "unknown": 0, "dropped": 1,
                                        "dropped_rollouts": 1}
    kept, _ = collect([result("r0"), result("r1")], calls, "run", 2, max_staleness=2)  # the control
    assert kept.tables()["samples"].column("rollout_id").to_pylist() == ["r0", "r1"]
    assert kept.staleness.summary()["behind"] == {"0": 1, "2": 1} and kept.staleness.dropped == 0
    synchronous, _ = collect([result("r0"), result("r1")], calls, "run", 2)  # S = 0: nothing is dropped
    assert synchronous.tables()["samples"].num_rows == 2 and synchronous.staleness.summary()["max_behind"] == 2


def test_a_version_that_is_not_a_number_is_kept_as_unknown():
    staleness = Staleness(trained_version=3, max_staleness=0)
    assert staleness.count("r", versions_behind(3, ["gpt-x"])) and staleness.summary()["unknown"] == 1
    assert not staleness.count("r", versions_behind(3, ["2"]))


@pytest.fixture(scope="module")
def swap_proxy(vllm_server, tmp_path_factory):
    """A proxy in front of the session's vLLM stamping version "0" until a swap."""
    with serve_proxy(vllm_server, str(tmp_path_factory.mktemp("store")), ADMIN, extra=["--weight-version", "0"]) as proxy:
        yield proxy


def test_a_rollout_spanning_a_real_swap_carries_two_versions_and_its_stale_sample_is_dropped(
        swap_proxy, tiny_model, tmp_path):
    other = build_tiny_model(tmp_path / "other", seed=1)
    rollout = swap_proxy.register("it2-t-s0")
    client = openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"])
    ask = dict(model="tiny", max_tokens=4, temperature=0, messages=[{"role": "user", "content": "Say something."}])
    client.chat.completions.create(**ask)
    try:
        swap_proxy.client.update_weights(str(other), "1")
        client.chat.completions.create(**ask)
    finally:
        swap_proxy.client.update_weights(str(tiny_model), "0")
    assert [c["weight_version"] for c in swap_proxy.calls("it2-t-s0")] == ["0", "1"]
    results = tmp_path / "results"
    (results / "it2-t-s0").mkdir(parents=True)
    (results / "it2-t-s0" / "result.json").write_text(json.dumps(result("it2-t-s0").to_json()))

    def trajectories(out: Path, *stale: str) -> dict:
        done = subprocess.run([sys.executable, "-m", "steps.trajectories", "--proxy-url", swap_proxy.url,
                               "--results", str(results), "--out", str(out), "--run", "r", "--iteration", "1", *stale],
                              cwd=REPO, capture_output=True, text=True, env={**os.environ, "OPENFORGE_ADMIN_KEY": ADMIN})
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    # Trained version 1: the call served by version 0 is 1 behind. S=0 drops every sample holding it.
    dropped = trajectories(tmp_path / "s0", "--max-staleness", "0")
    partition = partition_url(str(tmp_path / "s0"), "r", 1)
    samples = read_table(partition, "samples").to_pylist()
    assert all(s["weight_versions"] == ["1"] for s in samples)
    assert dropped["staleness"]["dropped"] >= 1 and dropped["staleness"]["dropped_rollouts"] == 1
    assert json.loads(Path(layout.staleness_url(partition)).read_text()) == dropped["staleness"]
    assert set(read_table(partition, "calls").column("weight_version").to_pylist()) == {"0", "1"}
    kept = trajectories(tmp_path / "s1", "--max-staleness", "1")  # the control: S=1 keeps it
    assert kept["staleness"]["dropped"] == 0 and kept["staleness"]["max_behind"] == 1
    assert kept["rows"]["samples"] == kept["staleness"]["samples"] == dropped["staleness"]["samples"] + \
        dropped["staleness"]["dropped"]


def test_a_bad_max_staleness_is_one_sentence(tmp_path):
    done = subprocess.run([sys.executable, "-m", "steps.trajectories", "--store", str(tmp_path), "--results",
                           str(tmp_path), "--out", str(tmp_path), "--max-staleness", "-1"],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 2 and "--max-staleness must be a whole number >= 0" in done.stderr
    assert "Traceback" not in done.stderr


def test_background_updates_run_in_order_and_none_runs_on_the_base_a_failed_one_left():
    updates, ran, gate = Updates(), [], threading.Event()

    def job(n: int, fail: bool = False):
        def run():
            gate.wait(10)
            ran.append(n)
            if fail:
                raise StepFailed(f"update {n} broke")
        return run

    updates.start(0, job(0))
    updates.start(1, job(1, fail=True))
    updates.start(2, job(2))
    updates.check()  # nothing done yet: nothing failed
    gate.set()
    updates.wait(0)
    with pytest.raises(StepFailed, match="the update of iteration 1 failed: update 1 broke"):
        updates.wait(2)
    updates.close()
    assert ran == [0, 1]  # update 2 never ran: its base, checkpoint 2, was never written
    assert "iteration 1 failed" in str(updates.started[2].exception())


def run_stubbed(tmp_path: Path, monkeypatch, iterations: int, staleness: int, failing: int | None = None,
                fail_when: str = "queued") -> tuple[int, list, Path]:
    """`run_overlapped` with its steps stubbed: which iteration a failure is recorded on depends on when the
    failed update ends against the next rollouts, and only stubs can place that moment (the real loop, with
    real vLLM and veRL, is the slow test below). Update `failing` raises once iteration `failing`+1's update is
    queued ("queued") or while its rollouts run ("rollouts"). Returns the exit code, the event order and the run."""
    events, lock, gate = [], threading.Lock(), threading.Event()

    def note(what: str) -> None:
        with lock:
            events.append((what, time.time()))

    def collect(config, iteration, *args):
        note(f"rollouts {iteration} start")
        if failing is not None and iteration == failing + 1 and fail_when == "rollouts":
            gate.set()
            time.sleep(0.3)  # update `failing` ends while these rollouts run
        return []

    def update(config, iteration, *args):
        if iteration == failing:
            gate.wait(10)
            raise StepFailed(f"update {iteration} boom")
        time.sleep(0.05)
        note(f"update {iteration} end")
        return config.checkpoint_url(iteration + 1)

    def say(text: str) -> None:
        if failing is not None and fail_when == "queued" and text.startswith(f"iteration {failing + 1}: its update"):
            gate.set()

    for name, stub in {"collect_iteration": collect, "update_iteration": update, "say": say,
                       "refresh_report": lambda run_url: None}.items():
        monkeypatch.setattr(local, name, stub)
    config = load_config(None, [f"store={tmp_path}", "run=ov", f"iterations={iterations}",
                                f"max_staleness={staleness}"], check_dataset=False)
    code = local.run_overlapped(config, 0, {}, "http://proxy", ADMIN, {}, tmp_path)
    return code, [what for what, _ in sorted(events, key=lambda e: e[1])], Path(config.run_url)


@pytest.mark.parametrize("fail_when", ["queued", "rollouts"])
def test_a_failed_update_is_recorded_on_its_own_iteration_and_one_that_only_waited_has_no_record(
        tmp_path, monkeypatch, capsys, fail_when):
    code, _, run = run_stubbed(tmp_path, monkeypatch, 3, 1, failing=0, fail_when=fail_when)
    assert code == 1 and "the update of iteration 0 failed: update 0 boom" in capsys.readouterr().err
    records = [record_of(run, i) for i in range(3)]
    assert records[0]["status"] == "Failed" and records[0]["reason"] == "update 0 boom"
    assert records[1]["status"] == "Failed"  # its rollouts ran; its update never did, and it says why
    assert "the update of iteration 0 failed" in records[1]["reason"]
    assert records[2] is None  # it only waited for update 0: it ran nothing, so it has no record


def test_a_failed_last_update_is_recorded_and_the_one_queued_behind_it_says_why_it_did_not_run(
        tmp_path, monkeypatch):
    code, _, run = run_stubbed(tmp_path, monkeypatch, 2, 1, failing=0)
    assert code == 1
    assert [(r["status"], r["reason"]) for r in (record_of(run, 0), record_of(run, 1))] == [
        ("Failed", "update 0 boom"), ("Failed", "update 1 not started: the update of iteration 0 failed")]


@pytest.mark.parametrize("staleness", [1, 2])
def test_rollouts_n_plus_s_plus_1_start_only_after_update_n_and_every_iteration_succeeds(
        tmp_path, monkeypatch, staleness):
    code, events, run = run_stubbed(tmp_path, monkeypatch, 4, staleness)
    assert code == 0 and [record_of(run, i)["status"] for i in range(4)] == ["Succeeded"] * 4
    for n in range(4 - staleness - 1):
        assert events.index(f"rollouts {n + staleness + 1} start") > events.index(f"update {n} end")
    # the control: rollouts n+S do not wait for update n (S = 1 overlaps them with update n's sleep)
    assert events.index(f"rollouts {staleness} start") < events.index("update 0 end")


# ---- one slow run of the embedded default with S = 1 ----

def record_of(run: Path, iteration: int) -> dict | None:
    path = run / "manifest" / f"iteration-{iteration}.json"
    return json.loads(path.read_text()) if path.exists() else None




@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(not (REPO / ".venv-train" / "bin" / "python").exists() and not os.environ.get("OPENFORGE_TRAIN_PYTHON"),
                    reason="veRL's environment (.venv-train) is not set up: run `make train-setup`")
def test_with_s_1_rollouts_overlap_the_update_and_a_run_killed_mid_overlap_resumes(tiny_model, tmp_path):
    store, run = tmp_path / "runs", tmp_path / "runs" / "overlap"
    settings = [f"store={store}", "run=overlap", "iterations=3", "dataset=steps/tasks/toy", "tasks_per_iteration=1",
                "samples_per_task=8", "max_tokens_cap=16", "parallel_rollouts=2", f"model={tiny_model}",
                "max_staleness=1"]
    log = open(tmp_path / "driver.log", "w")
    driver = subprocess.Popen([sys.executable, "workflows/submit.py", "--harness", "direct", *settings],
                              cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:  # killed while update 0 runs beside iteration 1's rollouts
        wait_for(lambda: (run / "logs" / "update-0.log").exists() and list((run / "results" / "iteration-1").glob("*"))
                 and record_of(run, 0)["status"] == "Running", 900, "update 0 beside iteration 1's rollouts")
    finally:
        driver.kill()
        driver.wait()
    assert record_of(run, 0)["status"] == "Running" and record_of(run, 1)["status"] == "Running"
    resumed = subprocess.run([sys.executable, "workflows/submit.py", "resume", "--run", "overlap", settings[0]],
                             cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    records = [record_of(run, i) for i in range(3)]
    assert [r["status"] for r in records] == ["Succeeded"] * 3 and records[0]["attempt"] == 1
    for n in (0, 1):  # rollouts n+1 started before update n ended, and the update of n+1 after it
        assert records[n + 1]["phase_times"]["rollouts"][0] < records[n]["phase_times"]["update"][1]
        assert records[n + 1]["phase_times"]["update"][0] >= records[n]["phase_times"]["reload"][1]
    for n, record in enumerate(records):
        staleness = record["staleness"]
        assert staleness["trained_version"] == n and staleness["max_staleness"] == 1 and staleness["dropped"] == 0
        assert staleness["samples"] == read_table(partition_url(str(run / "trajectories"), "overlap", n), "samples").num_rows
        assert staleness["max_behind"] <= 1
    versions = {}
    for call_log in (run / "calls" / "rollouts").glob("it*/calls.jsonl"):
        for one in map(json.loads, call_log.read_text().splitlines()):
            versions.setdefault(int(one["rollout_id"].split("-")[0][2:]), set()).add(one["weight_version"])
    assert versions[0] == {"0"} and versions[1] <= {"0", "1"} and versions[2] <= {"1", "2"}
    assert "0" in versions[1]  # iteration 1's first rollouts were served by version 0, while update 0 ran


# ---- the Argo driver and the follower (a fake Argo Server, moto S3, the real proxy and vLLM) ----

from test_workflows import FakeArgoServer, drive, fake_argo, s3_store  # noqa: E402,F401 (fixtures)

from steps import follow, manifest  # noqa: E402
from steps.contracts.manifest import IterationRecord  # noqa: E402


class CollectingArgo(FakeArgoServer):
    """The fake Argo Server with each Workflow's `collect` DAG node, advanced along `collect_script[name]`
    (default "" -> Running -> Succeeded) on each GET; `created` notes, at each creation, the others' phases."""

    def __init__(self) -> None:
        super().__init__()
        self.collect_script: dict[str, list[str]] = {}
        self.phases: dict[str, str] = {}
        self.created: list[tuple[str, dict]] = []

    def _status(self, name: str) -> dict:
        status = super()._status(name)
        phases = self.collect_script.setdefault(name, ["", "Running", "Succeeded"])
        collect = phases.pop(0) if len(phases) > 1 else phases[0]
        self.phases[name] = status.get("phase", "")
        if status:
            collect_id = node_id(name, f"{name}.collect")
            status["nodes"][collect_id] = {"id": collect_id, "name": f"{name}.collect", "type": "DAG",
                                           "templateName": "collect", "phase": collect}
        return status

    def handle(self, method: str, path: str, body: dict | None):
        if method == "POST" and not path.rstrip("/").endswith("lint") and path.count("/") == 4:
            self.created.append((body["workflow"]["metadata"]["name"], dict(self.phases)))
        return super().handle(method, path, body)


@pytest.fixture
def collecting_argo(fake_argo, monkeypatch):
    fake = CollectingArgo()
    yield fake
    fake.server.shutdown()


def test_the_driver_submits_the_next_iteration_once_the_collect_dag_succeeded_and_stays_s_ahead(
        collecting_argo: CollectingArgo, s3_store: str) -> None:
    fake = collecting_argo
    for i in range(3):  # each Workflow runs on well after its collect DAG succeeded: its update
        fake.script[f"openforge-ov-it{i}"] = ["", "Running", "Running", "Running", "Running", "Running", "Succeeded"]
    assert drive(fake, s3_store, "--harness", "codex", "run=ov", "iterations=3", "max_staleness=1") == 0
    created = dict(fake.created)
    assert list(created) == ["openforge-ov-it0", "openforge-ov-it1", "openforge-ov-it2"]
    assert created["openforge-ov-it1"]["openforge-ov-it0"] == "Running"  # submitted while update 0 ran
    assert created["openforge-ov-it2"]["openforge-ov-it0"] == "Succeeded"  # S = 1: only once iteration 0 ended
    assert created["openforge-ov-it2"]["openforge-ov-it1"] == "Running"
    records = manifest.read_iterations(f"{s3_store}/ov")
    assert [r.status for r in records.values()] == ["Succeeded"] * 3


def test_a_failed_update_stops_the_overlapped_run_and_resume_follows_what_is_running(
        collecting_argo: CollectingArgo, s3_store: str, capsys) -> None:
    fake = collecting_argo
    fake.script["openforge-of-it0"] = ["", "Running", "Running", "Running", "Failed"]  # its update failed
    fake.script["openforge-of-it1"] = ["", "Running"]  # its update waits for checkpoint 1, in vain
    assert drive(fake, s3_store, "--harness", "codex", "run=of", "iterations=3", "max_staleness=1") == 1
    assert "retry --run of --iteration 0" in capsys.readouterr().err
    assert [name for name, _ in fake.created] == ["openforge-of-it0", "openforge-of-it1"]  # never it2
    # A driver that died with iteration 0's update and iteration 1's collect running: resume follows both.
    manifest.record(f"{s3_store}/of", IterationRecord(0, "openforge-of-it0", status="Running"))
    fake.script["openforge-of-it0"] = ["Running", "Succeeded"]
    fake.script["openforge-of-it1"] = ["Running", "Running", "Succeeded"]
    assert drive(fake, s3_store, "resume", "--run", "of") == 0
    assert [name for name, _ in fake.created][2:] == ["openforge-of-it2"]  # the others followed, not made again
    records = manifest.read_iterations(f"{s3_store}/of")
    assert [(r.workflow, r.status) for r in records.values()] == [(f"openforge-of-it{i}", "Succeeded") for i in range(3)]


def test_retry_of_a_failed_update_retries_the_iteration_that_waited_for_it_and_follows_both(
        collecting_argo: CollectingArgo, s3_store: str, capsys) -> None:
    """Update 0 failed, so iteration 1's wait-checkpoint failed too: `retry --iteration 0` retries both (0 first,
    recorded Running before 1's wait reads it), follows them, and the run goes on (control: before the retry
    the run stopped with both Failed)."""
    fake = collecting_argo
    fake.script["openforge-or-it0"] = ["", "Running", "Running", "Running", "Failed"]
    fake.script["openforge-or-it1"] = ["", "Running", "Running", "Running", "Running", "Failed"]
    assert drive(fake, s3_store, "--harness", "codex", "run=or", "iterations=3", "max_staleness=1") == 1
    # the driver stopped at iteration 0; iteration 1's Workflow ended after it, recorded by its exit handler
    manifest.record(f"{s3_store}/or", IterationRecord(1, "openforge-or-it1", status="Failed"))
    assert {i: r.status for i, r in manifest.read_iterations(f"{s3_store}/or").items()} == {0: "Failed", 1: "Failed"}
    capsys.readouterr()
    assert drive(fake, s3_store, "retry", "--run", "or", "--iteration", "0") == 0
    retried = [path.split("/")[-2] for _, path, _, _ in fake.calls("PUT") if path.endswith("/retry")]
    assert retried == ["openforge-or-it0", "openforge-or-it1"]
    assert "iteration 1: retried with iteration 0" in capsys.readouterr().out
    records = manifest.read_iterations(f"{s3_store}/or")
    assert [(r.workflow, r.status) for r in records.values()] == [(f"openforge-or-it{i}", "Succeeded") for i in range(3)]


def test_resubmit_of_an_iteration_whose_checkpoint_a_later_update_used_is_one_sentence(
        collecting_argo: CollectingArgo, s3_store: str, capsys) -> None:
    """Resubmitting iteration 0 would rewrite checkpoint 1 under iteration 1, whose update trained on it: refused
    before anything is submitted (control: with iteration 1 Failed the resubmit goes ahead)."""
    run_url = f"{s3_store}/orr"
    assert drive(collecting_argo, s3_store, "--harness", "codex", "run=orr", "iterations=2", "max_staleness=1") == 0
    manifest.record(run_url, IterationRecord(0, "openforge-orr-it0", status="Failed"))
    capsys.readouterr()
    assert drive(collecting_argo, s3_store, "resubmit", "--run", "orr", "--iteration", "0") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: iteration 1 is Succeeded") and err.count("\n") == 1
    assert not any(path.endswith("/resubmit") for _, path, _, _ in collecting_argo.calls("PUT"))
    manifest.record(run_url, IterationRecord(1, "openforge-orr-it1", status="Failed"))
    drive(collecting_argo, s3_store, "resubmit", "--run", "orr", "--iteration", "0")
    assert any(path.endswith("/resubmit") for _, path, _, _ in collecting_argo.calls("PUT"))


def test_resume_of_an_overlapped_run_records_the_evaluation_an_ended_iteration_left_unrecorded(
        collecting_argo: CollectingArgo, s3_store: str) -> None:
    """The driver died after an eval_every iteration ended: its exit handler recorded the iteration (without its
    evaluation) and eval-0.json was never written. `resume` with S = 1 records it and runs nothing again
    (control: before resume the manifest has no evaluation 0)."""
    from test_eval import resume_records_a_missed_evaluation

    resume_records_a_missed_evaluation(collecting_argo, s3_store, "ovev", "max_staleness=1")


def test_the_wait_step_waits_for_a_whole_checkpoint_and_fails_when_its_iteration_failed(tmp_path: Path) -> None:
    run_url = str(tmp_path / "run")
    folder = Path(follow.checkpoint(run_url, 2))
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"w")  # weights without metrics.json: not complete yet
    assert not follow.complete(run_url, 2) and follow.newest(run_url, 0, 2) is None
    with pytest.raises(follow.FollowError, match="not complete within 0 s"):
        follow.wait_for(run_url, 2, poll_s=0.01, timeout_s=0)
    manifest.record(run_url, IterationRecord(1, "openforge-x-it1", status="Failed"))
    with pytest.raises(follow.FollowError, match="iteration 1 ended Failed .* checkpoint 2 will not be written"):
        follow.wait_for(run_url, 2, poll_s=0.01)
    (folder / "metrics.json").write_text("{}")  # the control: once whole, it is found
    assert follow.wait_for(run_url, 2, poll_s=0.01) == str(folder) and follow.newest(run_url, 0, 3) == 2
    manifest.record(run_url, IterationRecord(2, "openforge-x-it2", status="Error"))
    done = subprocess.run([sys.executable, "-m", "steps.follow", "wait", "--run-url", run_url, "--version", "3",
                           "--poll-s", "0.01"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr.startswith("error: ") and "Traceback" not in done.stderr


def test_the_wait_step_gives_up_after_the_update_timeout_when_no_record_ever_says_the_iteration_ended(
        tmp_path: Path) -> None:
    """A record left Running (a deleted Workflow, a lost controller) never ends the wait by itself: the
    Workflow's wait step passes `update_timeout_s`, and the step exits 1 with one sentence naming the iteration
    (control: the record's Failed, not the timeout, ends the wait in the test above)."""
    from workflows.commands import wait_checkpoint

    run_url = str(tmp_path / "run")
    manifest.record(run_url, IterationRecord(0, "openforge-x-it0", status="Running"))
    config = load_config(None, [f"store={tmp_path}", "run=run", "update_timeout_s=1"], check_dataset=False)
    command = wait_checkpoint(config, 1, python=sys.executable)
    assert command[-2:] == ["--timeout-s", "1"]
    done = subprocess.run([*command, "--poll-s", "0.05"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "not complete within 1 s" in done.stderr
    assert "does not say iteration 0 ended" in done.stderr


def test_the_follower_swaps_each_whole_checkpoint_into_a_running_serve(swap_proxy, tiny_model, tmp_path: Path) -> None:
    run_url = str(tmp_path / "run")
    folder = Path(follow.checkpoint(run_url, 1))
    build_tiny_model(folder, seed=1)
    served = []
    follower = threading.Thread(target=lambda: served.append(
        follow.follow(run_url, 0, 1, swap_proxy.client, tmp_path / "followed", poll_s=0.1)))
    follower.start()
    try:
        time.sleep(1)
        assert swap_proxy.client.health()["weight_version"] == "0"  # no metrics.json yet: not whole, not loaded
        (folder / "metrics.json").write_text("{}")
        follower.join(120)
        assert served == [1] and swap_proxy.client.health()["weight_version"] == "1"
    finally:
        follower.join(120)
        swap_proxy.client.update_weights(str(tiny_model), "0")


def test_the_reports_iteration_table_shows_staleness_only_where_it_was_recorded():
    from steps.report.index import iterations_table

    stale = iterations_table({0: {"status": "Succeeded", "staleness max versions behind": 1,
                                  "staleness samples dropped": 2}})
    assert "staleness max versions behind" in stale and "staleness samples dropped" in stale
    assert "staleness" not in iterations_table({0: {"status": "Succeeded"}})  # the control: an older run's records
