"""Where each group of a Workflow's pods runs and what it requests: the run's `serve_pod`, `rollout_pod`,
`update_pod` and `steps_pod` (`PodSettings`) as Kubernetes pod fields.

    from steps.contracts.config import RunConfig
    from workflows.pods import placement, requirements
    placement(RunConfig().rollout_pod)        # {'affinity': {'nodeAffinity': ...}}: kept off GPU nodes

Both the Argo templates (`workflows.iteration`, as Hera template fields) and the update's JobSet (`workflows.jobset`,
in its pod template) take these dicts: the field names are the pod spec's. docs/workflows.md, "Where pods run".
"""

import json

from steps.contracts.config import PodSettings

# The label NVIDIA's GPU Operator sets to "true" on every node with an NVIDIA GPU (`commonGPULabelKey` in its
# controllers/state_manager.go, the label its operands are deployed by; GPU feature discovery's own DaemonSet selects
# on it too: NVIDIA/k8s-device-plugin deployments/static/gpu-feature-discovery-daemonset.yaml). `NotIn [true]` also
# matches a node without the label, so the rule costs nothing on other clusters.
GPU_PRESENT = "nvidia.com/gpu.present"
# Kueue admits a pod (its "plain pods" integration) or a JobSet labelled with its LocalQueue's name
# (kueue.sigs.k8s.io/docs/tasks/run/plain_pods/, .../run/jobsets/): on the JobSet, not its pods.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
RESOURCE_KEYS = {"cpu": "cpu", "memory": "memory", "ephemeral_storage": "ephemeral-storage"}  # field -> resource


def gpu_node_rule(allowed: str = "true") -> dict:
    """A required node affinity keeping the pod off nodes labelled `GPU_PRESENT=allowed` (the rollout of a GPU task
    passes an expression that names another value, which no node has).

    >>> gpu_node_rule()["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    [{'matchExpressions': [{'key': 'nvidia.com/gpu.present', 'operator': 'NotIn', 'values': ['true']}]}]
    """
    term = {"matchExpressions": [{"key": GPU_PRESENT, "operator": "NotIn", "values": [allowed]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def placement(pod: PodSettings, gpu_value: str = "true") -> dict:
    """The pod fields that place one group's pods, as pod spec keys (those left unset absent): nodeSelector,
    tolerations, affinity (with `avoid_gpu_nodes`, `gpu_node_rule(gpu_value)`), priorityClassName."""
    fields = {"nodeSelector": dict(pod.node_selector), "tolerations": [dict(t) for t in pod.tolerations],
              "affinity": gpu_node_rule(gpu_value) if pod.avoid_gpu_nodes else None,
              "priorityClassName": pod.priority_class}
    return {key: value for key, value in fields.items() if value}


def hera_placement(pod: PodSettings, labels: dict[str, str] | None = None, gpu_value: str = "true") -> dict:
    """`placement` as a Hera template's keyword arguments, with the group's queue label added to `labels` and its
    `pod_spec_patch` (Argo's podSpecPatch, a strategic merge patch of the pod: argo-workflows
    docs/fields.md#template, examples/pod-spec-patch.yaml)."""
    names = {"nodeSelector": "node_selector", "tolerations": "tolerations", "affinity": "affinity",
             "priorityClassName": "priority_class_name"}
    fields = {names[key]: value for key, value in placement(pod, gpu_value).items()}
    patch = json.dumps(pod.pod_spec_patch) if pod.pod_spec_patch else None
    return {**fields, "labels": queue_labels(pod, labels) or None, "pod_spec_patch": patch}


def queue_labels(pod: PodSettings, labels: dict[str, str] | None = None) -> dict[str, str]:
    """`labels` with the group's Kueue queue, if it has one."""
    return {**(labels or {}), **({QUEUE_LABEL: pod.queue} if pod.queue else {})}


def requirements(pod: PodSettings, cpu: str | None, memory: str | None, storage: str | None,
                 gpus: int = 0) -> dict[str, dict[str, str]]:
    """A container's requests and limits: OpenForge's `cpu`, `memory` and ephemeral `storage` requests (None: no
    request) unless the group sets its own, the group's limits, and `gpus` GPUs (Kubernetes takes an extended
    resource's request from its limit: kubernetes.io/docs/tasks/manage-gpus/scheduling-gpus/).

    >>> requirements(PodSettings(memory="64Gi", cpu_limit="16"), "4", "32Gi", "50Gi", gpus=1)
    {'requests': {'cpu': '4', 'memory': '64Gi', 'ephemeral-storage': '50Gi', 'nvidia.com/gpu': '1'}, \
'limits': {'cpu': '16', 'nvidia.com/gpu': '1'}}
    """
    ours = {"cpu": cpu, "memory": memory, "ephemeral_storage": storage}
    requests = {RESOURCE_KEYS[name]: getattr(pod, name) or ours[name] for name in RESOURCE_KEYS}
    limits = {RESOURCE_KEYS[name]: getattr(pod, f"{name}_limit") for name in RESOURCE_KEYS}
    gpu = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    kinds = {"requests": {**{k: v for k, v in requests.items() if v}, **gpu},
             "limits": {**{k: v for k, v in limits.items() if v}, **gpu}}
    return {kind: quantities for kind, quantities in kinds.items() if quantities}


def merged_patch(patch: dict, ours: dict) -> dict:
    """The group's `pod_spec_patch` (may be empty) with `ours` merged in, as one patch: Argo applies a
    template's one podSpecPatch, so both must be in it. Containers are matched by name, as the strategic merge
    matches them; for the same container, `ours` wins on every key it sets (a rollout's resources are its task's),
    and within `resources` on every quantity it names, the user's other quantities kept.

    >>> merged_patch({"containers": [{"name": "main", "resources": {"limits": {"hugepages-2Mi": "1Gi", "cpu": "1"}}}],
    ...               "hostIPC": True}, {"containers": [{"name": "main", "resources": {"limits": {"cpu": "2"}}}]})
    {'containers': [{'name': 'main', 'resources': {'limits': {'hugepages-2Mi': '1Gi', 'cpu': '2'}}}], 'hostIPC': True}
    """
    containers = {c["name"]: c for c in patch.get("containers", [])}
    for container in ours.get("containers", []):
        theirs = containers.get(container["name"], {})
        resources = theirs.get("resources", {})
        merged = {**resources, **{kind: {**resources.get(kind, {}), **values}
                                  for kind, values in container.get("resources", {}).items()}}
        containers[container["name"]] = {**theirs, **container, **({"resources": merged} if merged else {})}
    rest = {key: value for key, value in ours.items() if key != "containers"}
    return {**patch, **rest, "containers": list(containers.values())}
