"""Eval runs: the summary's numbers, the plan's ids, the command line and its errors, the Workflows, the
driver, and evaluations end to end on this machine.

    .venv/bin/python -m pytest -q tests/test_eval.py -m "not vllm and not slow"   # seconds
    .venv/bin/python -m pytest -q tests/test_eval.py                              # + real vLLM on CPU, minutes
"""

import dataclasses
import doctest
import importlib
import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from steps import evaluate, manifest, plan
from steps.tasks import load_dataset
from steps.contracts import layout
from steps.contracts.manifest import IterationRecord
from steps.contracts.rollout import PlannedRollout, RolloutResult
from steps.proxy import results
from steps.proxy.config import ProxyConfig
from workflows import commands, submit
from workflows.config import load_config
from workflows.evaluation import evaluation_workflow
from workflows.iteration import APP_ROLLOUTS_FILE, iteration_workflow
from workflows.lint import semantic_problems
from test_workflows import (NO_CLUSTER_EGRESS, FakeArgoServer, fake_argo,  # noqa: F401 - the fake Argo Server and
                            s3_store)  # its fixtures

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "configs" / "cluster-example.yaml"
BUILTIN = REPO / "steps" / "tasks" / "builtin"
pytestmark = pytest.mark.filterwarnings("ignore::pydantic.PydanticDeprecatedSince20")


def result(task: str, sample: int, reward: float | None, attempt: int = 1, status: str = "ok", calls: int = 2,
           tokens: int = 10, seconds: float = 4.0) -> RolloutResult:
    """A rollout's result.json as `steps.rollout` writes it (the fields the summary reads)."""
    rollout_id = plan.attempt_id(f"ev0-{task}-s{sample}", attempt)
    if status == "infra_error":
        reward, calls, tokens = None, 0, 0
    return RolloutResult.from_json({"rollout_id": rollout_id, "task": task, "sample": sample, "status": status,
                                    "reward": reward, "num_calls": calls, "response_tokens": tokens,
                                    "durations": {"total_s": seconds}})


# ---- the summary ----

def test_an_infra_error_retried_to_a_finish_is_counted_and_changes_no_number() -> None:
    """A rollout whose first attempt was an infra error and whose retry passed: the infra error is counted, and
    every other number equals that of the results without it (control: without the retry's result, the try
    is missing, a failure)."""
    clean = [result("a", 0, 1.0, attempt=2), result("a", 1, 0.0), result("a", 2, 1.0)]
    failure = [result("a", 0, None, status="infra_error", seconds=99.0)]
    with_infra, without = evaluate.summarize(clean + failure, k=2), evaluate.summarize(clean, k=2)
    assert with_infra["overall"]["infra_errors"] == 1 and without["overall"]["infra_errors"] == 0
    assert {key: value for key, value in with_infra["overall"].items() if key != "infra_errors"} == \
        {key: value for key, value in without["overall"].items() if key != "infra_errors"}
    unretried = evaluate.summarize(clean[1:] + failure, k=2)["overall"]
    assert unretried["missing"] == 1 and unretried["pass_at_1"] < without["overall"]["pass_at_1"]


def killed(result: RolloutResult, process: str, by: str) -> RolloutResult:
    """`result` with a limit's kill in its `killed` list, as the runner writes it."""
    return dataclasses.replace(result, harness_exit_code=137, killed=[{"process": process, "by": by, "count": 1}])


def test_tries_whose_harness_a_limit_killed_are_counted_per_task_and_overall_and_the_table_warns() -> None:
    """Before: a memory-killed harness scored a plain 0 and nothing in the summary or the table said so. Counted:
    a harness killed by memory or pids in a try. Not counted: the agent's own processes killed, the agent timeout
    (an `agent_timeout` already), an infra error's kill (not a try), a result written before `killed` existed."""
    results = [killed(result("a", 0, 0.0), "harness", "memory"), dataclasses.replace(result("a", 1, 1.0), killed=[]),
               killed(result("b", 0, 0.0), "harness", "pids"), result("b", 1, 1.0),  # an older result: no `killed`
               killed(result("c", 0, 0.0), "agent", "memory"), killed(result("c", 1, 0.0, status="agent_timeout"),
                                                                      "harness", "time"),
               killed(result("c", 1, None, status="infra_error"), "harness", "memory")]
    summary = evaluate.summarize(results, k=2)
    assert {task: numbers["harness_killed"] for task, numbers in summary["tasks"].items()} == {"a": 1, "b": 1, "c": 0}
    assert summary["overall"]["harness_killed"] == 2 and summary["harness_killed"] == {"memory": 1, "pids": 1}
    assert summary["overall"]["pass_at_1"] == 1 / 3  # each killed try is still a graded try
    lines = evaluate.format_table(summary).splitlines()
    header = lines[0].split()
    assert [line.split()[header.index("killed")] for line in lines[2:5]] == ["1", "1", "0"]
    assert lines[6].split()[header.index("killed")] == "2"
    (warning,) = [line for line in lines if "harness" in line]
    assert warning.startswith("warning: evaluation: a limit killed the harness in 2 of 6 rollouts (memory 1, pids 1)")
    assert "raise harness_memory_mb" in warning


def test_an_evaluation_without_a_killed_harness_counts_zero_and_warns_nothing() -> None:
    """Control: the same tries without a kill; and a summary.json written before the column shows '-' there."""
    summary = evaluate.summarize([result(task, s, 1.0) for task in "ab" for s in range(2)], k=2)
    assert summary["overall"]["harness_killed"] == 0 and summary["harness_killed"] == {"memory": 0, "pids": 0}
    table = evaluate.format_table(summary)
    assert "harness" not in table
    older = {**summary, "tasks": {t: {k: v for k, v in n.items() if k != "harness_killed"} for t, n in summary["tasks"].items()},
             "overall": {k: v for k, v in summary["overall"].items() if k != "harness_killed"}}
    del older["harness_killed"]
    lines = evaluate.format_table(older).splitlines()
    assert lines[-1].split()[lines[0].split().index("killed")] == "-"


@pytest.mark.parametrize("b_results", [
    [result("b", 0, None, status="infra_error"), result("b", 1, None, status="infra_error"), result("b", 2, 0.0)],
    [result("b", s, None, status="infra_error") for s in range(3)]], ids=["two-infra-errors", "only-infra-errors"])
def test_a_try_without_a_finished_attempt_is_missing_and_fails(b_results: list[dict]) -> None:
    """a passes 3 of 3; b's tries end as infra errors (one or all of them): each such try is `missing` and
    counts as a failure, so b has its k tries, pass^k never exceeds pass@1, and infra errors cannot raise the
    score (before, b's infra errors were left out: overall pass@3 = pass^3 = 1.0, or b dropped out)."""
    summary = evaluate.summarize([result("a", s, 1.0) for s in range(3)] + b_results, k=3)
    b, overall = summary["tasks"]["b"], summary["overall"]
    assert (b["tries"], b["passes"], b["pass_at_k"], b["pass_hat_k"]) == (3, 0, 0.0, 0.0)
    assert b["missing"] == sum(r.status == "infra_error" for r in b_results)
    assert (overall["pass_at_1"], overall["pass_at_k"], overall["pass_hat_k"]) == (0.5, 0.5, 0.5)
    assert summary["missing"] == [f"ev0-b-s{s}" for s in range(3) if b_results[s].status == "infra_error"]
    assert "each counts as a failed try" in evaluate.format_table(summary)


def test_a_rollout_killed_before_writing_its_result_is_missing(tmp_path: Path, capsys) -> None:
    """Only one builtin task's tries wrote a result (the others' pods were killed): with the dataset, every
    planned try is counted, and the others are missing failures (control: without --dataset the vanished
    tasks are unknown, and the overall pass@1 reads 1.0)."""
    tasks, _ = load_dataset(BUILTIN)
    names = sorted(task.name for task in tasks)
    for r in [result(names[0], s, 1.0) for s in range(2)]:
        (tmp_path / "results" / r.rollout_id).mkdir(parents=True)
        (tmp_path / "results" / r.rollout_id / "result.json").write_text(json.dumps(r.to_json()))
    argv = ["--results", str(tmp_path / "results"), "--k", "2", "--out", str(tmp_path / "s.json")]
    assert evaluate.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["overall"]["pass_at_1"] == 1.0  # the control
    assert evaluate.main([*argv, "--dataset", str(BUILTIN)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert sorted(summary["tasks"]) == names and summary["overall"]["missing"] == 2 * (len(names) - 1)
    assert summary["overall"]["pass_at_1"] == pytest.approx(1 / len(names)) and summary["skipped_tasks"] == {}


def test_pass_at_k_and_pass_hat_k_per_task_and_overall() -> None:
    """Hand-computed values: a passes 3 of 3, b 1 of 3, c 0 of 3, d has only infra errors (2 missing tries,
    each a failure), at k=2."""
    results = [result("a", s, 1.0) for s in range(3)] + [result("b", 0, 1.0), result("b", 1, 0.0), result("b", 2, 0.5)]
    results += [result("c", s, 0.0, calls=4, tokens=40, seconds=10.0) for s in range(3)]
    results += [result("d", 0, None, status="infra_error"), result("d", 0, None, attempt=2, status="infra_error")]
    summary = evaluate.summarize(results, k=2)
    a, b, c, d = (summary["tasks"][t] for t in "abcd")
    assert (a["pass_at_1"], a["pass_at_k"], a["pass_hat_k"]) == (1.0, 1.0, 1.0)
    assert b["passes"] == 1 and b["pass_at_1"] == pytest.approx(1 / 3)
    assert b["pass_at_k"] == pytest.approx(1 - 1 / 3)  # 1 - C(2,2)/C(3,2)
    assert b["pass_hat_k"] == 0.0 and b["mean_reward"] == pytest.approx(0.5)  # C(1,2) = 0: never 2 passes
    assert (c["pass_at_k"], c["pass_hat_k"], c["mean_calls"], c["mean_tokens"]) == (0.0, 0.0, 4.0, 40.0)
    assert (d["tries"], d["missing"], d["infra_errors"], d["pass_at_1"], d["pass_at_k"], d["mean_calls"]) == \
        (2, 2, 2, 0.0, 0.0, None)
    overall = summary["overall"]  # macro averages over the tasks; costs per finished try
    assert (overall["tries"], overall["passes"], overall["missing"], overall["infra_errors"]) == (11, 4, 2, 2)
    assert overall["pass_at_1"] == pytest.approx((1 + 1 / 3 + 0 + 0) / 4)
    assert overall["pass_at_k"] == pytest.approx((1 + 2 / 3 + 0 + 0) / 4)
    assert overall["pass_hat_k"] == pytest.approx(1 / 4)
    assert overall["mean_calls"] == pytest.approx((6 * 2 + 3 * 4) / 9)
    assert overall["mean_duration_s"] == pytest.approx((6 * 4.0 + 3 * 10.0) / 9)


def test_a_planned_rollout_is_one_try_however_many_attempts_finished() -> None:
    """A rerun step whose earlier attempt also finished: its last finished attempt is its one try."""
    results = [result("a", 0, 0.0), result("a", 0, 1.0, attempt=3), result("a", 1, 1.0)]
    task = evaluate.summarize(results, k=2)["tasks"]["a"]
    assert (task["tries"], task["passes"], task["pass_hat_k"]) == (2, 2, 1.0)


def test_a_broken_task_the_plan_skipped_is_named_in_the_summary(tmp_path: Path, capsys) -> None:
    """A dataset with one broken task: the plan skips it with a warning, and summary.json says which and why,
    so that an evaluation over fewer tasks is never silent (control: the good task is counted as usual)."""
    dataset = tmp_path / "tasks"
    shutil.copytree(BUILTIN / "hello-file", dataset / "hello-file")
    (dataset / "broken").mkdir()
    (dataset / "broken" / "task.toml").write_text("this is [ not toml")
    r = result("hello-file", 0, 1.0)
    (tmp_path / "results" / r.rollout_id).mkdir(parents=True)
    (tmp_path / "results" / r.rollout_id / "result.json").write_text(json.dumps(r.to_json()))
    assert evaluate.main(["--results", str(tmp_path / "results"), "--k", "1", "--out", str(tmp_path / "s.json"),
                          "--dataset", str(dataset)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert list(summary["skipped_tasks"]) == ["broken"] and summary["skipped_tasks"]["broken"]
    assert list(summary["tasks"]) == ["hello-file"] and summary["overall"]["pass_at_1"] == 1.0
    assert evaluate.format_table(summary).endswith("warning: 1 broken tasks were skipped (not evaluated): broken")


def test_the_table_is_aligned_and_a_task_name_cannot_break_it() -> None:
    """One row per task and the overall row, columns aligned; a control character is shown escaped."""
    summary = evaluate.summarize([result("hello-file", 0, 1.0), result("evil\x1b[2J\nname", 0, 0.0)], k=3)
    lines = evaluate.format_table(summary).splitlines()
    assert lines[0].split() == ["task", "tries", "pass@1", "pass@3", "pass^3", "reward", "missing", "infra", "killed",
                                "calls", "tokens", "seconds"]
    lines = lines[:-1]  # the warning: each task has 2 missing tries of its 3
    assert len(lines) == 6 and len({len(line) for line in lines}) == 1  # header, rule, 2 tasks, rule, overall
    assert "\x1b" not in "".join(lines) and "evil\\x1b[2J\\nname" in lines[2] and lines[-1].startswith("overall")


def test_the_cli_writes_summary_json_prints_the_table_and_one_json_line(tmp_path: Path) -> None:
    results = tmp_path / "results"
    for r in [result("a", 0, 1.0), result("a", 1, 0.0), result("a", 0, None, status="infra_error", attempt=2)]:
        (results / r.rollout_id).mkdir(parents=True)
        (results / r.rollout_id / "result.json").write_text(json.dumps(r.to_json()))
    out = tmp_path / "eval" / "summary.json"
    argv = [sys.executable, "-m", "steps.evaluate", "--results", str(results), "--k", "2", "--out", str(out),
            "--harness", "direct", "--dataset", "steps/tasks/builtin", "--checkpoint", "runs/tiny-model",
            "--model", "tiny", "--iteration", "0"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    summary = json.loads(line)
    assert summary == json.loads(out.read_text())
    assert set(summary) == {"k", "harness", "dataset", "checkpoint", "model", "iteration", "tasks", "overall",
                            "missing", "harness_killed", "skipped_tasks"}
    assert set(summary["overall"]) == {"tries", "passes", "pass_at_1", "pass_at_k", "pass_hat_k", "mean_reward",
                                       "missing", "infra_errors", "harness_killed", "mean_calls", "mean_tokens",
                                       "mean_duration_s"}
    a = summary["tasks"]["a"]  # not a builtin task: counted beside the plan's, each of which has no result
    assert (a["tries"], a["missing"], a["infra_errors"], a["pass_at_k"]) == (2, 0, 1, 1.0)
    assert summary["overall"]["missing"] == 2 * len(load_dataset(BUILTIN)[0])
    assert "pass@2" in done.stderr and "overall" in done.stderr


@pytest.mark.parametrize("k, expected", [("0", "--k must be a whole number from 1 to 100 (tries per task), got '0'"),
                                         ("two", "got 'two'"), ("101", "got '101'")])
def test_the_cli_refuses_a_bad_k_and_missing_results_in_one_sentence(k: str, expected: str, tmp_path: Path, capsys) -> None:
    assert evaluate.main(["--results", str(tmp_path), "--k", k, "--out", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1
    assert evaluate.main(["--results", str(tmp_path), "--k", "1", "--out", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no rollout results under" in err and len(err.splitlines()) == 1 and not (tmp_path / "s.json").exists()


# ---- the plan ----

def test_the_eval_plan_is_every_task_times_k_under_ids_no_training_rollout_has() -> None:
    tasks, _ = load_dataset(BUILTIN)
    planned = plan.plan(tasks, 2, tasks_per_iteration=1, samples_per_task=3, root=REPO, evaluation=True)
    assert len(planned) == 3 * len(tasks) and len({p.rollout_id for p in planned}) == len(planned)
    assert {p.task.rsplit("/", 1)[1] for p in planned} == {t.name for t in tasks}
    assert planned[0].rollout_id == f"ev2-{sorted(t.name for t in tasks)[0]}-s0"
    assert all(p.rollout_id.startswith("ev2-") and p.rollout_id.endswith(f"-s{p.sample}") for p in planned)
    training = plan.plan(tasks, 2, tasks_per_iteration=len(tasks), samples_per_task=3, root=REPO)
    assert {p.rollout_id for p in training}.isdisjoint({p.rollout_id for p in planned})
    assert {(p.task, p.sample) for p in training} == {(p.task, p.sample) for p in planned}  # the same work


def test_the_eval_plan_refuses_a_k_beyond_the_cap(capsys) -> None:
    """An evaluation's k is at most MAX_EVAL_K (control: the cap itself is planned)."""
    with pytest.raises(SystemExit) as refused:
        plan.main(["--eval", "--dataset", str(BUILTIN / "hello-file"), "--iteration", "0",
                   "--samples-per-task", str(plan.MAX_EVAL_K + 1)])
    assert refused.value.code == 2 and f"must be 1 to {plan.MAX_EVAL_K}" in capsys.readouterr().err
    assert plan.main(["--eval", "--dataset", str(BUILTIN / "hello-file"), "--iteration", "0",
                      "--samples-per-task", str(plan.MAX_EVAL_K)]) == 0
    assert len(json.loads(capsys.readouterr().out)) == plan.MAX_EVAL_K


def test_the_eval_plan_command_is_the_one_the_step_parses() -> None:
    config = load_config(None, ["run=e", "eval_k=2", "dataset=steps/tasks/toy", "eval_dataset=steps/tasks/builtin"])
    argv = commands.plan(config, 0, python=sys.executable, evaluation=True)
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    items = json.loads(done.stdout)
    assert len(items) == 2 * len(load_dataset(BUILTIN)[0]) and items[0]["rollout_id"].startswith("ev0-")
    refused = subprocess.run(argv[:argv.index("--eval")] + argv[argv.index("--eval") + 1:], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--tasks-per-iteration is required" in refused.stderr


# ---- the command line ----

def training_run(store: Path, name: str = "trained", iterations_written: int = 1) -> Path:
    """A training run in a local store as the runner leaves it: its manifest and its checkpoints' folders."""
    config = load_config(None, [f"store={store}", f"run={name}", "model=/models/base"])
    manifest.write_run_config(config.run_url, config.to_dict())
    for iteration in range(1, iterations_written + 1):
        Path(config.checkpoint_url(iteration)).mkdir(parents=True)
        manifest.record(config.run_url, IterationRecord(iteration - 1, "local", status="Succeeded"))
    return Path(config.run_url)


@pytest.mark.parametrize("argv, expected", [
    (["--model", "m", "--checkpoint", "trained:1"], "give the model to evaluate with --model PATH or with "
                                                    "--checkpoint RUN:ITERATION, not both"),
    (["--checkpoint", "ghost:1"], "--checkpoint ghost:1: no run named 'ghost' in the store"),
    (["--checkpoint", "trained:2"], "--checkpoint trained:2: run 'trained' has no checkpoint for iteration 2"),
    (["--checkpoint", "half:1"], "--checkpoint half:1: run 'half' has no checkpoint for iteration 1 (its iteration 0 "
                                 "has not succeeded"),
    (["--checkpoint", "evaluated:0"], "--checkpoint evaluated:0: run 'evaluated' is an eval run"),
    (["--checkpoint", "trained"], "--checkpoint must be RUN:ITERATION"),
    (["--k", "0"], "--k must be a whole number from 1 to 100 (tries per task), got '0'"),
    (["--k", "three"], "--k must be a whole number from 1 to 100 (tries per task), got 'three'"),
    (["--k", "100000000000000000000"], "--k must be a whole number from 1 to 100 (tries per task), got '1000"),
    (["eval_k=101"], "config key 'eval_k' must be at most 100 (tries per task), got 101"),
    (["--upstream-model", "m"], "config key 'upstream_model' names the model an upstream serves; give the upstream"),
    (["--dataset", "no/such/tasks"], "config key 'dataset': 'no/such/tasks' does not exist"),
    (["--upstream", "ftp://x"], "config key 'upstream' must be an http:// or https:// URL"),
    (["--upstream", "http://x:8000", "--model", "m"], "--upstream evaluates the model that server serves"),
])
def test_eval_errors_are_one_sentence(argv: list[str], expected: str, tmp_path: Path, monkeypatch, capsys) -> None:
    """Each bad eval command stops with exit code 2 and one line on stderr, before any run is recorded."""
    monkeypatch.delenv("ARGO_SERVER", raising=False)
    training_run(tmp_path)
    half = training_run(tmp_path, "half")  # its update wrote a folder, then failed
    manifest.record(str(half), IterationRecord(0, "local", status="Failed"))
    evaluated = load_config(None, [f"store={tmp_path}", "run=evaluated"])
    manifest.write_run_config(evaluated.run_url, evaluated.to_dict(), evaluates={"checkpoint": "m"})
    monkeypatch.setattr("workflows.local.run_local_eval", lambda *a: pytest.fail("a bad eval must not start"))
    code = submit.main(["eval", "--harness", "direct", *argv, f"store={tmp_path}", "run=ev"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and expected in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "ev").exists()


def test_checkpoint_resolves_through_the_runs_manifest(tmp_path: Path, monkeypatch) -> None:
    """`--checkpoint RUN:N` evaluates `layout.checkpoint_url` of that run (0: its base model); the eval's
    config and what it evaluates go to the local runner."""
    monkeypatch.delenv("ARGO_SERVER", raising=False)
    run = training_run(tmp_path)
    seen = []
    monkeypatch.setattr("workflows.local.run_local_eval", lambda config, evaluates: seen.append((config, evaluates)) or 0)
    for spec in ("trained:1", "trained:0"):
        assert submit.main(["eval", "--harness", "direct", "--checkpoint", spec, "--k", "2", f"store={tmp_path}"]) == 0
    (first, evaluates), (base, _) = seen
    assert first.model == evaluates["checkpoint"] == layout.checkpoint_url(str(run), 1, "/models/base")
    assert (evaluates["run"], evaluates["iteration"], first.eval_k) == ("trained", 1, 2)
    assert base.model == "/models/base" and first.run.startswith("eval-direct-")


def test_options_of_eval_are_refused_elsewhere_and_upstream_for_training(monkeypatch, capsys) -> None:
    """`--k` belongs to eval; a training run with `upstream` is refused (control: without it, it starts)."""
    monkeypatch.delenv("ARGO_SERVER", raising=False)
    monkeypatch.setattr("workflows.local.run_local", lambda config: 0)
    assert submit.main(["--harness", "direct", "--k", "3"]) == 2
    assert "--k is a flag of `python workflows/submit.py eval`" in capsys.readouterr().err
    assert submit.main(["--harness", "direct", "upstream=http://127.0.0.1:8000"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: config key 'upstream' is for evaluations (`python workflows/submit.py eval --upstream URL`); "
                   "a training run serves its own checkpoints with vLLM")
    assert submit.main(["--harness", "direct"]) == 0


def test_locally_only_serve_gets_the_upstreams_key(tmp_path: Path, monkeypatch) -> None:
    """OPENFORGE_UPSTREAM_API_KEY (and the judge's, OPENFORGE_JUDGE_UPSTREAM_API_KEY) reaches the serve step and no
    other (a rollout's harness, agent and verifier never see it); control: the driver's own environment has it.
    Popen is replaced to catch the environment serve is started with, without starting it."""
    from workflows import local

    monkeypatch.setenv("OPENFORGE_UPSTREAM_API_KEY", "upstream-secret")
    monkeypatch.setenv("OPENFORGE_JUDGE_UPSTREAM_API_KEY", "judge-secret")  # the judge's key: the same rule
    env = local.step_env("admin")
    assert os.environ["OPENFORGE_UPSTREAM_API_KEY"] == "upstream-secret"  # the control
    assert "OPENFORGE_UPSTREAM_API_KEY" not in env and env["OPENFORGE_ADMIN_KEY"] == "admin"
    assert "OPENFORGE_JUDGE_UPSTREAM_API_KEY" not in env
    started = []

    class Exited:
        returncode = 1

        def __init__(self, argv, env, **kwargs) -> None:
            started.append(env)

        def poll(self) -> int:
            return 1

    monkeypatch.setattr(local.subprocess, "Popen", Exited)
    config = load_config(None, [f"store={tmp_path}", "run=r", "upstream=http://127.0.0.1:9", "upstream_model=m"])
    with pytest.raises(local.StepFailed):
        local.start_serve(config, "unused", 0, env, tmp_path)
    assert started[0]["OPENFORGE_UPSTREAM_API_KEY"] == "upstream-secret"
    assert started[0]["OPENFORGE_JUDGE_UPSTREAM_API_KEY"] == "judge-secret"


def test_locally_a_failed_eval_every_evaluation_is_said_and_the_training_goes_on(monkeypatch, capsys, tmp_path) -> None:
    """Within a training iteration, an evaluation that fails (its eval-plan step exits non-zero) is a warning, a
    Failed record and no summary, not the iteration's failure: its rollouts and trajectories still run (control: the
    evaluation on its own raises). The steps' processes are replaced: the point is what the iteration's DAG does
    with the failure, not how it fails."""
    from workflows import local

    ran = []

    def step(name: str, argv: list[str], env: dict, log: Path) -> str:
        ran.append(name)
        if "plan" in name:
            Path(argv[argv.index("--app-rollouts") + 1]).write_text("[]")
        if name in ("eval-plan", "evaluate"):  # evaluate finds no results: the plan that failed planned none
            raise local.StepFailed(f"step {name} failed with exit code 2")
        planned = PlannedRollout("t", 0, "it0-t-s0", "img", 480, 1, 1024, 1024, 0)
        if name == "plan":  # as `steps.plan --chunks`: the plan in the store, its chunks' numbers printed
            return json.dumps(plan.write_chunks(argv[argv.index("--chunks") + 1], "rollouts", [planned]))
        return "{}"

    graded = RolloutResult(rollout_id="it0-t-s0", task="t", harness="direct", status="ok", reward=1.0)
    monkeypatch.setattr(local, "run_step", step)
    monkeypatch.setattr(local, "run_rollouts", lambda *args, **kwargs: [graded])
    config = load_config(None, ["run=r", "eval_every=1", f"store={tmp_path}"])
    assert local.collect_iteration(config, 0, "http://proxy", {}, tmp_path, 0, {}) == [graded]
    assert ran == ["plan", "trajectories", "eval-plan"]
    assert "warning: eval 0 failed (eval-plan); the training goes on" in capsys.readouterr().err
    assert manifest.read_evals(config.run_url)[0].status == "Failed"
    with pytest.raises(local.StepFailed):  # the control
        local.run_evaluation(config, 0, "http://proxy", {}, tmp_path)


# ---- the Workflows ----

def test_the_eval_workflow_is_the_iterations_templates_on_the_evaluations_folders() -> None:
    """collect (serve, plan --eval, rollouts, trajectories) then evaluate, whatever the rollouts did; every
    file goes under evals/iteration-N; no update; the exit handler records the evaluation."""
    config = load_config(CLUSTER, ["run=ev", "harness=direct", "eval_k=4"])
    spec = evaluation_workflow(config, 0).to_dict()["spec"]
    templates = {t["name"]: t for t in spec["templates"]}
    assert "update" not in templates and spec["onExit"] == "exit"
    outer = {t["name"]: t.get("depends") for t in templates["evaluation"]["dag"]["tasks"]}
    assert outer == {"collect": None, "evaluate": "collect.Succeeded || collect.Failed"}
    stored = commands.stored_dataset_url(config, evaluation=True)
    assert templates["plan"]["container"]["command"] == commands.plan(config, 0, evaluation=True,
                                                                      app_rollouts=APP_ROLLOUTS_FILE, dataset=stored,
                                                                      chunks=True)
    # its plan in chunks under the evaluation's folder, which its chunk DAGs read
    chunks = templates["plan"]["container"]["command"]
    assert chunks[chunks.index("--chunks") + 1] == layout.eval_plan_url(config.run_url, 0)
    items = next(t for t in templates["rollout-chunk"]["dag"]["tasks"] if t["name"] == "items")
    assert items["arguments"]["parameters"][0]["value"].startswith(layout.eval_plan_url(config.run_url, 0))
    assert templates["evaluate"]["container"]["command"] == commands.evaluate(config, 0, dataset=stored)
    assert templates["record"]["container"]["command"] == commands.record_eval(config, 0, "{{workflow.name}}",
                                                                               "{{workflow.status}}")
    # Each rollout sends its result as the evaluation's, which the serve pod's proxy writes into evals/iteration-0.
    rollout, serve = templates["rollout"]["container"]["command"], templates["serve"]["container"]["command"]
    assert rollout[rollout.index("--send-result") + 1] == "evaluation"
    assert (serve[serve.index("--run-url") + 1], serve[serve.index("--iteration") + 1]) == (config.run_url, "0")
    proxy = ProxyConfig("u", "s", "k", run_url=config.run_url, iteration=0)
    assert (results.result_url(proxy, "ev0-t-s0", 0, evaluation=True)
            == "s3://openforge/runs/ev/evals/iteration-0/results/ev0-t-s0/result.json")
    trajectories = templates["trajectories"]["container"]["command"]
    assert trajectories[trajectories.index("--out") + 1] == layout.eval_trajectories_url(config.run_url, 0)
    assert "--eval" in commands.plan(config, 0, evaluation=True) and semantic_problems({"spec": spec}) == []


def test_each_argo_attempt_of_a_rollout_uploads_its_own_result_under_its_own_id(tmp_path: Path) -> None:
    """Argo retries a rollout step with the same parameters: each retry (`{{retries}}` 0, 1, ...) runs as its own
    attempt id and the proxy writes its result under that id's folder, so that a retry that passed never
    overwrites the infra error before it, even when a workflow retry (`submit.py retry`) has Argo count
    `{{retries}}` from 0 again and two attempts share one retry number, in training and evaluation alike."""
    config = load_config(CLUSTER, ["run=r", "harness=direct", "eval_every=1"])
    templates = [t for t in iteration_workflow(config, 0).to_dict()["spec"]["templates"]
                 if t["name"] in ("rollout", "eval-rollout")]
    assert len(templates) == 2
    proxy = ProxyConfig("u", "s", "k", run_url=config.run_url, iteration=0)
    for template in templates:
        command = template["container"]["command"] + template["container"].get("args", [])
        assert command[command.index("--retry") + 1] == "{{retries}}"
        evaluation = command[command.index("--send-result") + 1] == "evaluation"
        urls = {results.result_url(proxy, plan.attempt_id("ev0-a-s0", retry + 1), retry, evaluation)
                for retry in (0, 1)}
        assert len(urls) == 2
        assert len({results.result_url(proxy, plan.attempt_id("ev0-a-s0", attempt), 0, evaluation)
                    for attempt in (1, 2)}) == 2
    argv = [sys.executable, "-m", "steps.rollout", "--task", str(tmp_path / "no-task"), "--harness", "direct",
            "--proxy-url", "http://127.0.0.1:9", "--rollout-id", "ev0-a-s0", "--retry", "1", "--out", str(tmp_path / "o")]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OPENFORGE_ADMIN_KEY": "k"})
    assert done.returncode == 3 and json.loads((tmp_path / "o" / "result.json").read_text())["rollout_id"] == "ev0-a-s0-a2"


def test_an_iteration_with_eval_every_evaluates_its_checkpoint_on_the_same_serve() -> None:
    """eval_every=2 of 3 iterations: iterations 0 and 2 carry an evaluation in their collect DAG (its rollouts
    behind the same policies and serve pod), iteration 1 does not; the final checkpoint's is its own Workflow."""
    config = load_config(CLUSTER, ["run=t", "iterations=3", "eval_every=2"])
    for iteration, evaluates in ((0, True), (1, False), (2, True)):
        spec = iteration_workflow(config, iteration).to_dict()["spec"]
        collect = next(t for t in spec["templates"] if t["name"] == "collect")
        tasks = {t["name"]: t.get("depends", "") for t in collect["dag"]["tasks"]}
        assert ("evaluate" in tasks) == evaluates == ("eval-rollout" in tasks)
        if evaluates:
            assert tasks["eval-rollout"] == "serve-ready && eval-plan && isolate-rollouts && isolate-serve"
            rollout = next(t for t in spec["templates"] if t["name"] == "eval-rollout")
            assert rollout["metadata"]["labels"] == {"openforge.dev/role": "rollout"}  # the same NetworkPolicy
            command = rollout["container"]["command"]
            assert command[command.index("--send-result") + 1] == "evaluation"  # the proxy writes it to evals/
            evaluate_task = next(t for t in collect["dag"]["tasks"] if t["name"] == "evaluate")
            assert evaluate_task["continueOn"] == {"failed": True, "error": True}  # a failed eval stops no update
    assert submit.build_workflows(config)[-1][1].name == "openforge-t-eval3"
    assert [w.name for _, w in submit.build_workflows(load_config(CLUSTER, ["run=t", "iterations=2"]))] == ["openforge-t-it0",
                                                                                            "openforge-t-it1"]


# ---- the driver against the fake Argo Server (tests/test_workflows.py) ----

def fake_summary(run_url: str, iteration: int, k: int = 2) -> dict:
    """The summary.json the evaluate step of a Workflow would have written (the fake server runs no pod)."""
    summary = {"k": k, "harness": "codex", "dataset": "steps/tasks/builtin", "checkpoint": "", "model": "qwen3-4b",
               "iteration": iteration, **evaluate.summarize([result("hello-file", s, 1.0) for s in range(k)], k)}
    manifest.write_json(layout.eval_summary_url(run_url, iteration), summary)
    return summary


def drive(fake: FakeArgoServer, store: str, *args: str) -> int:
    """`submit.py` in-process against the fake server and the S3 store."""
    return submit.main([*args, "--config", str(CLUSTER), "--argo-server", fake.url, "--poll", "0.01", f"store={store}",
                        f"s3_endpoint={os.environ['AWS_ENDPOINT_URL']}", *NO_CLUSTER_EGRESS])


def test_an_eval_run_on_argo_is_one_workflow_followed_and_recorded(fake_argo: FakeArgoServer, s3_store: str,
                                                                   capsys) -> None:
    """`eval --checkpoint trained:1`: the eval Workflow of that checkpoint is linted, created and followed; the
    manifest says what it evaluates and records the evaluation with its numbers; the table and the summary are
    printed; `status` shows it."""
    trained = f"{s3_store}/trained"
    config = load_config(CLUSTER, ["run=trained", f"store={s3_store}"])
    manifest.write_run_config(trained, config.to_dict())
    manifest.write_json(layout.metrics_url(config.checkpoint_url(1)), {"loss": 0.1})  # what its update wrote
    manifest.record(trained, IterationRecord(0, "openforge-trained-it0", status="Succeeded"))
    summary = fake_summary(f"{s3_store}/ev", 0)
    assert drive(fake_argo, s3_store, "eval", "--harness", "codex", "--checkpoint", "trained:1", "--k", "2", "run=ev") == 0
    out = capsys.readouterr().out.splitlines()
    assert json.loads(out[-1]) == summary and out[-2].split()[:2] == ["overall", "2"]
    posts = [(path.rsplit("/", 1)[-1], body["workflow"]["metadata"]["name"]) for _, path, body, _ in fake_argo.calls("POST")]
    assert posts == [("lint", "openforge-ev-eval0"), ("openforge", "openforge-ev-eval0")]
    created = fake_argo.workflows["openforge-ev-eval0"]
    serve = next(t for t in created["spec"]["templates"] if t["name"] == "serve")["container"]["command"]
    assert serve[serve.index("--model") + 1] == config.checkpoint_url(1)
    evaluates = manifest.read_evaluates(f"{s3_store}/ev")
    assert (evaluates["run"], evaluates["iteration"], evaluates["checkpoint"]) == ("trained", 1, config.checkpoint_url(1))
    record = manifest.read_evals(f"{s3_store}/ev")[0]
    assert (record.workflow, record.status, record.overall["pass_hat_k"]) == ("openforge-ev-eval0", "Succeeded", 1.0)
    assert drive(fake_argo, s3_store, "status", "--run", "ev") == 0
    shown = capsys.readouterr().out
    assert "eval 0: Succeeded  openforge-ev-eval0" in shown and "0 missing, 0 infra errors" in shown


def test_a_failed_eval_workflow_is_retried_like_an_iteration(fake_argo: FakeArgoServer, s3_store: str, capsys) -> None:
    """A failed evaluation stops with exit code 1 and says how to retry; `retry` reruns its failed rollouts and
    follows it to the end (control: before the retry the manifest records it Failed)."""
    fake_argo.script["openforge-evr-eval0"] = ["", "Running", "Failed"]
    assert drive(fake_argo, s3_store, "eval", "--harness", "codex", "--k", "2", "run=evr") == 1
    assert "eval 0 ended Failed" in capsys.readouterr().err
    assert manifest.read_evals(f"{s3_store}/evr")[0].status == "Failed"
    summary = fake_summary(f"{s3_store}/evr", 0)
    assert drive(fake_argo, s3_store, "retry", "--run", "evr") == 0
    (_, path, body, _), = fake_argo.calls("PUT")
    assert path.endswith("/openforge-evr-eval0/retry") and body["nodeFieldSelector"] == "templateName=serve"
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == summary
    assert manifest.read_evals(f"{s3_store}/evr")[0].status == "Succeeded"


def test_a_training_run_with_eval_every_records_each_evaluation(fake_argo: FakeArgoServer, s3_store: str) -> None:
    """eval_every=1 of 1 iteration: the iteration's Workflow evaluates checkpoint 0 (its record gets the
    numbers and a pointer to the summary), then the driver submits the final checkpoint's evaluation."""
    run_url = f"{s3_store}/ev-train"
    first, final = fake_summary(run_url, 0), fake_summary(run_url, 1)
    assert drive(fake_argo, s3_store, "--harness", "codex", "run=ev-train", "iterations=1", "eval_every=1") == 0
    created = [body["workflow"]["metadata"]["name"] for _, path, body, _ in fake_argo.calls("POST")
               if not path.endswith("/lint")]
    assert created == ["openforge-ev-train-it0", "openforge-ev-train-eval1"]
    iteration = manifest.read_iterations(run_url)[0]
    assert iteration.eval == {"summary": layout.eval_summary_url(run_url, 0), "k": 2, **first["overall"]}
    evaluations = manifest.read_evals(run_url)
    assert {i: (e.workflow, e.status) for i, e in evaluations.items()} == {
        0: ("openforge-ev-train-it0", "Succeeded"), 1: ("openforge-ev-train-eval1", "Succeeded")}
    assert evaluations[1].overall == {"k": 2, **final["overall"]}


def test_resume_records_the_evaluation_of_an_iteration_that_ended_while_no_driver_ran(
        fake_argo: FakeArgoServer, s3_store: str) -> None:
    """The driver died after an eval_every iteration's Workflow ended: its exit handler recorded the iteration
    (without its evaluation), and eval-0.json was never written. `resume` records it from its summary and
    runs nothing again (control: before resume the manifest has no evaluation 0)."""
    resume_records_a_missed_evaluation(fake_argo, s3_store, "ev-died")


def resume_records_a_missed_evaluation(argo: FakeArgoServer, s3_store: str, run: str, *settings: str) -> None:
    """Runs `run` (one iteration, evaluated) on `argo`, forgets its evaluation's record as a driver that died
    before writing it would, and checks that `resume` records it and creates no Workflow."""
    import fsspec

    run_url = f"{s3_store}/{run}"
    fake_summary(run_url, 0), fake_summary(run_url, 1)
    assert drive(argo, s3_store, "--harness", "codex", f"run={run}", "iterations=1", "eval_every=1", *settings) == 0
    record = manifest.read_iterations(run_url)[0]
    manifest.record(run_url, dataclasses.replace(record, eval=None))  # as the exit handler writes it
    fs, path = fsspec.core.url_to_fs(layout.eval_record_url(run_url, 0))
    fs.rm(path)
    assert 0 not in manifest.read_evals(run_url)  # the control
    created = len(argo.calls("POST"))
    assert drive(argo, s3_store, "resume", "--run", run) == 0
    assert len(argo.calls("POST")) == created
    assert manifest.read_evals(run_url)[0].status == "Succeeded" and manifest.read_iterations(run_url)[0].eval


# ---- evaluations end to end on this machine (the embedded default) ----

def submit_eval(store: Path, run: str, *argv: str, timeout_s: float = 900) -> subprocess.CompletedProcess:
    """`python workflows/submit.py eval ...` with no Argo server: the local runner."""
    env = {key: value for key, value in os.environ.items() if key != "ARGO_SERVER"}
    done = subprocess.run([sys.executable, "workflows/submit.py", "eval", "--harness", "direct", *argv,
                           f"store={store}", f"run={run}", "parallel_rollouts=4"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def printed(done: subprocess.CompletedProcess, store: Path, run: str) -> dict:
    """The summary the eval printed: a table (header, a row per task, overall) then one JSON line, equal to
    its summary.json, recorded as the run's one evaluation."""
    *table, line = done.stdout.splitlines()
    summary = json.loads(line)
    assert summary == json.loads((store / run / "evals" / "iteration-0" / "summary.json").read_text())
    assert table[0].split()[:2] == ["task", "tries"] and table[-1].split()[0] == "overall"
    assert [row.split()[0] for row in table[2:-2]] == sorted(summary["tasks"])
    record = manifest.read_evals(str(store / run))[0]
    assert record.status == "Succeeded" and record.overall["tries"] == summary["overall"]["tries"]
    assert manifest.read_evaluates(str(store / run)) is not None and manifest.read_iterations(str(store / run)) == {}
    return summary


def copy_tasks(names: list[str], into: Path) -> Path:
    """A dataset of some built-in tasks, copied."""
    for name in names:
        shutil.copytree(BUILTIN / name, into / name)
    return into


class FlakyMirror:
    """A package mirror on loopback that fails its first request (503) and serves every later one: what a task
    image's build fetches from. A real flaky mirror cannot be had on demand; this one makes the first build
    of the task that uses it fail, a real sandbox failure before the harness starts (an infra error)."""

    def __init__(self) -> None:
        self.requests = 0
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                mirror.requests += 1
                self.send_response(503 if mirror.requests == 1 else 200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.mark.slow
def test_the_oracles_pass_every_task_and_an_infra_error_is_retried_and_not_counted(tmp_path: Path) -> None:
    """Every built-in task, plus a copy of hello-file whose image build fetches from a mirror that fails once,
    evaluated with k=2 through `--upstream` in front of the scripted model replaying each task's oracle: every
    task passes (pass@k = pass^k = 1); the failed build is an infra error, retried under `-a2`, counted and
    not a try."""
    from scripted_model import ScriptedModel

    dataset = tmp_path / "tasks"
    shutil.copytree(BUILTIN, dataset)
    mirror = FlakyMirror()
    flaky = dataset / "hello-file-mirror"
    shutil.copytree(BUILTIN / "hello-file", flaky)
    (flaky / "environment" / "Dockerfile").write_text(
        f"FROM python:3.11-slim\nWORKDIR /app\n"
        f"RUN python3 -c \"import urllib.request; urllib.request.urlopen('{mirror.url}')\"\n")
    store = tmp_path / "runs"
    with ScriptedModel(model="remote", oracle=dataset) as double:
        done = submit_eval(store, "oracle", "--dataset", str(dataset), "--k", "2", "--upstream", double.url,
                           "--upstream-model", "remote", "max_tokens_cap=4096")
    summary = printed(done, store, "oracle")
    tasks = summary["tasks"]
    assert len(tasks) == len(load_dataset(BUILTIN)[0]) + 1
    assert {(t["tries"], t["pass_at_k"], t["pass_hat_k"]) for t in tasks.values()} == {(2, 1.0, 1.0)}
    overall = summary["overall"]
    assert (overall["pass_at_1"], overall["pass_at_k"], overall["pass_hat_k"]) == (1.0, 1.0, 1.0)
    assert overall["infra_errors"] == tasks["hello-file-mirror"]["infra_errors"] == 1 and mirror.requests >= 2
    assert overall["tries"] == 2 * len(tasks) and overall["missing"] == 0
    results = [json.loads(p.read_text()) for p in (store / "oracle" / "evals" / "iteration-0" / "results").glob("*/result.json")]
    (failed,) = [r for r in results if r["status"] == "infra_error"]
    assert failed["task"] == "hello-file-mirror" and "RUN failed" in failed["error"]
    assert any(r["rollout_id"] == f"{failed['rollout_id']}-a2" and r["reward"] == 1.0 for r in results)
    assert summary["checkpoint"] == double.url and summary["model"] == "remote"


@pytest.mark.slow
def test_a_wrong_script_passes_no_task(tmp_path: Path) -> None:
    """The scripted model playing a wrong script (one command that changes nothing): no task passes, and
    every try is counted as one (pass@k = pass^k = 0, no infra error)."""
    from scripted_model import WRONG_COMMANDS, ScriptedModel

    dataset = copy_tasks(["hello-file", "count-errors", "edit-config"], tmp_path / "tasks")
    store = tmp_path / "runs"
    with ScriptedModel(model="remote", commands=WRONG_COMMANDS) as double:
        done = submit_eval(store, "wrong", "--dataset", str(dataset), "--k", "2", "--upstream", double.url,
                           "--upstream-model", "remote")
    summary = printed(done, store, "wrong")
    assert {(t["tries"], t["passes"], t["pass_at_k"], t["pass_hat_k"]) for t in summary["tasks"].values()} == \
        {(2, 0, 0.0, 0.0)}
    assert (summary["overall"]["infra_errors"], summary["overall"]["mean_reward"]) == (0, 0.0)


@pytest.mark.slow
@pytest.mark.vllm
def test_an_eval_of_the_builtin_dataset_with_direct_on_the_embedded_default(tiny_model: Path, tmp_path: Path) -> None:
    """`submit.py eval` of the built-in dataset with `direct` and no server: vLLM on CPU serves the tiny model,
    every task gets its k tries under `ev0-` ids, the table and the summary are printed, `status` shows the
    evaluation and `resume` of a finished one prints it again without running anything."""
    store = tmp_path / "runs"
    done = submit_eval(store, "tiny", "--dataset", "steps/tasks/builtin", "--k", "2", "--model", str(tiny_model),
                       "max_tokens_cap=16")
    summary = printed(done, store, "tiny")
    tasks = load_dataset(BUILTIN)[0]
    assert sorted(summary["tasks"]) == sorted(t.name for t in tasks)
    assert {t["tries"] for t in summary["tasks"].values()} == {2} and summary["overall"]["missing"] == 0
    assert summary["checkpoint"] == str(tiny_model) and summary["k"] == 2
    called = {path.name for path in (store / "tiny" / "calls" / "rollouts").iterdir()}
    assert called and all(name.startswith("ev0-") for name in called)
    env = {key: value for key, value in os.environ.items() if key != "ARGO_SERVER"}
    status = subprocess.run([sys.executable, "workflows/submit.py", "status", "--run", "tiny", f"store={store}"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert status.returncode == 0 and "eval 0: Succeeded" in status.stdout
    again = subprocess.run([sys.executable, "workflows/submit.py", "resume", "--run", "tiny", f"store={store}"],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and json.loads(again.stdout.splitlines()[-1]) == summary


@pytest.mark.parametrize("module", ["steps.evaluate", "steps.plan", "steps.net", "steps.contracts.layout", "workflows.config",
                                    "workflows.submit"])
def test_doctests(module: str) -> None:
    """The examples in the docstrings of the evaluation's pure functions hold."""
    failures, tried = doctest.testmod(importlib.import_module(module))
    assert tried > 0 and failures == 0
