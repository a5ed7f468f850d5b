"""Rollouts: a real harness works a built-in task in the bubblewrap sandbox through the real proxy,
then the task's verifier grades it; infrastructure failures are never scored.

The upstream is `tests/scripted_model.py`, a double of vLLM's server (a small random model cannot
call tools): it answers with the task's oracle `solve.sh` as one shell tool call, then "done". The last
test runs the `direct` harness against the real vLLM on CPU instead.
"""

import json
import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from scripted_model import oracle_command
from steps.harnesses import HARNESSES
from steps.rollout import RolloutSpec, register, run_rollout
from steps.tasks import BUILTIN_DATASET, load_task
from test_harnesses import installed_exe

ADMIN_KEY = "test-admin-key"


def spec_for(proxy, task: Path, harness: str, tmp_path: Path, **kwargs) -> RolloutSpec:
    rollout_id = f"{harness}-{task.name}-{uuid.uuid4().hex[:6]}"
    return RolloutSpec(task=task, harness=harness, proxy_url=proxy.url, rollout_id=rollout_id,
                       out=tmp_path / rollout_id, admin_key=ADMIN_KEY, **kwargs)


def oracle(task_name: str) -> str:
    """The task's solve.sh as one shell command; some harnesses' shell tools run `sh`, not bash."""
    return oracle_command(BUILTIN_DATASET / task_name)


def tool_outputs(calls: list[dict]) -> list[str]:
    """What the harness sent back as tool results, as the last recorded request shows them."""
    request = calls[-1]["request"]
    return [json.dumps(m.get("content")) for m in request.get("messages", []) if m.get("role") == "tool"]


CASES = [pytest.param(harness, task, marks=() if harness == "direct" else pytest.mark.harness)  # direct: no CLI
         for harness in HARNESSES for task in ("hello-file", "csv-stats")
         if not (harness == "openclaw" and task == "csv-stats")]  # openclaw spends ~20 s starting; one task will do


@pytest.mark.parametrize("harness, task_name", CASES)
def test_the_oracle_as_tool_calls_earns_reward_1(harness, task_name, scripted, scripted_proxy, tmp_path):
    installed_exe(harness)  # skips when the harness is not installed
    scripted.set_commands([oracle(task_name)])
    spec = spec_for(scripted_proxy, BUILTIN_DATASET / task_name, harness, tmp_path)
    result = run_rollout(spec)
    context = f"{result}\n{Path(result.paths.get('harness_log', '/dev/null')).read_text()[-3000:]}"
    assert (result.status, result.reward) == ("ok", 1.0), context
    calls = scripted_proxy.calls(spec.rollout_id)
    assert result.num_calls == len(calls) == len(scripted.exchanges) >= 2, context
    assert all(call["status"] == "ok" for call in calls)
    assert json.loads((spec.out / "result.json").read_text())["reward"] == 1.0
    if harness in ("codex", "claude-code"):  # the ones that keep a session log under HOME
        assert result.paths["harness_logs"], "the harness's own session log is kept with the result"


def test_a_wrong_answer_earns_0_through_the_cli(scripted, scripted_proxy, tmp_path):
    scripted.set_commands(["echo goodbye > /app/answer.txt"])
    out = tmp_path / "cli"
    rollout_id = f"cli-{uuid.uuid4().hex[:6]}"
    argv = [sys.executable, "-m", "steps.rollout", "--task", str(BUILTIN_DATASET / "hello-file"), "--harness", "direct",
            "--proxy-url", scripted_proxy.url, "--rollout-id", rollout_id, "--sample", "1", "--out", str(out),
            "--model-name", "tiny"]
    done = subprocess.run(argv, env={**os.environ, "OPENFORGE_ADMIN_KEY": ADMIN_KEY}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    result = json.loads((out / "result.json").read_text())
    assert (result["status"], result["reward"], result["num_calls"], result["sample"]) == ("ok", 0.0, 2, 1)
    assert registration(scripted_proxy, rollout_id)["metadata"] == {"task": "hello-file", "harness": "direct", "sample": 1}
    assert Path(result["paths"]["verifier_output"], "reward.txt").read_text().strip() == "0"
    assert ((out / "status").read_text(), (out / "reward").read_text()) == ("ok", "0")


def registration(proxy, rollout_id: str) -> dict:
    """What the proxy's store keeps of a rollout's registration."""
    return json.loads((Path(proxy.store) / "rollouts" / rollout_id / "rollout.json").read_text())


def test_a_retried_step_runs_under_a_new_id_when_its_failed_attempt_holds_the_old_one(scripted, scripted_proxy, tmp_path):
    # Argo reruns a failed rollout step with the same parameters; the failed attempt's registration and
    # calls stay in the proxy's store, which refuses the id (409): the retry registers as ID-a2.
    scripted.set_commands([oracle("hello-file")])
    spec = spec_for(scripted_proxy, BUILTIN_DATASET / "hello-file", "direct", tmp_path, sample=3)
    scripted_proxy.register(spec.rollout_id)  # the failed attempt
    result = run_rollout(spec)
    assert (result.rollout_id, result.status, result.reward, result.sample) == (f"{spec.rollout_id}-a2", "ok", 1.0, 3)
    written = json.loads((spec.out / "result.json").read_text())
    assert (written["rollout_id"], written["sample"]) == (f"{spec.rollout_id}-a2", 3)
    assert registration(scripted_proxy, result.rollout_id)["metadata"]["sample"] == 3
    assert scripted_proxy.calls(spec.rollout_id) == [] and len(scripted_proxy.calls(result.rollout_id)) == result.num_calls
    # The local runner's second attempt starts at ID-a2, which that rerun holds now: one numbering for both.
    assert register(replace(spec, attempt=2), {})[0] == f"{spec.rollout_id}-a3"


def test_the_agent_cannot_see_the_verifier(scripted, scripted_proxy, tmp_path):
    scripted.set_commands(["ls -la /tests; cat /tests/test.sh; ls /logs/verifier; find / -name test.sh 2>/dev/null | head"])
    spec = spec_for(scripted_proxy, BUILTIN_DATASET / "hello-file", "direct", tmp_path)
    result = run_rollout(spec)
    (output,) = tool_outputs(scripted_proxy.calls(spec.rollout_id))
    assert "No such file or directory" in output and "reward.txt" not in output, output
    assert result.status == "ok" and result.reward == 0.0


def test_a_hanging_harness_is_stopped_and_leaves_nothing_running(scripted, scripted_proxy, tmp_path):
    marker = f"hang-{uuid.uuid4().hex[:8]}"
    scripted.set_commands([f"sleep 600; echo {marker}"])
    spec = spec_for(scripted_proxy, BUILTIN_DATASET / "hello-file", "direct", tmp_path, agent_timeout_s=4)
    result = run_rollout(spec)
    assert (result.status, result.reward) == ("agent_timeout", 0.0), result
    assert result.durations["agent_s"] < 30
    survivors = [pid for pid in os.listdir("/proc") if pid.isdigit() and marker in _cmdline(pid)]
    assert survivors == []


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_a_harness_that_cannot_start_is_an_infra_error(scripted, scripted_proxy, tmp_path, monkeypatch):
    monkeypatch.setattr(HARNESSES["direct"], "command", lambda instruction, workdir, exe: ["/no/such/harness"])
    result = run_rollout(spec_for(scripted_proxy, BUILTIN_DATASET / "hello-file", "direct", tmp_path))
    assert (result.status, result.reward) == ("infra_error", None) and "could not start" in result.error


def test_a_harness_that_makes_no_model_call_is_an_infra_error(scripted, scripted_proxy, tmp_path, monkeypatch):
    monkeypatch.setattr(HARNESSES["direct"], "command", lambda instruction, workdir, exe: ["bash", "-c", "exit 1"])
    result = run_rollout(spec_for(scripted_proxy, BUILTIN_DATASET / "hello-file", "direct", tmp_path))
    assert (result.status, result.reward) == ("infra_error", None) and "no model call that was answered" in result.error


def test_an_unreachable_proxy_is_an_infra_error_with_exit_code_3(tmp_path):
    argv = [sys.executable, "-m", "steps.rollout", "--task", str(BUILTIN_DATASET / "hello-file"), "--harness", "direct",
            "--proxy-url", "http://127.0.0.1:9", "--rollout-id", "nowhere", "--out", str(tmp_path)]
    done = subprocess.run(argv, env={**os.environ, "OPENFORGE_ADMIN_KEY": ADMIN_KEY}, capture_output=True, text=True)
    result = json.loads((tmp_path / "result.json").read_text())
    assert done.returncode == 3 and result["status"] == "infra_error" and "unreachable" in result["error"]
    # What the Argo node shows: the result's status, and no reward.
    assert ((tmp_path / "status").read_text(), (tmp_path / "reward").read_text()) == ("infra_error", "none")


def test_a_verifier_that_writes_no_reward_scores_0_not_an_infra_error(scripted, scripted_proxy, tmp_path):
    """Grading runs in a pristine root, so a verifier left without a reward can only have been broken by the
    agent's work (or the task, which `steps.tasks check` catches): a 0, never a retried infra_error."""
    task = tmp_path / "broken-verifier"
    shutil.copytree(BUILTIN_DATASET / "hello-file", task)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 'verifier bug' >&2\nexit 2\n")
    scripted.set_commands([oracle("hello-file")])
    result = run_rollout(spec_for(scripted_proxy, task, "direct", tmp_path))
    assert (result.status, result.reward) == ("ok", 0.0)
    assert "wrote no reward" in result.error and "exit code 2" in result.error


def test_direct_harness_on_the_real_vllm_records_every_call(proxy, vllm_server, tmp_path):
    real = proxy(vllm_server, extra=["--max-tokens-cap", "32"])
    spec = spec_for(real, BUILTIN_DATASET / "hello-file", "direct", tmp_path, agent_timeout_s=120)
    result = run_rollout(spec)
    calls = real.calls(spec.rollout_id)
    assert result.status == "ok" and result.reward in (0.0, 1.0), result
    assert result.num_calls == len(calls) >= 1
    assert all(c["status"] == "ok" and len(c["response_token_ids"]) == len(c["response_logprobs"]) > 0 for c in calls)
    assert calls[0]["request"]["messages"][1] == {"role": "user", "content": load_task(spec.task).instruction}


def test_a_dead_model_server_is_an_infra_error_not_a_zero(proxy, tmp_path):
    from steps.net import free_port

    dead = proxy(f"http://127.0.0.1:{free_port()}", extra=["--model-name", "tiny"])
    result = run_rollout(spec_for(dead, BUILTIN_DATASET / "hello-file", "direct", tmp_path))
    assert (result.status, result.reward) == ("infra_error", None)
    assert "no model call that was answered" in result.error and "unreachable" in result.error


def test_outputs_that_cannot_be_written_are_left_absent(tmp_path):
    """No folder to write into: no exception, nothing written; Argo then shows the template's defaults."""
    from steps.contracts.rollout import RolloutResult
    from steps.rollout import write_outputs

    write_outputs(tmp_path / "missing", RolloutResult("r", "t", "direct", "ok", 1.0))
    assert not (tmp_path / "missing").exists()
    write_outputs(tmp_path, RolloutResult("r", "t", "direct", "agent_timeout", 0.0))  # the control
    assert ((tmp_path / "status").read_text(), (tmp_path / "reward").read_text()) == ("agent_timeout", "0")
