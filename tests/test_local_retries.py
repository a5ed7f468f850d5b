"""The local runner's retries, without vLLM: a rollout step that fails with an infra error (exit code 3) on
its first attempt is run again as `ID-a2` in its own folder with the plan's sample number; the iteration's
results folder then holds both results, and the trajectory tables give every row the plan's number."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from steps.trajectories.collect import collect, load_results
from steps.contracts import layout
from steps.contracts.rollout import PlannedRollout, RolloutResult
from workflows import local
from workflows.config import load_config

PLANNED = [PlannedRollout(task="steps/tasks/builtin/hello-file", sample=s, rollout_id=f"it0-hello-file-s{s}", image="",
                          deadline_s=480, cpus=1, memory_mb=1024, storage_mb=1024, gpus=0) for s in (0, 1)]


def fake_rollout_step(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Plays `steps.rollout`: writes OUT/result.json as the id it runs under; sample 0's first attempt fails."""
    flag = lambda name, default=None: argv[argv.index(name) + 1] if name in argv else default  # noqa: E731
    planned, attempt, sample = flag("--rollout-id"), int(flag("--attempt", "1")), int(flag("--sample"))
    failed = sample == 0 and attempt == 1
    out = Path(flag("--out"))
    out.mkdir(parents=True)
    (out / layout.RESULT_FILE).write_text(json.dumps({
        "rollout_id": planned if attempt == 1 else f"{planned}-a{attempt}", "task": "hello-file", "sample": sample,
        "harness": "direct", "status": "infra_error" if failed else "ok", "reward": None if failed else 1.0}))
    return subprocess.CompletedProcess(argv, 3 if failed else 0, "", "")


def test_a_retried_rollout_keeps_its_sample_number_in_every_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(local.subprocess, "run", fake_rollout_step)
    config = load_config(None, [f"store={tmp_path}", "run=r", "rollout_retries=2", "harness=direct"])
    results = local.run_rollouts(config, 0, PLANNED, "http://proxy:8100", {})
    assert [(r.rollout_id, r.status, r.sample) for r in results] == \
        [("it0-hello-file-s0-a2", "ok", 0), ("it0-hello-file-s1", "ok", 1)]
    folder = Path(layout.results_url(config.run_url, 0))
    assert sorted(p.name for p in folder.iterdir()) == ["it0-hello-file-s0", "it0-hello-file-s0-a2", "it0-hello-file-s1"]

    loaded = load_results(str(folder))  # what `steps.trajectories` reads: the failed attempt's result too
    calls = {r.rollout_id: [{"call_index": 0, "status": "ok", "prompt_token_ids": [1], "response_token_ids": [2],
                                "response_logprobs": [-0.5], "weight_version": "0"}] for r in loaded}
    tables = collect(loaded, calls, "r", 0)[0].tables()
    for name in ("rollouts", "calls", "samples"):
        assert {(row["rollout_id"], row["sample"]) for row in tables[name].to_pylist()} >= \
            {("it0-hello-file-s0-a2", 0), ("it0-hello-file-s1", 1)}, name
    assert {(row["rollout_id"], row["sample"]) for row in tables["rollouts"].to_pylist()} == \
        {("it0-hello-file-s0", 0), ("it0-hello-file-s0-a2", 0), ("it0-hello-file-s1", 1)}
    # The failed attempt is on record but never trained on: sample 0 is trained once, from its retry.
    assert sorted((s["sample"], s["rollout_id"]) for s in tables["samples"].to_pylist()) == \
        [(0, "it0-hello-file-s0-a2"), (1, "it0-hello-file-s1")]


def test_the_built_rollout_command_is_the_one_the_step_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--sample`, `--attempt` and `--model-name` as `workflows.commands.rollout` builds them reach the step's spec."""
    from steps import rollout
    from workflows import commands

    seen = {}
    monkeypatch.setenv("OPENFORGE_ADMIN_KEY", "k")
    monkeypatch.setattr(rollout, "run_rollout", lambda spec: seen.setdefault("spec", spec) and RolloutResult(
        rollout_id="x", task="t", harness="direct", status="ok", reward=1.0))
    config = load_config(None, ["harness=direct", "model_name=qwen3-4b"])
    argv = commands.rollout(config, "steps/tasks/builtin/hello-file", "it0-hello-file-s3", 3, "http://p:8100",
                            "/tmp/never-written", python=sys.executable, attempt=2)
    assert rollout.main(argv[3:]) == 0
    spec = seen["spec"]
    assert (spec.rollout_id, spec.sample, spec.attempt, spec.model_name) == ("it0-hello-file-s3", 3, 2, "qwen3-4b")


def test_the_steps_get_none_of_the_drivers_process_group_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver inside a torchrun launch, or one whose process made its own group (the train suite, which runs updates
    in-process), has MASTER_PORT and friends set to a port already bound: an update step that inherited them failed
    with EADDRINUSE. They are left out of every step's environment; the control: the driver has them, and the other
    variables pass."""
    for name, value in {"MASTER_PORT": "29500", "MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1",
                        "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0", "OPENFORGE_X": "kept"}.items():
        monkeypatch.setenv(name, value)
    env = local.step_env("admin")
    assert not set(local.LAUNCHER_ENV) & set(env) and env["OPENFORGE_X"] == "kept"
    assert all(name in os.environ for name in local.LAUNCHER_ENV)


@pytest.mark.parametrize("broken", ["base_model", "start_serve"])
def test_a_model_that_cannot_be_fetched_or_a_serve_that_cannot_start_is_one_sentence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, broken: str) -> None:
    """The run ends with exit code 1 and one `error:` line naming the step and its log, not a traceback (a hub that
    cannot be reached once printed StepFailed's traceback). The steps are replaced: the failure is what is tested."""
    def fails(*args, **kwargs):
        raise local.StepFailed(f"step {broken} failed with exit code 1; {tmp_path}/logs/{broken}.log:\nerror: down")

    monkeypatch.setattr(local, "base_model", fails if broken == "base_model" else lambda config: "/models/m")
    monkeypatch.setattr(local, "start_serve", fails)
    config = load_config(None, [f"store={tmp_path}", "run=r", "harness=direct"])
    assert local.run_local(config) == 1
    err = capsys.readouterr().err
    assert f"error: run r: step {broken} failed with exit code 1" in err and "Traceback" not in err
