"""The embedded default end to end: `python workflows/submit.py` with no Argo server runs the whole loop
on this machine — real vLLM on CPU with the tiny model, the proxy, `direct` rollouts in bubblewrap,
grading, Parquet, the real veRL update, the new weights swapped in — and resumes after its driver dies.
With `eval_every: 2` it also evaluates the checkpoint iteration 0 serves (before its rollouts, in the same
serve) and the final one (after the last swap), and the resumed run does not evaluate iteration 0 again.
The same run's report is then checked in headless chromium (one run for the module: it takes minutes).

The dataset is the toy `target-word` task, whose verifier gives partial credit for the reply, so that
the random model's samples earn different rewards and the update has a gradient.
"""

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from report_browser import PLOT_POINTS, browser  # noqa: F401 (a fixture)
from safetensors.torch import load_file

from steps.contracts.table_files import partition_url, read_table
from steps import tracking
from steps.contracts import layout
from steps.report.data import load_run
from steps.update.shards import read_weights

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(not (REPO / ".venv-train" / "bin" / "python").exists() and
                                 not os.environ.get("OPENFORGE_TRAIN_PYTHON"),
                                 reason="veRL's environment (.venv-train) is not set up: run `make train-setup`")]


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def iteration_record(store: Path, iteration: int) -> dict | None:
    path = store / "loop" / "manifest" / f"iteration-{iteration}.json"
    return json.loads(path.read_text()) if path.exists() else None


def processes_mentioning(text: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if text in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                found.append(int(pid))
        except OSError:
            pass
    return found


def always_training_update_config(folder: Path) -> Path:
    """The default update config with a small entropy bonus, written to `folder`: every update trains, even in the
    rare iteration where all rewards are equal (no advantage), which steps.update would otherwise skip, leaving the
    served weights unchanged."""
    update_config = folder / "update.yaml"
    defaults = (REPO / "configs" / "update.yaml").read_text()
    assert "\nentropy_coeff: 0.0\n" in defaults
    update_config.write_text(defaults.replace("\nentropy_coeff: 0.0\n", "\nentropy_coeff: 0.001\n"))
    return update_config


@dataclass
class LocalRun:
    """The one end-to-end run of this module (minutes): its store, its first iteration record as first
    written, and the resumed driver's outcome. Every test of the module reads it; none runs another."""

    store: Path
    run: Path
    first: dict
    first_eval: dict
    resumed: subprocess.CompletedProcess


@pytest.fixture(scope="module")
def local_run(tiny_model, tmp_path_factory) -> LocalRun:
    """Two iterations of the embedded default, killed in the middle of iteration 1, then resumed."""
    tmp_path = tmp_path_factory.mktemp("local-run")
    store = tmp_path / "runs"
    update_config = always_training_update_config(tmp_path)
    settings = [f"store={store}", "run=loop", "iterations=2", "dataset=steps/tasks/toy", "tasks_per_iteration=1",
                "samples_per_task=8", "max_tokens_cap=16", "parallel_rollouts=4", f"model={tiny_model}",
                f"update_config={update_config}", "eval_every=2", "eval_k=2", "trackers=[tensorboard]"]
    log = open(tmp_path / "driver.log", "w")
    driver = subprocess.Popen([sys.executable, "workflows/submit.py", "--harness", "direct", *settings],
                              cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    run = store / "loop"
    try:
        first = wait_for(lambda: (r := iteration_record(store, 0)) and r["status"] == "Succeeded" and r,
                         600, "iteration 0 to succeed")
        # Killed in the middle of iteration 1, with some of its rollouts done and others running.
        wait_for(lambda: list((run / "results" / "iteration-1").glob("*/result.json")), 300, "a rollout of iteration 1")
    finally:
        driver.kill()  # the driver dies mid-run; serve (and its vLLM) and the rollouts must go with it
        driver.wait()
    wait_for(lambda: not processes_mentioning(str(store)), 60, "serve, vLLM and rollouts to stop after the driver died")
    first_eval = json.loads((run / "manifest" / "eval-0.json").read_text())
    assert first_eval["status"] == "Succeeded" and first["eval"]["tries"] == 2

    resumed = subprocess.run([sys.executable, "workflows/submit.py", "resume", "--run", "loop", *settings[:1]],
                             cwd=REPO, capture_output=True, text=True, timeout=900)
    return LocalRun(store, run, first, first_eval, resumed)


def test_two_iterations_run_locally_and_resume_after_the_driver_is_killed(local_run, tiny_model):
    store, run, first, resumed = local_run.store, local_run.run, local_run.first, local_run.resumed
    first_eval = local_run.first_eval
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert iteration_record(store, 0)["updated"] == first["updated"]  # iteration 0 was not run again
    assert iteration_record(store, 1)["status"] == "Succeeded" and iteration_record(store, 1)["attempt"] == 1
    assert json.loads((run / "manifest" / "eval-0.json").read_text()) == first_eval  # not evaluated again
    assert iteration_record(store, 1)["eval"] is None  # eval_every 2: iteration 1's checkpoint is not evaluated
    final = json.loads((run / "manifest" / "eval-2.json").read_text())
    assert final["status"] == "Succeeded" and final["checkpoint"] == str(run / "checkpoints" / "iteration-2")
    assert json.loads(resumed.stdout.splitlines()[-1])["eval"] == 2
    # The dead start's results are kept aside. The proxy's store still holds that start's registrations:
    # the rollouts it had registered ran again under new ids instead of failing on the old ones (409).
    assert list((run / "results" / "iteration-1-attempt-0").glob("*/result.json"))
    again = [json.loads(p.read_text()) for p in (run / "results" / "iteration-1").glob("*/result.json")]
    assert any(result["rollout_id"].endswith("-a2") for result in again)
    for iteration in (0, 1):
        results = [json.loads(p.read_text()) for p in (run / "results" / f"iteration-{iteration}").glob("*/result.json")]
        assert len(results) == 8 and {r["status"] for r in results} == {"ok"}
        partition = partition_url(str(run / "trajectories"), "loop", iteration)
        assert read_table(partition, "rollouts").num_rows == 8 and read_table(partition, "samples").num_rows >= 8
        sampled = read_table(partition, "calls").select(["temperature", "top_p", "top_k"]).to_pylist()
        assert {tuple(row.values()) for row in sampled} == {(1.0, 1.0, 0)}  # the run's, forced on every call
        metrics = json.loads((run / "checkpoints" / f"iteration-{iteration + 1}" / "metrics.json").read_text())
        assert metrics["tokens_trained"] > 0

    # Iteration 1 was served the weights iteration 0's update wrote, stamped with their version; each evaluation
    # the checkpoint it evaluates (ev0: the base model, ev2: what the last update wrote).
    versions = {}
    for call_log in (run / "calls" / "rollouts").glob("*/calls.jsonl"):
        for call in map(json.loads, call_log.read_text().splitlines()):
            versions.setdefault(call["rollout_id"].split("-")[0], set()).add(call["weight_version"])
    assert versions == {"it0": {"0"}, "it1": {"1"}, "ev0": {"0"}, "ev2": {"2"}}
    base, updated = load_file(tiny_model / "model.safetensors"), read_weights(run / "checkpoints" / "iteration-1")
    assert base.keys() == updated.keys()
    assert any(not base[name].float().equal(updated[name].float()) for name in base)


def test_each_driver_logged_what_it_ran_into_the_runs_tracker(local_run):
    """`trackers=[tensorboard]`: the first driver logged iteration 0 (with its evaluation) before it was killed, the
    resumed one iteration 1 and the final checkpoint's evaluation, each at its step, with the report's numbers."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = local_run.run
    events = EventAccumulator(layout.tensorboard_url(str(run)), size_guidance={"scalars": 0})
    events.Reload()
    history: dict[int, dict] = {}
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            history.setdefault(event.step, {})[tag] = event.value
    assert sorted(history) == [0, 1, 2]
    for n in (0, 1):
        assert history[n] == pytest.approx(tracking.iteration_numbers(load_run(str(run)), n), rel=1e-6)
        assert {"train/mean_reward", "train/grad_norm", "train/logprob_gap", "train/phase_rollouts_s"} <= set(history[n])
    assert "eval/pass_at_k" in history[0] and not any(k.startswith("eval/") for k in history[1])
    assert history[2] == pytest.approx(tracking.iteration_numbers(load_run(str(run)), 2), rel=1e-6)  # eval/ alone
    assert history[2]["eval/tries"] == json.loads((run / "evals" / "iteration-2" / "summary.json").read_text())[
        "overall"]["tries"]
    first_log = (local_run.store.parent / "driver.log").read_text()
    for log in (first_log, local_run.resumed.stderr):
        assert f"tracking: tensorboard logs this run to {layout.tensorboard_url(str(run))}" in log


def test_the_runs_report_is_written_after_every_iteration_and_every_page_of_it_loads(local_run, browser):
    """The report of the real run in headless chromium: the driver printed its path after every iteration and
    every evaluation (first start: eval 0, iteration 0; resumed: iteration 1, eval 2); every page loads with no
    console error; the plots carry the run's numbers; each rollout page (training and evaluation) shows the
    samples table's tokens."""
    run = local_run.run
    index = run / "reports" / "index.html"
    first_log = (local_run.store.parent / "driver.log").read_text()
    for log in (first_log, local_run.resumed.stderr):
        assert [line.split("] ", 1)[-1] for line in log.splitlines() if "] report" in line] == [f"report: {index}"] * 2
    train_pages = sorted((run / "reports" / "rollouts").glob("train-*/*.html"))
    eval_pages = sorted((run / "reports" / "rollouts").glob("eval-*/*.html"))
    partitions = {("train", i): partition_url(str(run / "trajectories"), "loop", i) for i in (0, 1)} | \
        {("eval", i): partition_url(layout.eval_trajectories_url(str(run), i), "loop", i) for i in (0, 2)}
    samples = {key: read_table(url, "samples").to_pylist() for key, url in partitions.items()}
    rollouts = {i: read_table(partitions["train", i], "rollouts").to_pylist() for i in (0, 1)}
    assert len(train_pages) == 16 and len(eval_pages) == 4  # eval_k 2 tries of the one task, at iterations 0 and 2
    loaded = browser.open(index, screenshot="local-run-index")
    assert loaded.errors == []
    assert loaded.page.evaluate(PLOT_POINTS)
    points = loaded.page.evaluate(PLOT_POINTS.replace("document.querySelectorAll('.plot')",
                                                      "document.querySelector('.plots').querySelectorAll('.plot')"))
    assert len(points) >= 6 and all(plot and max(plot) == 2 for plot in points), points  # two iterations each
    mean_reward = loaded.page.evaluate("Array.from(document.querySelectorAll('.plot')).find(d => "
                                       "d.layout.title.text === 'Mean reward').data[0].y")
    assert mean_reward == pytest.approx([sum(r["reward"] for r in rollouts[i]) / 8 for i in (0, 1)])
    assert loaded.page.locator("#rollout-table tbody tr").count() == 20
    for n, page_path in enumerate(train_pages + eval_pages):
        loaded = browser.open(page_path, screenshot="local-run-rollout" if n == 0 else None)
        assert loaded.errors == [], page_path
        rollout_id = loaded.page.evaluate("document.querySelector('h1').textContent").removeprefix("Rollout ")
        kind, iteration = page_path.parent.name.split("-")
        expected = [sum(s["response_mask"]) for s in sorted(samples[kind, int(iteration)], key=lambda s: s["sample_index"])
                    if s["rollout_id"] == rollout_id]
        shown = loaded.page.evaluate("Array.from(document.querySelectorAll('section.sample')).map(s => "
                                     "s.querySelectorAll('span.m1').length)")
        assert shown == expected and expected, rollout_id
        assert loaded.page.locator("#exchange ~ .call").count() >= 1
