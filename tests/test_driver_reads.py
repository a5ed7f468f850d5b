"""What the driver reads from the Argo server while it follows a Workflow: counted in the fake server, which applies
the `fields` query as Argo's server does (`clean_fields`, a port of util/fields/fields.go `Cleaner`).

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q -n 0 tests/test_driver_reads.py

A 10,000-rollout Workflow's simulated status (a Retry node and a Pod node per rollout, as Argo records a step with
a retryStrategy) is megabytes; a poll must cost a few hundred bytes whatever the fan-out, and the nodes are read
once, when the Workflow has ended.
"""

import json

import pytest

from test_workflows import FakeArgoServer, clean_fields, fake_argo  # noqa: F401 (a fixture)
from steps.contracts.manifest import IterationRecord
from workflows import submit
from workflows.argo import ArgoClient, node_id, poll_fields

ROLLOUTS = 10_000


def simulated_status(name: str, rollouts: int, phase: str) -> dict:
    """A Workflow's status as Argo's controller writes it for an iteration of `rollouts` rollouts: the outer DAG,
    `collect`, the serve daemon, plan, the rollout TaskGroup and per rollout a Retry node and its Pod node with
    their inputs and outputs (the fields and their sizes of a real rollout node)."""
    nodes, collect = {}, f"{name}.collect"

    def add(node_name: str, kind: str, template: str, node_phase: str, **extra) -> str:
        nid = node_id(name, node_name)
        nodes[nid] = {"id": nid, "name": node_name, "displayName": node_name.rsplit(".", 1)[-1], "type": kind,
                      "templateName": template, "templateScope": "local/", "phase": node_phase,
                      "boundaryID": node_id(name, collect), "startedAt": "2026-12-04T04:00:00Z",
                      "finishedAt": "2026-12-04T04:20:00Z", "progress": "1/1", "children": [], **extra}
        return nid

    add(name, "DAG", "iteration", phase)
    add(collect, "DAG", "collect", "Succeeded" if phase == "Succeeded" else "Running")
    add(f"{collect}.serve", "Pod", "serve", "Succeeded", podIP="10.4.7.12", hostNodeName="gpu-node-17")
    add(f"{collect}.plan", "Pod", "plan", "Succeeded")
    group = add(f"{collect}.rollout", "TaskGroup", "rollout", "Running")
    for i in range(rollouts):
        item = {"task": f"task-{i % 500:04d}", "sample": str(i % 8), "rollout_id": f"r{i:05d}-{'a' * 24}",
                "image": "registry.example.com/openforge-tasks/task-0001:3f2a9c0e1b7d", "deadline": "1920",
                "cpus": "2", "memory_mb": "4096", "storage_mb": "10240", "gpus": "0",
                "proxy_url": "http://10.96.14.201:8100"}
        retry = add(f"{collect}.rollout({i}:{json.dumps(item, sort_keys=True)})", "Retry", "rollout", "Succeeded",
                    inputs={"parameters": [{"name": k, "value": v} for k, v in item.items()]})
        pod = add(f"{nodes[retry]['name']}(0)", "Pod", "rollout", "Succeeded", hostNodeName=f"cpu-node-{i % 300}",
                  podIP=f"10.8.{i // 250}.{i % 250}", resourcesDuration={"cpu": 812, "memory": 3310},
                  outputs={"parameters": [{"name": "status", "value": "ok"}, {"name": "reward", "value": "1.0"}],
                           "exitCode": "0"})
        nodes[retry]["children"] = [pod]
        nodes[group]["children"].append(retry)
    return {"phase": phase, "progress": f"{rollouts + 2}/{rollouts + 2}", "nodes": nodes,
            "startedAt": "2026-12-04T04:00:00Z"}


class SimulatedArgo(FakeArgoServer):
    """The fake Argo server with one Workflow of a simulated status, Running for `running` gets, then Succeeded."""

    def __init__(self, name: str, rollouts: int, running: int) -> None:
        super().__init__()
        self.workflows[name] = {"metadata": {"name": name, "namespace": "openforge"}, "spec": {"entrypoint": "iteration"}}
        self.statuses = {phase: simulated_status(name, rollouts, phase) for phase in ("Running", "Succeeded")}
        self.script[name] = ["Running"] * running + ["Succeeded"]

    def _status(self, name: str) -> dict:
        phases = self.script[name]
        return self.statuses[phases.pop(0) if len(phases) > 1 else phases[0]]


@pytest.fixture(scope="module")
def simulated():
    """One fake server holding a 10,000-rollout Workflow, Running for 5 polls."""
    fake = SimulatedArgo("openforge-big-it0", ROLLOUTS, running=5)
    yield fake
    fake.server.shutdown()


def test_a_poll_reads_a_bounded_few_bytes_whatever_the_fan_out(simulated: SimulatedArgo) -> None:
    """Following a 10,000-rollout Workflow: each poll while it runs transfers under 1 KB, the nodes are read once at
    the end, and the counts come out right. Control: one get without `fields` is megabytes."""
    client = ArgoClient(simulated.url, "t", "openforge")
    reports = []
    assert client.wait("openforge-big-it0", poll_s=0, report=reports.append) == "Succeeded"
    polls = [size for method, path, size in simulated.sent if "status.progress" in path]
    full_reads = [size for method, path, size in simulated.sent if path.endswith("fields=status.nodes")]
    assert len(polls) == 6 and max(polls) < 1024, polls
    assert len(full_reads) == 1  # the nodes, once, for the final counts
    assert reports[0].collect == "Running" and reports[0].pods == f"{ROLLOUTS + 2}/{ROLLOUTS + 2}"
    assert (reports[-1].rollouts_done, reports[-1].rollouts_failed, reports[-1].collect) == (ROLLOUTS, 0, "Succeeded")
    whole = len(json.dumps({**simulated.workflows["openforge-big-it0"], "status": simulated.statuses["Running"]}))
    assert whole > 5_000_000 and full_reads[0] > 5_000_000  # the control: what every poll cost before
    assert sum(polls) < whole / 1000


def test_status_reads_the_phase_alone(simulated: SimulatedArgo) -> None:
    """`submit.py status` shows each iteration's live phase from `status.phase` alone: under 200 bytes for the
    10,000-rollout Workflow; one that is gone (its TTL) shows the manifest's word."""
    client = ArgoClient(simulated.url, "t", "openforge")
    before = len(simulated.sent)
    assert submit.phase_of(client, IterationRecord(iteration=0, workflow="openforge-big-it0")) in ("Running", "Succeeded")
    assert submit.phase_of(client, IterationRecord(iteration=1, workflow="gone", status="Failed")) == "Failed (recorded)"
    (_, path, size), _ = simulated.sent[before:]
    assert path.endswith("fields=status.phase") and size < 200


def test_fields_are_cleaned_as_argo_does() -> None:
    """The fake's `fields` filtering follows Argo's Cleaner: a named path keeps its subtree, a path leading to a
    named one keeps only that branch, a leading `-` excludes; a node is reached by its id (no wildcard)."""
    wf = {"metadata": {"name": "w", "labels": {"a": "1"}}, "spec": {"entrypoint": "x"},
          "status": {"phase": "Running", "progress": "1/2",
                     "nodes": {"w-1": {"phase": "Running", "name": "w.collect"}, "w-2": {"phase": "Failed"}}}}
    assert clean_fields(wf, "status.phase") == {"status": {"phase": "Running"}}
    assert clean_fields(wf, "metadata,status.nodes.w-1.phase") == {
        "metadata": {"name": "w", "labels": {"a": "1"}}, "status": {"nodes": {"w-1": {"phase": "Running"}}}}
    assert clean_fields(wf, "-status,spec") == {"metadata": {"name": "w", "labels": {"a": "1"}}}
    assert clean_fields(wf, "") == wf
    assert poll_fields("w").startswith("status.phase,status.progress,status.nodes.w-")
