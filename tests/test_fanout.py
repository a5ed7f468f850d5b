"""A fan-out of any size, and a Workflow that Argo can store: the plan goes to the store in chunks, each printed
well under Argo's 256 KiB cap on a step's result, and 10,000 rollouts render, validate and are sized against
Argo's 1 MiB object limit (`tests/argo_status.py` models the cap, the node status and its compression)."""

import json
import random
import re
from pathlib import Path

import pytest
import yaml

from argo_status import (MAX_WORKFLOW_SIZE, RESULT_BYTES, WithParamError, collect_nodes, fnv32a, go_value,
                         json_bytes, stored_sizes, step_result, with_param)
from steps import manifest, plan
from steps.contracts import layout
from steps.contracts.rollout import PlannedRollout
from steps.tasks import load_dataset
from test_workflows import (FakeArgoServer, cluster_config, drive, fake_argo, s3_store,  # noqa: F401 - fixtures
                            schema_errors, workflow_validator)
from workflows import commands
from workflows.config import MAX_ROLLOUTS_WITHOUT_OFFLOAD, ConfigError, check_workflow_size, validate_for_argo
from workflows.evaluation import evaluation_workflow
from workflows.iteration import APP_ROLLOUTS_FILE, iteration_workflow
from workflows.lint import semantic_problems

REPO = Path(__file__).resolve().parents[1]
BUILTIN = "steps/tasks/builtin"  # 14 tasks: 10 tasks x 1,000 samples are 10,000 rollouts
INPUT = re.compile(r"\{\{inputs\.parameters\.(\w+)\}\}")
ITEM = re.compile(r"\{\{item\.(\w+)\}\}")


def template(spec: dict, name: str) -> dict:
    return next(t for t in spec["templates"] if t["name"] == name)


def dag_task(spec: dict, dag: str, name: str) -> dict:
    return next(t for t in template(spec, dag)["dag"]["tasks"] if t["name"] == name)


def arguments(task: dict) -> dict[str, str]:
    return {p["name"]: p["value"] for p in task["arguments"]["parameters"]}


def printed(argv: list[str], capsys) -> str:
    """Runs a `python -m steps.plan ...` argv in this process; returns its stdout."""
    assert argv[:3] == ["python", "-m", "steps.plan"]
    assert plan.main(argv[3:]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def big_config(store: Path, *overrides: str):
    return cluster_config("run=big", f"store={store}", f"dataset={BUILTIN}", "tasks_per_iteration=10",
                          "samples_per_task=1000", *overrides)


def test_a_plan_printed_whole_is_cut_at_argos_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The failing control: 10,000 rollouts printed as one list are ~2.5 MB, Argo keeps the last 256 KiB and the
    `withParam` cannot parse it. A small plan passes the same model unchanged."""
    monkeypatch.chdir(REPO)
    argv = commands.plan(big_config(tmp_path), 0)  # no --chunks: the whole list on stdout, as before
    whole = printed(argv, capsys)
    assert len(whole) > 2_000_000 and len(step_result(whole).encode()) == RESULT_BYTES
    with pytest.raises(WithParamError, match="could not be parsed as a JSON list"):
        with_param(step_result(whole))
    small = printed(commands.plan(big_config(tmp_path, "samples_per_task=8"), 0), capsys)
    assert len(with_param(step_result(small))) == 80


def test_10000_rollouts_fan_out_by_chunks_each_reading_its_own_item(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      capsys) -> None:
    """The rendered Workflow's fan-out, run through Argo's cap: the plan step's printed chunk numbers, each chunk's
    printed items, every rollout's inputs from its own item; together exactly the 10,000 planned rollouts."""
    monkeypatch.chdir(REPO)
    config = big_config(tmp_path / "store")
    spec = iteration_workflow(config, 0).to_dict()["spec"]
    argv = template(spec, "plan")["container"]["command"]
    assert argv == commands.plan(config, 0, app_rollouts=APP_ROLLOUTS_FILE, chunks=True,
                                 dataset=commands.stored_dataset_url(config))
    argv = [*argv]  # here: the repository's dataset rather than the run's snapshot, the app list in tmp_path
    argv[argv.index("--dataset") + 1], argv[argv.index("--app-rollouts") + 1] = BUILTIN, str(tmp_path / "apps.json")
    numbers = with_param(step_result(printed(argv, capsys)))
    assert with_param(step_result((tmp_path / "apps.json").read_text())) == []  # no builtin task has an app
    fanout = dag_task(spec, "collect", "rollout")
    assert (fanout["withParam"], fanout["template"]) == ("{{tasks.plan.outputs.result}}", "rollout-chunk")
    assert arguments(fanout)["chunk"] == "{{item}}"
    items_task, rollouts = dag_task(spec, "rollout-chunk", "items"), dag_task(spec, "rollout-chunk", "rollout")
    assert rollouts["withParam"] == "{{tasks.items.outputs.result}}" and rollouts["template"] == "rollout"
    seen: dict[str, dict[str, str]] = {}
    for number in numbers:
        url = INPUT.sub(lambda m: {"chunk": go_value(number)}[m.group(1)], arguments(items_task)["url"])
        command = [INPUT.sub(lambda m: url, part) for part in template(spec, "chunk-items")["container"]["command"]]
        out = printed(command, capsys)
        assert len(out.encode()) <= plan.CHUNK_BYTES + 1 < RESULT_BYTES  # its newline beside it
        for item in with_param(step_result(out)):
            inputs = {name: ITEM.sub(lambda m: go_value(item[m.group(1)]), value)
                      for name, value in arguments(rollouts).items() if name != "proxy_url"}
            assert inputs["rollout_id"] not in seen
            seen[inputs["rollout_id"]] = inputs
    tasks, _ = load_dataset(BUILTIN)
    planned = plan.plan(tasks, 0, 10, 1000, config.seed, commands.task_image_prefix(config))
    assert len(numbers) == 40 and len(seen) == len(planned) == 10_000
    for rollout in planned:
        assert seen[rollout.rollout_id] == {
            "task": rollout.task, "sample": str(rollout.sample), "rollout_id": rollout.rollout_id,
            "image": rollout.image,
            "deadline": str(rollout.deadline_s), "cpus": go_value(rollout.cpus), "memory_mb": str(rollout.memory_mb),
            "storage_mb": str(rollout.storage_mb), "gpus": str(rollout.gpus)}


def test_chunks_hold_whole_items_within_their_limit(tmp_path: Path, capsys) -> None:
    """Items of any size (a long app command makes one large) go into consecutive chunks, each printed within the
    limit; an item larger than a chunk is an error naming it, and the plan step says so in one line."""
    rng = random.Random(0)
    items = [PlannedRollout(f"tasks/t{i}", i % 8, f"it0-t{i}-s{i % 8}", "img", 480, 1, 2048, 10240, 0,
                            app="x" * rng.choice([0, 10, 2000, 20_000])) for i in range(3000)]
    found = plan.chunks(items)
    assert all(len(chunk.encode()) <= plan.CHUNK_BYTES for chunk in found) and len(found) > 10
    assert [r["rollout_id"] for chunk in found for r in json.loads(chunk)] == [r.rollout_id for r in items]
    huge = PlannedRollout("tasks/t", 0, "it0-t-s0", "img", 480, 1, 2048, 10240, 0, app="x" * plan.CHUNK_BYTES)
    with pytest.raises(plan.ChunkError, match="planned rollout it0-t-s0 is .* more than a chunk of the plan holds"):
        plan.chunks([huge])
    folder = str(tmp_path / "plan")
    assert plan.write_chunks(folder, "app-rollouts", items[:5]) == [0]
    assert plan.main(["chunk", layout.plan_chunk_url(folder, "app-rollouts", 0)]) == 0
    assert [r["rollout_id"] for r in json.loads(capsys.readouterr().out)] == [r.rollout_id for r in items[:5]]
    assert plan.main(["chunk", layout.plan_chunk_url(folder, "app-rollouts", 7)]) == 2
    assert "app-rollouts-7.json of the plan cannot be read" in capsys.readouterr().err
    (tmp_path / "file").write_text("")  # a store folder that cannot be made: one sentence, exit code 2
    argv = ["--dataset", str(REPO / BUILTIN), "--iteration", "0", "--tasks-per-iteration", "1",
            "--samples-per-task", "1", "--chunks", str(tmp_path / "file" / "plan")]
    assert plan.main(argv) == 2 and "error: the plan cannot be written to" in capsys.readouterr().err


@pytest.mark.parametrize("rollouts", [1000, 10_000])
def test_the_workflow_of_an_iteration_renders_the_same_at_any_size(rollouts: int, workflow_validator) -> None:
    """1,000 and 10,000 rollouts (with an evaluation of as many beside them) render the same small spec, which
    validates against Argo's strict schema and its semantics."""
    config = cluster_config("run=big", f"tasks_per_iteration={rollouts // 8}", "samples_per_task=8", "eval_every=1",
                            "eval_k=8", "argo_node_status_offload=true")
    validate_for_argo(config)
    for workflow in (iteration_workflow(config, 0).to_dict(), evaluation_workflow(config, 1).to_dict()):
        assert schema_errors(workflow_validator, workflow) == [] and semantic_problems(workflow) == []
        assert json_bytes(workflow) < 64 * 1024
    small = cluster_config("run=big", "tasks_per_iteration=4", "samples_per_task=8", "eval_every=1", "eval_k=8")
    assert yaml.safe_dump(iteration_workflow(config, 0).to_dict()["spec"]).replace(
        f"tasks-per-iteration\n    - '{rollouts // 8}'", "") == yaml.safe_dump(
        iteration_workflow(small, 0).to_dict()["spec"]).replace("tasks-per-iteration\n    - '4'", "")


def test_fnv_is_gos() -> None:
    """The node ids' hash is Go's FNV-1a (hash/fnv New32a): its published test vectors."""
    assert (fnv32a(""), fnv32a("a"), fnv32a("foobar")) == (0x811C9DC5, 0xE40C292C, 0xBF9CF968)


def sizes(rollouts: int) -> tuple[dict[str, int], int, int]:
    """The modelled sizes of an iteration's Workflow whose collect DAG ran `rollouts` rollouts; its spec's bytes and
    node count."""
    tasks, _ = load_dataset(str(REPO / BUILTIN))
    planned = plan.plan(tasks, 0, 10, rollouts // 10, image_prefix="ghcr.io/openforge/task-", root=REPO)
    chunks = [json.loads(chunk) for chunk in plan.chunks(planned)]
    workflow = iteration_workflow(cluster_config("run=big", f"tasks_per_iteration={rollouts // 8}"), 0).to_dict()
    status = collect_nodes("openforge-big-it0", chunks)
    assert len(status["nodes"]) == 2 * rollouts + 5 * len(chunks) + 9  # a Retry and a Pod each; DAG, items x2, ...
    return stored_sizes(workflow, status), json_bytes(workflow), len(chunks)


def test_the_status_of_1000_rollouts_fits_once_compressed_and_10000_need_offload() -> None:
    """docs/workflows.md's table: 1,000 rollouts are ~4 MB of node status, which Argo compresses below 1 MiB; 10,000
    stay above it compressed, so they need node status offload; the driver's limit keeps under half of 1 MiB."""
    small, spec, _ = sizes(1000)
    assert 3_500_000 < small["nodes"] < 4_300_000 and small["raw"] > MAX_WORKFLOW_SIZE
    assert small["compressed"] < MAX_WORKFLOW_SIZE // 3 and spec < 30_000
    big, spec_big, chunks = sizes(10_000)
    assert 35_000_000 < big["nodes"] < 43_000_000 and chunks == 40
    assert abs(spec_big - spec) < 8  # the same spec but the digits of tasks_per_iteration
    assert big["compressed"] > 2 * MAX_WORKFLOW_SIZE
    limit, _, _ = sizes(MAX_ROLLOUTS_WITHOUT_OFFLOAD)
    assert limit["compressed"] < MAX_WORKFLOW_SIZE // 2


def test_the_driver_refuses_an_iteration_argo_cannot_store(fake_argo: FakeArgoServer, s3_store: str,
                                                          capsys) -> None:
    """More than MAX_ROLLOUTS_WITHOUT_OFFLOAD rollouts a Workflow (counted from the staged datasets) without
    `argo_node_status_offload`: one sentence naming the controller's setting, and nothing created; with the key
    (the control) the run goes on."""
    big = ("run=big", "iterations=1", "tasks_per_iteration=64", "samples_per_task=200")  # 14 builtin tasks: 2,800
    assert drive(fake_argo, s3_store, *big) == 2
    err = capsys.readouterr().err
    assert "persistence.nodeStatusOffLoad" in err and "argo_node_status_offload: true" in err
    assert "up to 2800 rollouts" in err and len([line for line in err.splitlines() if line.startswith("error:")]) == 1
    assert [path for _, path, _, _ in fake_argo.calls("POST") if not path.endswith("/lint")] == []
    manifest.write_json(f"{s3_store}/big/checkpoints/iteration-1/metrics.json", {"loss": 0.5})
    assert drive(fake_argo, s3_store, *big, "argo_node_status_offload=true") == 0
    created = [path for _, path, _, _ in fake_argo.calls("POST") if not path.endswith("/lint")]
    assert created == ["/api/v1/workflows/openforge"]
    with pytest.raises(ConfigError, match="up to 2008 rollouts, more than 2000"):
        check_workflow_size(cluster_config("run=big", "tasks_per_iteration=251", "samples_per_task=8"), 1000, 0)
    check_workflow_size(cluster_config("run=big", "tasks_per_iteration=250", "samples_per_task=8"), 1000, 0)
    check_workflow_size(cluster_config("run=big", "tasks_per_iteration=1250", "samples_per_task=8"), 14, 0)  # 112
    with pytest.raises(ConfigError, match="up to 2005 rollouts"):  # an eval run: its tasks x eval_k
        check_workflow_size(cluster_config("run=big", "eval_k=5"), 0, 401, evaluation=True)
    with pytest.raises(ConfigError, match="up to 2012 rollouts"):  # an iteration and its evaluation beside it
        check_workflow_size(cluster_config("run=big", "tasks_per_iteration=12", "samples_per_task=1", "eval_every=2",
                                           "eval_k=4"), 14, 500)
