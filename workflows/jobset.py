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

from workflows import commands, layout
from workflows.config import RunConfig

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
# Kubernetes caps a pod's name at 63 characters, and JobSet refuses a JobSet whose pods' names would be longer:
# `<prefix>-<5 random>-node-0-<rank>-<5 random>` fits with a prefix of 40 for up to 1,000 nodes.
NAME_PREFIX_CHARS = 40
NAME_PREFIX = f"{{{{=sprig.trunc({NAME_PREFIX_CHARS}, workflow.name)}}}}"  # Argo fills in this expression
# The label JobSet puts on its pods (the JobSet's name) and the annotation Kubernetes puts on an Indexed Job's pods.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
# Kubernetes expands $(VAR) in a container's command only for variables of its own env: these three are defined there.
NODE_RANK_ENV, JOBSET_ENV, MASTER_ADDR_ENV = "OPENFORGE_NODE_RANK", "OPENFORGE_JOBSET", "OPENFORGE_MASTER_ADDR"


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


def update_jobset(config: RunConfig, iteration: int, image: str, env: list[dict], resources: dict,
                  labels: dict[str, str]) -> dict:
    """The JobSet of iteration `iteration`'s update: `update_nodes` pods in `image`, each with `env` (plus its rank's)
    and `resources`, labelled `labels`; named `<NAME_PREFIX>-<5 random>` by the API server (`generateName`), so
    that each run of the step (a retry, a resubmitted Workflow) creates its own."""
    nodes = config.update_nodes
    pod = {
        "metadata": {"labels": dict(labels)},  # a copy: YAML would write the shared dict as an alias
        "spec": {
            "restartPolicy": "Never",  # a failed torchrun fails the update; Argo decides about retries
            "automountServiceAccountToken": False,  # the update has no business with the Kubernetes API
            "containers": [{
                "name": "update", "image": image, "workingDir": "/opt/openforge/app",
                "command": update_command(config, iteration), "env": [*env, *rank_env()], "resources": resources,
                "ports": [{"name": "rendezvous", "containerPort": commands.UPDATE_MASTER_PORT}],
                "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
            }],
            # NCCL passes tensors between a node's processes through /dev/shm (64 MiB in a pod by default).
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        },
    }
    job = {"parallelism": nodes, "completions": nodes, "completionMode": "Indexed", "backoffLimit": 0, "template": pod}
    return {
        "apiVersion": API_VERSION, "kind": "JobSet",
        "metadata": {"generateName": f"{NAME_PREFIX}-", "labels": labels},
        "spec": {
            # A pod's failure fails its Job (backoffLimit 0) and the JobSet (no restart): the ranks left would
            # wait on a rendezvous that cannot complete.
            "failurePolicy": {"maxRestarts": 0},
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "replicatedJobs": [{"name": NODE, "replicas": 1, "template": {"spec": job}}],
        },
    }
