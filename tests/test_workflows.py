"""The Argo side of a run, checked offline: golden YAML, strict schema, semantics, secrets, the driver.

    .venv/bin/python -m pytest -q tests/test_workflows.py
    OPENFORGE_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_workflows.py   # rewrite tests/golden/

No Kubernetes API server, Argo controller or container engine can be installed on this kind of
machine (none is in the package registries it reaches), so no Workflow is executed here. What is checked instead:
the exact YAML (golden files), Argo's schema with unknown keys forbidden (Hera's own models), the
references the schema cannot see (workflows/lint.py), that no secret value is in the YAML, and what
`workflows/submit.py` sends to an Argo Server. For the last, `FakeArgoServer` is a test double: a
small HTTP server on 127.0.0.1 that speaks the Argo Server routes Hera's WorkflowsService calls
(create, get, lint, retry, resubmit), records every request and moves each workflow through its
phases. The run manifest goes to a real S3 endpoint on loopback (moto, the `s3_server` fixture).
"""

import ast
import copy
import json
import os
import re
import subprocess
import sys
import threading
import urllib.parse
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import jsonschema
from jsonschema.protocols import Validator
import pytest
import yaml
from hera.workflows.models import Workflow as WorkflowModel

from steps import manifest, plan, sampling
from steps.harnesses import ALL_HARNESSES
from steps.tasks import load_dataset, load_task
from steps.contracts import layout
from steps.contracts.manifest import IterationRecord
from steps.contracts.rollout import PlannedRollout, RolloutResult
from workflows import commands, shape, submit
from workflows import lint
from workflows.argo import node_id
from workflows.config import ConfigError, load_config, validate_for_argo
from workflows.evaluation import evaluation_workflow
from workflows.sft import sft_workflow
from workflows.iteration import (APP_ROLLOUTS_FILE, KEPT_LOGS, PRIVATE, RUNNER_STORAGE_MB, WORKFLOW_POD_LABEL,
                                 app_layout, iteration_workflow, rollout_pod_patch, rollout_resources, workflow_name)
from workflows.lint import semantic_problems

REPO = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden"
CLUSTER = REPO / "configs" / "cluster-example.yaml"
# What a driver without Kubernetes access (these tests: no kubeconfig) sets instead of `auto`: the API server's
# addresses (tests/test_rollout_network.py checks `auto` itself)
NO_CLUSTER_EGRESS = ("rollout_egress_cidrs=10.0.0.5/32",)
# Hera 7.1 calls pydantic's deprecated .json() on every request; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::pydantic.PydanticDeprecatedSince20")
# Every scheduling key set, on each pod group (tests/test_scheduling.py checks where each one lands).
EVERY_POD_KEY = [
    "serve_pod={node_selector: {pool: h100}, priority_class: rl-high, queue: rl-gpu, cpu: 16, memory: 128Gi, "
    "ephemeral_storage: 200Gi, cpu_limit: 32, memory_limit: 256Gi, ephemeral_storage_limit: 400Gi, "
    "pod_spec_patch: {hostIPC: true}}",
    "rollout_pod={node_selector: {pool: cpu}, tolerations: [{key: spot, operator: Exists}], priority_class: rl-low, "
    "queue: rl-cpu, pod_spec_patch: {dnsPolicy: Default, containers: [{name: main, resources: {limits: {cpu: '9'}}}]}}",
    "update_pod={node_selector: {pool: h100}, priority_class: rl-high, queue: rl-gpu, cpu: 64, memory: 512Gi, "
    "ephemeral_storage: 1Ti, memory_limit: 1Ti, pod_spec_patch: {hostIPC: true}}",
    "steps_pod={node_selector: {pool: cpu}, avoid_gpu_nodes: false, priority_class: rl-low, queue: rl-cpu, cpu: 1, "
    "memory: 4Gi, ephemeral_storage: 10Gi, pod_spec_patch: {enableServiceLinks: false}, "
    "tolerations: [{key: pool, operator: Equal, value: cpu, effect: NoSchedule, tolerationSeconds: 60}]}",
    "serve_shm=32Gi", "workflow_timeout_s=172800", "serve_timeout_s=86400", "step_timeout_s=3600",
    "update_timeout_s=36000"]
GOLDEN_CASES = {  # golden file -> (overrides on configs/cluster-example.yaml, iteration); evaluation-*: an eval Workflow
    "iteration-codex-it0.yaml": (["run=golden", "iterations=2"], 0),
    "iteration-codex-it1.yaml": (["run=golden", "iterations=2"], 1),
    "iteration-codex-stale1-it1.yaml": (["run=golden", "iterations=2", "max_staleness=1"], 1),
    "iteration-direct-it0.yaml": (["run=golden", "harness=direct", "samples_per_task=4", "s3_endpoint="], 0),
    "iteration-codex-eval-it0.yaml": (["run=golden", "iterations=2", "eval_every=2", "eval_k=2"], 0),
    # 10,000 rollouts (1,250 tasks x 8): the same spec, the plan in chunks in the store (tests/test_fanout.py)
    "iteration-codex-10000-it0.yaml": (["run=golden", "iterations=2", "tasks_per_iteration=1250",
                                        "samples_per_task=8", "argo_node_status_offload=true"], 0),
    "evaluation-direct.yaml": (["run=golden-eval", "harness=direct", "eval_k=3"], 0),
    "evaluation-codex-final.yaml": (["run=golden", "iterations=2", "eval_every=2", "eval_k=2"], 2),
    "iteration-codex-2nodes-it0.yaml": (["run=golden", "iterations=2", "update_nodes=2", "update_gpus=8"], 0),
    "iteration-codex-2nodes-nccl-it0.yaml": (["run=golden", "iterations=2", "update_nodes=2", "update_gpus=8",
                                             "update_rdma_resources={rdma/ib: 1}", "update_host_network=true",
                                             "update_env={NCCL_DEBUG: INFO, NCCL_IB_HCA: mlx5}"], 0),
    "iteration-browser-use-it0.yaml": (["run=golden", "harness=browser-use", "dataset=steps/tasks/gui"], 0),
    "iteration-codex-podidentity-it0.yaml": (["run=golden", "s3_credentials=pod-identity", "s3_endpoint=",
                                              "rollout_service_account=openforge-rollout", "s3_region=us-west-2"], 0),
    "iteration-codex-every-pod-key-it0.yaml": (["run=golden", "iterations=2", "eval_every=2", *EVERY_POD_KEY], 0),
    "iteration-codex-lora-cache-it1.yaml": (["run=golden", "iterations=2", "lora_rank=8",
                                             "model_cache_volume=openforge-models"], 1),
    # an SFT run (workflows/sft.py) of a hub student on the recordings of the run "teacher"
    "sft-hub.yaml": (["run=golden-sft", "iterations=1", "model=hf://Qwen/Qwen3-8B", "learning_rate=1e-5"], 0),
}


def golden_workflow(name: str):
    """The Workflow a golden file holds: an iteration's, an evaluation's (`workflows/evaluation.py`) or an SFT
    run's (`workflows/sft.py`)."""
    overrides, iteration = GOLDEN_CASES[name]
    if name.startswith("sft-"):
        return sft_workflow(cluster_config(*overrides), "teacher")
    build = evaluation_workflow if name.startswith("evaluation-") else iteration_workflow
    return build(cluster_config(*overrides), iteration)


def cluster_config(*overrides: str):
    """configs/cluster-example.yaml with overrides."""
    return load_config(CLUSTER, list(overrides))


# ---- golden YAML, schema, semantics, secrets ----

@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_yaml(name: str) -> None:
    """Each workflow equals its committed YAML; OPENFORGE_UPDATE_GOLDEN=1 rewrites the file instead."""
    workflow = golden_workflow(name)
    path = GOLDEN / name
    if os.environ.get("OPENFORGE_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(workflow.to_yaml())
    assert path.exists(), f"{path} is missing; create it with OPENFORGE_UPDATE_GOLDEN=1"
    assert workflow.to_dict() == yaml.safe_load(path.read_text()), f"{name} changed; review and regenerate"


def strict(schema: object) -> object:
    """The schema with `additionalProperties: false` on every object that lists its properties."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def workflow_validator() -> Validator:
    """Argo's Workflow schema from Hera's models, unknown keys forbidden (plain pydantic ignores them)."""
    schema = strict(WorkflowModel.model_json_schema(by_alias=True))
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)


def schema_errors(validator: Validator, workflow: dict) -> list[str]:
    """Every schema violation as 'path: message'."""
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(workflow)]


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_schema_strict(name: str, workflow_validator: Validator) -> None:
    """Every golden workflow validates against Argo's schema with no unknown key."""
    assert schema_errors(workflow_validator, yaml.safe_load((GOLDEN / name).read_text())) == []


def test_schema_catches_misspelt_keys(workflow_validator: Validator) -> None:
    """The strict schema is not vacuous: a misspelt key and a wrong type are reported."""
    workflow = iteration_workflow(cluster_config("run=t"), 0).to_dict()
    broken = copy.deepcopy(workflow)
    rollout = next(t for t in broken["spec"]["templates"] if t["name"] == "rollout")
    rollout["retryStrategy"]["limt"] = rollout["retryStrategy"].pop("limit")
    collect = next(t for t in broken["spec"]["templates"] if t["name"] == "collect")
    fanout = next(t for t in collect["dag"]["tasks"] if t["name"] == "rollout")
    fanout["withParams"] = fanout.pop("withParam")
    broken["spec"]["parallelism"] = "many"
    errors = "\n".join(schema_errors(workflow_validator, broken))
    assert "limt" in errors and "withParams" in errors and "parallelism" in errors


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_semantics(name: str) -> None:
    """Templates exist, references resolve, no cycles, in every golden workflow."""
    assert semantic_problems(yaml.safe_load((GOLDEN / name).read_text())) == []


def test_semantics_catch_broken_workflows() -> None:
    """Each kind of break is reported: unknown template, unresolved task/input refs, cycle, missing argument."""
    workflow = iteration_workflow(cluster_config("run=t"), 0).to_dict()
    templates = {t["name"]: t for t in workflow["spec"]["templates"]}
    tasks = {t["name"]: t for t in templates["collect"]["dag"]["tasks"]}
    tasks["rollout"]["depends"] = tasks["rollout-app"]["depends"] = "plan"  # they use serve-address's ip before it
    tasks["plan"]["depends"] = "trajectories"  # plan -> trajectories -> rollout -> plan
    tasks["trajectories"]["template"] = "trajectory"
    del tasks["trajectories"]["arguments"]
    templates["rollout"]["inputs"]["parameters"].pop()  # proxy_url no longer declared
    workflow["spec"]["onExit"] = "recorder"
    problems = "\n".join(semantic_problems(workflow))
    for expected in ("does not depend on task 'serve-address'", "'plan' depends on itself", "unknown template 'trajectory'",
                     "declares no input 'proxy_url'", "passes 'proxy_url', which template 'rollout' does not take",
                     "onExit names unknown template 'recorder'"):
        assert expected in problems


def test_no_secret_values_in_yaml(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials are secretKeyRefs only: no credential-like env has a literal value, no secret leaks in."""
    secrets = {"ARGO_TOKEN": "argo-token-do-not-leak", "AWS_SECRET_ACCESS_KEY": "aws-secret-do-not-leak",
               "AWS_ACCESS_KEY_ID": "AKIAEXAMPLEDONOTLEAK", "OPENFORGE_ADMIN_KEY": "admin-do-not-leak"}
    for key, value in secrets.items():
        monkeypatch.setenv(key, value)
    for name in GOLDEN_CASES:
        text = golden_workflow(name).to_yaml()
        assert not any(value in text for value in secrets.values())
        assert not re.search(r"AKIA[0-9A-Z]{12,}|-----BEGIN|password", text, re.IGNORECASE)
        envs = [env for doc in [yaml.safe_load(text)] for t in doc["spec"]["templates"]
                for env in (t.get("container") or {}).get("env", [])]
        credentials = [e for e in envs if re.search(r"KEY|SECRET|TOKEN|PASSWORD", e["name"]) and "ENDPOINT" not in e["name"]]
        assert credentials and all("secretKeyRef" in e.get("valueFrom", {}) and "value" not in e for e in credentials)


# ---- the pieces the workflows are made of ----

def test_plan_is_deterministic_and_covers_the_dataset() -> None:
    """The plan: tasks x samples, unique rollout ids, rotating tasks, the task's timeouts in the deadline."""
    tasks, errors = load_dataset(REPO / "steps" / "tasks" / "builtin")
    assert not errors
    first = plan.plan(tasks, 0, 4, 2, seed=0, root=REPO)
    assert first == plan.plan(tasks, 0, 4, 2, seed=0, root=REPO) and len(first) == 8
    assert len({r.rollout_id for r in first}) == 8 and all(r.rollout_id.startswith("it0-") for r in first)
    second = plan.plan(tasks, 1, 4, 2, seed=0, root=REPO)
    assert {r.task for r in first}.isdisjoint({r.task for r in second})
    hello = next(r for r in plan.plan(tasks, 0, len(tasks), 1, root=REPO) if r.task.endswith("hello-file"))
    assert hello.task == "steps/tasks/builtin/hello-file" and hello.deadline_s == 300 + 60 + plan.SETUP_MARGIN_S
    assert (hello.cpus, hello.memory_mb, hello.storage_mb, hello.gpus) == (1, 1024, 1024, 0)  # hello-file's


def test_plan_cli_prints_only_json() -> None:
    """`python -m steps.plan` prints a JSON list on stdout, which Argo hands to withParam."""
    argv = commands.plan(cluster_config("run=t", "tasks_per_iteration=3", "samples_per_task=2"), 0, python=sys.executable)
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True, timeout=60).stdout
    items = json.loads(out)
    assert len(items) == 6 and set(items[0]) == {"task", "sample", "rollout_id", "image", "deadline_s", "cpus",
                                                 "memory_mb", "storage_mb", "gpus", "app"}
    assert items[0]["image"].startswith("ghcr.io/openforge/task-")


def test_commands_are_the_templates_commands() -> None:
    """The Argo templates run exactly the argv `workflows.commands` builds (one place for each step)."""
    config = cluster_config("run=t")
    spec = iteration_workflow(config, 1).to_dict()["spec"]
    argv = {t["name"]: t["container"]["command"] for t in spec["templates"] if "container" in t}
    assert argv["plan"] == commands.plan(config, 1, app_rollouts=APP_ROLLOUTS_FILE,
                                         dataset=commands.stored_dataset_url(config), chunks=True)
    assert argv["update"] == commands.update(config, layout.run_partition_url(config.run_url, "t", 1), config.checkpoint_url(1),
                                             config.checkpoint_url(2))
    assert argv["trajectories"][:3] == ["python", "-m", "steps.trajectories"]
    assert argv["rollout"][1:3] == ["-m", "steps.rollout"] and "--harness" in argv["rollout"]
    assert {t["name"] for t in spec["templates"]} >= {"serve", "plan", "rollout", "trajectories", "update", "record"}


def test_rollout_retries_only_infra_errors() -> None:
    """The rollout template retries on exit code 3 and the cluster's faults (tests/test_cluster_faults.py), with
    backoff, under the task's deadline plus the setup's."""
    rollout = next(t for t in iteration_workflow(cluster_config("run=t"), 0).to_dict()["spec"]["templates"]
                   if t["name"] == "rollout")
    assert rollout["retryStrategy"]["expression"].startswith("(lastRetry.exitCode == '3') || ")
    assert rollout["retryStrategy"]["backoff"]["factor"] == 2
    assert rollout["activeDeadlineSeconds"] == "{{=asInt(inputs.parameters.deadline) + 600}}"
    from steps.contracts.rollout import INFRA_EXIT_CODE
    assert INFRA_EXIT_CODE == 3


def test_rollout_pod_is_the_sandbox() -> None:
    """The rollout pod: pod isolation on the task read from the root-only copy, the task's own resources from
    the plan item (the patch, beside the runner's share in the container), no service account token, the image's
    WORKDIR kept, the layout from `app_layout`."""
    config = cluster_config("run=t")
    spec = iteration_workflow(config, 0).to_dict()["spec"]
    rollout = next(t for t in spec["templates"] if t["name"] == "rollout")
    argv = rollout["container"]["command"]
    assert argv[argv.index("--isolation") + 1] == "pod" and "--agent-uid" not in argv
    assert argv[argv.index("--task") + 1] == f"{PRIVATE}/tasks/{{{{inputs.parameters.task}}}}"  # fetched by `task`
    assert rollout["automountServiceAccountToken"] is False and "workingDir" not in rollout["container"]
    assert rollout["container"]["resources"] == rollout_resources(config, task=False)
    assert rollout["podSpecPatch"] == rollout_pod_patch(config)
    assert {"name": "PYTHONSAFEPATH", "value": "1"} in rollout["container"]["env"]
    assert app_layout() in rollout["initContainers"][0]["command"][-1]
    chunk = next(t for t in spec["templates"] if t["name"] == "rollout-chunk")  # one chunk of the fan-out
    fanout = next(t for t in chunk["dag"]["tasks"] if t["name"] == "rollout")
    passed = {p["name"]: p["value"] for p in fanout["arguments"]["parameters"]}
    assert [passed[n] for n in ("cpus", "memory_mb", "storage_mb", "gpus")] == [
        "{{item.cpus}}", "{{item.memory_mb}}", "{{item.storage_mb}}", "{{item.gpus}}"]
    assert set(passed) - {"proxy_url"} <= set(PlannedRollout.__dataclass_fields__) | {"deadline"}


def test_the_rollout_runner_may_keep_the_oom_killer_off_itself_unless_the_namespace_forbids_it() -> None:
    """SYS_RESOURCE lets the runner set its own oom_score_adj to -1000 (`steps.sandbox.pod.protect_runner`), so that
    Kubernetes' group OOM kill of the container spares it; `rollout_oom_guard: false` (Pod Security baseline refuses
    the capability) leaves the container without it (the control: no capability, no security context at all)."""
    for guard, expected in (("true", {"capabilities": {"add": ["SYS_RESOURCE"]}}), ("false", None)):
        spec = iteration_workflow(cluster_config("run=t", f"rollout_oom_guard={guard}"), 0).to_dict()["spec"]
        for name in ("rollout", "rollout-app"):
            rollout = next(t for t in spec["templates"] if t["name"] == name)
            assert rollout["container"].get("securityContext") == expected, (guard, name)


# ---- the rollout pod's resources, as Argo and Kubernetes make them ----

ARGO_TAG = re.compile(r"\{\{(=?)(.+?)\}\}")
ITEM = re.compile(r"\{\{item\.(\w+)\}\}")
# The expressions the rollout templates use: a subset of Argo's expression language (expr-lang) that reads the same
# in Python (calls, names, attributes, whole numbers and strings, +, *, != and ==). An expression outside it fails
# `argo_substitute`: check what Argo makes of it first (its JSON encoding escapes <, > and &, for one).
EXPRESSION_NODES = (ast.Expression, ast.Call, ast.Name, ast.Attribute, ast.Load, ast.Constant, ast.BinOp, ast.Add,
                    ast.Mult, ast.Compare, ast.NotEq, ast.Eq)
# kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/ (and apimachinery's ParseQuantity)
QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")


def argo_substitute(text: str, inputs: dict[str, str]) -> str:
    """`text` as Argo's controller substitutes a template for one node: `{{inputs.parameters.X}}` is the input's
    value, `{{=EXPR}}` the expression's value over the inputs, printed as Go's `%v` prints it (Argo's `asInt` and
    `sprig.ternary` as they behave on these strings)."""
    env = {"inputs": SimpleNamespace(parameters=SimpleNamespace(**inputs)), "asInt": int,
           "sprig": SimpleNamespace(ternary=lambda if_true, if_false, test: if_true if test else if_false)}

    def replace(tag: re.Match) -> str:
        expression, body = tag.groups()
        if not expression:
            return inputs[body.removeprefix("inputs.parameters.")]
        tree = ast.parse(body, mode="eval")
        assert all(isinstance(node, EXPRESSION_NODES) for node in ast.walk(tree)), f"not modelled here: {body}"
        return str(eval(compile(tree, "argo", "eval"), {"__builtins__": {}}, env))

    return ARGO_TAG.sub(replace, text)


def strategic_merge(original: dict, patch: dict) -> dict:
    """A strategic merge patch on maps as Kubernetes applies it (apimachinery's `mergeMap`, unmatched nulls
    ignored): a null removes its key, a map the original has is merged into, anything else (a map the original
    lacks included, nulls and all) replaces the original's value."""
    for key, value in patch.items():
        if value is None:
            original.pop(key, None)
        elif isinstance(value, dict) and isinstance(original.get(key), dict):
            original[key] = strategic_merge(original[key], value)
        else:
            original[key] = value
    return original


def rollout_pod_resources(config, task_toml: str, tmp_path: Path, app: bool = False) -> dict:
    """The resources of the rollout pod's main container for a task declaring `task_toml`'s [environment], as the
    cluster gets them: the plan's item, passed by the fan-out task (`{{item.X}}`, a JSON number as its digits), the
    template's podSpecPatch substituted with those inputs and merged into the container (Argo's `ApplyPodSpecPatch`),
    then the API server's defaulting (a limit without a request gives its request:
    kubernetes.io/docs/concepts/configuration/manage-resources-containers/#requests-and-limits)."""
    folder = tmp_path / "sized"
    (folder / "tests").mkdir(parents=True)
    (folder / "environment").mkdir()
    (folder / "task.toml").write_text(f"[environment]\n{task_toml}\n")
    (folder / "instruction.md").write_text("Say hello.\n")
    (folder / "tests" / "test.sh").write_text("exit 0\n")
    (folder / "environment" / "Dockerfile").write_text("FROM debian:bookworm-slim\n")
    (item,) = plan.plan([load_task(folder)], 0, 1, 1, root=tmp_path)
    spec = iteration_workflow(config, 0).to_dict()["spec"]
    name = "rollout-app" if app else "rollout"
    fanout = next(t for t in template(spec, f"{name}-chunk")["dag"]["tasks"] if t["name"] == name)
    values = {key: value if isinstance(value, str) else json.dumps(value) for key, value in asdict(item).items()}
    inputs = {p["name"]: ITEM.sub(lambda field: values[field.group(1)], p["value"])
              for p in fanout["arguments"]["parameters"] if p["name"] != "proxy_url"}
    rollout = template(spec, name)
    assert set(inputs) <= {p["name"] for p in rollout["inputs"]["parameters"]}
    main = {"name": "main", "resources": copy.deepcopy(rollout["container"]["resources"])}
    (patched,) = json.loads(argo_substitute(rollout["podSpecPatch"], inputs))["containers"]
    assert patched["name"] == "main"
    resources = strategic_merge(main, patched)["resources"]
    resources["requests"] = {**resources["limits"], **resources["requests"]}
    return resources


@pytest.mark.parametrize("harness", ["codex", "openclaw"])
def test_the_rollout_pod_gets_the_tasks_resources_and_the_harness_budget(harness: str, tmp_path: Path) -> None:
    """A task declaring memory_mb=1024, storage_mb=2048, gpus=1 gets a rollout pod whose limits are 1024 Mi plus
    the harness's allowance, its CPUs plus the harness's, 2048 Mi of ephemeral storage plus the runner's, and one
    GPU; each request equals its limit. Control: the same task with gpus = 0 names no GPU at all."""
    config = cluster_config("run=t", f"harness={harness}")
    module = ALL_HARNESSES[harness]
    runner_mb = RUNNER_STORAGE_MB + KEPT_LOGS * config.rollout_log_mb
    expected = {"cpu": f"{round((2 + module.CPUS) * 1000)}m", "memory": f"{1024 + module.MEMORY_MB}Mi",
                "ephemeral-storage": f"{2048 + runner_mb}Mi"}
    gpu = rollout_pod_resources(config, "cpus = 2\nmemory_mb = 1024\nstorage_mb = 2048\ngpus = 1", tmp_path)
    assert gpu == {"limits": {**expected, "nvidia.com/gpu": 1}, "requests": {**expected, "nvidia.com/gpu": 1}}
    for quantity in [*gpu["limits"].values(), *gpu["requests"].values()]:
        assert QUANTITY.match(str(quantity)), quantity
    none = rollout_pod_resources(config, "cpus = 2\nmemory_mb = 1024\nstorage_mb = 2048\ngpus = 0",
                                 tmp_path / "control")
    assert none == {"limits": expected, "requests": expected}


def test_the_harness_allowance_is_the_runs_when_it_sets_one(tmp_path: Path) -> None:
    """`harness_memory_mb` replaces the harness module's MEMORY_MB in the pod's memory; a task that declares
    nothing gets Harbor's defaults (1 CPU, 2048 MiB, 10240 MiB of disk, no GPU) plus the harness's share; logs
    cut at a larger `rollout_log_mb` get more room."""
    config = cluster_config("run=t", "harness=codex", "harness_memory_mb=3000", "rollout_log_mb=64")
    resources = rollout_pod_resources(config, "", tmp_path)
    cpus = round((1 + ALL_HARNESSES["codex"].CPUS) * 1000)
    assert resources["limits"] == {"cpu": f"{cpus}m", "memory": f"{2048 + 3000}Mi",
                                   "ephemeral-storage": f"{10240 + RUNNER_STORAGE_MB + KEPT_LOGS * 64}Mi"}


def test_the_app_rollout_pod_has_room_for_the_apps_state(tmp_path: Path) -> None:
    """rollout-app: the same CPUs and memory (the app sidecar has its own), and room in the ephemeral storage for
    the size limit of the app's state volume, since every disk-backed emptyDir counts against the pod's limit."""
    from steps.sandbox.app import APP_STORAGE_MB
    config = cluster_config("run=t", "harness=browser-use", "dataset=steps/tasks/gui")
    plain = rollout_pod_resources(config, "memory_mb = 1024\nstorage_mb = 2048", tmp_path)
    app = rollout_pod_resources(config, 'memory_mb = 1024\nstorage_mb = 2048\napp = "true"', tmp_path / "app",
                                app=True)
    storage = f"{2048 + RUNNER_STORAGE_MB + KEPT_LOGS * config.rollout_log_mb + APP_STORAGE_MB}Mi"
    for kind in ("requests", "limits"):
        assert app[kind] == {**plain[kind], "ephemeral-storage": storage}


def test_a_gpu_count_left_to_a_map_the_container_lacks_would_be_a_zero_gpu_request(tmp_path: Path) -> None:
    """Why the container keeps its own limits: without them, the strategic merge copies the patch's limits whole,
    and the task without GPUs would name `nvidia.com/gpu` (null, which Kubernetes reads as a quantity of 0), enough
    for GPU tolerations and quotas to apply to it. The model catches that."""
    config = cluster_config("run=t")
    rollout = template(iteration_workflow(config, 0).to_dict()["spec"], "rollout")
    inputs = {"cpus": "1", "memory_mb": "1024", "storage_mb": "1024", "gpus": "0"}
    (patched,) = json.loads(argo_substitute(rollout["podSpecPatch"], inputs))["containers"]
    kept = strategic_merge({"name": "main", "resources": copy.deepcopy(rollout["container"]["resources"])}, patched)
    assert "nvidia.com/gpu" not in kept["resources"]["limits"]
    bare = strategic_merge({"name": "main", "resources": {}}, copy.deepcopy(patched))
    assert bare["resources"]["limits"]["nvidia.com/gpu"] is None


def test_every_expression_in_the_rollout_templates_reads_declared_inputs() -> None:
    """The `{{=...}}` expressions (which `workflows/lint.py` does not read) name only inputs their template
    declares, in every golden workflow. Control: a misspelt input is caught."""
    def undeclared(template: dict) -> set[str]:
        declared = {p["name"] for p in template.get("inputs", {}).get("parameters", [])}
        used = set()
        for expression in re.findall(r"\{\{=(.+?)\}\}", json.dumps(template)):
            used |= set(re.findall(r"inputs\.parameters\.([A-Za-z0-9_]+)", expression))
        return used - declared

    for name in GOLDEN_CASES:
        templates = yaml.safe_load((GOLDEN / name).read_text())["spec"]["templates"]
        assert [t["name"] for t in templates if undeclared(t)] == []
    rollout = template(iteration_workflow(cluster_config("run=t"), 0).to_dict()["spec"], "rollout")
    rollout["podSpecPatch"] = rollout["podSpecPatch"].replace("parameters.memory_mb", "parameters.memory")
    assert undeclared(rollout) == {"memory"}


def template(spec: dict, name: str) -> dict:
    """One template of a Workflow spec, by name."""
    return next(t for t in spec["templates"] if t["name"] == name)


def pod_labels(spec: dict, name: str) -> dict:
    """The labels of the pods a template runs: its own, plus the Workflow's name, which Argo adds."""
    return {**template(spec, name).get("metadata", {}).get("labels", {}), WORKFLOW_POD_LABEL: "{{workflow.name}}"}


def selects(selector: dict, labels: dict) -> bool:
    """Whether a podSelector (matchLabels only) selects a pod with `labels`."""
    return set(selector) == {"matchLabels"} and all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def policies(spec: dict) -> dict[str, dict]:
    """The NetworkPolicies the Workflow applies, by template name; each template must own what it applies. (The
    serve's Service, the other resource template, is tests/test_serve_address.py's.)"""
    applied = {}
    for t in spec["templates"]:
        if "resource" in t and t["name"] != shape.SERVE_ADDRESS:
            assert t["resource"]["action"] == "apply" and t["resource"]["setOwnerReference"] is True
            applied[t["name"]] = yaml.safe_load(t["resource"]["manifest"])
    assert all(p["apiVersion"] == "networking.k8s.io/v1" and p["kind"] == "NetworkPolicy" for p in applied.values())
    return applied


def test_rollout_pods_reach_only_the_proxy() -> None:
    """The rollout pods' policy selects them alone, lets nothing in and lets out only TCP 8100 to this
    Workflow's serve pod; the serve pod's policy lets in only rollout, trajectories and serve-ready pods, on 8100; every
    rollout waits for both policies."""
    spec = iteration_workflow(cluster_config("run=t"), 0).to_dict()["spec"]
    applied = policies(spec)
    assert set(applied) == {"isolate-rollouts", "isolate-serve"}
    pods = {name: pod_labels(spec, name) for name in ("serve", "plan", "rollout", "trajectories", "update", "record",
                                                       "serve-ready")}
    rollouts, serve = applied["isolate-rollouts"]["spec"], applied["isolate-serve"]["spec"]
    assert [name for name, labels in pods.items() if selects(rollouts["podSelector"], labels)] == ["rollout"]
    assert rollouts["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in rollouts  # nothing may connect
    (rule,) = rollouts["egress"]
    (peer,) = rule["to"]
    assert rule["ports"] == [{"protocol": "TCP", "port": commands.PROXY_PORT}] and set(peer) == {"podSelector"}
    assert [name for name, labels in pods.items() if selects(peer["podSelector"], labels)] == ["serve"]
    assert [name for name, labels in pods.items() if selects(serve["podSelector"], labels)] == ["serve"]
    (rule,) = serve["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": commands.PROXY_PORT}]
    assert sorted(name for name, labels in pods.items()
                  if any(selects(peer["podSelector"], labels) for peer in rule["from"])) == ["rollout", "serve-ready",
                                                                                            "trajectories"]
    assert template(spec, "serve")["container"]["ports"] == [{"name": "proxy", "containerPort": commands.PROXY_PORT}]
    fanout = next(t for t in template(spec, "collect")["dag"]["tasks"] if t["name"] == "rollout")
    assert {"isolate-rollouts", "isolate-serve"} <= lint.depends_on(fanout)
    assert template(spec, "rollout")["executor"] == {"serviceAccountName": "openforge"}  # no token in the main container


def test_rollout_egress_extras_and_no_policy() -> None:
    """`rollout_egress_cidrs` and `rollout_dns` add exactly those peers; `network_policy=false` applies none,
    and a CIDR that is not one is a config error naming the key."""
    spec = iteration_workflow(cluster_config("run=t", "rollout_egress_cidrs=10.0.0.5/32, 10.96.0.1/32",
                                             "rollout_dns=true"), 0).to_dict()["spec"]
    egress = policies(spec)["isolate-rollouts"]["spec"]["egress"]
    assert egress[1:] == [
        {"to": [{"ipBlock": {"cidr": "10.0.0.5/32"}}, {"ipBlock": {"cidr": "10.96.0.1/32"}}]},
        {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                 "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
         "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}]
    bare = iteration_workflow(cluster_config("run=t", "network_policy=false"), 0).to_dict()["spec"]
    assert policies(bare) == {} and semantic_problems({"spec": bare}) == []
    fanout = next(t for t in template(bare, "collect")["dag"]["tasks"] if t["name"] == "rollout")
    assert fanout["depends"] == "serve-ready && plan"
    with pytest.raises(ConfigError, match="'rollout_egress_cidrs' must be auto or list CIDRs .* '10.0.0.300/32' is not one"):
        validate_for_argo(cluster_config("rollout_egress_cidrs=10.0.0.300/32"))
    with pytest.raises(ConfigError, match="'network_policy' must be true or false, got 'yes please'"):
        cluster_config("network_policy=yes please")


def test_vllm_listens_on_the_serve_pods_loopback_only() -> None:
    """vLLM's own routes (dev mode, no key) are never reachable from another pod: both device commands bind
    127.0.0.1, the proxy's upstream is that address, and the serve pod exposes only the proxy's port."""
    from steps import serve
    from steps.vllm_server import ServingOptions, vllm_command

    for device in ("gpu", "cpu"):
        argv = vllm_command("/models/current", "m", 8000, ServingOptions(tool_call_parser="hermes"), device=device)
        assert argv[argv.index("--host") + 1] == "127.0.0.1", argv
    config = cluster_config("run=t")
    args = serve.parse_args(commands.serve(config, "/models/current", "s3://b/calls", 0, host="0.0.0.0")[3:])
    proxy = serve.proxy_argv(args, 8000)
    assert proxy[proxy.index("--upstream") + 1] == "http://127.0.0.1:8000"
    assert proxy[proxy.index("--host") + 1] == "0.0.0.0" and args.port == commands.PROXY_PORT
    spec = iteration_workflow(config, 0).to_dict()["spec"]
    assert [p["containerPort"] for p in template(spec, "serve")["container"]["ports"]] == [commands.PROXY_PORT]


# ---- config errors: one sentence, exit code 2, nothing submitted ----

@pytest.mark.parametrize("argv, expected", [
    (["--harness", "codx"], "unknown harness 'codx'; did you mean codex?"),
    (["iteratons=3"], "unknown config key 'iteratons' (in the override iteratons=3) (did you mean iterations?)"),
    (["algorithm=rloo"], "config key 'algorithm' (in the override algorithm=rloo) was renamed to 'adv_estimator'"),
    (["iterations=two"], "config key 'iterations' must be a whole number, got 'two'"),
    (["dataset=no/such/tasks"], "config key 'dataset': 'no/such/tasks' does not exist"),
    (["--config", "configs/nope.yaml"], "cannot read config file configs/nope.yaml"),
    (["--dry-run"], "config key 'store' must be an s3:// URL for an Argo run"),
])
def test_bad_config_is_one_sentence(argv: list[str], expected: str, fake_argo, capsys) -> None:
    """A bad config stops the driver with exit code 2 and one line on stderr; the server hears nothing."""
    code = submit.main(argv + ["--argo-server", fake_argo.url])
    err = capsys.readouterr().err.strip()
    assert code == 2 and expected in err and len(err.splitlines()) == 1 and err.startswith("error: ")
    assert fake_argo.requests == []


def test_config_overrides_and_errors() -> None:
    """key=value overrides are typed; a float accepts 1e-5; a missing run name for resume is one sentence."""
    config = load_config(None, ["learning_rate=1e-5", "iterations=3", "run=x"])
    assert config.learning_rate == 1e-5 and config.iterations == 3 and config.run_url == "runs/x"
    with pytest.raises(ConfigError, match="must be a number"):
        load_config(None, ["learning_rate=fast"])


def test_dry_run_prints_every_workflow(capsys) -> None:
    """--dry-run prints one Workflow per iteration as YAML and contacts nothing."""
    assert submit.main(["--config", str(CLUSTER), "--dry-run", "run=dry", "iterations=3"]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert [d["metadata"]["name"] for d in docs] == ["openforge-dry-it0", "openforge-dry-it1", "openforge-dry-it2"]
    assert docs[2] == iteration_workflow(cluster_config("run=dry", "iterations=3"), 2).to_dict()
    serve = next(t for t in docs[0]["spec"]["templates"] if t["name"] == "serve")["container"]["command"]
    pairs = set(zip(serve, serve[1:]))  # the run's sampling and no checkpoint defaults, visible in the serve step
    assert {("--generation-config", "vllm"), ("--sampling", "temperature=1.0"), ("--sampling", "top_p=1.0"),
            ("--sampling", "top_k=0")} <= pairs


def test_without_argo_server_calls_the_local_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Argo server configured: the run goes to workflows.local.run_local with the loaded config."""
    monkeypatch.delenv("ARGO_SERVER", raising=False)
    seen = []
    monkeypatch.setattr("workflows.local.run_local", lambda config: seen.append(config) or 0)
    assert submit.main(["--harness", "direct", "run=local", "iterations=1"]) == 0
    assert seen[0].harness == "direct" and seen[0].run == "local" and seen[0].argo_server == ""


def test_preflight_names_what_is_missing() -> None:
    """With a reachable cluster, a missing namespace/secret/GPU node is one sentence with the fix."""
    from kubernetes.client.exceptions import ApiException
    from types import SimpleNamespace

    from workflows.preflight import check_cluster

    class FakeCoreApi:  # the three CoreV1Api calls preflight makes
        def read_namespace(self, name, **_):
            return {}

        def read_namespaced_secret(self, name, namespace, **_):
            if name == "openforge-admin":
                raise ApiException(status=404)

        def read_namespaced_service_account(self, name, namespace, **_):
            return SimpleNamespace(metadata=SimpleNamespace(annotations={}))

        def list_node(self, **_):
            return SimpleNamespace(items=[SimpleNamespace(status=SimpleNamespace(allocatable={"cpu": "8"}))])

        def read_namespaced_endpoints(self, name, namespace, **_):
            assert (name, namespace) == ("kubernetes", "default")
            return SimpleNamespace(subsets=[SimpleNamespace(addresses=[SimpleNamespace(ip="10.0.0.5")])])

    notes, problems = check_cluster(FakeCoreApi(), cluster_config("run=t"))
    assert "only a CNI that enforces them applies" in notes[0] and len(notes) == 2 and len(problems) == 2
    assert "may reach the Kubernetes API server at 10.0.0.5/32 (rollout_egress_cidrs: auto)" in notes[1]
    notes, _ = check_cluster(FakeCoreApi(), cluster_config("run=t", "rollout_egress_cidrs=10.0.0.5/32"))
    assert len(notes) == 1
    assert "secret 'openforge-admin' is missing in namespace 'openforge'" in problems[0]
    assert "no node offers 1 nvidia.com/gpu" in problems[1]


# ---- the driver against a fake Argo Server ----

class FakeArgoServer:
    """A test double for the Argo Server API on 127.0.0.1 (no real one can run here; see the module docstring).

    Each GET of a workflow advances it one phase along `script[name]` (default: "" -> Running ->
    Succeeded); the last phase sticks. `requests` records (method, path, body, Authorization).
    """

    def __init__(self) -> None:
        self.workflows: dict[str, dict] = {}
        self.script: dict[str, list[str]] = {}
        self.collect: dict[str, str] = {}  # a Workflow's collect DAG phase where it differs from the Workflow's
        self.requests: list[tuple[str, str, dict | None, str | None]] = []
        self.sent: list[tuple[str, str, int]] = []  # (method, path with its query, bytes of the response body)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def calls(self, method: str | None = None) -> list[tuple[str, str, dict | None, str | None]]:
        """Recorded requests, optionally of one method."""
        return [r for r in self.requests if method is None or r[0] == method]

    def _status(self, name: str) -> dict:
        phases = self.script.setdefault(name, ["", "Running", "Succeeded"])
        phase = phases.pop(0) if len(phases) > 1 else phases[0]
        nodes = {node_id(name, f"{name}.collect.rollout({i})"): {
            "id": node_id(name, f"{name}.collect.rollout({i})"), "name": f"{name}.collect.rollout({i})", "type": "Pod",
            "templateName": "rollout", "phase": "Succeeded" if phase == "Succeeded" else "Running"} for i in range(2)}
        collect = node_id(name, f"{name}.collect")  # the collect DAG: as the Workflow, unless `collect` says
        nodes[collect] = {"id": collect, "name": f"{name}.collect", "type": "DAG", "templateName": "collect",
                          "phase": self.collect.get(name, phase)}
        return {"phase": phase, "nodes": nodes} if phase else {}

    def handle(self, method: str, path: str, body: dict | None) -> tuple[int, dict]:
        """Routes one request like the Argo Server does; returns (status code, JSON body)."""
        parts = path.strip("/").split("/")  # api v1 workflows {ns} [{name} [action]]
        if parts[:3] != ["api", "v1", "workflows"] or len(parts) < 4:
            return 404, {"code": 5, "message": f"no route {path}"}
        rest = parts[4:]
        if method == "POST" and rest == ["lint"]:
            return 200, body["workflow"]
        if method == "POST" and not rest:
            name = body["workflow"]["metadata"]["name"]
            if name in self.workflows:  # grpc-gateway v1's error body (Argo's swagger: grpc.gateway.runtime.Error)
                taken = f"workflows.argoproj.io \"{name}\" already exists"
                return 409, {"error": taken, "code": 6, "message": taken, "details": []}  # 6: ALREADY_EXISTS
            self.workflows[name] = body["workflow"]
            return 200, body["workflow"]
        name = rest[0] if rest else ""
        if name not in self.workflows:
            return 404, {"code": 5, "message": f"workflows.argoproj.io \"{name}\" not found"}
        if method == "GET" and len(rest) == 1:
            return 200, {**self.workflows[name], "status": self._status(name)}
        if method == "PUT" and rest[1:] == ["retry"]:
            self.script[name] = ["Running", "Succeeded"]
            return 200, {**self.workflows[name], "status": {"phase": "Running"}}
        if method == "PUT" and rest[1:] == ["resubmit"]:
            new = copy.deepcopy(self.workflows[name])
            new["metadata"]["name"] = f"{name}-resubmit"
            self.workflows[new["metadata"]["name"]] = new
            return 200, new
        return 404, {"code": 5, "message": f"no route {method} {path}"}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                fake.requests.append((self.command, self.path, body, self.headers.get("authorization")))
                path, _, query = self.path.partition("?")
                code, payload = fake.handle(self.command, path, body)
                fields = urllib.parse.parse_qs(query).get("fields", [""])[0]
                data = json.dumps(clean_fields(payload, fields) if code == 200 else payload).encode()
                fake.sent.append((self.command, self.path, len(data)))
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = _serve

            def log_message(self, *args) -> None:
                pass

        return Handler


def clean_fields(payload: dict, fields: str) -> dict:
    """`payload` as Argo's server sends it for a `fields` query: a port of util/fields/fields.go `Cleaner` (which
    server/workflow/workflow_server.go `GetWorkflow` and `ListWorkflows` apply). Comma-separated dotted paths; a key
    stays when its path is named or is the start of a named path (its descent then cleaned the same way), and goes
    otherwise; with a leading `-` the named paths go and the rest stays. No field: the whole object."""
    if not fields:
        return payload
    exclude, named = fields.startswith("-"), set(fields.lstrip("-").split(","))

    def clean(path: list[str], item) -> None:
        if isinstance(item, dict):
            for key in list(item):
                at = ".".join([*path, key])
                named_here = at in named
                leads = named_here or any(field.startswith(at) for field in named)
                if (exclude and not named_here) or (not exclude and leads):
                    if not named_here:
                        clean([*path, key], item[key])
                else:
                    del item[key]
        elif isinstance(item, list):
            for element in item:
                clean(path, element)

    cleaned = copy.deepcopy(payload)
    clean([], cleaned)
    return cleaned


@pytest.fixture
def fake_argo(monkeypatch: pytest.MonkeyPatch):
    """A fresh fake Argo Server; no kubeconfig (so preflight skips), a token in ARGO_TOKEN."""
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("ARGO_TOKEN", "test-token")
    monkeypatch.delenv("ARGO_SERVER", raising=False)
    fake = FakeArgoServer()
    yield fake
    fake.server.shutdown()


@pytest.fixture
def s3_store(s3_server: dict, monkeypatch: pytest.MonkeyPatch, request) -> str:
    """A fresh store URL on the moto S3 server, with s3fs pointed at it."""
    for key, value in s3_server["env"].items():
        monkeypatch.setenv(key, value)
    import fsspec
    fsspec.config.conf.pop("s3", None)
    return f"s3://{s3_server['bucket']}/{request.node.name.replace('[', '-').rstrip(']')}"


def drive(fake: FakeArgoServer, store: str, *args: str) -> int:
    """Runs `submit.py` in-process against the fake server and the S3 store (`s3_store`'s endpoint as the config's:
    the driver reaches the store where the config says, as the pods do)."""
    return submit.main([*args, "--config", str(CLUSTER), "--argo-server", fake.url, "--poll", "0.01",
                        f"store={store}", f"s3_endpoint={os.environ['AWS_ENDPOINT_URL']}", *NO_CLUSTER_EGRESS])


def test_submit_runs_one_workflow_per_iteration(fake_argo: FakeArgoServer, s3_store: str, capsys) -> None:
    """submit: lint every iteration, then create and poll them in order; the manifest records each."""
    manifest.write_json(f"{s3_store}/sub/checkpoints/iteration-1/metrics.json", {"loss": 0.5})  # what update writes
    assert drive(fake_argo, s3_store, "--harness", "codex", "run=sub", "iterations=2") == 0
    out = capsys.readouterr().out
    assert f"{fake_argo.url}/workflows/openforge/openforge-sub-it0" in out and "openforge-sub-it1" in out
    posts = [(path, body["workflow"]["metadata"]["name"]) for _, path, body, _ in fake_argo.calls("POST")]
    assert posts == [("/api/v1/workflows/openforge/lint", "openforge-sub-it0"),
                     ("/api/v1/workflows/openforge/lint", "openforge-sub-it1"),
                     ("/api/v1/workflows/openforge", "openforge-sub-it0"),
                     ("/api/v1/workflows/openforge", "openforge-sub-it1")]
    config = cluster_config("run=sub", "iterations=2", f"store={s3_store}", f"argo_server={fake_argo.url}",
                            f"s3_endpoint={os.environ['AWS_ENDPOINT_URL']}", *NO_CLUSTER_EGRESS)
    assert fake_argo.workflows["openforge-sub-it1"] == iteration_workflow(config, 1).build().model_dump(by_alias=True, exclude_none=True)
    assert all(auth == "Bearer test-token" for *_, auth in fake_argo.requests)
    records = manifest.read_iterations(f"{s3_store}/sub")
    assert [(r.workflow, r.status) for r in records.values()] == [("openforge-sub-it0", "Succeeded"),
                                                                  ("openforge-sub-it1", "Succeeded")]
    assert records[1].checkpoint == f"{s3_store}/sub/checkpoints/iteration-1"
    assert records[0].metrics == {"loss": 0.5} and records[1].metrics is None
    assert manifest.read_run_config(f"{s3_store}/sub")["harness"] == "codex"


def test_failed_iteration_then_retry_failed_steps(fake_argo: FakeArgoServer, s3_store: str, capsys) -> None:
    """A failed iteration stops the run (exit 1, says how to retry); `retry` sends the failed-steps-only request."""
    fake_argo.script["openforge-rt-it0"] = ["", "Running", "Failed"]
    assert drive(fake_argo, s3_store, "--harness", "codex", "run=rt", "iterations=2") == 1
    assert "retry --run rt --iteration 0" in capsys.readouterr().err
    assert "openforge-rt-it1" not in fake_argo.workflows
    assert drive(fake_argo, s3_store, "retry", "--run", "rt") == 0
    (_, path, body, _), = fake_argo.calls("PUT")
    assert path == "/api/v1/workflows/openforge/openforge-rt-it0/retry"
    assert body == {"name": "openforge-rt-it0", "namespace": "openforge", "restartSuccessful": True,
                    "nodeFieldSelector": "templateName=serve"}  # its collect failed: the serve starts again
    statuses = [r.status for r in manifest.read_iterations(f"{s3_store}/rt").values()]
    assert statuses == ["Succeeded", "Succeeded"] and "openforge-rt-it1" in fake_argo.workflows


def test_resubmit_memoized(fake_argo: FakeArgoServer, s3_store: str) -> None:
    """`resubmit --memoized` asks for a memoized copy and follows the new workflow, recorded in the manifest (here
    its collect succeeded, its update failed; tests/test_serve_address.py has the one whose collect failed)."""
    fake_argo.script["openforge-rs-it0"] = ["Failed"]
    fake_argo.collect["openforge-rs-it0"] = "Succeeded"
    assert drive(fake_argo, s3_store, "--harness", "codex", "run=rs", "iterations=1") == 1
    assert drive(fake_argo, s3_store, "resubmit", "--run", "rs", "--iteration", "0", "--memoized") == 0
    (_, path, body, _), = fake_argo.calls("PUT")
    assert path.endswith("/openforge-rs-it0/resubmit") and body["memoized"] is True
    record = manifest.read_iterations(f"{s3_store}/rs")[0]
    assert (record.workflow, record.status) == ("openforge-rs-it0-resubmit", "Succeeded")


def test_resume_after_the_driver_died(fake_argo: FakeArgoServer, s3_store: str) -> None:
    """resume: a succeeded iteration is skipped, a running one is followed (not recreated), the rest submitted."""
    config = cluster_config("run=rm", "iterations=3", f"store={s3_store}", f"argo_server={fake_argo.url}",
                            *NO_CLUSTER_EGRESS)
    manifest.write_run_config(config.run_url, config.to_dict())
    submit.mark(config, 0, workflow_name(config, 0), "Succeeded")
    submit.mark(config, 1, workflow_name(config, 1), "Running")  # the driver died while iteration 1 ran
    fake_argo.workflows[workflow_name(config, 1)] = iteration_workflow(config, 1).to_dict()
    assert drive(fake_argo, s3_store, "resume", "--run", "rm") == 0
    created = [body["workflow"]["metadata"]["name"] for _, _, body, _ in fake_argo.calls("POST")]
    assert created == ["openforge-rm-it2"]
    gets = {path.rsplit("/", 1)[1].split("?")[0] for _, path, _, _ in fake_argo.calls("GET")}
    assert gets == {"openforge-rm-it1", "openforge-rm-it2"}
    assert [r.status for r in manifest.read_iterations(config.run_url).values()] == ["Succeeded"] * 3


def test_status_shows_each_iteration(fake_argo: FakeArgoServer, s3_store: str, capsys) -> None:
    """status: one line per iteration with the live phase and the UI link."""
    assert drive(fake_argo, s3_store, "--harness", "codex", "run=st", "iterations=1") == 0
    capsys.readouterr()
    assert drive(fake_argo, s3_store, "status", "--run", "st") == 0
    out = capsys.readouterr().out
    assert "iteration 0: Succeeded" in out and f"{fake_argo.url}/workflows/openforge/openforge-st-it0" in out


def killed_results(iteration: int, killed_by: list[str | None]) -> list[RolloutResult]:
    """An iteration's results as read back from result.json, one per entry: the limit that killed its harness, ""
    for a result whose `killed` list is empty, None for one written before the list existed."""
    def killed(by):
        return {} if by is None else {"killed": [{"process": "harness", "by": by, "count": 1}] if by else []}
    return [RolloutResult.from_json({"rollout_id": f"it{iteration}-t-s{n}", "task": "t", "sample": n,
                                     "harness": "openclaw", "status": "ok", "reward": 0.0 if by else 1.0, **killed(by)})
            for n, by in enumerate(killed_by)]


def test_status_counts_the_harnesses_a_limit_killed_in_each_iteration(tmp_path, monkeypatch, capsys) -> None:
    """Before: status showed each iteration's phase only, so a run whose harnesses were killed looked normal.
    Iteration 0: 3 of 6 harnesses killed (a warning line); iteration 1: none (control); iteration 2: no table yet."""
    from steps.trajectories.collect import collect
    from steps.contracts.table_files import write_tables

    monkeypatch.delenv("ARGO_SERVER", raising=False)
    config = load_config(None, ["run=ks", f"store={tmp_path}", "iterations=3", "harness=openclaw"])
    manifest.write_run_config(config.run_url, config.to_dict())
    for iteration, killed_by in ((0, ["memory", "memory", "pids", "time", "", None]), (1, ["", None])):
        write_tables(collect(killed_results(iteration, killed_by), {}, "ks", iteration)[0].tables(),
                     layout.run_partition_url(config.run_url, "ks", iteration))
        manifest.record(config.run_url, IterationRecord(iteration, "local", status="Succeeded"))
    assert submit.main(["status", "--run", "ks", f"store={tmp_path}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].endswith("local  6 rollouts, 3 harnesses killed (memory 2, pids 1)")
    assert lines[2].startswith("warning: iteration 0: a limit killed the harness in 3 of 6 rollouts") and \
        "harness_memory_mb" in lines[2]
    assert lines[3].endswith("local  2 rollouts, 0 harnesses killed (memory 0, pids 0)")
    assert lines[4].startswith("iteration 2: Pending") and lines[4].endswith("-") and len(lines) == 5


def test_the_local_summary_counts_the_harnesses_a_limit_killed_and_warns_past_a_few_percent(tmp_path, capsys) -> None:
    """The local runner's iteration line: `harness_killed` by limit, and one warning line on the driver's progress
    output; the control iteration (no kill, and results older than the `killed` list) says nothing."""
    from workflows.local import summarize

    killed = summarize(4, killed_results(4, ["memory", "memory", "pids", "time", "", None]), str(tmp_path / "none"), {})
    assert killed["harness_killed"] == {"memory": 2, "pids": 1} and killed["rollouts"] == 6
    err = capsys.readouterr().err
    assert "warning: iteration 4: a limit killed the harness in 3 of 6 rollouts (memory 2, pids 1)" in err
    assert "raise harness_memory_mb" in err and len(err.splitlines()) == 1
    clean = summarize(5, killed_results(5, ["", None, "time"]), str(tmp_path / "none"), {})
    assert clean["harness_killed"] == {"memory": 0, "pids": 0} and capsys.readouterr().err == ""
    few = summarize(6, killed_results(6, ["memory"] + [""] * 39), str(tmp_path / "none"), {})
    assert few["harness_killed"]["memory"] == 1 and capsys.readouterr().err == ""  # 1 of 40: not past a few percent


def test_unreachable_server_is_one_sentence(s3_store: str, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """A server that does not answer: exit code 2 and one sentence before anything is created or recorded."""
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    fake = FakeArgoServer()
    fake.server.shutdown()
    fake.server.server_close()
    assert drive(fake, s3_store, "--harness", "codex", "run=down") == 2
    err = capsys.readouterr().err
    assert f"error: cannot reach the Argo server at {fake.url}" in err
    assert manifest.read_run_config(f"{s3_store}/down") is None


def test_resume_of_unknown_run_is_one_sentence(fake_argo: FakeArgoServer, s3_store: str, capsys) -> None:
    """resume/status/retry of a run the store does not have: one sentence, nothing sent."""
    assert drive(fake_argo, s3_store, "resume", "--run", "ghost") == 2
    assert "no run named 'ghost'" in capsys.readouterr().err and fake_argo.requests == []


def test_images_pin_the_versions_the_code_uses() -> None:
    """The Dockerfiles pin what the code expects: vLLM 0.33.0, veRL 0.9.1, Node of steps.harnesses, Python 3.11."""
    from steps.harnesses.base import NODE_VERSION

    images = {p.stem.split(".")[0]: p.read_text() for p in (REPO / "images").glob("*.Dockerfile")}
    assert set(images) == {"serve", "train", "harness", "steps"}
    assert "vllm/vllm-openai:v0.33.0" in images["serve"] and '"vllm==0.33.0"' in images["serve"]
    assert '"verl==0.9.1"' in images["train"] and '"torch==2.13.0"' in images["train"]
    assert f"FROM node:{NODE_VERSION}-" in images["harness"]
    assert 'steps.harnesses install $(python3 -c "from steps.harnesses import HARNESSES; print(*HARNESSES)")' in \
        images["harness"]
    assert "FROM python:3.11." in images["steps"]
    # browser-use's virtualenv is built on the steps image's Python, which is its base in the rollout pod.
    steps_base = re.search(r"^FROM (\S+)$", images["steps"], re.MULTILINE).group(1)
    assert f"FROM {steps_base} AS gui" in images["harness"] and "from steps.harnesses import GUI_HARNESSES" in \
        images["harness"]
    # computer-use runs on that Python too, with the SDK and Playwright the tests use.
    assert '"anthropic==2.15.0" "playwright==1.65.2"' in images["steps"]
    assert all(":latest" not in text for text in images.values())


def test_step_parsers_accept_the_built_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """The flags `workflows.commands` builds are the ones the steps' own parsers take (no drift)."""
    from steps import serve
    from steps.proxy.__main__ import parse_args as proxy_args
    from steps.trajectories.__main__ import parse_args as trajectories_args

    monkeypatch.setenv("OPENFORGE_ADMIN_KEY", "k")
    config = cluster_config("run=t")
    serve_args = serve.parse_args(commands.serve(config, "/models/current", "s3://b/calls", 1, host="0.0.0.0")[3:])
    proxy = proxy_args(serve.proxy_argv(serve_args, 8000))
    assert (proxy.port, proxy.host, proxy.max_tokens_cap, proxy.weight_version) == (8100, "0.0.0.0", 4096, "1")
    assert proxy.model == serve_args.model_name == config.model_name
    assert proxy.forced_sampling == {**sampling.NEUTRAL, "temperature": config.temperature}  # every key, forced
    traj = trajectories_args(commands.trajectories(config, "http://proxy:8100", "s3://b/results", 2)[3:])
    assert (traj.run, traj.iteration, traj.out) == ("t", 2, layout.trajectories_url(config.run_url))
    from steps.update.train import parse_args as update_args
    from steps.update.config import load_config as update_config

    upd = update_args(commands.update(config, "s3://b/t", "s3://b/c0", "s3://b/c1")[3:])
    loaded = update_config(REPO / upd.config, upd.overrides)  # the update's own checks of the overrides
    assert (loaded.adv_estimator, loaded.learning_rate, loaded.epochs) == ("grpo", 1e-6, 1)
    assert (loaded.temperature, loaded.unmatched_sampling) == (config.temperature, "")


def test_sampling_the_update_cannot_reproduce_is_refused_unless_the_run_allows_it(tmp_path: Path, capsys) -> None:
    """top_p 0.9 stops the run at load, in one sentence naming the key and the way out; allowed, it is served,
    and the update's overrides (so its metrics) and the run's summary name it. The run's temperature alone is
    always fine: the update computes its logprobs at it."""
    with pytest.raises(ConfigError) as refused:
        load_config(None, ["run=x", "top_p=0.9"])
    message = str(refused.value)
    assert "'top_p'" in message and "allow_unmatched_sampling: true" in message and len(message.splitlines()) == 1
    with pytest.raises(ConfigError, match=r"config key 'top_k' must be 0 \(off\) or a whole number >= 1, got -1"):
        load_config(None, ["run=x", "top_k=-1"])
    warm = load_config(None, ["run=x", "temperature=0.7"])  # control: the trainer reproduces a temperature
    assert commands.update_overrides(warm)[-1] == "temperature=0.7"

    config = load_config(None, ["run=x", "top_p=0.9", "allow_unmatched_sampling=true", f"store={tmp_path}"])
    assert commands.update_overrides(config)[-2:] == ["temperature=1.0", "unmatched_sampling=top_p=0.9"]
    argv = commands.serve(config, "/models/current", "s3://b/calls", 0)
    assert [argv[i + 1] for i, word in enumerate(argv) if word == "--sampling"][:2] == ["temperature=1.0", "top_p=0.9"]
    assert submit.main(["--config", str(CLUSTER), "--dry-run", "run=x", "top_p=0.9",
                        "allow_unmatched_sampling=true"]) == 0
    err = capsys.readouterr().err
    assert "run x: samples at top_p=0.9, which the update does not reproduce" in err


def test_the_dry_run_shows_the_runs_sampling_in_the_serve_step(capsys) -> None:
    """`--dry-run` of the cluster example: the serve step forces the run's sampling (every key) on the proxy,
    and the update gets the run's temperature."""
    assert submit.main(["--config", str(CLUSTER), "--dry-run", "run=t", "iterations=1"]) == 0
    out = capsys.readouterr().out
    flags = "".join(f"\n      - --sampling\n      - {key}={value}" for key, value in sampling.NEUTRAL.items())
    assert flags in out and "\n      - temperature=1.0\n" in out


def test_exit_handler_command_writes_the_manifest(tmp_path: Path) -> None:
    """The exit handler's command (`steps.manifest record`) records the outcome; the driver reads it back."""
    config = load_config(None, ["run=exit", f"store={tmp_path}"])
    argv = commands.record(config, 1, "openforge-exit-it1", "Failed", config.checkpoint_url(1),
                           config.checkpoint_url(2), python=sys.executable)
    subprocess.run(argv, cwd=REPO, check=True, capture_output=True, timeout=60)
    entry = manifest.read_iterations(config.run_url)[1]
    assert (entry.workflow, entry.status, entry.done) == ("openforge-exit-it1", "Failed", True)
    assert entry.next_checkpoint == str(tmp_path / "exit" / "checkpoints" / "iteration-2")


@pytest.mark.parametrize("override, expected", [
    ("learning_rate=nan", "config key 'learning_rate' must be a finite number, got 'nan'"),
    ("learning_rate=.inf", "config key 'learning_rate' must be a finite number, got inf"),
    ("learning_rate=-1", "config key 'learning_rate' must be more than 0, got -1.0"),
    ("learning_rate=true", "config key 'learning_rate' must be a number, got True"),
    ("adv_estimator=grpoo", "config key 'adv_estimator' must be one of grpo, "),
])
def test_a_run_config_the_update_would_refuse_is_refused_before_the_run(override: str, expected: str) -> None:
    """NaN, infinity, a negative rate or a misspelt estimator stop the run at load, not at the first update;
    the valid spellings of the same keys load (control)."""
    with pytest.raises(ConfigError) as refused:
        load_config(None, [override, "run=x"])
    assert expected in str(refused.value) and len(str(refused.value).splitlines()) == 1
    valid = load_config(None, ["learning_rate=1e-5", "adv_estimator=rloo", "run=x"])
    assert (valid.learning_rate, valid.adv_estimator) == (1e-5, "rloo")


def test_serve_against_an_upstream_starts_no_vllm_and_takes_no_gpu(monkeypatch: pytest.MonkeyPatch,
                                                                    workflow_validator: Validator) -> None:
    """With `upstream` the serve command names that server and the model it serves, carries no vLLM option,
    and its pod requests no GPU and no model volume; without, the pod keeps its GPU (the control). The
    Workflow stays valid: Argo's schema, strictly, and the offline lint."""
    from steps import serve
    from steps.proxy.__main__ import parse_args as proxy_args

    monkeypatch.setenv("OPENFORGE_ADMIN_KEY", "k")
    config = cluster_config("run=t", "upstream=http://10.0.0.5:8000/v1", "upstream_model=Qwen/Qwen3-8B")
    argv = commands.serve(config, config.checkpoint_url(0), "s3://b/calls", 0, host="0.0.0.0", device="gpu")
    assert "--model" not in argv and not any(flag.startswith(("--vllm", "--gpu", "--device")) for flag in argv)
    proxy = proxy_args(serve.upstream_proxy_argv(serve.parse_args(argv[3:])))
    assert (proxy.upstream, proxy.upstream_model, proxy.model) == ("http://10.0.0.5:8000", "Qwen/Qwen3-8B", config.model_name)
    assert proxy.external_upstream and proxy.forced_sampling == {**sampling.NEUTRAL, "temperature": config.temperature}
    own = proxy_args(serve.upstream_proxy_argv(serve.parse_args(
        commands.serve(cluster_config("run=t", "upstream=http://u:1"), "", "s", 0)[3:])))
    assert own.upstream_model == own.model  # empty upstream_model: the run's model_name
    for overrides, gpus in (((), str(config.serve_gpus)), (("upstream=http://u:1",), None)):
        serve_pod = template(iteration_workflow(cluster_config("run=t", *overrides), 0).to_dict()["spec"], "serve")
        resources = serve_pod["container"]["resources"]
        assert resources.get("limits", {}).get("nvidia.com/gpu") == gpus, resources
        assert ("volumes" in serve_pod) == (gpus is not None)
        assert serve_pod["container"]["image"].split("/")[-1].startswith("serve:" if gpus else "steps:")
    workflow = yaml.safe_load(iteration_workflow(config, 0).to_yaml())
    assert schema_errors(workflow_validator, workflow) == [] and semantic_problems(workflow) == []


def test_rollout_nodes_show_the_runners_status_and_reward() -> None:
    """The rollout template's output parameters are the files steps.rollout writes into OUT (its `--out`, where
    its result.json is written before the runner sends it to the proxy), with defaults for a pod that died
    before writing them."""
    from steps.contracts.rollout import NO_REWARD

    rollout = template(iteration_workflow(cluster_config("run=t"), 0).to_dict()["spec"], "rollout")
    out = rollout["container"]["command"][rollout["container"]["command"].index("--out") + 1]
    parameters = {p["name"]: p["valueFrom"] for p in rollout["outputs"]["parameters"]}
    assert parameters == {"status": {"path": f"{out}/{layout.STATUS_FILE}", "default": "no_result"},
                          "reward": {"path": f"{out}/{layout.REWARD_FILE}", "default": NO_REWARD}}


def test_the_exit_handler_records_first_and_a_failed_report_changes_no_outcome() -> None:
    """`exit` runs record, then the report (also after a failed record); the report's failure is continued on.
    The report command is the report step's, on the run's store."""
    spec = iteration_workflow(cluster_config("run=t"), 0).to_dict()["spec"]
    assert spec["onExit"] == "exit"
    tasks = {task["name"]: task for task in template(spec, "exit")["dag"]["tasks"]}
    assert "depends" not in tasks["record"] and tasks["record"]["template"] == "record"
    assert lint.depends_on(tasks["report"]) == {"record"} and "record.Failed" in tasks["report"]["depends"]
    assert tasks["report"]["continueOn"] == {"failed": True, "error": True}
    assert template(spec, "report")["container"]["command"] == ["python", "-m", "steps.report", "--run", "t",
                                                                "--store", "s3://openforge/runs"]


def test_the_workflow_links_the_run_report_where_the_argo_ui_shows_it() -> None:
    """The description annotation (Markdown in the Argo UI) links the report's index at `report_url_base`;
    without one it names the s3:// URL as text, since a browser cannot open it."""
    key = "workflows.argoproj.io/description"
    linked = iteration_workflow(cluster_config("run=my run", "report_url_base=https://r.example.com/runs/"), 1)
    assert linked.to_dict()["metadata"]["annotations"][key] == (
        "[Run report](https://r.example.com/runs/my%20run/reports/index.html)")
    plain = iteration_workflow(cluster_config("run=t"), 1).to_dict()["metadata"]["annotations"][key]
    assert "`s3://openforge/runs/t/reports/index.html`" in plain and "](" not in plain
    with pytest.raises(ConfigError, match="report_url_base"):
        cluster_config("report_url_base=s3://openforge/runs")


# ---- the update across nodes (update_nodes > 1: a JobSet) ----

MULTI_NODE = ("run=t", "update_nodes=2", "update_gpus=8")


def update_manifest(spec: dict) -> dict:
    """The JobSet the `update` resource template creates, as a dict."""
    return yaml.safe_load(template(spec, "update")["resource"]["manifest"])


def undefined_references(container: dict) -> list[str]:
    """The `$(VAR)` references in a container's command and env values that Kubernetes would leave as they are:
    it expands only variables of the container's own env (in env values, only those defined above)."""
    defined, missing = set(), []
    for env in container.get("env", []):
        missing += [v for v in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", env.get("value", "")) if v not in defined]
        defined.add(env["name"])
    command = " ".join(container.get("command", []) + container.get("args", []))
    return missing + [v for v in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", command) if v not in defined]


def test_multi_node_update_is_a_jobset_owned_by_the_workflow() -> None:
    """update_nodes=2: the update step creates (never applies) one JobSet owned by the Workflow and waits on its
    terminal state; 2 pods of one Indexed Job, failed after update_timeout_s (the config's, the default 6 h), 8 GPUs
    each, the train image, the S3 env by secretKeyRef, a memory-backed /dev/shm, torchrun's line from
    `commands.update` with this pod's rank and rank 0's address from its own env. update_nodes=1 keeps the one-pod
    Container (the control)."""
    from workflows import jobset

    config = cluster_config(*MULTI_NODE)
    spec = iteration_workflow(config, 0).to_dict()["spec"]
    update = template(spec, "update")
    assert "container" not in update and update["resource"]["action"] == "create"
    assert update["resource"]["setOwnerReference"] is True
    assert update["outputs"]["parameters"] == [{"name": "jobset", "valueFrom": {"jsonPath": "{.metadata.name}"}}]
    manifest = update_manifest(spec)
    assert manifest["metadata"]["name"] == jobset.NAME and "generateName" not in manifest["metadata"]
    assert manifest["metadata"]["labels"]["openforge.dev/workflow"] == "{{workflow.name}}"
    assert WORKFLOW_POD_LABEL not in manifest["metadata"]["labels"]  # Argo's label would make them Argo's pods
    (replicated,) = manifest["spec"]["replicatedJobs"]
    job = replicated["template"]["spec"]
    assert (replicated["replicas"], job["parallelism"], job["completions"]) == (1, 2, 2)
    assert (job["completionMode"], job["backoffLimit"], job["template"]["spec"]["restartPolicy"]) == ("Indexed", 0, "Never")
    assert job["activeDeadlineSeconds"] == config.update_timeout_s == 6 * 3600
    assert cluster_config(*MULTI_NODE, "update_timeout_s=600").update_timeout_s == 600
    (container,) = job["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/openforge/train:0.1.0" and container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    # 8 CPUs and 64Gi per GPU (one update process each); the one-GPU pod below asks for 8 and 64Gi
    assert container["resources"]["requests"] == {"cpu": "64", "memory": "512Gi", "ephemeral-storage": "100Gi",
                                                  "nvidia.com/gpu": "8"}
    assert container["command"] == commands.update(
        config, layout.run_partition_url(config.run_url, "t", 0), config.checkpoint_url(0), config.checkpoint_url(1),
        node_rank="$(OPENFORGE_NODE_RANK)", master_addr="$(OPENFORGE_MASTER_ADDR)")
    argv = container["command"]
    assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--nproc-per-node") + 1] == "8"
    env = {e["name"]: e for e in container["env"]}
    assert env["AWS_SECRET_ACCESS_KEY"] == {"name": "AWS_SECRET_ACCESS_KEY",
                                            "valueFrom": {"secretKeyRef": {"key": "secret-key", "name": "openforge-s3"}}}
    assert env["OPENFORGE_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert env["OPENFORGE_MASTER_ADDR"]["value"] == "$(OPENFORGE_JOBSET)-node-0-0.$(OPENFORGE_JOBSET)"
    assert undefined_references(container) == []
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in job["template"]["spec"]["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert jobset.INSTALL.endswith(f"/{jobset.VERSION}/manifests.yaml")
    one = template(iteration_workflow(cluster_config("run=t"), 0).to_dict()["spec"], "update")
    assert "resource" not in one and one["container"]["command"][:3] == ["python", "-m", "steps.update"]
    assert one["container"]["resources"]["requests"] == {"cpu": "8", "memory": "64Gi", "ephemeral-storage": "100Gi",
                                                         "nvidia.com/gpu": "1"}


def kubelet_expand(container: dict, pod: dict) -> list[str]:
    """The container's command as the kubelet runs it in `pod` (its metadata): each env var's `fieldRef` read from
    the pod's labels and annotations, each value's `$(VAR)` expanded from the vars above it, then the command's.
    A test double: no kubelet runs here."""
    env: dict[str, str] = {}

    def expand(text: str) -> str:
        return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), text)

    for var in container["env"]:
        if "fieldRef" in var.get("valueFrom", {}):
            kind, key = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]",
                                     var["valueFrom"]["fieldRef"]["fieldPath"]).groups()
            env[var["name"]] = pod[kind][key]
        elif "value" in var:
            env[var["name"]] = expand(var["value"])
    return [expand(word) for word in container["command"]]


def test_torchrun_reads_each_pods_rank_and_rank_0s_address() -> None:
    """Pod 1 of a JobSet `js` (the label JobSet puts on its pods, the completion index Kubernetes annotates), its
    env and command expanded as the kubelet does, is read by torchrun's own parser as node 1 of 2 joining rank 0 at
    JobSet's hostname for pod 0 of Job 0 of the replicated Job, `<job>-<index>` under the subdomain `js`
    (`<js>-<replicated job>-<job index>-<pod index>.<js>`), port 29500, then the update step. Rank 0's address
    built with the wrong Job index is caught (the control)."""
    from torch.distributed.run import get_args_parser

    from workflows import jobset

    container = update_manifest(iteration_workflow(cluster_config(*MULTI_NODE), 0).to_dict()["spec"])[
        "spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    pod = {"labels": {"jobset.sigs.k8s.io/jobset-name": "js"},
           "annotations": {"batch.kubernetes.io/job-completion-index": "1"}}
    args = get_args_parser().parse_args(kubelet_expand(container, pod)[3:])
    rank_0 = f"js-{jobset.NODE}-0-0.js"  # JobSet's naming rule, not the manifest's
    assert (args.nnodes, args.node_rank, args.master_addr, args.master_port) == ("2", 1, rank_0, 29500)
    assert (args.nproc_per_node, args.module, args.training_script) == ("8", True, "steps.update")
    wrong = copy.deepcopy(container)
    address = next(e for e in wrong["env"] if e["name"] == "OPENFORGE_MASTER_ADDR")
    address["value"] = "$(OPENFORGE_JOBSET)-node-0.$(OPENFORGE_JOBSET)"  # the pod index left out
    assert get_args_parser().parse_args(kubelet_expand(wrong, pod)[3:]).master_addr != rank_0


def test_undefined_env_references_are_caught() -> None:
    """The `$(VAR)` check bites: a reference to a variable the container does not define, or defines only below
    its use, is reported."""
    container = update_manifest(iteration_workflow(cluster_config(*MULTI_NODE), 0).to_dict()["spec"])[
        "spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    broken = copy.deepcopy(container)
    broken["env"] = [e for e in broken["env"] if e["name"] != "OPENFORGE_NODE_RANK"]
    assert undefined_references(broken) == ["OPENFORGE_NODE_RANK"]
    reordered = copy.deepcopy(container)
    reordered["env"].reverse()  # OPENFORGE_MASTER_ADDR now above OPENFORGE_JOBSET
    assert undefined_references(reordered) == ["OPENFORGE_JOBSET", "OPENFORGE_JOBSET"]


@pytest.fixture(scope="module")
def jobset_validator() -> Validator:
    """The JobSet fields OpenForge writes, unknown keys forbidden (tests/jobset_schema.py)."""
    from tests.jobset_schema import JOBSET

    return jsonschema.validators.validator_for(JOBSET)(JOBSET)


def test_the_jobset_manifest_is_valid_strictly(jobset_validator: Validator) -> None:
    """The created JobSet validates against JobSet's API types with no unknown key; a misspelt field, a wrong
    type and an unknown completion mode are each reported (the control)."""
    manifest = update_manifest(yaml.safe_load((GOLDEN / "iteration-codex-2nodes-it0.yaml").read_text())["spec"])
    assert schema_errors(jobset_validator, manifest) == []
    broken = copy.deepcopy(manifest)
    job = broken["spec"]["replicatedJobs"][0]["template"]["spec"]
    job["backoffLimt"] = job.pop("backoffLimit")
    job["completionMode"] = "Indexd"
    broken["spec"]["network"]["enableDNSHostnames"] = "yes"
    errors = "\n".join(schema_errors(jobset_validator, broken))
    assert "backoffLimt" in errors and "'Indexd'" in errors and "enableDNSHostnames" in errors


LABEL_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?"
REQUIREMENT = re.compile(rf"^\s*([A-Za-z0-9](?:[-A-Za-z0-9_./]*[A-Za-z0-9])?)\s*(==|=|!=)\s*({LABEL_VALUE})\s*$")


def parse_condition(condition: str) -> list[tuple[str, str, str]]:
    """A resource template's success/failure condition as Argo reads it: Kubernetes label-selector requirements
    (`labels.Parse`), comma-separated, here only `key == value`, `key = value` and `key != value`. A test double:
    Argo's Go parser cannot run here. Raises ValueError on what that parser would refuse of these forms."""
    requirements = []
    for part in condition.split(","):
        match = REQUIREMENT.match(part)
        if not match:
            raise ValueError(f"not a label-selector requirement: {part!r}")
        requirements.append(match.groups())
    return requirements


def condition_holds(condition: str, resource: dict) -> bool:
    """Whether every requirement holds on the resource's JSON, keys read as paths (Argo's gjson lookup)."""
    def lookup(path: str) -> str | None:
        node = resource
        for key in path.split("."):
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return str(node)

    return all((lookup(key) == value) == (op != "!=") for key, op, value in parse_condition(condition))


def test_the_update_waits_for_the_jobsets_terminal_state(jobset_validator: Validator) -> None:
    """The conditions parse as Argo's label-selector syntax and read a field of JobSet's status: a Completed JobSet
    succeeds the step, a Failed one fails it, a running one (no terminal state yet) keeps it waiting. The parser
    refuses a quoted value, which Argo's would (the control)."""
    update = template(iteration_workflow(cluster_config(*MULTI_NODE), 0).to_dict()["spec"], "update")["resource"]
    success, failure = update["successCondition"], update["failureCondition"]
    base = update_manifest({"templates": [{"name": "update", "resource": update}]})
    for status, succeeded, failed in (({"terminalState": "Completed"}, True, False),
                                      ({"terminalState": "Failed"}, False, True),
                                      ({"restarts": 0, "replicatedJobsStatus": [{"name": "node"}]}, False, False)):
        resource = {**base, "status": status}
        assert schema_errors(jobset_validator, resource) == []  # the status is one JobSet can have
        assert (condition_holds(success, resource), condition_holds(failure, resource)) == (succeeded, failed)
    with pytest.raises(ValueError):
        parse_condition('status.terminalState == "Completed"')


def argo_expression_tags(text: str, workflow: str) -> str:
    """`text` with each `{{=...}}` tag of the forms `jobset.NAME` uses evaluated as Argo would for the Workflow
    `workflow`: `workflow.name`, `sprig.sha1sum(x)`, `sprig.trunc(n, x)`. A test double: Argo's expression engine
    cannot run here."""
    import hashlib

    def evaluate(expr: str) -> str:
        expr = expr.strip()
        if expr == "workflow.name":
            return workflow
        if match := re.fullmatch(r"sprig\.sha1sum\((.+)\)", expr):
            return hashlib.sha1(evaluate(match.group(1)).encode()).hexdigest()
        if match := re.fullmatch(r"sprig\.trunc\((\d+),\s*(.+)\)", expr):
            return evaluate(match.group(2))[:int(match.group(1))]
        raise ValueError(f"not an expression this double knows: {expr!r}")

    return re.sub(r"\{\{=(.+?)\}\}(?!\})", lambda m: evaluate(m.group(1)), text)


def test_jobset_pod_names_fit_for_any_run_name() -> None:
    """JobSet refuses a JobSet whose longest pod name (`<jobset>-node-0-<rank>-<5 random>`) passes 63 characters
    (its webhook's DNS-1035 label check): with the longest run name, iteration 99, resubmitted and the most nodes the
    config accepts, it fits. The name is what Argo makes of `jobset.NAME` (`jobset_name`, used by the preflight),
    the same for one Workflow every time (a repeated create is refused, not doubled) and different for the
    iterations of a long-named run; the Workflow's name uncut would not fit (the control)."""
    from workflows import jobset
    from workflows.config import MAX_UPDATE_NODES

    config = cluster_config("run=" + "r" * 80, f"update_nodes={MAX_UPDATE_NODES}")
    with pytest.raises(ConfigError, match=f"config key 'update_nodes' must be at most {MAX_UPDATE_NODES}, got 1001"):
        cluster_config("run=t", f"update_nodes={MAX_UPDATE_NODES + 1}")
    workflow = f"{workflow_name(config, 99)}-abcde"  # Argo's resubmit names a copy `<name>-<5 random>`
    assert len(workflow) <= 63  # Argo's own cap on a Workflow's name
    name = argo_expression_tags(jobset.NAME, workflow)
    assert name == jobset.jobset_name(workflow) and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name)

    def longest_pod_name(jobset_name: str) -> str:
        return f"{jobset_name}-{jobset.NODE}-0-{config.update_nodes - 1}-yyyyy"  # JobSet's and Kubernetes' suffixes

    assert len(longest_pod_name(name)) <= 63
    assert len(longest_pod_name(workflow)) > 63
    assert jobset.jobset_name(workflow_name(config, 1)) != jobset.jobset_name(workflow_name(config, 2))


def test_the_jobset_pods_run_as_the_workflows_service_account() -> None:
    """The JobSet's pods name the Workflow's service account (its imagePullSecrets; Argo sets it only on its own
    pods), with no API token mounted; another service_account is followed (the control)."""
    for account in ("openforge", "trainer"):
        spec = iteration_workflow(cluster_config(*MULTI_NODE, f"service_account={account}"), 0).to_dict()["spec"]
        pod = update_manifest(spec)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        assert spec["serviceAccountName"] == pod["serviceAccountName"] == account
        assert pod["automountServiceAccountToken"] is False


def test_no_two_update_jobsets_write_one_checkpoint() -> None:
    """Across nodes, `clean-update` deletes every JobSet of this run's iteration (by its labels) and waits for its
    pods to go before `update` creates its own; a Workflow that did not succeed deletes its own JobSet in its exit
    handler. Both selectors select the JobSet the update creates. update_nodes=1 has neither (the control)."""
    from workflows import jobset

    spec = iteration_workflow(cluster_config(*MULTI_NODE), 3).to_dict()["spec"]
    labels = update_manifest(spec)["metadata"]["labels"]
    tasks = {t["name"]: t for t in template(spec, "iteration")["dag"]["tasks"]}
    assert (tasks["clean-update"]["depends"], tasks["update"]["depends"]) == ("collect", "clean-update")
    exit_tasks = {t["name"]: t for t in template(spec, "exit")["dag"]["tasks"]}
    assert exit_tasks["delete-update"]["when"] == "{{workflow.status}} != Succeeded"
    selectors = {}
    for name in ("clean-update", "delete-update"):
        resource = template(spec, name)["resource"]
        kind, flag, selector, *rest = resource["flags"]
        assert (resource["action"], kind, flag) == ("delete", jobset.CRD, "-l")
        assert rest == ["--cascade=foreground", "--wait"]  # returns once the pods are gone
        selectors[name] = dict(pair.split("=") for pair in selector.split(","))
        assert selectors[name].items() <= labels.items()
    assert selectors == {"clean-update": {"openforge.dev/run": "t", "openforge.dev/iteration": "3"},
                         "delete-update": {"openforge.dev/workflow": "{{workflow.name}}"}}
    one = iteration_workflow(cluster_config("run=t"), 3).to_dict()["spec"]
    assert {t["name"] for t in one["templates"]}.isdisjoint({"clean-update", "delete-update"})
    assert [t["name"] for t in template(one, "exit")["dag"]["tasks"]] == ["record", "report"]


def test_multi_node_workflow_is_accepted_by_the_argo_server(fake_argo: FakeArgoServer, s3_store: str) -> None:
    """submit with update_nodes=2: linted and created as built, its update step the JobSet's resource template."""
    assert drive(fake_argo, s3_store, "--harness", "codex", "run=mn", "iterations=1", "update_nodes=2") == 0
    created = fake_argo.workflows["openforge-mn-it0"]
    update = next(t for t in created["spec"]["templates"] if t["name"] == "update")
    assert "JobSet" in update["resource"]["manifest"] and "container" not in update
    assert [path for _, path, _, _ in fake_argo.calls("POST")] == ["/api/v1/workflows/openforge/lint",
                                                                   "/api/v1/workflows/openforge"]


class FakeJobSetApi:
    """A test double for the one CustomObjectsApi call the JobSet preflight makes (no API server runs here): a
    dry-run create answered as the API server would with the JobSet CRD missing (404), its controller down
    (500 from the webhook call), the JobSet refused by its webhook (422, or 403 "denied the request"), the
    caller not allowed (403), iteration 0's JobSet already there (409), or everything there (the object back)."""

    def __init__(self, status: int | None, body: str = "") -> None:
        self.status, self.body, self.calls = status, body, []

    def create_namespaced_custom_object(self, group, version, namespace, plural, body, **kwargs):
        from kubernetes.client.exceptions import ApiException

        self.calls.append(((group, version, namespace, plural), body, kwargs))
        if self.status:
            exc = ApiException(status=self.status, reason="error")
            exc.body = self.body
            raise exc
        return body


def test_preflight_names_a_missing_jobset_or_its_controller() -> None:
    """update_nodes=2: a missing JobSet CRD and a JobSet controller that does not answer are each one sentence with
    the install command; both there, no problem. The check is a dry run of the very JobSet iteration 0 creates,
    its Argo placeholders filled in. update_nodes=1 asks nothing (the control)."""
    from workflows import jobset
    from workflows.preflight import check_jobset

    config = cluster_config(*MULTI_NODE)
    missing = FakeJobSetApi(404)
    assert check_jobset(missing, config) == ([], [
        f"update_nodes is 2, but the cluster has no JobSet API (CRD jobsets.jobset.x-k8s.io); install JobSet "
        f"({jobset.INSTALL})"])
    (where, body, kwargs), = missing.calls
    assert where == ("jobset.x-k8s.io", "v1alpha2", "openforge", "jobsets") and kwargs["dry_run"] == "All"
    assert "{{" not in json.dumps(body) and body["metadata"]["name"] == jobset.jobset_name("openforge-t-it0")
    built = json.dumps(update_manifest(iteration_workflow(config, 0).to_dict()["spec"]))
    assert body == json.loads(argo_expression_tags(built, "openforge-t-it0").replace("{{workflow.name}}",
                                                                                   "openforge-t-it0"))
    down = FakeJobSetApi(500, '{"message": "Internal error occurred: failed calling webhook \\"mjobset.kb.io\\""}')
    _, problems = check_jobset(down, config)
    assert problems[0].startswith("update_nodes is 2, but JobSet's controller did not answer") and jobset.INSTALL in problems[0]
    refused = FakeJobSetApi(422, '{"message": "JobSet.jobset.x-k8s.io \\"x\\" is invalid:\\n spec: bad"}')
    assert check_jobset(refused, config)[1] == ["update_nodes is 2, but JobSet refuses the update's JobSet: "
                                                "JobSet.jobset.x-k8s.io \"x\" is invalid: spec: bad"]
    denied = FakeJobSetApi(403, '{"message": "admission webhook \\"vjobset.kb.io\\" denied the request: name too long"}')
    assert check_jobset(denied, config)[1] == ["update_nodes is 2, but JobSet refuses the update's JobSet: admission "
                                               "webhook \"vjobset.kb.io\" denied the request: name too long"]
    forbidden = check_jobset(FakeJobSetApi(403, '{"message": "jobsets.jobset.x-k8s.io is forbidden"}'), config)
    assert forbidden[1] == [] and forbidden[0][0].startswith("could not check JobSet for update_nodes (HTTP 403")
    assert check_jobset(FakeJobSetApi(None), config) == ([], [])
    # The name is fixed per Workflow: a resumed run's iteration 0 JobSet answers AlreadyExists, past the webhook.
    exists = FakeJobSetApi(409, '{"message": "jobsets.jobset.x-k8s.io \\"x\\" already exists"}')
    assert check_jobset(exists, config) == ([], [])


def test_preflight_reports_only_an_unreachable_server_as_one() -> None:
    """The JobSet check names a connection failure (urllib3's, as the kubernetes client raises it) as the API server
    not answering; any other exception (a bug in building the manifest) is raised, not hidden behind that note."""
    import urllib3

    from workflows.preflight import check_jobset

    class Raising:  # a test double for CustomObjectsApi: no API server runs here
        def __init__(self, exc: Exception) -> None:
            self.exc = exc

        def create_namespaced_custom_object(self, *args, **kwargs):
            raise self.exc

    config = cluster_config(*MULTI_NODE)
    unreachable = Raising(urllib3.exceptions.MaxRetryError(None, "/apis", "connection refused"))
    assert check_jobset(unreachable, config) == (["the cluster's API server did not answer the JobSet check for "
                                                   "update_nodes"], [])
    with pytest.raises(KeyError):
        check_jobset(Raising(KeyError("spec")), config)


def test_preflight_counts_the_gpu_nodes_a_multi_node_update_needs() -> None:
    """Through check_cluster: one node with 8 GPUs cannot hold update_nodes=2 of update_gpus=8 (one sentence), two
    can, and so can that one node for update_nodes=2 of update_gpus=4 (the scheduler puts both pods there: GPU slots
    are counted, not nodes); the JobSet check runs there only with update_nodes > 1."""
    from types import SimpleNamespace

    from workflows.preflight import check_cluster

    class FakeCoreApi:  # the CoreV1Api calls preflight makes, everything present
        def __init__(self, nodes: int) -> None:
            self.nodes = nodes

        def read_namespace(self, name, **_):
            return {}

        def read_namespaced_secret(self, name, namespace, **_):
            return {}

        def read_namespaced_service_account(self, name, namespace, **_):
            return SimpleNamespace(metadata=SimpleNamespace(annotations={}))

        def list_node(self, **_):
            gpus = SimpleNamespace(status=SimpleNamespace(allocatable={"nvidia.com/gpu": "8"}))
            return SimpleNamespace(items=[gpus] * self.nodes)

        def read_namespaced_endpoints(self, name, namespace, **_):
            return SimpleNamespace(subsets=[])

    config = cluster_config(*MULTI_NODE, "rollout_egress_cidrs=10.0.0.5/32")
    jobsets = FakeJobSetApi(None)
    assert check_cluster(FakeCoreApi(1), config, jobsets)[1] == [
        "update_nodes is 2, but the nodes offer only 1 slot(s) of update_gpus=8 nvidia.com/gpu; lower update_nodes or "
        "add GPU nodes"]
    assert check_cluster(FakeCoreApi(2), config, jobsets)[1] == [] and len(jobsets.calls) == 2
    halves = cluster_config("run=t", "update_nodes=2", "update_gpus=4", "rollout_egress_cidrs=10.0.0.5/32")
    assert check_cluster(FakeCoreApi(1), halves, jobsets)[1] == []
    assert check_cluster(FakeCoreApi(1), cluster_config("run=t", "update_nodes=3", "update_gpus=4", *NO_CLUSTER_EGRESS),
                         jobsets)[1] == [
        "update_nodes is 3, but the nodes offer only 2 slot(s) of update_gpus=4 nvidia.com/gpu; lower update_nodes or "
        "add GPU nodes"]
    assert check_cluster(FakeCoreApi(1), cluster_config("run=t", "update_gpus=8", *NO_CLUSTER_EGRESS), None)[1] == []


def test_the_local_runner_refuses_a_multi_node_update(tmp_path: Path, capsys) -> None:
    """The embedded default runs on one machine: update_nodes=2 stops it before anything starts or is written,
    in one sentence naming the key and what to do."""
    from workflows.local import run_local

    assert run_local(load_config(None, ["run=mn", "update_nodes=2", f"store={tmp_path}"])) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: config key 'update_nodes' is 2, but the local runner runs the update on this one machine: "
                   "set update_nodes: 1 (update_gpus processes run here), or run on Argo")
    assert list(tmp_path.iterdir()) == []
