"""Signal where there is signal: task groups whose rollouts all earned one reward are dropped from the update and
counted, the local runner's `fill_batch` rolls out more tasks while groups are flat, and the curriculum chooses
tasks by their recent pass rate in the plan step.

Fast: no vLLM and no veRL run. The samples and rollouts tables are real Parquet files written with the project's
schemas; the update's skip path (`python -m steps.update` without torch) runs for real on a checkpoint folder whose
weights it only copies; the plan step runs as its command line. `tests/test_update_signal.py` (training environment)
runs the one veRL update that shows a dropped group is not trained on.
"""

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from steps import curriculum, manifest
from steps.contracts import layout
from steps.contracts.config import RunConfig
from steps.contracts.rollout import OK, PlannedRollout, RolloutResult
from steps.contracts.table_files import write_table
from steps.contracts.tables import ROLLOUTS
from steps.curriculum import Curriculum, TaskRecord, choose_tasks
from steps.report import index as report_index
from steps.update import skip
from steps.update.config import UpdateConfig, load_config as load_update_config
from steps.update.samples import SAMPLE_COLUMNS, read_samples, signal_groups
from workflows import commands, local, shape
from workflows.config import ConfigError, load_config, validate_for_argo
from workflows.iteration import iteration_workflow

REPO = Path(__file__).resolve().parents[1]
BUILTIN = REPO / "steps" / "tasks" / "builtin"
CLUSTER = REPO / "configs" / "cluster-example.yaml"
NO_CLUSTER_EGRESS = ("rollout_egress_cidrs=10.0.0.5/32",)  # what a driver without cluster access sets for `auto`


def write_samples(folder: Path, groups: dict[str, list[float]]) -> Path:
    """A samples.parquet of one sample per rollout: `groups` maps a task to its rollouts' rewards."""
    rows = [{"rollout_id": f"it0-{task}-s{i}", "task": task, "prompt_token_ids": [11, 12, 13],
             "response_token_ids": [21, 22, 23], "response_mask": [1, 0, 1], "response_logprobs": [-0.5, 0.0, -1.0],
             "reward": reward, "loss_weight": 1.0} for task, rewards in groups.items() for i, reward in enumerate(rewards)]
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([{name: row[name] for name in SAMPLE_COLUMNS} for row in rows]),
                   folder / "samples.parquet")
    return folder


def checkpoint_folder(folder: Path) -> Path:
    """A checkpoint the skip path copies without loading: its config (the vocabulary checked) and a weights file."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"vocab_size": 64}))
    (folder / "model.safetensors").write_bytes(b"weights the skip copies unchanged")
    return folder


def test_flat_groups_are_dropped_and_counted_and_an_unequal_group_is_kept(tmp_path: Path) -> None:
    """Two flat groups (all 1, all 0) leave the batch, the mixed group stays (the control); each count is right."""
    samples = read_samples(str(write_samples(tmp_path / "it0", {"solved": [1.0, 1.0], "unsolved": [0.0, 0.0],
                                                                  "mixed": [0.0, 1.0, 0.4]})))
    kept, counts = signal_groups(samples, UpdateConfig())
    assert counts == {"groups_kept": 1, "groups_dropped": 2}
    assert {sample.task for sample in kept} == {"mixed"} and len(kept) == 3
    everything, counts_off = signal_groups(samples, UpdateConfig(drop_flat_groups=False))
    assert everything == samples and counts_off == {"groups_kept": 3, "groups_dropped": 0}
    # reinforce++ whitens over the whole batch, where a flat group still has an advantage: nothing is dropped
    assert signal_groups(samples, UpdateConfig(adv_estimator="reinforce_plus_plus"))[0] == samples


def test_the_update_is_not_skipped_while_a_group_is_left_and_is_when_none_is(tmp_path: Path) -> None:
    """With one mixed group left the skip path declines (the update trains); with every group flat it writes the
    skip, whose metrics count every group dropped and none kept (the control)."""
    checkpoint = checkpoint_folder(tmp_path / "checkpoint")
    some = write_samples(tmp_path / "some", {"solved": [1.0, 1.0], "mixed": [0.0, 1.0]})
    assert skip.main(["--trajectories", str(some), "--checkpoint", str(checkpoint), "--out", str(tmp_path / "a")]) \
        is None
    assert not (tmp_path / "a").exists()
    none = write_samples(tmp_path / "none", {"solved": [1.0, 1.0], "unsolved": [0.0, 0.0]})
    assert skip.main(["--trajectories", str(none), "--checkpoint", str(checkpoint), "--out", str(tmp_path / "b")]) == 0
    metrics = json.loads((tmp_path / "b" / "metrics.json").read_text())
    assert metrics["skipped"] == skip.NO_ADVANTAGE
    assert (metrics["groups_kept"], metrics["groups_dropped"]) == (0, 2)
    assert (tmp_path / "b" / "model.safetensors").read_bytes() == (checkpoint / "model.safetensors").read_bytes()


def test_the_run_turns_dropping_off_through_the_updates_override() -> None:
    """`drop_flat_groups: false` reaches the update as its override; the default adds none (the update's default is
    on) and `update_args` may not set it (the run owns it)."""
    assert load_update_config(None, commands.update_overrides(RunConfig())).drop_flat_groups
    assert not load_update_config(None, commands.update_overrides(RunConfig(drop_flat_groups=False))).drop_flat_groups
    with pytest.raises(ConfigError, match="may not set 'drop_flat_groups'"):
        load_config(None, ["update_args=[drop_flat_groups=false]"])


HISTORY = {"half": TaskRecord(8, 4), "quarter": TaskRecord(8, 2), "rare": TaskRecord(8, 1), "solved": TaskRecord(8, 8),
           "unsolved": TaskRecord(8, 0)}


def test_the_curriculum_is_deterministic_given_the_seed() -> None:
    """The same seed and iteration choose the same tasks; another seed, over a few iterations, chooses others."""
    names = [*HISTORY, "new-1", "new-2", "new-3"]
    first = [choose_tasks(names, HISTORY, 3, Curriculum(), seed=7, iteration=i).chosen for i in range(6)]
    again = [choose_tasks(names, HISTORY, 3, Curriculum(), seed=7, iteration=i).chosen for i in range(6)]
    other = [choose_tasks(names, HISTORY, 3, Curriculum(), seed=8, iteration=i).chosen for i in range(6)]
    assert first == again
    assert first != other


def test_the_curriculum_moves_toward_tasks_of_middle_pass_rate() -> None:
    """Solved and never-solved tasks rest while others are left; among the rest a task at pass rate 0.5 is chosen
    more often than one at 0.125. The control: the rotation without a curriculum chooses the resting ones as often."""
    names = list(HISTORY)
    picks = Counter(name for i in range(400) for name in choose_tasks(names, HISTORY, 2, Curriculum(), 0, i).chosen)
    assert picks["solved"] == picks["unsolved"] == 0
    assert picks["half"] > picks["quarter"] > picks["rare"] > 0
    from types import SimpleNamespace
    from steps.plan import pick_tasks
    rotation = Counter(t.name for i in range(400) for t in pick_tasks([SimpleNamespace(name=n) for n in names], i, 2, 0))
    assert rotation["solved"] > 0 and rotation["unsolved"] > 0


def test_unseen_tasks_are_tried_and_resting_ones_fill_in_when_nothing_else_is_left() -> None:
    """An unseen task weighs as one at 0.5, so it is tried; when only resting tasks are left they are chosen."""
    pool = choose_tasks(["solved", "unsolved", "fresh"], HISTORY, 1, Curriculum(), 0, 0)
    assert pool.chosen == ["fresh"] and pool.tasks["fresh"]["state"] == "unseen"
    resting = choose_tasks(["solved", "unsolved"], HISTORY, 1, Curriculum(), 0, 0)
    assert len(resting.chosen) == 1
    # narrower bounds: a task at 0.125 now rests as unsolved
    assert curriculum.state(HISTORY["rare"], Curriculum(min_pass=0.2)) == "unsolved"


def write_rollouts(run_url: str, run: str, iteration: int, rewards: dict[str, list[float | None]]) -> None:
    """An iteration's rollouts.parquet, written with the trajectories step's writer and schema."""
    rows = [{"run": run, "iteration": iteration, "rollout_id": f"it{iteration}-{task}-s{i}", "task": task,
             "status": OK if reward is not None else "infra_error", "reward": reward}
            for task, values in rewards.items() for i, reward in enumerate(values)]
    write_table(pa.Table.from_pylist(rows, schema=ROLLOUTS), layout.run_partition_url(run_url, run, iteration),
                "rollouts")


def plan_names(printed: str) -> list[str]:
    return sorted({Path(item["task"]).name for item in json.loads(printed)})


def test_the_plan_step_chooses_by_the_runs_earlier_pass_rates_and_records_the_pool(tmp_path: Path) -> None:
    """The plan command (both runners') reads the earlier iterations' rollouts tables within the window, leaves out
    the solved and never-solved tasks, writes the pool beside the plan, and the manifest's record reads it back."""
    run_url = str(tmp_path / "demo")
    tasks = sorted(p.name for p in BUILTIN.iterdir() if (p / "task.toml").is_file())[:6]
    solved, unsolved, mixed = tasks[0], tasks[1], tasks[2]
    write_rollouts(run_url, "demo", 0, {solved: [1.0, 1.0], unsolved: [0.0, None], mixed: [1.0, 0.0]})
    write_rollouts(run_url, "demo", 1, {solved: [1.0, 1.0], unsolved: [0.0, 0.0]})
    dataset = tmp_path / "dataset.txt"
    dataset.write_text("".join(f"{BUILTIN / name}\n" for name in tasks))
    config = RunConfig(dataset=str(dataset), store=str(tmp_path), run="demo", tasks_per_iteration=4,
                       samples_per_task=1, curriculum="pass_rate")
    argv = commands.plan(config, 2, python=sys.executable, chunks=True)
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    pool = curriculum.read_pool(run_url, 2)
    assert pool is not None and len(pool.chosen) == 4 and solved not in pool.chosen and unsolved not in pool.chosen
    assert pool.tasks[mixed] == {"tries": 2, "passes": 1, "pass_rate": 0.5, "state": "learning"}
    assert pool.tasks[unsolved]["tries"] == 3  # the infra error is no try
    assert manifest.read_curriculum(run_url, 2) == pool.summary()
    cells = report_index.curriculum_cells(pool.summary())
    assert cells["tasks chosen"] == "learning 1, unseen 3, solved 0, unsolved 0"
    # the control: without the curriculum the plan writes no pool and the rotation is the plain one
    plain = subprocess.run(commands.plan(RunConfig(dataset=str(dataset), store=str(tmp_path), run="plain",
                                                   tasks_per_iteration=4, samples_per_task=1), 2,
                                         python=sys.executable, chunks=True), cwd=REPO, capture_output=True, text=True,
                           timeout=120)
    assert plain.returncode == 0 and manifest.read_curriculum(str(tmp_path / "plain"), 2) is None


def test_a_fill_plan_leaves_out_the_tasks_that_ran(tmp_path: Path) -> None:
    """The fill round's plan command plans only tasks the iteration has not run."""
    tasks = sorted(p.name for p in BUILTIN.iterdir() if (p / "task.toml").is_file())[:5]
    dataset = tmp_path / "dataset.txt"
    dataset.write_text("".join(f"{BUILTIN / name}\n" for name in tasks))
    config = RunConfig(dataset=str(dataset), store=str(tmp_path), run="fill", samples_per_task=2)
    done = subprocess.run(commands.plan(config, 0, python=sys.executable, tasks=2, exclude=tasks[:3]), cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert plan_names(done.stdout) == sorted(tasks[3:])
    assert len(json.loads(done.stdout)) == 4


def test_fill_rounds_roll_out_more_tasks_until_enough_groups_have_signal(tmp_path: Path, monkeypatch) -> None:
    """`LocalSteps.fill` plans more tasks while fewer than `tasks_per_iteration` groups earned two rewards, and stops
    at `max_fill_rounds`. The plan runs for real; the rollouts are a stand-in that scores each task as scripted,
    since a real policy's rewards cannot be chosen (tests/test_local_run.py runs the real rollouts)."""
    tasks = sorted(p.name for p in BUILTIN.iterdir() if (p / "task.toml").is_file())[:6]
    dataset = tmp_path / "dataset.txt"
    dataset.write_text("".join(f"{BUILTIN / name}\n" for name in tasks))
    flat = set(tasks[:4])  # the first four tasks give flat groups, the last two mixed ones
    ran: list[list[str]] = []

    def rollouts(config, iteration, planned: list[PlannedRollout], proxy_url, env, evaluation=False):
        ran.append(sorted({Path(item.task).name for item in planned}))
        return [RolloutResult(rollout_id=item.rollout_id, task=Path(item.task).name, harness="direct", status=OK,
                              reward=1.0 if Path(item.task).name in flat else float(item.sample % 2),
                              sample=item.sample) for item in planned]

    monkeypatch.setattr(local, "run_rollouts", rollouts)
    config = RunConfig(dataset=str(dataset), store=str(tmp_path), run="fill", tasks_per_iteration=2,
                       samples_per_task=2, fill_batch=True, max_fill_rounds=3)

    def first_plan(names: list[str]) -> local.LocalSteps:
        steps = local.LocalSteps(config, 0, "http://127.0.0.1:9", {}, tmp_path, {False: 0}, {})
        steps.results[shape.ROLLOUT_STEPS[0]] = rollouts(config, 0, [
            PlannedRollout(str(BUILTIN / name), s, f"it0-{name}-s{s}", "image", 60, 1, 512, 256, 0)
            for name in names for s in range(2)], "", {})
        return steps

    steps = first_plan(tasks[:2])
    steps.fill()
    assert len(ran) >= 2 and ran[0] == sorted(tasks[:2])
    assert set(tasks[4:]) <= {result.task for result in steps.training_results()}  # both mixed tasks were reached
    assert all(not set(batch) & set(sum(ran[:i], [])) for i, batch in enumerate(ran))  # no task twice
    # the control: a first plan whose groups both have signal rolls out nothing more
    ran.clear()
    enough = first_plan(tasks[4:])
    enough.fill()
    assert ran == [sorted(tasks[4:])] and not enough.filled


@pytest.mark.parametrize("override, message", [
    ("curriculum=easy", "'curriculum' must be one of off, pass_rate, got 'easy'"),
    ("curriculum_window=0", "'curriculum_window' must be at least 1, got 0"),
    ("max_fill_rounds=0", "'max_fill_rounds' must be at least 1, got 0"),
    ("curriculum_min_pass=0.8", "must satisfy 0 <= min < max <= 1 .* got 0.8 and 0.5"),
    ("curriculum_max_pass=1.5", "must satisfy 0 <= min < max <= 1"),
    ("curriculum_pass_reward=0", "'curriculum_pass_reward' must be more than 0"),
])
def test_a_bad_learning_signal_key_is_refused_in_one_sentence(override: str, message: str) -> None:
    """Each bad value is refused naming its key; the control: the same keys with good values load."""
    extra = ["curriculum_max_pass=0.5"] if "min_pass" in override else []
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["harness=direct", *extra, override])
    load_config(None, ["harness=direct", "curriculum=pass_rate", "curriculum_window=2", "curriculum_min_pass=0.1",
                       "curriculum_max_pass=0.9", "fill_batch=true", "max_fill_rounds=1"])


def test_fill_batch_is_refused_for_an_argo_run_in_one_sentence() -> None:
    """The Argo DAG plans once: `fill_batch` is refused for it; the control: the same config without it passes."""
    settings = ["harness=direct", "store=s3://bucket/runs", "model=s3://bucket/model", "max_model_len=4096"]
    with pytest.raises(ConfigError, match="'fill_batch' is for the local runner only"):
        validate_for_argo(load_config(None, [*settings, "fill_batch=true"]))
    validate_for_argo(load_config(None, [*settings, "curriculum=pass_rate"]))


def test_an_argo_iterations_plan_step_runs_the_same_curriculum_command() -> None:
    """The Argo plan template carries the curriculum's flags the local runner's plan command has (one builder,
    `commands.plan`), reading and writing the run's store; the control: without a curriculum it carries none."""
    settings = ["run=t", *NO_CLUSTER_EGRESS]
    config = load_config(CLUSTER, [*settings, "curriculum=pass_rate"])
    text = json.dumps(iteration_workflow(config, 3).to_dict())
    for flag in commands.curriculum_flags(config):
        assert json.dumps(flag)[1:-1] in text
    assert config.run_url.startswith("s3://") and "--curriculum-pass-reward" in text
    assert "--curriculum" not in json.dumps(iteration_workflow(load_config(CLUSTER, settings), 3).to_dict())

