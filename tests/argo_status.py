"""Argo's side of a fan-out and of a Workflow's size, modelled from its source (v3.5 to v3.7) for tests that run
no controller.

    from argo_status import step_result, with_param, collect_nodes, stored_sizes

- `step_result`: what Argo's executor keeps of a step's stdout as `outputs.result`: one trailing newline trimmed, then
  the last 256 KiB (workflow/executor/executor.go `CaptureScriptResult`, `maxAnnotationSize = 256 * (1 << 10)`).
- `with_param`: the list a `withParam` expands to, or the controller's error when the value is no JSON list
  (workflow/controller/dag.go `expandTask`: "withParam value could not be parsed as a JSON list").
- `collect_nodes`: the `status.nodes` of a collect DAG whose rollouts all ran, one `NodeStatus` per node with the
  fields Argo writes (pkg/apis/workflow/v1alpha1/workflow_types.go `NodeStatus`): node ids `<workflow>-<FNV-32a of
  the node's name>` (`Workflow.NodeID`), a fan-out's child named `<task>(<index>:<item>)` with a map item's
  `key:value` pairs sorted and joined by commas (workflow/controller/operator.go `processItem`, `generateNodeName`),
  a retried template as a Retry node whose Pod children are `<retry node>(<attempt>)` and which carries its last
  child's outputs (operator.go `processNodeRetries`), a fan-out as a TaskGroup node, and a pod's
  `taskResultsCompletionStatus` entry.
- `stored_sizes`: the Workflow object's JSON bytes as the controller sizes it, and after its compression of
  `status.nodes` into `status.compressedNodes` (gzip, then base64: workflow/packer/packer.go `compressWorkflow`,
  util/file/fileutil.go `CompressEncodeString`), which it does only when the object is over `MAX_WORKFLOW_SIZE`,
  1 MiB by default (packer.go `getMaxWorkflowSize`); an object still over it after compression is an error, unless
  node status offload is on (workflow/hydrator/hydrator.go `Dehydrate`).
"""

import base64
import gzip
import json
import random

RESULT_BYTES = 256 * 1024  # executor.go CaptureScriptResult's maxAnnotationSize
MAX_WORKFLOW_SIZE = 1024 * 1024  # packer.go getMaxWorkflowSize's default
STARTED = "2026-12-01T10:00:00Z"


def step_result(stdout: str) -> str:
    """The `outputs.result` Argo keeps of a step's stdout: one trailing newline trimmed, then the last 256 KiB
    (the bytes of the UTF-8 text; the plan prints ASCII)."""
    out = stdout[:-1] if stdout.endswith("\n") else stdout
    data = out.encode()
    return data[-RESULT_BYTES:].decode(errors="replace") if len(data) > RESULT_BYTES else out


class WithParamError(ValueError):
    """The controller's error for a `withParam` value that is not a JSON list."""


def with_param(value: str) -> list:
    """The items of a `withParam`, as the controller expands them."""
    try:
        items = json.loads(value)
    except ValueError as exc:
        raise WithParamError(f"withParam value could not be parsed as a JSON list: {value[:40]}...: {exc}") from None
    if not isinstance(items, list):
        raise WithParamError("withParam value could not be parsed as a JSON list")
    return items


def fnv32a(text: str) -> int:
    """FNV-1a, 32 bits (Go's hash/fnv New32a), as `Workflow.NodeID` hashes a node's name."""
    h = 0x811C9DC5
    for byte in text.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def go_value(value: object) -> str:
    """An item's value as Argo prints it in a node's name (`%v` of a JSON value: strings unquoted)."""
    return value if isinstance(value, str) else json.dumps(value)


def item_name(task: str, index: int, item: object) -> str:
    """A fan-out child's name (`processItem`, `generateNodeName`): parentheses removed from the item."""
    desc = (",".join(sorted(f"{k}:{go_value(v)}" for k, v in item.items())) if isinstance(item, dict)
            else go_value(item))
    return f"{task}({index}:{desc.replace('(', '').replace(')', '')})"


class Nodes:
    """A growing `status.nodes` of one Workflow."""

    def __init__(self, workflow: str, seed: int = 0) -> None:
        self.workflow, self.nodes, self.done = workflow, {}, {}
        self.random = random.Random(seed)
        self.clock = 0

    def node_id(self, name: str) -> str:
        return f"{self.workflow}-{fnv32a(name)}"

    def add(self, name: str, display: str, kind: str, template: str | None, boundary: str | None,
            inputs: list[dict] | None = None, outputs: dict | None = None, **extra) -> str:
        """One NodeStatus, Succeeded, with its times, progress and resource durations as a finished node has them."""
        node_id = self.node_id(name)
        self.clock += self.random.randint(1, 30)
        minutes, seconds = divmod(self.clock, 60)
        node = {"id": node_id, "name": name, "displayName": display, "type": kind,
                **({"templateName": template, "templateScope": f"local/{self.workflow}"} if template else {}),
                "phase": "Succeeded", **({"boundaryID": boundary} if boundary else {}),
                "startedAt": STARTED,
                "finishedAt": f"2026-12-01T{10 + minutes // 60:02d}:{minutes % 60:02d}:{seconds:02d}Z",
                "progress": extra.pop("progress", "1/1"),
                "resourcesDuration": {"cpu": self.random.randint(10, 9000), "memory": self.random.randint(10, 90000)},
                **({"inputs": {"parameters": inputs}} if inputs else {}), **({"outputs": outputs} if outputs else {}),
                **extra}
        if kind == "Pod":
            pool, number = self.random.randint(0, 2000), self.random.randint(0, 99999)
            node["hostNodeName"] = f"gke-pool-cpu-{pool:04x}-{number:05d}"
            node["estimatedDuration"] = self.random.randint(60, 1800)
            self.done[node_id] = True
        self.nodes[node_id] = node
        return node_id

    def child(self, parent: str, child: str) -> None:
        self.nodes[parent].setdefault("children", []).append(child)

    def retried_pod(self, name: str, display: str, template: str, boundary: str, inputs: list[dict],
                    outputs: dict) -> str:
        """A retried template's Retry node with its one Pod attempt; returns the Retry node's id."""
        retry = self.add(name, display, "Retry", template, boundary, inputs, outputs)
        pod = self.add(f"{name}(0)", f"{display}(0)", "Pod", template, boundary, inputs, outputs,
                       nodeFlag={"retried": True})
        self.child(retry, pod)
        return retry


def parameters(values: dict) -> list[dict]:
    return [{"name": k, "value": v if isinstance(v, str) else json.dumps(v)} for k, v in values.items()]


def collect_nodes(workflow: str, chunks: list[list[dict]], proxy_url: str = "http://10.8.4.17:8100") -> dict:
    """The `status.nodes` (and `taskResultsCompletionStatus`) of a Workflow whose collect DAG ran every rollout of
    `chunks` (the plan's chunks, each a list of planned rollouts) once, each chunk as a `rollout-chunk` DAG: its
    `items` step (its printed chunk its result), its rollouts and its `ended` suspend node, beside the Workflow's
    other steps (serve, plan, isolation, trajectories, update, the exit handler)."""
    nodes = Nodes(workflow)
    root = nodes.add(workflow, workflow, "DAG", "iteration", None)
    collect = nodes.add(f"{workflow}.collect", "collect", "DAG", "collect", root)
    nodes.child(root, collect)
    for step in ("isolate-rollouts", "isolate-serve", "serve", "plan", "trajectories"):
        outputs = {"result": json.dumps(list(range(len(chunks))))} if step == "plan" else None
        nodes.child(collect, nodes.add(f"{workflow}.collect.{step}", step, "Pod", step, collect, outputs=outputs,
                                       **({"daemoned": True, "podIP": "10.8.4.17"} if step == "serve" else {})))
    group = nodes.add(f"{workflow}.collect.rollout", "rollout", "TaskGroup", None, collect)
    nodes.child(collect, group)
    for index, chunk in enumerate(chunks):
        name = item_name(f"{workflow}.collect.rollout", index, index)
        dag = nodes.add(name, item_name("rollout", index, index), "DAG", "rollout-chunk", collect,
                        parameters({"chunk": str(index), "proxy_url": proxy_url}),
                        progress=f"{len(chunk)}/{len(chunk)}")
        nodes.child(group, dag)
        url = f"s3://openforge/runs/demo/plans/iteration-0/rollouts-{index}.json"
        items = nodes.retried_pod(f"{name}.items", "items", "chunk-items", dag, parameters({"url": url}),
                                  {"result": json.dumps(chunk), "exitCode": "0"})
        nodes.child(dag, items)
        fanout = nodes.add(f"{name}.rollout", "rollout", "TaskGroup", None, dag)
        nodes.child(items, fanout)
        ended = nodes.add(f"{name}.ended", "ended", "Suspend", "ended", dag)
        for number, item in enumerate(chunk):
            inputs = {"task": item["task"], "sample": item["sample"], "rollout_id": item["rollout_id"],
                      "image": item["image"], "deadline": item["deadline_s"],
                      **{k: item[k] for k in ("cpus", "memory_mb", "storage_mb", "gpus")}, "proxy_url": proxy_url}
            outputs = {"parameters": [
                {"name": "status", "value": "ok", "valueFrom": {"path": "/tmp/rollout/status", "default": "no_result"}},
                {"name": "reward", "value": f"{nodes.random.random():.4f}",
                 "valueFrom": {"path": "/tmp/rollout/reward", "default": "0"}}], "exitCode": "0"}
            retry = nodes.retried_pod(item_name(f"{name}.rollout", number, item), item_name("rollout", number, item),
                                      "rollout", dag, parameters(inputs), outputs)
            nodes.child(fanout, retry)
            nodes.child(retry, ended)
        nodes.nodes[dag]["outboundNodes"] = [ended]
    for step in ("update",):
        nodes.child(root, nodes.add(f"{workflow}.{step}", step, "Pod", step, root))
    return {"nodes": nodes.nodes, "taskResultsCompletionStatus": nodes.done}


def compressed(nodes: dict) -> str:
    """`status.compressedNodes`: the nodes' JSON, gzipped, base64 (`CompressEncodeString`)."""
    return base64.b64encode(gzip.compress(json.dumps(nodes, separators=(",", ":")).encode())).decode()


def json_bytes(document: dict) -> int:
    """Bytes of a document as Go's json.Marshal writes it (no spaces)."""
    return len(json.dumps(document, separators=(",", ":")).encode())


def stored_sizes(workflow: dict, status: dict) -> dict[str, int]:
    """The Workflow object's JSON bytes with its status (`raw`), after Argo compressed its nodes (`compressed`), and
    its status's nodes alone raw (`nodes`) and compressed (`compressed_nodes`)."""
    whole = {**workflow, "status": {"phase": "Succeeded", **status}}
    packed = {**workflow, "status": {"phase": "Succeeded", **{k: v for k, v in status.items() if k != "nodes"},
                                     "compressedNodes": compressed(status["nodes"])}}
    return {"raw": json_bytes(whole), "compressed": json_bytes(packed), "nodes": json_bytes(status["nodes"]),
            "compressed_nodes": len(packed["status"]["compressedNodes"])}
