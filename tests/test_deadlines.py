"""Deadlines on every long-lived part of an iteration's Workflow, and the update's NCCL settings across nodes.

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q -n 0 tests/test_deadlines.py

Each deadline is read from the rendered Workflow (the Workflow's, the serve daemon's, the single update pod's, the
update JobSet's Job's) and follows its config key; the NCCL keys land in the JobSet's pods and a bad one is refused
in one sentence; a Workflow Argo ends at its deadline is recorded Failed with the reason, and `retry` reruns it.
What Argo does at a deadline is modelled on its source (docs/workflows.md, "Deadlines"; `workflows.argo`).
"""

import copy

import pytest
import yaml
from hera.workflows.models import NodeStatus

from steps import manifest
from workflows import argo, jobset
from workflows.config import ConfigError
from workflows.iteration import iteration_workflow
from tests.test_workflows import (FakeArgoServer, cluster_config, drive, fake_argo, jobset_validator,  # noqa: F401
                                  s3_store, schema_errors, template, update_manifest, workflow_validator)

pytestmark = pytest.mark.filterwarnings("ignore::pydantic.PydanticDeprecatedSince20")
KEYS = ("workflow_timeout_s", "serve_timeout_s", "update_timeout_s")
NCCL = ["update_nodes=2", "update_rdma_resources={rdma/ib: 1, vpc.amazonaws.com/efa: 4}",
        "update_env={NCCL_DEBUG: INFO, NCCL_SOCKET_IFNAME: '^lo,docker', FI_PROVIDER: efa}", "update_host_network=true"]


def rendered(*overrides: str) -> dict:
    """Iteration 0's Workflow spec for configs/cluster-example.yaml with `overrides`, as the YAML Argo gets."""
    return yaml.safe_load(iteration_workflow(cluster_config("run=dl", *overrides), 0).to_yaml())["spec"]


def deadlines(spec: dict) -> dict[str, int | None]:
    """Each deadline a Workflow spec carries: the Workflow's, the serve daemon's, and the update's (its pod's, or
    across nodes its JobSet's Job's); None where it has none."""
    update = template(spec, "update")
    if "resource" in update:
        update_deadline = update_manifest(spec)["spec"]["replicatedJobs"][0]["template"]["spec"].get(
            "activeDeadlineSeconds")
    else:
        update_deadline = update.get("activeDeadlineSeconds")
    return {"workflow_timeout_s": spec.get("activeDeadlineSeconds"),
            "serve_timeout_s": template(spec, "serve").get("activeDeadlineSeconds"),
            "update_timeout_s": update_deadline}


@pytest.mark.parametrize("nodes", [1, 2])
def test_each_deadline_is_its_config_keys(nodes: int) -> None:
    """The Workflow's, the serve daemon's and the update's deadline (one pod, or the JobSet's Job) follow their keys;
    the same reading of a spec without them finds none (the control)."""
    defaults = deadlines(rendered(f"update_nodes={nodes}"))
    assert defaults == {"workflow_timeout_s": 86400, "serve_timeout_s": 43200, "update_timeout_s": 21600}
    changed = deadlines(rendered(f"update_nodes={nodes}", "workflow_timeout_s=9000", "serve_timeout_s=5000",
                                 "update_timeout_s=3000"))
    assert changed == {"workflow_timeout_s": 9000, "serve_timeout_s": 5000, "update_timeout_s": 3000}
    bare = rendered(f"update_nodes={nodes}")
    bare.pop("activeDeadlineSeconds")
    template(bare, "serve").pop("activeDeadlineSeconds")
    if nodes == 1:
        template(bare, "update").pop("activeDeadlineSeconds")
    else:
        job = update_manifest(bare)
        job["spec"]["replicatedJobs"][0]["template"]["spec"].pop("activeDeadlineSeconds")
        template(bare, "update")["resource"]["manifest"] = yaml.safe_dump(job)
    assert deadlines(bare) == dict.fromkeys(KEYS)


def test_the_deadlines_and_nccl_settings_pass_the_strict_schemas(workflow_validator, jobset_validator) -> None:
    """A Workflow with every deadline changed and the NCCL keys set validates against Argo's schema and its JobSet
    against JobSet's, unknown keys forbidden; a misspelt host-network field or a wrong DNS policy is caught."""
    spec = rendered(*NCCL, "workflow_timeout_s=9000", "serve_timeout_s=5000", "update_timeout_s=3000")
    workflow = yaml.safe_load(iteration_workflow(cluster_config("run=dl", *NCCL), 0).to_yaml())
    assert schema_errors(workflow_validator, workflow) == []
    created = update_manifest(spec)
    assert schema_errors(jobset_validator, created) == []
    broken = copy.deepcopy(created)
    pod = broken["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["hostNetwrk"] = pod.pop("hostNetwork")
    pod["dnsPolicy"] = "ClusterFirstHostNet"
    errors = "\n".join(schema_errors(jobset_validator, broken))
    assert "hostNetwrk" in errors and "ClusterFirstHostNet" in errors


def test_the_nccl_settings_reach_the_jobset_pods() -> None:
    """The RDMA resources in each JobSet pod's requests and limits, the env before the rank's, the host network with
    the DNS policy that still resolves rank 0's name; none of it without the keys (the control)."""
    pod = update_manifest(rendered(*NCCL))["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    for kind in ("requests", "limits"):
        assert container["resources"][kind]["rdma/ib"] == "1"
        assert container["resources"][kind]["vpc.amazonaws.com/efa"] == "4"
    names = [e["name"] for e in container["env"]]
    assert {"name": "NCCL_SOCKET_IFNAME", "value": "^lo,docker"} in container["env"]
    assert names.index("FI_PROVIDER") < names.index(jobset.NODE_RANK_ENV)
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert {"name": jobset.SHM_VOLUME, "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    plain = update_manifest(rendered("update_nodes=2"))["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert "hostNetwork" not in plain["spec"] and "dnsPolicy" not in plain["spec"]
    assert not any("rdma" in k for k in plain["spec"]["containers"][0]["resources"]["limits"])
    assert not any(e["name"].startswith(("NCCL_", "FI_")) for e in plain["spec"]["containers"][0]["env"])


def test_the_single_update_pod_gets_the_nccl_env() -> None:
    """One update pod (NCCL between its GPUs) gets `update_env` too, beside its S3 env."""
    env = template(rendered("update_env={NCCL_DEBUG: INFO}"), "update")["container"]["env"]
    assert {"name": "NCCL_DEBUG", "value": "INFO"} in env
    assert not any(e["name"] == "NCCL_DEBUG" for e in template(rendered(), "update")["container"]["env"])


@pytest.mark.parametrize("override, expected", [
    ("update_env={AWS_SECRET_ACCESS_KEY: x}", "'update_env' takes only NCCL_*"),
    ("update_env={NCCL_API_TOKEN: x}", "none naming a key, secret, token or password"),
    ("update_env={LD_PRELOAD: /tmp/x.so}", "'update_env' takes only NCCL_*"),
    ("update_env={NCCL_SOCKET_IFNAME: $(HOME)}", "'update_env.NCCL_SOCKET_IFNAME' must be"),
    ("update_env={NCCL_DEBUG: 3}", "'update_env.NCCL_DEBUG' must be a string"),
    ("update_rdma_resources={nvidia.com/gpu: 1}", "GPUs are update_gpus"),
    ("update_rdma_resources={rdma/ib: 0}", "counts of at least 1"),
    ("update_rdma_resources={ib: 1}", "extended resource names (domain/name"),
    ("update_rdma_resources={rdma/ib: one}", "'update_rdma_resources.rdma/ib' must be a whole number"),
])
def test_a_bad_nccl_key_is_one_sentence(override: str, expected: str) -> None:
    """Each bad NCCL key is refused with one sentence naming the key and what it accepts."""
    with pytest.raises(ConfigError) as refused:
        cluster_config("run=dl", "update_nodes=2", override)
    message = str(refused.value)
    assert expected in message and "\n" not in message, message


def test_a_workflow_deadline_shorter_than_serve_and_update_is_refused() -> None:
    """The Workflow's deadline must leave room for the serve pod's and then the update's: one second short is refused
    in one sentence, the sum itself accepted (the control)."""
    with pytest.raises(ConfigError, match=r"'workflow_timeout_s' \(7999\) must be at least .* \(8000\)"):
        cluster_config("run=dl", "workflow_timeout_s=7999", "serve_timeout_s=5000", "update_timeout_s=3000")
    assert cluster_config("run=dl", "workflow_timeout_s=8000", "serve_timeout_s=5000",
                          "update_timeout_s=3000").workflow_timeout_s == 8000


@pytest.mark.parametrize("override", ["update_rdma_resources={rdma/ib: 1}", "update_host_network=true"])
def test_network_keys_need_nodes(override: str) -> None:
    """RDMA resources and the host network are for the update across nodes: with one update pod they are refused,
    with two accepted (the control)."""
    with pytest.raises(ConfigError, match="for the update across nodes"):
        cluster_config("run=dl", override)
    assert cluster_config("run=dl", "update_nodes=2", override).update_nodes == 2


# ---- a Workflow ended by a deadline, as Argo ends it ----

def node(workflow: str, step: str, template_name: str, phase: str, message: str = "", finished: str = "") -> dict:
    """One node of a Workflow's status, as the Argo Server returns it (Argo's NodeStatus)."""
    return {"id": f"{workflow}-{step}", "name": f"{workflow}.{step}", "displayName": step, "type": "Pod",
            "templateName": template_name, "phase": phase, "message": message,
            **({"finishedAt": finished} if finished else {})}


class EndingArgoServer(FakeArgoServer):
    """The fake Argo Server, where a workflow named in `endings` ends Failed with those nodes: what Argo leaves at a
    deadline (docs/workflows.md, "Deadlines") or any other failure. Its exit handler's nodes succeeded; the
    Workflow's own message is empty, as a failed DAG leaves it. A retry makes it run and succeed (the base class)."""

    def __init__(self) -> None:
        super().__init__()
        self.endings: dict[str, list[dict]] = {}

    def _status(self, name: str) -> dict:
        status = super()._status(name)
        if status.get("phase") == "Failed" and name in self.endings:
            exit_nodes = [node(name, "record", "record", "Succeeded"), node(name, "report", "report", "Succeeded")]
            status["nodes"] = {n["id"]: n for n in [*self.endings[name], *exit_nodes]}
        return status


@pytest.fixture
def ending_argo(fake_argo: FakeArgoServer):
    """A fresh `EndingArgoServer`, in the environment `fake_argo` sets (no kubeconfig, a token in ARGO_TOKEN)."""
    fake = EndingArgoServer()
    yield fake
    fake.server.shutdown()


def test_a_workflow_ended_by_its_deadline_is_recorded_failed_with_why_and_retried(
        ending_argo: EndingArgoServer, s3_store: str, capsys) -> None:
    """Argo stops the rollouts and serve at the Workflow's deadline: the driver stops the run (exit 1), records the
    iteration Failed with the deadline as its reason, prints it and `status` shows it; `retry` reruns it and the
    record turns Succeeded with no reason left."""
    name = "openforge-dl-it0"
    ending_argo.script[name] = ["", "Running", "Failed"]
    ending_argo.endings[name] = [
        node(name, "collect.rollout(0)", "rollout", "Failed", argo.WORKFLOW_DEADLINE, "2026-01-01T10:00:01Z"),
        node(name, "collect.rollout(1)", "rollout", "Failed", argo.WORKFLOW_DEADLINE, "2026-01-01T10:00:02Z"),
        node(name, "collect.serve", "serve", "Failed", argo.WORKFLOW_DEADLINE, "2026-01-01T10:00:03Z")]
    assert drive(ending_argo, s3_store, "--harness", "codex", "run=dl", "iterations=1") == 1
    record = manifest.read_iterations(f"{s3_store}/dl")[0]
    assert record.status == "Failed"
    assert record.reason == ("the Workflow passed its deadline (workflow_timeout_s, spec.activeDeadlineSeconds) and "
                             "Argo stopped collect.rollout(0) and 2 more")
    err = capsys.readouterr().err
    assert record.reason in err and "retry --run dl --iteration 0" in err
    assert drive(ending_argo, s3_store, "status", "--run", "dl") == 0
    assert f"why: {record.reason}" in capsys.readouterr().out
    assert drive(ending_argo, s3_store, "retry", "--run", "dl") == 0
    (_, path, _, _), = ending_argo.calls("PUT")
    assert path == f"/api/v1/workflows/openforge/{name}/retry"
    retried = manifest.read_iterations(f"{s3_store}/dl")[0]
    assert (retried.status, retried.reason) == ("Succeeded", None)


def test_a_pods_own_deadline_and_a_plain_failure_say_so(ending_argo: EndingArgoServer, s3_store: str) -> None:
    """The update pod stopped at its own deadline is named with update_timeout_s; a step that exited 1 is named with
    its message and no deadline (the control)."""
    late, broken = "openforge-dp-it0", "openforge-dq-it0"
    ending_argo.script[late] = ending_argo.script[broken] = ["Failed"]
    ending_argo.endings[late] = [node(late, "update", "update", "Failed", argo.POD_DEADLINE)]
    ending_argo.endings[broken] = [node(broken, "plan", "plan", "Failed", "Error (exit code 1)")]
    assert drive(ending_argo, s3_store, "--harness", "codex", "run=dp", "iterations=1") == 1
    assert drive(ending_argo, s3_store, "--harness", "codex", "run=dq", "iterations=1") == 1
    assert manifest.read_iterations(f"{s3_store}/dp")[0].reason == (
        "update passed its own deadline (update_timeout_s, the pod's activeDeadlineSeconds)")
    assert manifest.read_iterations(f"{s3_store}/dq")[0].reason == "plan failed: Error (exit code 1)"


def test_the_failure_reason_reads_argos_node_status() -> None:
    """`failure_reason` on Hera's own NodeStatus models: the earliest failed step first, the serve daemon's deadline
    named by its key, a failed rollout retried and then stopped counted once per node; the Workflow's own message
    when no step says anything."""
    def status(step: str, template_name: str, message: str, finished: str) -> NodeStatus:
        return NodeStatus.model_validate(node("w", step, template_name, "Failed", message, finished))

    serve = status("collect.serve", "serve", argo.POD_DEADLINE + ".", "2026-01-01T10:00:00Z")
    rollout = status("collect.rollout(3)", "rollout", "Error (exit code 1)", "2026-01-01T11:00:00Z")
    assert argo.failure_reason("", [rollout, serve]) == (
        "collect.serve passed its own deadline (serve_timeout_s, the pod's activeDeadlineSeconds) (1 more steps failed)")
    assert argo.failure_reason("child 'x' failed", []) == "child 'x' failed"
    assert argo.failure_reason(None, []) == ""
