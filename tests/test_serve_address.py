"""The serve at a stable address, and `retry` / `resubmit` bringing a live serve back.

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q -n 0 tests/test_serve_address.py

No Argo controller runs here, so `DaemonArgo` (the fake Argo server of tests/test_workflows.py) models what one does
with the rendered collect DAG, each behaviour from the Argo source (v3.5-3.7, unchanged on main) it comes from:
- a DAG task's node lists as `children` the nodes of the tasks that depend on it (workflow/controller/dag.go,
  `addChildNode` per dependency); a fan-out is a TaskGroup node, each item a Retry node over its Pod nodes;
- when a DAG ends, its daemons' pods are stopped and their nodes marked Succeeded
  (workflow/controller/exec_control.go `killDaemonedChildren`); the node keeps its podIP;
- `retry` (workflow/util/util.go `FormulateRetryWorkflow`): the nodes its `nodeFieldSelector` names, only with
  `restartSuccessful` (`getNodeIDsToReset`), and every Failed/Error pod without a succeeded descendant; each is
  deleted with all its descendants (`resetPath`, `getChildren`), its ancestors reset to Running; the controller
  then runs the missing tasks again, a Retry node's next pod numbered by its remaining children;
- `resubmit --memoized` (`FormulateResubmitWorkflow`): every pod node that did not fail is copied as Skipped;
- a Service sends a connection to its ClusterIP to a ready pod its selector matches (kube-proxy), and
  `{{tasks.serve.ip}}` is the serve node's recorded podIP.
"""

import copy
import itertools
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from test_workflows import FakeArgoServer, cluster_config
from steps.datasets import TaskArchiveError, wait_for_proxy
from steps.net import HOST, free_port
from workflows import commands, shape
from workflows.argo import ArgoClient, ArgoError, node_id
from workflows.evaluation import evaluation_workflow
from workflows.iteration import (PROXY_URL, ROLE, ROLLOUT_PROXY_WAIT_S, WORKFLOW_POD_LABEL, iteration_workflow, rollout_policy, serve_policy,
                                 serve_service)

ITEMS = 3  # rollouts in the modelled iteration: on the first run the first succeeds, the others fail (e.g. evicted)


def rendered(config=None) -> dict:
    """Iteration 0 of the cluster example, as the dict Argo receives."""
    return iteration_workflow(config or cluster_config("run=sa"), 0).build().model_dump(by_alias=True, exclude_none=True)


def collect_tasks(workflow: dict) -> dict[str, dict]:
    """The collect DAG's tasks by name."""
    collect = next(t for t in workflow["spec"]["templates"] if t["name"] == "collect")
    return {t["name"]: t for t in collect["dag"]["tasks"]}


def needs(task: dict) -> set[str]:
    """The task names a `depends` expression names."""
    return {term.split(".")[0] for term in re.findall(r"[a-z][a-z0-9-]*(?:\.[A-Za-z]+)?", task.get("depends", ""))}


def old_rendering(workflow: dict) -> dict:
    """The control: the Workflow as it was before the Service, rollouts after `serve` at `{{tasks.serve.ip}}`."""
    old = copy.deepcopy(workflow)
    for task in collect_tasks(old).values():
        task["depends"] = task.get("depends", "").replace(shape.SERVE_READY, "serve")
        for parameter in task.get("arguments", {}).get("parameters", []):
            if parameter["name"] == "proxy_url":
                parameter["value"] = f"http://{{{{tasks.serve.ip}}}}:{commands.PROXY_PORT}"
    return old


class Cluster:
    """Pods and the serve Service, as far as an address reaches a serve: each pod's IP, labels, and liveness."""

    def __init__(self) -> None:
        self.pods: dict[str, dict] = {}
        self.ips = (f"10.8.0.{i}" for i in itertools.count(10))
        self.cluster_ip = "10.96.14.201"

    def start(self, name: str, labels: dict) -> str:
        ip = next(self.ips)
        self.pods[name] = {"ip": ip, "labels": labels, "live": True}
        return ip

    def reaches_serve(self, url: str) -> bool:
        """Whether a connection to `url` reaches a live serve pod: at the ClusterIP, a live pod the Service's selector
        matches; at a pod IP, that pod if live."""
        host = url.split("//")[1].rsplit(":", 1)[0]
        selector = serve_service()["spec"]["selector"]
        if host == self.cluster_ip:
            return any(p["live"] and all(p["labels"].get(k) == v.replace("{{workflow.name}}", p["labels"][
                WORKFLOW_POD_LABEL]) for k, v in selector.items()) for p in self.pods.values())
        return any(p["live"] and p["ip"] == host for p in self.pods.values())


class DaemonArgo(FakeArgoServer):
    """The fake Argo server holding one iteration Workflow whose collect DAG it runs as `Cluster`'s controller would
    (module docstring): on the first run the last rollouts fail, so collect fails and its serve is stopped; `retry` and `resubmit`
    apply Argo's rules to the recorded nodes. `addresses` records, per rollout pod run, (its proxy URL, whether it
    reached a live serve)."""

    def __init__(self, workflow: dict) -> None:
        super().__init__()
        self.cluster, self.addresses = Cluster(), []
        self.name = workflow["metadata"]["name"]
        self.workflows[self.name] = workflow
        self.status = {"phase": "Running", "nodes": {}}
        self.first_run(self.name)

    # --- the controller -------------------------------------------------------------------------------------
    def node(self, wf: str, name: str, kind: str, template: str, phase: str, parent: str | None, **extra) -> dict:
        nid = node_id(wf, name)
        node = {"id": nid, "name": name, "type": kind, "templateName": template, "phase": phase, "children": [], **extra}
        self.status["nodes"][nid] = node
        if parent and nid not in self.status["nodes"][parent]["children"]:
            self.status["nodes"][parent]["children"].append(nid)
        return node

    def task_parent(self, wf: str, task: dict) -> str:
        """The node a task's node hangs under: its first dependency's (Argo lists it under each; `newWorkflowsDag`
        keeps one parent), or the collect DAG's for a task without one."""
        first = sorted(needs(task))
        return node_id(wf, f"{wf}.collect.{first[0]}") if first else node_id(wf, f"{wf}.collect")

    def run_task(self, wf: str, task: dict, fail_rollouts: bool) -> None:
        """Runs one collect task whose node is missing, or the missing pods of a fan-out's Retry nodes."""
        name, nodes = f"{wf}.collect.{task['name']}", self.status["nodes"]
        for need in sorted(needs(task))[1:]:  # listed as a child of each dependency (`addChildNode`)
            if node_id(wf, name) not in nodes[node_id(wf, f"{wf}.collect.{need}")]["children"]:
                nodes[node_id(wf, f"{wf}.collect.{need}")]["children"].append(node_id(wf, name))
        if task["name"] == "serve":
            if node_id(wf, name) not in nodes:
                ip = self.cluster.start(name, {WORKFLOW_POD_LABEL: wf, ROLE: "serve"})
                self.node(wf, name, "Pod", "serve", "Running", self.task_parent(wf, task), podIP=ip, daemoned=True)
            return
        if task["name"] == shape.SERVE_ADDRESS:
            if node_id(wf, name) not in nodes:
                self.node(wf, name, "Pod", task["name"], "Succeeded", self.task_parent(wf, task),
                          outputs={"parameters": [{"name": "ip", "value": self.cluster.cluster_ip}]})
            return
        if task["name"] not in shape.ROLLOUT_STEPS[:1]:
            if node_id(wf, name) not in nodes:
                self.node(wf, name, "Pod", task["name"], "Succeeded", self.task_parent(wf, task))
            return
        group = nodes.get(node_id(wf, name)) or self.node(wf, name, "TaskGroup", "rollout", "Running",
                                                          self.task_parent(wf, task))
        for i in range(ITEMS):
            retry_name = f"{name}({i})"
            retry = nodes.get(node_id(wf, retry_name)) or self.node(wf, retry_name, "Retry", "rollout", "Running",
                                                                     group["id"])
            if retry["phase"] != "Running":
                continue
            url = self.resolve(wf, task)
            live = self.cluster.reaches_serve(url)
            self.addresses.append((url, live))
            ok = live and not (fail_rollouts and i > 0)
            phase = "Succeeded" if ok else "Failed"
            self.node(wf, f"{retry_name}({len(retry['children'])})", "Pod", "rollout", phase, retry["id"])
            retry["phase"] = phase
        group["phase"] = "Succeeded" if all(nodes[c]["phase"] == "Succeeded" for c in group["children"]) else "Failed"

    def resolve(self, wf: str, task: dict) -> str:
        """The task's proxy_url with Argo's substitution of `{{tasks.X.ip}}` and `{{tasks.X.outputs.parameters.Y}}`
        from the recorded nodes."""
        url = next(p["value"] for p in task["arguments"]["parameters"] if p["name"] == "proxy_url")
        nodes = self.status["nodes"]

        def value(match: re.Match) -> str:
            node = nodes[node_id(wf, f"{wf}.collect.{match.group(1)}")]
            if match.group(2) == "ip":
                return node["podIP"]
            return next(p["value"] for p in node["outputs"]["parameters"] if p["name"] == match.group(3))
        return re.sub(r"\{\{tasks\.([a-z-]+)\.(ip|outputs\.parameters\.([a-z-]+))\}\}", value, url)

    def run_collect(self, wf: str, fail_rollouts: bool = False) -> None:
        """The collect DAG to its end: its tasks in order, then its daemons stopped (`killDaemonedChildren`)."""
        nodes = self.status["nodes"]
        for task in collect_tasks(self.workflows[wf]).values():
            if task["name"] in shape.ROLLOUT_STEPS[1:] or task["name"] == "trajectories":
                continue  # no app rollouts in this plan; trajectories are not what is modelled
            self.run_task(wf, task, fail_rollouts)
        collect = nodes[node_id(wf, f"{wf}.collect")]
        failed = any(n["phase"] == "Failed" and n["type"] == "Pod" for n in nodes.values())
        collect["phase"] = "Failed" if failed else "Succeeded"
        for node in nodes.values():
            if node.pop("daemoned", False):
                node["phase"] = "Succeeded"
                self.cluster.pods[node["name"]]["live"] = False
        self.status["phase"] = collect["phase"]
        nodes[node_id(wf, wf)]["phase"] = collect["phase"]

    def first_run(self, wf: str) -> None:
        """The first run: the rollouts after the first fail (a live serve); collect fails and stops its serve."""
        self.node(wf, wf, "DAG", "iteration", "Running", None)
        self.node(wf, f"{wf}.collect", "DAG", "collect", "Running", node_id(wf, wf))
        self.run_collect(wf, fail_rollouts=True)

    # --- Argo's retry and resubmit ------------------------------------------------------------------------
    def descendants(self, nid: str) -> set[str]:
        found, queue = set(), [nid]
        while queue:
            for child in self.status["nodes"][queue.pop()]["children"]:
                if child not in found:
                    found.add(child)
                    queue.append(child)
        return found

    def retry(self, restart_successful: bool, selector: str) -> None:
        """`FormulateRetryWorkflow`, then the controller runs collect again."""
        nodes = self.status["nodes"]
        selected = set()
        if restart_successful and selector:  # getNodeIDsToReset
            wanted = dict(term.split("=") for term in selector.split(","))
            selected = {n["id"] for n in nodes.values()
                        if all({"templateName": n["templateName"], "phase": n["phase"]}.get(k) == v
                               for k, v in wanted.items())}
        failed = {n["id"] for n in nodes.values() if n["type"] == "Pod" and n["phase"] in ("Failed", "Error")}
        deleted = set()
        for nid in selected | failed:  # resetPath: the node and its descendants go
            deleted |= {nid} | self.descendants(nid)
        for nid in deleted:
            nodes.pop(nid, None)
        for node in nodes.values():
            node["children"] = [c for c in node["children"] if c in nodes]
            if node["type"] in ("DAG", "TaskGroup", "Retry") and node["phase"] == "Failed":
                node["phase"] = "Running"  # the deleted nodes' ancestors are reset
        self.run_collect(self.name)

    def handle(self, method: str, path: str, body: dict | None) -> tuple[int, dict]:
        parts = path.strip("/").split("/")
        if method == "GET" and len(parts) == 5:
            return 200, {**self.workflows[parts[4]], "status": self.status}
        if method == "PUT" and parts[5:] == ["retry"]:
            self.requests_body = body
            self.retry(body.get("restartSuccessful", False), body.get("nodeFieldSelector", ""))
            return 200, {**self.workflows[self.name], "status": {"phase": "Running"}}
        return super().handle(method, path, body)


@pytest.fixture
def daemon_argo():
    """A `DaemonArgo` of the rendered iteration (its first run done: collect failed); and one of the old rendering."""
    made = []

    def make(workflow: dict) -> DaemonArgo:
        made.append(DaemonArgo(workflow))
        return made[-1]
    yield make
    for fake in made:
        fake.server.shutdown()


def test_the_serve_is_reached_through_a_service_owned_by_the_workflow() -> None:
    """Rollouts, app rollouts and trajectories (an evaluation's too) get the Service's ClusterIP, never the daemon's
    pod IP; the Service is created by an owned resource step and selects this Workflow's serve pod, the pod the
    NetworkPolicies let rollouts reach, on the proxy port; the serve-ready gate is let in."""
    config = cluster_config("run=sa", "eval_every=1")
    for workflow in (rendered(config), evaluation_workflow(config, 1).build().model_dump(by_alias=True,
                                                                                         exclude_none=True)):
        text = json.dumps(workflow)
        assert "tasks.serve.ip" not in text
        tasks = collect_tasks(workflow)
        callers = [n for n in tasks if n.endswith(("rollout", "rollout-app", "trajectories")) or n == "serve-ready"]
        for name in callers:
            assert {"name": "proxy_url", "value": PROXY_URL} in tasks[name]["arguments"]["parameters"], name
        address = next(t for t in workflow["spec"]["templates"] if t["name"] == shape.SERVE_ADDRESS)
        assert address["resource"]["action"] == "create" and address["resource"]["setOwnerReference"] is True
        assert address["outputs"]["parameters"] == [{"name": "ip", "valueFrom": {"jsonPath": "{.spec.clusterIP}"}}]
        service = yaml.safe_load(address["resource"]["manifest"])
        assert service == serve_service()
        for rollout in (t for t in workflow["spec"]["templates"] if t["name"].endswith(shape.ROLLOUT_STEPS)):
            fetch = next(c for c in rollout["initContainers"] if c["name"] == "task")["command"]
            assert fetch[fetch.index("--wait-s") + 1] == str(ROLLOUT_PROXY_WAIT_S), rollout["name"]
    rollout_to_serve = rollout_policy(config)["spec"]["egress"][0]
    assert service["spec"]["selector"] == rollout_to_serve["to"][0]["podSelector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == rollout_to_serve["ports"][0]["port"] == commands.PROXY_PORT
    clients = [c["podSelector"]["matchLabels"][ROLE] for c in serve_policy()["spec"]["ingress"][0]["from"]]
    assert clients == ["rollout", "trajectories", shape.SERVE_READY]


def test_no_task_depends_on_the_serve_node() -> None:
    """A retry that starts the serve again deletes the serve node's DAG descendants with it (`resetPath`): nothing
    may depend on it, or every succeeded rollout would run again. The rollouts wait for serve-ready instead.
    Control: the old rendering's rollouts depend on it."""
    def after_serve(workflow: dict) -> set[str]:
        tasks = collect_tasks(workflow)
        found, changed = {"serve"}, True
        while changed:
            later = {name for name, task in tasks.items() if needs(task) & found} - found
            changed, found = bool(later), found | later
        return found - {"serve"}
    assert after_serve(rendered()) == set()
    assert {"rollout", "rollout-app", "trajectories"} <= after_serve(old_rendering(rendered()))
    assert needs(collect_tasks(rendered())["rollout"]) >= {shape.SERVE_READY}


def test_retry_after_the_serve_died_brings_a_live_serve_at_the_same_address(daemon_argo) -> None:
    """The first run's rollouts 1 and 2 failed, so collect failed and its serve was stopped. `ArgoClient.retry_failed`
    (what `submit.py retry` sends) starts the serve again; the retried rollouts reach a live serve at the Service's address, and
    rollout 0, which succeeded, is not run again."""
    fake = daemon_argo(rendered())
    assert [live for _, live in fake.addresses] == [True, True, True]  # the first run had its serve
    first_ip = next(n["podIP"] for n in fake.status["nodes"].values() if n["templateName"] == "serve")
    ArgoClient(fake.url, "t", "openforge").retry_failed(fake.name)
    assert fake.requests_body["restartSuccessful"] is True and fake.requests_body["nodeFieldSelector"] == "templateName=serve"
    retried = fake.addresses[3:]
    assert retried == [(f"http://{fake.cluster.cluster_ip}:{commands.PROXY_PORT}", True)] * 2
    assert fake.status["phase"] == "Succeeded"
    serve = next(n for n in fake.status["nodes"].values() if n["templateName"] == "serve")
    assert serve["podIP"] != first_ip  # a new serve pod, behind the same address


def test_controls_the_pod_ip_or_no_serve_reset_give_a_dead_address(daemon_argo) -> None:
    """Controls: (1) the old rendering with the old request (`restartSuccessful=false` and a rollout selector, which
    Argo ignores): the retried rollouts get the stopped serve's pod IP; (2) the Service with no serve reset: no live
    pod behind it; (3) the old rendering with the serve reset: every rollout runs again, the succeeded one too."""
    old = daemon_argo(old_rendering(rendered()))
    old.retry(False, "templateName=rollout,phase=Failed")
    dead_ip = [url for url, _ in old.addresses[3:]]
    assert [live for _, live in old.addresses[3:]] == [False, False] and "10.8.0.10" in dead_ip[0]
    service = daemon_argo(rendered())
    service.retry(False, "")
    assert [live for _, live in service.addresses[3:]] == [False, False]
    rerun = daemon_argo(old_rendering(rendered()))
    rerun.retry(True, "templateName=serve")
    assert len(rerun.addresses[3:]) == ITEMS  # rollout 0 ran again


def test_resubmit(daemon_argo) -> None:
    """A memoized resubmit of a Workflow whose collect failed is refused with one sentence (Argo would copy the
    stopped serve as Skipped: control below); a plain resubmit is a new Workflow, whose own serve answers at its own
    Service; a memoized one of a Workflow whose collect succeeded is sent."""
    fake = daemon_argo(rendered())
    client = ArgoClient(fake.url, "t", "openforge")
    with pytest.raises(ArgoError, match="memoized resubmit would not start its serve again"):
        client.resubmit(fake.name, memoized=True)
    assert not fake.calls("PUT")
    # The control: Argo's memoized copy (`FormulateResubmitWorkflow`): the serve Skipped, so nothing behind the Service.
    for node in fake.status["nodes"].values():
        if node["type"] == "Pod" and node["phase"] == "Succeeded":
            node["phase"] = "Skipped"
    fake.cluster.pods.clear()
    fake.retry(False, "")
    assert [live for _, live in fake.addresses[3:]] == [False, False]
    fresh = daemon_argo(rendered())
    client = ArgoClient(fresh.url, "t", "openforge")
    assert client.resubmit(fresh.name, memoized=False) == f"{fresh.name}-resubmit"
    copy_of = daemon_argo(fresh.workflows[f"{fresh.name}-resubmit"])  # the copy runs from scratch, its own serve
    assert [live for _, live in copy_of.addresses] == [True, True, True]
    fresh.status["nodes"][node_id(fresh.name, f"{fresh.name}.collect")]["phase"] = "Succeeded"  # only update failed
    client.resubmit(fresh.name, memoized=True)
    assert fresh.calls("PUT")[-1][2]["memoized"] is True


def test_a_rollout_waits_for_a_serve_that_comes_back_at_the_address() -> None:
    """`wait_for_proxy` (serve-ready's, and a rollout's task fetch with `--wait-s`) returns once `/health` answers at
    the address, here a server that starts there 1 s after the wait began (a serve started again behind the
    Service); with none there, it gives up after its bound with one sentence naming the address."""
    port = free_port()
    url = f"http://{HOST}:{port}"

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    servers = []

    def start_later() -> None:
        time.sleep(1.0)
        servers.append(ThreadingHTTPServer((HOST, port), Health))
        servers[0].serve_forever()

    threading.Thread(target=start_later, daemon=True).start()
    began = time.monotonic()
    wait_for_proxy(url, wait_s=30, poll_s=0.2)
    assert 0.9 < time.monotonic() - began < 10
    servers[0].shutdown()
    servers[0].server_close()
    with pytest.raises(TaskArchiveError, match=f"the proxy at {url} did not answer within 1 s"):
        wait_for_proxy(url, wait_s=1, poll_s=0.2)
