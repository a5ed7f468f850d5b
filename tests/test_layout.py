"""The run's folder layout has one owner, `steps/contracts/layout.py`: no other module of `steps/` or `workflows/`
spells a piece of it, and the local runner and the Argo DAG put every file at the same URL."""

import ast
import dataclasses
import re
import subprocess
from pathlib import Path

import pytest

from steps.contracts import layout
from steps.contracts.rollout import PlannedRollout, plan_json
from steps.proxy import results
from steps.proxy.config import ProxyConfig
from workflows import local
from workflows.config import load_config
from workflows.iteration import iteration_workflow

REPO = Path(__file__).resolve().parents[1]
# Pieces of a run's layout as they would appear in a string literal (or an f-string's literal part).
# A folder's name counts beside a slash ("trajectories" alone is a table or template name).
FOLDERS = "results|checkpoints|base-model|manifest|trajectories|calls|logs|reports|datasets|tracking"
PIECES = re.compile(rf"/({FOLDERS})(/|$)|^({FOLDERS})/|iteration-(\{{|\*|$)|-attempt-|/run=|/iteration="
                    r"|/(result|metrics|run)\.json$|/\w*\.parquet$")
# What owns paths that are not a run's: the proxy's routes and its store's inside, the sandbox's and the
# harnesses' folders (/logs/agent, /logs/verifier), the task format, and the layout itself.
NOT_THE_RUNS = ("steps/proxy/", "steps/sandbox/", "steps/harnesses/", "steps/tasks/", "steps/contracts/layout.py")


def literals(path: Path) -> list[tuple[int, str]]:
    """Every string literal of a module but its docstrings, with its line."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def layout_pieces(paths: list[Path], root: Path = REPO) -> list[str]:
    """`file:line: literal` for each literal that spells a piece of the run's layout."""
    return [f"{path.relative_to(root)}:{line}: {value!r}" for path in paths for line, value in literals(path)
            if PIECES.search(value)]


def test_only_the_layout_module_spells_the_runs_folders() -> None:
    modules = [p for folder in ("steps", "workflows") for p in sorted((REPO / folder).rglob("*.py"))
               if not str(p.relative_to(REPO)).startswith(NOT_THE_RUNS)]
    assert len(modules) > 20
    assert layout_pieces(modules) == []


def test_the_scan_finds_a_spelt_out_path(tmp_path: Path) -> None:
    """Control: the scan catches the ways the layout used to be spelt out, and leaves docstrings alone."""
    module = tmp_path / "spelt.py"
    module.write_text('"""Writes runs/demo/results/iteration-0/r/result.json."""\n'
                      'def f(run, i):\n    return f"{run}/results/iteration-{i}"\n'
                      'def g(run):\n    return run + "/checkpoints/iteration-1"\n'
                      'def h(run):\n    return f"{run}/logs"\n')
    found = layout_pieces([module], root=tmp_path)
    assert [entry.split(":")[1] for entry in found] == ["3", "5", "7"]
    assert layout_pieces([REPO / "steps" / "contracts" / "layout.py"])  # the owner does spell them


def test_the_layout_is_the_one_existing_runs_have() -> None:
    """Runs already in a store stay readable: the URLs are the ones they were written at."""
    run = layout.run_url("s3://b/runs/", "demo")
    assert run == "s3://b/runs/demo"
    assert layout.calls_url(run) == "s3://b/runs/demo/calls"
    assert layout.result_url(run, 3, "it3-t-s1") == "s3://b/runs/demo/results/iteration-3/it3-t-s1/result.json"
    assert layout.run_partition_url(run, "demo", 3) == "s3://b/runs/demo/trajectories/run=demo/iteration=3"
    assert layout.table_url(layout.run_partition_url(run, "demo", 3), "samples").endswith("iteration=3/samples.parquet")
    assert layout.checkpoint_url(run, 2, "s3://b/base") == "s3://b/runs/demo/checkpoints/iteration-2"
    assert layout.metrics_url(layout.checkpoint_url(run, 2, "")) == "s3://b/runs/demo/checkpoints/iteration-2/metrics.json"
    assert layout.iteration_record_url(run, 3) == "s3://b/runs/demo/manifest/iteration-3.json"
    assert layout.run_config_url(run) == "s3://b/runs/demo/manifest/run.json"
    assert (layout.logs_url(run), layout.reports_url(run)) == ("s3://b/runs/demo/logs", "s3://b/runs/demo/reports")


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def config():
    """A cluster config whose store is a local folder: the local runner's paths are folders (Path), and the
    Workflow builder takes any store."""
    return load_config("configs/cluster-example.yaml", ["run=t", "store=/srv/store"])


@pytest.fixture
def local_commands(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """The argv of each step the local runner starts for iteration 1, one planned rollout, nothing actually run."""
    seen: dict[str, list[str]] = {}
    planned = plan_json([PlannedRollout(task="steps/tasks/builtin/hello-file", sample=1, rollout_id="it1-hello-file-s1",
                                        image="", deadline_s=480, cpus=1, memory_mb=1024, storage_mb=1024, gpus=0)])

    def run_step(name: str, argv: list[str], env: dict, log: Path) -> str:
        seen[name] = argv
        return "[0]" if name == "plan" else ""  # one chunk of the plan, which `read_chunk` reads

    def read_chunk(url: str) -> str:
        seen["chunk"] = [url]
        return planned

    def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        seen["rollout"] = argv
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(local, "run_step", run_step)
    monkeypatch.setattr(local, "read_chunk", read_chunk)
    monkeypatch.setattr(local.subprocess, "run", run)
    monkeypatch.setattr(local, "swap_weights", lambda *args: None)
    real = local.run_rollouts  # nothing ran, so no result: graded here, for the iteration to go on to its update
    monkeypatch.setattr(local, "run_rollouts", lambda *args, **kwargs: [dataclasses.replace(result, status="ok", reward=0.0)
                                                                        for result in real(*args, **kwargs)])
    local.run_iteration(config(), 1, "http://proxy:8100", "k", {}, Path("/nonexistent"))
    return seen


def test_local_runner_and_argo_put_every_file_at_the_same_url(local_commands: dict[str, list[str]]) -> None:
    run = config()
    spec = iteration_workflow(run, 1).to_dict()["spec"]
    argo = {t["name"]: t for t in spec["templates"]}
    command = {name: t["container"]["command"] for name, t in argo.items() if "container" in t}
    for name in ("trajectories", "update"):
        for option in ("--results", "--out", "--run", "--iteration", "--trajectories", "--checkpoint"):
            if option in command[name]:
                assert flag(local_commands[name], option) == flag(command[name], option), (name, option)
    assert flag(command["trajectories"], "--results") == layout.results_url(run.run_url, 1) == "/srv/store/t/results/iteration-1"
    assert flag(command["update"], "--trajectories") == layout.run_partition_url(run.run_url, "t", 1)
    assert flag(command["update"], "--out") == layout.checkpoint_url(run.run_url, 2, run.model)
    assert flag(command["serve"], "--store") == layout.calls_url(run.run_url)
    # The plan's chunks: written and read at the same URLs.
    assert flag(local_commands["plan"], "--chunks") == flag(command["plan"], "--chunks") == layout.plan_url(run.run_url, 1)
    items = next(t for t in argo["rollout-chunk"]["dag"]["tasks"] if t["name"] == "items")
    assert local_commands["chunk"] == [layout.plan_chunk_url(layout.plan_url(run.run_url, 1), "rollouts", 0)]
    assert items["arguments"]["parameters"][0]["value"] == layout.plan_chunk_url(
        layout.plan_url(run.run_url, 1), "rollouts", "{{inputs.parameters.chunk}}")
    # A rollout's result: the local runner's --out folder (its attempt id) and where the serve pod's proxy writes
    # what an Argo rollout sends it (one folder per attempt id, as the local runner's), both under the iteration's
    # results folder that the trajectories step reads.
    assert flag(local_commands["rollout"], "--out") == layout.rollout_url(run.run_url, 1, "it1-hello-file-s1")
    proxy = ProxyConfig("u", "s", "k", run_url=flag(command["serve"], "--run-url"),
                        iteration=int(flag(command["serve"], "--iteration")))
    assert flag(command["rollout"], "--send-result") == "iteration"
    assert results.result_url(proxy, "it1-hello-file-s1-a2", 1, evaluation=False) == \
        layout.result_url(run.run_url, 1, "it1-hello-file-s1-a2")
    # The plan's sample number reaches the rollout step on both.
    assert flag(local_commands["rollout"], "--sample") == "1"
    assert flag(command["rollout"], "--sample") == "{{inputs.parameters.sample}}"
