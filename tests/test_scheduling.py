"""Where each group of pods runs and what it requests (`serve_pod`, `rollout_pod`, `update_pod`, `steps_pod`), the
serve pod's /dev/shm and the deadlines, as the rendered Workflows and the update's JobSet carry them.

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q -n 0 tests/test_scheduling.py     # seconds; no cluster

The Workflows are Hera's output checked against Argo's strict schema (tests/test_workflows.py), the JobSet against
tests/jobset_schema.py; the rollout's podSpecPatch is substituted and merged as Argo and Kubernetes do
(`argo_substitute`, `strategic_merge`), since no cluster runs here.
"""

import copy
import json
from pathlib import Path

import pytest
import yaml
from jsonschema.protocols import Validator

from test_workflows import (EVERY_POD_KEY, MULTI_NODE, argo_substitute, cluster_config, jobset_validator,  # noqa: F401
                            rollout_pod_resources, schema_errors, strategic_merge, template, update_manifest,
                            workflow_validator)
from steps.contracts.config import GPU_TAINT_TOLERATION
from workflows.config import ConfigError, from_dict
from workflows.evaluation import evaluation_workflow
from workflows.iteration import iteration_workflow
from workflows.pods import GPU_PRESENT, QUEUE_LABEL, merged_patch

pytestmark = pytest.mark.filterwarnings("ignore::pydantic.PydanticDeprecatedSince20")
SMALL_STEPS = ("plan", "trajectories", "record", "report", "eval-plan", "eval-trajectories", "evaluate")
ROLLOUTS = ("rollout", "rollout-app")


def every_key_spec(*more: str) -> dict:
    """The spec of iteration 0's Workflow (with its evaluation) with every scheduling key set (`EVERY_POD_KEY`)."""
    return iteration_workflow(cluster_config("run=t", "iterations=2", "eval_every=2", *EVERY_POD_KEY, *more),
                              0).to_dict()["spec"]


def barred_gpu_label(pod: dict) -> list[str]:
    """The GPU_PRESENT values a pod's required node affinity bars (none: it may land on GPU nodes)."""
    terms = (pod.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", {})
             .get("nodeSelectorTerms", []))
    return [value for term in terms for rule in term["matchExpressions"]
            if rule["key"] == GPU_PRESENT and rule["operator"] == "NotIn" for value in rule["values"]]


def test_each_groups_keys_land_on_its_pods() -> None:
    """serve, rollout and rollout-app, the single-pod update and every small step (the evaluation's included) carry
    their own group's node selector, priority class, queue label and requests; the Workflow and each long step its
    deadline; the serve pod its /dev/shm of `serve_shm`."""
    spec = every_key_spec()
    assert spec["activeDeadlineSeconds"] == 172800
    serve = template(spec, "serve")
    assert (serve["nodeSelector"], serve["priorityClassName"]) == ({"pool": "h100"}, "rl-high")
    assert serve["metadata"]["labels"][QUEUE_LABEL] == "rl-gpu" and serve["activeDeadlineSeconds"] == 86400
    assert serve["container"]["resources"] == {
        "requests": {"cpu": "16", "memory": "128Gi", "ephemeral-storage": "200Gi", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "32", "memory": "256Gi", "ephemeral-storage": "400Gi", "nvidia.com/gpu": "1"}}
    assert json.loads(serve["podSpecPatch"]) == {"hostIPC": True}
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}} in serve["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in serve["container"]["volumeMounts"]
    for name in ROLLOUTS:
        rollout = template(spec, name)
        assert (rollout["nodeSelector"], rollout["priorityClassName"]) == ({"pool": "cpu"}, "rl-low"), name
        assert rollout["tolerations"] == [{"key": "spot", "operator": "Exists"}]
        assert rollout["metadata"]["labels"] == {"openforge.dev/role": "rollout", QUEUE_LABEL: "rl-cpu"}
        assert json.loads(argo_substitute(rollout["podSpecPatch"], {"cpus": "1", "memory_mb": "1", "storage_mb": "1",
                                                                     "gpus": "0"}))["dnsPolicy"] == "Default"
    update = template(spec, "update")
    assert (update["nodeSelector"], update["priorityClassName"]) == ({"pool": "h100"}, "rl-high")
    assert update["metadata"]["labels"] == {QUEUE_LABEL: "rl-gpu"} and update["activeDeadlineSeconds"] == 36000
    assert update["container"]["resources"] == {
        "requests": {"cpu": "64", "memory": "512Gi", "ephemeral-storage": "1Ti", "nvidia.com/gpu": "1"},
        "limits": {"memory": "1Ti", "nvidia.com/gpu": "1"}}
    for name in SMALL_STEPS:
        step = template(spec, name)
        assert (step["nodeSelector"], step["priorityClassName"]) == ({"pool": "cpu"}, "rl-low"), name
        assert step["metadata"]["labels"][QUEUE_LABEL] == "rl-cpu" and step["activeDeadlineSeconds"] == 3600, name
        requests = {"cpu": "1", "memory": "4Gi", "ephemeral-storage": "10Gi"}
        assert step["container"]["resources"] == {"requests": requests}, name
        assert json.loads(step["podSpecPatch"]) == {"enableServiceLinks": False} and "affinity" not in step, name
        assert step["tolerations"] == [{"key": "pool", "operator": "Equal", "value": "cpu", "effect": "NoSchedule",
                                        "tolerationSeconds": 60}], name


def test_the_evaluation_workflow_carries_the_keys_too() -> None:
    """An evaluation Workflow: its deadline, the serve pod's and the small steps' keys (the control: the same
    Workflow without the keys has none of them)."""
    for overrides, expected in ((EVERY_POD_KEY, True), ((), False)):
        spec = evaluation_workflow(cluster_config("run=t", *overrides), 0).to_dict()["spec"]
        assert spec["activeDeadlineSeconds"] == (172800 if expected else 86400)
        for name, selector in (("serve", {"pool": "h100"}), ("plan", {"pool": "cpu"}), ("evaluate", {"pool": "cpu"}),
                               ("record", {"pool": "cpu"}), ("rollout", {"pool": "cpu"})):
            assert template(spec, name).get("nodeSelector") == (selector if expected else None), name


def test_the_every_key_workflow_is_valid_strictly(workflow_validator: Validator) -> None:
    """With every key set the Workflow still validates against Argo's schema with no unknown key; a toleration with
    a misspelt field does not (the control)."""
    workflow = iteration_workflow(cluster_config("run=t", "eval_every=2", *EVERY_POD_KEY), 0).to_dict()
    assert schema_errors(workflow_validator, workflow) == []
    broken = copy.deepcopy(workflow)
    template(broken["spec"], "rollout")["tolerations"][0]["operater"] = "Exists"
    assert "operater" in "\n".join(schema_errors(workflow_validator, broken))


def test_the_jobset_pods_are_placed_and_the_jobset_queued(jobset_validator: Validator) -> None:
    """Across nodes each JobSet pod gets the update group's node selector, tolerations, priority class and requests,
    and the Kueue queue labels the JobSet (where Kueue reads it), not its pods; the manifest validates strictly (the
    control: a misspelt toleration field fails)."""
    spec = iteration_workflow(cluster_config(*MULTI_NODE, "update_pod={node_selector: {pool: h100}, priority_class: "
                                             "rl-high, queue: rl-gpu, memory: 1Ti}"), 0).to_dict()["spec"]
    manifest = update_manifest(spec)
    pod = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert manifest["metadata"]["labels"][QUEUE_LABEL] == "rl-gpu" and QUEUE_LABEL not in pod["metadata"]["labels"]
    assert (pod["spec"]["nodeSelector"], pod["spec"]["priorityClassName"]) == ({"pool": "h100"}, "rl-high")
    assert pod["spec"]["tolerations"] == [GPU_TAINT_TOLERATION] and "affinity" not in pod["spec"]
    assert pod["spec"]["containers"][0]["resources"]["requests"]["memory"] == "1Ti"
    assert schema_errors(jobset_validator, manifest) == []
    pod["spec"]["tolerations"][0]["efect"] = "NoSchedule"
    assert "efect" in "\n".join(schema_errors(jobset_validator, manifest))


def test_the_users_rollout_patch_keeps_the_tasks_resources(tmp_path: Path) -> None:
    """`rollout_pod.pod_spec_patch` is merged into the rollout's own patch: its other fields kept, its other
    quantities kept, but the task's CPUs win over the patch's `cpu: 99`. Control: merged the other way round (the
    user's patch over the rollout's), the pod would get 99 CPUs, and the comparison would fail."""
    task = "cpus = 2\nmemory_mb = 1024\nstorage_mb = 2048\ngpus = 0"
    plain = rollout_pod_resources(cluster_config("run=t"), task, tmp_path / "plain")
    patch = ("rollout_pod.pod_spec_patch={containers: [{name: main, resources: "
             "{limits: {cpu: '99', example.com/fpga: '1'}}}]}")
    patched = rollout_pod_resources(cluster_config("run=t", patch), task, tmp_path / "patched")
    assert patched == {"limits": {**plain["limits"], "example.com/fpga": "1"},
                       "requests": {**plain["requests"], "example.com/fpga": "1"}}
    user = {"containers": [{"name": "main", "resources": {"limits": {"cpu": "99"}}}]}
    ours = {"containers": [{"name": "main", "resources": {"limits": {"cpu": plain["limits"]["cpu"]}}}]}
    wrong_way = strategic_merge(copy.deepcopy(plain), merged_patch(ours, user)["containers"][0]["resources"])
    assert wrong_way["limits"]["cpu"] == "99" != patched["limits"]["cpu"]


def test_rollouts_and_small_steps_stay_off_gpu_nodes_by_default() -> None:
    """By default a rollout of a task without GPUs and every small step bar nodes labelled nvidia.com/gpu.present=
    true, and tolerate no taint; the serve and update pods have no such rule and tolerate the GPU taint (the control:
    the rule is what tells them apart). A task with GPUs lifts its rollout's bar (the value no node has)."""
    spec = iteration_workflow(cluster_config("run=t", "iterations=2", "eval_every=2"), 0).to_dict()["spec"]
    for name in SMALL_STEPS:
        assert barred_gpu_label(template(spec, name)) == ["true"] and "tolerations" not in template(spec, name), name
    for name in ("serve", "update"):
        assert barred_gpu_label(template(spec, name)) == [] and template(spec, name)["tolerations"] == [
            GPU_TAINT_TOLERATION], name
    for name in ROLLOUTS:
        (value,) = barred_gpu_label(template(spec, name))
        assert argo_substitute(value, {"gpus": "0"}) == "true" and argo_substitute(value, {"gpus": "1"}) == "none"
    off = iteration_workflow(cluster_config("run=t", "steps_pod.avoid_gpu_nodes=false"), 0).to_dict()["spec"]
    assert barred_gpu_label(template(off, "plan")) == []


def test_a_partial_group_keeps_its_defaults_and_the_manifest_reads_back() -> None:
    """`serve_pod.cpu=16` changes the serve pod's CPUs only (its GPU toleration stays); a config with every key set
    reads back from its stored dict unchanged."""
    config = cluster_config("run=t", "serve_pod.cpu=16")
    assert config.serve_pod.cpu == "16" and config.serve_pod.tolerations == (GPU_TAINT_TOLERATION,)
    assert cluster_config("run=t", "serve_pod=").serve_pod == cluster_config("run=t").serve_pod  # empty: defaults
    every = cluster_config("run=t", *EVERY_POD_KEY)
    assert from_dict(yaml.safe_load(yaml.safe_dump(every.to_dict()))) == every


@pytest.mark.parametrize("override, message", [
    ("serve_pod.memory=lots", "config key 'serve_pod.memory' must be a Kubernetes quantity such as 8, 500m or 64Gi"),
    ("steps_pod.cpu=-1", "config key 'steps_pod.cpu' must be a Kubernetes quantity"),
    ("serve_pod.nodeselector={a: b}", "unknown config key 'serve_pod.nodeselector'"),
    ("update_pod.tolerations=[{key: a, operator: Maybe}]", "has operator 'Maybe'; give one of Exists, Equal"),
    ("update_pod.tolerations=[{key: a, efect: NoSchedule}]", "unknown field 'efect'"),
    ("rollout_pod.cpu=8", "config key 'rollout_pod' cannot set cpu, memory, ephemeral_storage"),
    ("rollout_pod.queue=no queue", "config key 'rollout_pod.queue' must be a Kueue LocalQueue's name"),
    ("serve_pod.priority_class=High", "config key 'serve_pod.priority_class' must be a PriorityClass's name"),
    ("steps_pod.pod_spec_patch={containers: [{image: x}]}", "must list its containers each with its name"),
    ("serve_pod=16", "config key 'serve_pod' must be a mapping of node_selector"),
    ("serve_shm=big", "config key 'serve_shm' must be a Kubernetes quantity"),
    ("step_timeout_s=0", "config key 'step_timeout_s' must be at least 1"),
])
def test_bad_values_are_one_sentence(override: str, message: str) -> None:
    """Each bad value is refused with one sentence naming its key; the control: a good value of the same key loads."""
    with pytest.raises(ConfigError) as caught:
        cluster_config("run=t", override)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    good = {"serve_pod.memory": "64Gi", "steps_pod.cpu": "500m", "update_pod.tolerations": "[{key: a, operator: Exists}]",
            "rollout_pod.queue": "rl-cpu", "serve_pod.priority_class": "high", "serve_shm": "8Gi",
            "step_timeout_s": "60"}
    key = override.partition("=")[0]
    if key in good:
        cluster_config("run=t", f"{key}={good[key]}")


def test_the_update_patch_is_refused_across_nodes() -> None:
    """update_pod.pod_spec_patch is Argo's podSpecPatch, which the JobSet's pods never see: refused with
    update_nodes > 1, accepted on one pod (the control)."""
    patch = "update_pod.pod_spec_patch={hostIPC: true}"
    with pytest.raises(ConfigError, match="the update's pods are the JobSet's"):
        cluster_config(*MULTI_NODE, patch)
    assert cluster_config("run=t", patch).update_pod.pod_spec_patch == {"hostIPC": True}
