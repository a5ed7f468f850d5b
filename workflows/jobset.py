"""The update across `update_nodes` pods: the JobSet (jobset.x-k8s.io/v1alpha2) an Argo resource template creates.

    from workflows.config import load_config
    from workflows.iteration import update_nodes_template
    print(update_nodes_template(load_config("configs/cluster-example.yaml", ["run=demo", "update_nodes=2"]), 0).manifest)

One replicated Job `node` of `update_nodes` pods (Indexed: each pod's completion index is its node rank), each
with `update_gpus` GPUs, running torchrun's static rendezvous (`commands.update`). JobSet gives the pods stable
DNS names through a headless Service named after the JobSet: rank 0 is `<jobset>-node-0-0.<jobset>`. Any pod
that fails fails its Job (no backoff), so the JobSet and with it the Workflow's `update` step (docs/workflows.md,
"The update across nodes"). Why JobSet and not a PyTorchJob, TrainJob or LeaderWorkerSet: that section too.
"""

import hashlib

from steps.contracts import layout
from workflows import commands
from workflows.pods import placement, queue_labels
from steps.contracts.config import RunConfig

API_VERSION = "jobset.x-k8s.io/v1alpha2"
CRD = "jobsets.jobset.x-k8s.io"
VERSION = "v0.12.0"  # the release the install command names, and the API this manifest was checked against
INSTALL = (f"kubectl apply --server-side -f "
           f"https://github.com/kubernetes-sigs/jobset/releases/download/{VERSION}/manifests.yaml")
NODE = "node"  # the replicated Job's name: part of every pod's hostname
# JobSet's status.terminalState is "Completed" or "Failed" once it has ended (empty before); Argo's resource
# conditions are label-selector requirements on the object's JSON (docs/workflows.md).
SUCCESS_CONDITION = "status.terminalState == Completed"
FAILURE_CONDITION = "status.terminalState == Failed"
# The JobSet's name: fixed per Workflow, so that a `kubectl create` Argo's executor repeats after a lost answer
# gets AlreadyExists instead of creating a second JobSet writing the same checkpoint. The Workflow's name cut to 30
# plus 8 hex characters of its SHA-1 (Argo fills in these expressions), so that two Workflows whose names share
# their first 30 characters (iterations of one long-named run) get two names. JobSet refuses a JobSet whose
# longest pod name, `<name>-node-0-<rank>-<5 random>`, would pass 63 characters: 56 at MAX_UPDATE_NODES.
NAME_PREFIX_CHARS, NAME_HASH_CHARS = 30, 8
NAME = (f"{{{{=sprig.trunc({NAME_PREFIX_CHARS}, workflow.name)}}}}-"
        f"{{{{=sprig.trunc({NAME_HASH_CHARS}, sprig.sha1sum(workflow.name))}}}}")
# NCCL passes tensors between a node's processes through /dev/shm (64 MiB in a pod by default): a memory-backed
# emptyDir there, for every update with more than one process (workflows/iteration.py's one pod, and these).
SHM_VOLUME, SHM_PATH, SHM_MEDIUM = "dshm", "/dev/shm", "Memory"
# The label JobSet puts on its pods (the JobSet's name) and the annotation Kubernetes puts on an Indexed Job's pods.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
# Kubernetes expands $(VAR) in a container's command only for variables of its own env: these three are defined there.
NODE_RANK_ENV, JOBSET_ENV, MASTER_ADDR_ENV = "OPENFORGE_NODE_RANK", "OPENFORGE_JOBSET", "OPENFORGE_MASTER_ADDR"


def jobset_name(workflow: str) -> str:
    """The name Argo gives the JobSet (`NAME`) in the Workflow named `workflow` (the preflight's dry run uses it).

    >>> jobset_name("openforge-a-run-whose-name-is-long-it12")
    'openforge-a-run-whose-name-is--734e95d3'
    """
    return f"{workflow[:NAME_PREFIX_CHARS]}-{hashlib.sha1(workflow.encode()).hexdigest()[:NAME_HASH_CHARS]}"


def rank_env() -> list[dict]:
    """Each pod's node rank and rank 0's address, as the pod's own env (read from what JobSet and Kubernetes set).

    >>> rank_env()[2]
    {'name': 'OPENFORGE_MASTER_ADDR', 'value': '$(OPENFORGE_JOBSET)-node-0-0.$(OPENFORGE_JOBSET)'}
    """
    def field(path: str) -> dict:
        return {"valueFrom": {"fieldRef": {"fieldPath": path}}}

    return [{"name": NODE_RANK_ENV, **field(f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']")},
            {"name": JOBSET_ENV, **field(f"metadata.labels['{JOBSET_NAME_LABEL}']")},
            # The headless Service is named after the JobSet; a pod's hostname is `<job>-<completion index>`.
            {"name": MASTER_ADDR_ENV, "value": f"$({JOBSET_ENV})-{NODE}-0-0.$({JOBSET_ENV})"}]


def update_command(config: RunConfig, iteration: int) -> list[str]:
    """The update's torchrun line for one pod of the JobSet: its rank and rank 0's address from its env."""
    return commands.update(config, layout.run_partition_url(config.run_url, config.run, iteration),
                           config.checkpoint_url(iteration), config.checkpoint_url(iteration + 1),
                           node_rank=f"$({NODE_RANK_ENV})", master_addr=f"$({MASTER_ADDR_ENV})")


def nccl_env(config: RunConfig) -> list[dict]:
    """The run's `update_env` (NCCL's and its network plugin's settings) as a container's env.

    >>> nccl_env(RunConfig(update_env={"NCCL_DEBUG": "INFO"}))
    [{'name': 'NCCL_DEBUG', 'value': 'INFO'}]
    """
    return [{"name": name, "value": value} for name, value in config.update_env.items()]


def with_rdma(resources: dict, rdma: dict[str, int]) -> dict:
    """`resources` with the RDMA device plugin's extended resources in requests and limits (Kubernetes wants an
    extended resource's request equal to its limit: kubernetes.io/docs/concepts/configuration/
    manage-resources-containers/#consuming-extended-resources).

    >>> with_rdma({"limits": {"nvidia.com/gpu": "8"}}, {"rdma/ib": 1})["requests"]
    {'rdma/ib': '1'}
    """
    extra = {name: str(count) for name, count in rdma.items()}
    return {kind: {**resources.get(kind, {}), **extra} for kind in ("requests", "limits")} if extra else resources


def host_network(config: RunConfig) -> dict:
    """With `update_host_network`, the pod spec's fields that put it on its node's network: `dnsPolicy` must then be
    ClusterFirstWithHostNet for the pod to resolve rank 0's Service name (kubernetes.io/docs/concepts/
    services-networking/dns-pod-service/, "Pod's DNS Policy")."""
    return {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"} if config.update_host_network else {}


def update_jobset(config: RunConfig, iteration: int, image: str, env: list[dict], resources: dict,
                  labels: dict[str, str], service_account: str) -> dict:
    """The JobSet of iteration `iteration`'s update: `update_nodes` pods in `image`, each with `env` (plus `update_env`
    and its rank's) and `resources` (plus `update_rdma_resources`), with `update_host_network` on its node's network,
    labelled `labels`, running as `service_account` (the Workflow's: its imagePullSecrets), failed
    `update_timeout_s` after its Job started; named `NAME`, one per Workflow. The pods are placed as `update_pod`
    says (`workflows.pods.placement`); its Kueue queue labels the JobSet, where Kueue reads it."""
    nodes = config.update_nodes
    pod = {
        "metadata": {"labels": dict(labels)},  # a copy: YAML would write the shared dict as an alias
        "spec": {
            "restartPolicy": "Never",  # a failed torchrun fails the update; Argo decides about retries
            "serviceAccountName": service_account,
            "automountServiceAccountToken": False,  # the update has no business with the Kubernetes API
            "containers": [{
                "name": "update", "image": image, "workingDir": "/opt/openforge/app",
                "command": update_command(config, iteration), "env": [*env, *nccl_env(config), *rank_env()],
                "resources": with_rdma(resources, config.update_rdma_resources),
                "ports": [{"name": "rendezvous", "containerPort": commands.UPDATE_MASTER_PORT}],
                "volumeMounts": [{"name": SHM_VOLUME, "mountPath": SHM_PATH}],
            }],
            "volumes": [{"name": SHM_VOLUME, "emptyDir": {"medium": SHM_MEDIUM}}],
            **host_network(config),
            **placement(config.update_pod),
        },
    }
    # The deadline counts from the Job's start, Pending pods included: pods that never schedule (no free GPUs, a
    # quota, an image that does not pull) fail the Job (DeadlineExceeded) and so the JobSet, instead of keeping the
    # step waiting for ever. The template's own activeDeadlineSeconds would stop only Argo's pod, not the JobSet, and
    # JobSet v0.12.0's JobSetSpec (api/jobset/v1alpha2/jobset_types.go) has no deadline of its own: the Job's is it
    # (batch/v1 JobSpec.activeDeadlineSeconds: from the Job's startTime; stopped and reset while it is suspended).
    job = {"parallelism": nodes, "completions": nodes, "completionMode": "Indexed", "backoffLimit": 0,
           "activeDeadlineSeconds": config.update_timeout_s, "template": pod}
    return {
        "apiVersion": API_VERSION, "kind": "JobSet",
        "metadata": {"name": NAME, "labels": queue_labels(config.update_pod, labels)},
        "spec": {
            # A pod's failure fails its Job (backoffLimit 0) and the JobSet (no restart): the ranks left would
            # wait on a rendezvous that cannot complete.
            "failurePolicy": {"maxRestarts": 0},
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "replicatedJobs": [{"name": NODE, "replicas": 1, "template": {"spec": job}}],
        },
    }
