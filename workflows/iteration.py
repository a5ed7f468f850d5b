"""One RL iteration as an Argo Workflow, built with Hera: serve, plan, rollout fan-out, trajectories, update.

    from workflows.config import load_config
    from workflows.iteration import iteration_workflow
    print(iteration_workflow(load_config("configs/cluster-example.yaml", ["run=demo"]), 0).to_yaml())

The outer DAG `iteration` runs `collect` then `update`; with a hub `model` (`hf://org/name`), the first
iteration's runs `fetch-model` before them, which streams the model into the run's store once (`steps.fetch_model`).
`collect` is a DAG of its own so that the `serve` daemon (vLLM + proxy, one GPU pod) is stopped as soon as the
rollouts and trajectories are done, before
`update` takes its GPU. Inside `collect`: `serve` (daemon, ready when the proxy's /health answers; reached at
the address of `serve-address`, a Service owned by the Workflow that selects its serve pod, which `serve-ready`
waits to answer; its proxy writes the rollouts' results to the store), `plan` (writes the rollouts to the store in
chunks and prints the chunks' numbers, those of tasks with an `[environment] app` in chunks of their own listed in its
output `app-rollouts`), `rollout` (per chunk, a `rollout-chunk` DAG that prints it and runs one pod per item,
given its task, sample and rollout id, in the task's image, with the harness and OpenForge copied in by init
containers, the verifiers into a root-only folder; `steps.rollout --isolation pod` runs the harness as an
unprivileged uid; the task's CPUs, memory, disk and GPUs with the harness's own budget added (`rollout_resources`);
no service account token and no store credentials: its result goes through the proxy; retried only on exit code 3,
infra_error), `rollout-app` (the same, one pod per app rollout, with the app as a sidecar container on the pod's
loopback: `rollout_template`), `trajectories` (Parquet to S3). Before the rollouts, `isolate-rollouts` and
`isolate-serve` apply two NetworkPolicies owned by the Workflow (deleted with it): a rollout pod reaches only this
Workflow's serve pod on the proxy port (plus `rollout_egress_cidrs`, the Kubernetes API server's addresses for
Argo's executor, and DNS only with `rollout_dns`) and accepts no connection; the serve pod's proxy accepts only this
Workflow's rollout and trajectories pods.
`update` (veRL, GPU) writes the next checkpoint, whose URI is fixed by the config, so the driver needs no
output from this workflow to chain the next one; with `update_nodes` > 1 it creates a JobSet of that many pods
(`workflows.jobset`, owned by the Workflow) and waits for it, after `clean-update` deleted any earlier JobSet of the
iteration. The exit handler `exit` writes the iteration's outcome to the run manifest (`record`), then the run's
report to the store (`report`, which may fail without changing the outcome), and, across nodes, deletes the
JobSet of a Workflow that did not succeed (`delete-update`); the Workflow's description links to that report in
the Argo UI. Every container command comes from
`workflows.commands`; credentials come from Kubernetes Secrets (`secretKeyRef`) or, with `s3_credentials: pod-identity`,
from the pods' service account, never from this YAML.
"""

import hashlib
import json
import re

import yaml
from hera.workflows import (DAG, Container, EmptyDirVolume, Env, ExistingVolume, Parameter, Resource,
                            RetryStrategy, SecretEnv, Suspend, Task, UserContainer, Workflow)
from hera.workflows.models import (Backoff, Capabilities, ContainerPort, ContinueOn, EmptyDirVolumeSource,
                                   ExecutorConfig, HTTPGetAction, PodGC, Probe, ResourceRequirements,
                                   SecurityContext, TTLStrategy, ValueFrom, Volume, VolumeMount)

from steps.harnesses import ALL_HARNESSES as HARNESSES, allowance
from steps.plan import FANOUTS
from steps.proxy.config import JUDGE_KEY_ENV
from steps.harnesses.base import NODE_VERSION
from steps.contracts.rollout import NO_REWARD
from steps.fetch_model import TOKEN_ENV
from steps.sandbox.app import APP_STATE_DIR, APP_STORAGE_MB
from steps.sandbox.pod import APP_LIVE
from steps.contracts import layout
from workflows import commands, faults, jobset, shape
from workflows.pods import hera_placement, merged_patch, requirements
from steps.contracts.config import RunConfig

from workflows.config import egress_cidrs

SHARED = "/openforge"  # the emptyDir the init containers fill in a rollout pod
PRIVATE = f"{SHARED}/private"  # root-only (0700): the tasks with their verifiers and oracles, for the runner alone
TASKS = f"{PRIVATE}/tasks"  # the rollout's task folder, fetched from the proxy by the `task` init container
MODELS_VOLUME = "/models"  # the serve pod's emptyDir: the checkpoint it serves
MODEL_DIR = f"{MODELS_VOLUME}/current"
MODEL_CACHE = "/model-cache"  # the serve pod's mount of `model_cache_volume`: a LoRA run's base, kept across pods
# A rollout is retried for its runner's infra_error (exit code 3) and for what the cluster does to its pod, never for
# what its agent does (`workflows.faults`; docs/workflows.md, "Retries").
RETRY_ON_INFRA_ERROR = faults.expression()
ROLE = "openforge.dev/role"  # the pod label the NetworkPolicies select on: serve, rollout, trajectories
WORKFLOW_POD_LABEL = "workflows.argoproj.io/workflow"  # Argo's own label on every pod: the Workflow's name
# The update JobSet's pods carry the Workflow's name under our own key: Argo's own label would make its controller
# take them for pods of the Workflow.
UPDATE_WORKFLOW_LABEL = "openforge.dev/workflow"
RUN_LABEL, ITERATION_LABEL = "openforge.dev/run", "openforge.dev/iteration"  # on the Workflow and the update JobSet
RUN_NAME_ANNOTATION = "openforge.dev/run-name"  # the exact run name, on every Workflow of the run (`ArgoClient.create`)
# A run's id (`run_id`) is at most 36 characters, so that its longest Workflow name, `openforge-<id>-eval<N>` plus the
# `-<5 random>` Argo's resubmit appends, stays within the 63 characters Argo accepts for a Workflow's name (its
# validation's `maxCharsInObjectName`: the name is the `workflows.argoproj.io/workflow` label value of every pod, and
# a label value is at most 63 characters). Pods themselves are named `<workflow>-<template>-<hash>` (Argo's v2 pod
# names, workflow/util/pod_name.go), cut to 253 characters by Argo.
RUN_ID_CHARS, RUN_HASH_CHARS = 36, 10
READABLE_ID = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
NO_STATUS = "no_result"  # a rollout node's status when its runner wrote none (the pod died, or hit its deadline)
ROLLOUT_TEMPLATES = shape.ROLLOUT_STEPS  # the rollout pods: without and with the task's app as a sidecar
RESOURCE_INPUTS = ("cpus", "memory_mb", "storage_mb", "gpus")  # the plan item's task resources, rollout inputs alike
APP_ROLLOUTS = shape.APP_ROLLOUTS  # the plan's output: the chunks of the rollouts of tasks with an app
APP_ROLLOUTS_FILE = "/tmp/app-rollouts.json"
# The fan-out by chunks of the plan (`chunk_dag`): a rollout fan-out's task runs `<its step>-chunk` once per chunk the
# plan step lists, which prints its chunk (`CHUNK_ITEMS`) and runs one rollout pod per item, then `ENDED` if any of
# them succeeded.
CHUNK_SUFFIX, CHUNK_ITEMS, ENDED = "-chunk", "chunk-items", "ended"
APP_STATE_VOLUME = "app-state"  # the app sidecar's state (APP_STATE_DIR there), read-only at APP_LIVE for the runner
# The app sidecar's own budget beside the task's CPUs and memory (which the agent's container keeps): a site, or
# for a desktop task an X display with a kiosk browser. Requests and limits alike, as for the agent.
APP_RESOURCES = {"cpu": "1", "memory": "1536Mi"}
SHM_SIZE = "1Gi"  # each browser's /dev/shm (the container runtime's default, 64 MiB, makes Chromium crash)
# A rollout pod's local ephemeral storage beyond the task's storage_mb: what the runner's side of the pod writes
# to the node's disk, which counts against the pod's limit as the agent's files do (disk-backed emptyDirs, container
# layers and the kubelet's container logs: kubernetes.io/docs/concepts/configuration/manage-resources-containers/
# #local-ephemeral-storage). The init containers' copies in /openforge: OpenForge's Python with its packages (about
# 0.7 GiB, pyarrow and Playwright the largest) and the pinned harness with its Node (0.35 to 0.85 GiB, openclaw's
# the largest, measured on the installs of 2026-12); the container logs the kubelet keeps (rotated at 5 x 10 MiB by
# default) of the rollout, app and Argo's wait containers. 2.25 GiB holds them with about 0.4 GiB to spare.
RUNNER_STORAGE_MB = 2304
# The logs the runner keeps with the result, each cut at the run's `rollout_log_mb` (the harness's output, its
# session logs, the verifier's output and /logs/verifier, the app's log): room for this many of them.
KEPT_LOGS = 8
# The rollout container's quantities: resource -> (the plan item's task resource it adds to, that input's factor to
# the unit, the unit).
ROLLOUT_QUANTITIES = {"cpu": ("cpus", 1000, "m"), "memory": ("memory_mb", 1, "Mi"),
                      "ephemeral-storage": ("storage_mb", 1, "Mi")}
GPU = "nvidia.com/gpu"
# The task's GPU count, or JSON null for none, which the strategic merge patch reads as "no such key": a pod that
# asks for no GPU names none (a count of 0 would still get it the GPU nodes' tolerations from Kubernetes'
# ExtendedResourceToleration admission plugin, which adds one for every extended resource a pod names). It stands
# unquoted in the patch (a bare number is a valid quantity), and has no `>`, which Go's JSON encoding of the template
# escapes (argoproj/argo-workflows#12709).
GPUS_OR_NULL = "{{=sprig.ternary(inputs.parameters.gpus, 'null', inputs.parameters.gpus != '0')}}"
# The GPU-node label value a rollout pod must not land on (`workflows.pods.gpu_node_rule`): "true" for a task without
# GPUs; for a task with GPUs a value no node has, so that its pod may go where its GPUs are.
GPU_NODES_BARRED = "{{=sprig.ternary('true', 'none', inputs.parameters.gpus == '0')}}"
# Ephemeral storage the pods other than the rollouts' request by default (their group's `ephemeral_storage` wins):
# the serve pod's checkpoint in its disk-backed emptyDir, the update's checkpoint written before its upload, a small
# step's logs and the files it writes before an upload. A request only places the pod; no limit unless set.
SERVE_STORAGE, UPDATE_STORAGE, STEP_STORAGE, PROXY_STORAGE = "50Gi", "100Gi", "2Gi", "2Gi"


def run_id(run: str) -> str:
    """The run's id, unique per exact run name: a name that already is a readable id (lower-case letters and digits,
    single dashes between, at most `RUN_ID_CHARS`) is its own id; any other is a readable prefix, `--` and
    `RUN_HASH_CHARS` hex characters of the name's SHA-256. `--` never occurs in a name kept as it is, so two runs
    share an id only if their hashes collide (`exp_1` and `EXP-1`, or two long names alike in their first 40
    characters, no longer share their Workflows).

    >>> run_id("demo"), run_id("exp_1"), run_id("EXP-1")
    ('demo', 'exp-1--dd8fdeeda3', 'exp-1--c94ad8f222')
    """
    if READABLE_ID.fullmatch(run) and len(run) <= RUN_ID_CHARS:
        return run
    prefix_chars = RUN_ID_CHARS - len("--") - RUN_HASH_CHARS
    prefix = re.sub(r"[^a-z0-9]+", "-", run.lower())[:prefix_chars].strip("-") or "run"
    return f"{prefix}--{hashlib.sha256(run.encode()).hexdigest()[:RUN_HASH_CHARS]}"


def run_label(config: RunConfig) -> str:
    """The run's id (`run_id`): its Workflows' and update JobSets' `openforge.dev/run` label and part of their names."""
    return run_id(config.run)


def workflow_name(config: RunConfig, iteration: int) -> str:
    """The iteration's Workflow name: fixed, so that a resumed driver finds it (DNS-1123)."""
    return f"openforge-{run_label(config)}-it{iteration}"


def image(config: RunConfig, name: str) -> str:
    """One of OpenForge's images (images/<name>.Dockerfile), pinned to the config's tag."""
    return f"{config.image_registry}/{name}:{config.image_tag}"


def s3_env(config: RunConfig) -> list:
    """The store's settings for s3fs/boto3 (`RunConfig.store_env`: endpoint, region, not secrets); with
    `s3_credentials: secret` its keys from the Secret, with `pod-identity` none: the SDKs' default chain then takes
    the web identity the pod's service account brings (EKS injects AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE,
    GKE answers on its metadata server)."""
    keys = [SecretEnv(name="AWS_ACCESS_KEY_ID", secret_name=config.s3_secret, secret_key="access-key"),
            SecretEnv(name="AWS_SECRET_ACCESS_KEY", secret_name=config.s3_secret, secret_key="secret-key")]
    return (keys if config.s3_credentials == "secret" else []) + [Env(name=k, value=v) for k, v in
                                                                   config.store_env().items()]


def admin_env(config: RunConfig) -> list:
    """The proxy's admin key, from the Secret."""
    return [SecretEnv(name="OPENFORGE_ADMIN_KEY", secret_name=config.admin_secret, secret_key="admin-key")]


def judge_env(config: RunConfig) -> list:
    """The judge upstream's key, for the serve pod's proxy alone (never a rollout pod's): the `judge_secret` Secret's
    key `api-key`, optional (a judge that needs no key needs no Secret); nothing without a judge."""
    return [SecretEnv(name=JUDGE_KEY_ENV, secret_name=config.judge_secret, secret_key="api-key", optional=True)] \
        if config.judge_upstream else []


def serve_template(config: RunConfig, iteration: int) -> Container:
    """vLLM on this iteration's checkpoint plus the proxy: a daemon, ready when the proxy's /health answers.

    The step fetches the checkpoint itself, without the optimizer state the update keeps beside the
    weights (twice their size); an Argo input artifact would download the whole folder. `serve_replicas`
    vLLM servers run in this one pod, `serve_gpus` GPUs each, on its loopback behind the proxy
    (docs/serving.md, "Replicas"). With `upstream` the pod runs only the proxy, in front of that server: the
    steps image (no vLLM), no GPU, no checkpoint. A LoRA run's `model_cache_volume` is mounted at MODEL_CACHE, where
    the base is fetched once for every iteration's pod (docs/serving.md, "The base model cache on Argo")."""
    first = iteration if config.upstream else commands.served_first(config, iteration)
    command = commands.serve(config, config.checkpoint_url(first), layout.calls_url(config.run_url), first,
                             host="0.0.0.0", device="gpu", model_dir=MODEL_DIR,
                             tasks=layout.datasets_url(config.run_url), results_of=iteration)
    command += [] if config.upstream else commands.follow_flags(config, iteration)
    cached = bool(config.model_cache_volume and config.lora_rank > 0 and not config.upstream)
    command += ["--model-cache", MODEL_CACHE] if cached else []
    env = admin_env(config) + s3_env(config) + judge_env(config)
    if config.upstream:  # its key, if it needs one: the admin Secret's optional `upstream-api-key`
        env.append(SecretEnv(name="OPENFORGE_UPSTREAM_API_KEY", secret_name=config.admin_secret,
                             secret_key="upstream-api-key", optional=True))
        resources, volumes, name = requirements(config.serve_pod, "2", "4Gi", PROXY_STORAGE), [], "steps"
    else:
        replicas = config.serve_replicas
        resources = requirements(config.serve_pod, str(4 * replicas), f"{32 * replicas}Gi", SERVE_STORAGE,
                                 gpus=config.serve_gpus * replicas)
        # vLLM's tensor-parallel workers pass tensors through /dev/shm (64 MiB in a pod by default); a memory-backed
        # emptyDir counts against the pod's memory.
        volumes = [EmptyDirVolume(name="models", mount_path=MODELS_VOLUME),
                   EmptyDirVolume(name=jobset.SHM_VOLUME, mount_path=jobset.SHM_PATH, medium=jobset.SHM_MEDIUM,
                                  size_limit=config.serve_shm)]
        # A claim the user provides (docs/serving.md, "LoRA"): the base stays there from one iteration's pod to the
        # next, where an emptyDir goes with its pod. Not a hostPath: Pod Security Standards "baseline" forbids it
        # (kubernetes staging/src/k8s.io/pod-security-admission/policy/check_hostPathVolumes.go, CheckHostPathVolumes).
        volumes += [ExistingVolume(name="model-cache", claim_name=config.model_cache_volume,
                                   mount_path=MODEL_CACHE)] if cached else []
        name = "serve"
    return Container(
        name="serve", image=image(config, name), daemon=True, command=command,
        volumes=volumes, env=env, resources=ResourceRequirements(**resources),
        # A daemon's deadline stops it whatever the steps using it still do (docs/workflows.md, "Deadlines").
        active_deadline_seconds=config.serve_timeout_s, **hera_placement(config.serve_pod, {ROLE: "serve"}),
        ports=[ContainerPort(name="proxy", container_port=commands.PROXY_PORT)],
        readiness_probe=Probe(http_get=HTTPGetAction(path="/health", port=commands.PROXY_PORT),
                              initial_delay_seconds=20, period_seconds=10, failure_threshold=180),
    )


# How long the serve may take to answer: its readiness probe's whole window (`serve_template`: 20 s, then 180 probes
# 10 s apart), after which Kubernetes would still call it unready.
SERVE_READY_S = 20 + 180 * 10
# How long a rollout's task fetch waits for the proxy: a serve that a retry started again (docs/workflows.md, "The
# serve's address"), within the rollout's deadline, which counts from the pod's start.
ROLLOUT_PROXY_WAIT_S = 600
SERVICE_IP = "ip"  # serve-address's output: the Service's ClusterIP
# The rollouts' and trajectories' proxy: the serve Service's ClusterIP, stable for the Workflow's life whichever
# serve pod answers behind it (never a daemon's pod IP, which Argo keeps in the node after that pod is gone).
PROXY_URL = f"http://{{{{tasks.{shape.SERVE_ADDRESS}.outputs.parameters.{SERVICE_IP}}}}}:{commands.PROXY_PORT}"


def serve_service() -> dict:
    """The serve's Service: this Workflow's serve pod (by its labels, as the NetworkPolicies select it) on the proxy
    port. Its name is generated (`openforge-serve-xxxxx`: a Service's name is a 63-character DNS label, which
    `<workflow>-serve` may exceed); Kubernetes sends a connection to its ClusterIP to a ready pod it selects, so a
    serve started again behind it is reached at the same address."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"generateName": "openforge-serve-"},
            "spec": {"type": "ClusterIP", "selector": this_workflows("serve")["matchLabels"],
                     "ports": [{"name": "proxy", "protocol": "TCP", "port": commands.PROXY_PORT,
                                "targetPort": commands.PROXY_PORT}]}}


def serve_address_template(config: RunConfig) -> Resource:
    """Creates the serve's Service (`serve_service`), owned by the Workflow (deleted with it); its ClusterIP is the
    step's output `ip` (Argo's resource outputs: `kubectl get` with the jsonPath after the create, argo-workflows
    workflow/executor/resource.go `SaveResourceParameters`). The ClusterIP and not the Service's DNS name: a
    rollout pod has no DNS unless `rollout_dns`, and needs none for this."""
    return Resource(name=shape.SERVE_ADDRESS, action="create", set_owner_reference=True,
                    manifest=yaml.safe_dump(serve_service(), sort_keys=False), **hera_placement(config.steps_pod),
                    outputs=[Parameter(name=SERVICE_IP, value_from=ValueFrom(json_path="{.spec.clusterIP}"))])


def serve_ready_template(config: RunConfig) -> Container:
    """Waits until a serve answers at the Service (`steps.datasets wait-proxy`), so that no rollout starts its
    deadline before the serve is up; the serve's NetworkPolicy lets this pod in (`serve_policy`)."""
    return Container(name=shape.SERVE_READY, image=image(config, "steps"), working_dir="/opt/openforge/app",
                     inputs=[Parameter(name="proxy_url")],
                     command=commands.wait_proxy("{{inputs.parameters.proxy_url}}", SERVE_READY_S),
                     **step_pod(config, "100m", "128Mi", labels={ROLE: shape.SERVE_READY}, deadline=False))


def serve_templates(config: RunConfig, iteration: int) -> list:
    """The serve daemon, its Service and the gate that waits for it to answer there."""
    return [serve_template(config, iteration), serve_address_template(config), serve_ready_template(config)]


def fetch_model_template(config: RunConfig) -> Container:
    """Fetches the hub `model` into the run's store (`steps.fetch_model`), once per run: it does nothing when the run
    holds the model already. The token is the `hub_secret` Secret's key `token`, optional (a public model needs no
    Secret: Kubernetes leaves out the variable of an optional key it does not find, Kubernetes API `SecretKeySelector`
    `optional`); it streams to S3, so the pod needs no disk for the weights."""
    token = SecretEnv(name=TOKEN_ENV, secret_name=config.hub_secret, secret_key="token", optional=True)
    return Container(name=shape.FETCH_MODEL, image=image(config, "steps"), working_dir="/opt/openforge/app",
                     command=commands.fetch_model(config), env=[token, *s3_env(config)],
                     retry_strategy=RetryStrategy(limit=2, retry_policy="OnError"), **step_pod(config, "1", "1Gi"))


def plan_template(config: RunConfig, iteration: int, evaluation: bool = False, name: str = "plan") -> Container:
    """Writes the iteration's rollouts (with `evaluation`, its checkpoint's evaluation's) to the store in chunks
    (`steps.plan --chunks`) and prints their chunks' numbers as a JSON list on stdout,
    `{{tasks.plan.outputs.result}}`; those of tasks with an `[environment] app` are chunks of their own, listed in
    the output parameter `app-rollouts` (each list may be empty: its fan-out is then skipped). No list that grows
    with the plan passes through an output: Argo keeps only the last 256 KiB of one (`steps.plan.ARGO_RESULT_BYTES`).
    It reads the run's dataset snapshot in the store (`workflows.datasets`), so each item's task is its folder there."""
    return Container(name=name, image=image(config, "steps"), working_dir="/opt/openforge/app",
                     command=commands.plan(config, iteration, evaluation=evaluation, app_rollouts=APP_ROLLOUTS_FILE,
                                           dataset=commands.stored_dataset_url(config, evaluation), chunks=True),
                     env=s3_env(config),
                     outputs=[Parameter(name=APP_ROLLOUTS, value_from=ValueFrom(path=APP_ROLLOUTS_FILE))],
                     **step_pod(config, "500m", "512Mi"))


def app_layout(source: str = "/opt/openforge/app") -> str:
    """Shell (run as root) laying out the repository `source` for the rollout pod, where the agent must not
    see any task's verifier or oracle.

    `PRIVATE/app` is the whole repository in a root-only folder: the runner reads its task there.
    `SHARED/app` is the same without any task folder (a folder holding a task.toml): the code the
    `direct` harness imports. `SHARED` itself ends root-owned 0755 (an emptyDir is world-writable).
    """
    return (f"mkdir -m 700 {PRIVATE} && cp -a {source} {PRIVATE}/app && cp -a {source} {SHARED}/app"
            f" && find {SHARED}/app -type d -exec test -e '{{}}/task.toml' ';' -prune -exec rm -rf '{{}}' +"
            f" && chmod 755 {SHARED}")


def init_containers(config: RunConfig) -> list[UserContainer]:
    """Copy OpenForge (Python and this repository, see `app_layout`) and the pinned harness into the shared emptyDir:
    an npm harness with its Node, a PyPI one (browser-use) as its virtualenv, built on that same Python."""
    mount = [VolumeMount(name="openforge", mount_path=SHARED)]
    # The installed package carries the task folders' .py files (verifier checks): not for the agent's eyes.
    copy_openforge = (f"mkdir -p {SHARED}/python && cp -a /usr/local/. {SHARED}/python/"
                      f" && rm -rf {SHARED}/python/lib/python3*/site-packages/steps/tasks/*/ && {app_layout()}")
    copies = [UserContainer(name="openforge", image=image(config, "steps"), volume_mounts=mount,
                            command=["sh", "-c", copy_openforge])]
    harness = HARNESSES[config.harness]
    # `direct` and `computer-use` run on OpenForge's Python: nothing to copy
    if harness.NPM_PACKAGE or getattr(harness, "PIP_PACKAGE", None):
        installs = "/opt/openforge/harnesses"
        node = f" {installs}/node-{NODE_VERSION}" if harness.NPM_PACKAGE else ""
        copy_harness = (f"mkdir -p {SHARED}/harnesses && cp -a {installs}/{config.harness}-{harness.VERSION}{node}"
                        f" {SHARED}/harnesses/")
        copies.append(UserContainer(name="harness", image=image(config, "harness"), volume_mounts=mount,
                                    command=["sh", "-c", copy_harness]))
    return copies


def task_init_container(config: RunConfig, evaluation: bool = False) -> UserContainer:
    """Fetches the rollout's task folder from the proxy into the root-only `TASKS` (after `init_containers` made
    `PRIVATE`), with the admin key, which the agent never holds: a rollout pod reaches only the proxy, never S3.

    Argo substitutes `{{inputs.parameters.*}}` throughout the template, init containers included (its
    workflow/common/util.go `SubstituteParams` replaces them in the whole template's JSON, as the app sidecar's
    image relies on too)."""
    command = commands.fetch_task("{{inputs.parameters.proxy_url}}", commands.stored_dataset(config, evaluation),
                                  "{{inputs.parameters.task}}", TASKS, wait_s=ROLLOUT_PROXY_WAIT_S)
    return UserContainer(name="task", image=image(config, "steps"), command=command, env=admin_env(config),
                         volume_mounts=[VolumeMount(name="openforge", mount_path=SHARED)])


def app_sidecar(config: RunConfig) -> tuple[list[UserContainer], UserContainer, list]:
    """What a rollout pod adds for a task's `[environment] app`: (its init container, the sidecar, the volumes).

    The sidecar runs the app (`bash -c APP`, the plan item's `app`) in the task's image, on the pod's loopback,
    where the agent reaches it, in no other namespace of the agent's (no shared process namespace). It writes
    what the verifier grades into the `app-state` volume at `APP_STATE_DIR`, which the init container made root-only
    (0700) before either started; the rollout container mounts it read-only at `APP_LIVE`, where only the runner
    (root) reads it: it waits there for the ready file and copies the state when the agent's command ends
    (`steps.sandbox.pod`). Each container's browser gets a /dev/shm of its own."""
    state = f"/{APP_STATE_VOLUME}"
    close_state = UserContainer(name=APP_STATE_VOLUME, image=image(config, "steps"),
                                command=["sh", "-c", f"chmod 700 {state}"],
                                volume_mounts=[VolumeMount(name=APP_STATE_VOLUME, mount_path=state)])
    sidecar = UserContainer(
        name="app", image="{{inputs.parameters.image}}", command=["bash", "-c", "{{inputs.parameters.app}}"],
        volume_mounts=[VolumeMount(name=APP_STATE_VOLUME, mount_path=APP_STATE_DIR),
                       VolumeMount(name="app-shm", mount_path=jobset.SHM_PATH)],
        resources=ResourceRequirements(requests=APP_RESOURCES, limits=APP_RESOURCES))
    volumes = [EmptyDirVolume(name=APP_STATE_VOLUME, mount_path=str(APP_LIVE), read_only=True,
                              size_limit=f"{APP_STORAGE_MB}Mi"),
               EmptyDirVolume(name="shm", mount_path=jobset.SHM_PATH, medium=jobset.SHM_MEDIUM, size_limit=SHM_SIZE),
               # the sidecar's alone: a pod volume that the rollout container does not mount
               Volume(name="app-shm", empty_dir=EmptyDirVolumeSource(medium=jobset.SHM_MEDIUM, size_limit=SHM_SIZE))]
    return [close_state], sidecar, volumes


def harness_budget(config: RunConfig) -> tuple[int, float]:
    """The harness's own memory (MiB) and CPUs beside the task's (`steps.harnesses.allowance`): the same for every
    rollout of the run."""
    return allowance(config.harness, config.harness_memory_mb)


def runner_share(config: RunConfig, app: bool = False) -> dict[str, int]:
    """What a rollout container needs whatever its task, by resource in `ROLLOUT_QUANTITIES`' units: the harness's
    CPUs and memory (`harness_budget`), and the runner's ephemeral storage (`RUNNER_STORAGE_MB`, `KEPT_LOGS` logs of
    `rollout_log_mb`, and with `app` the app's state volume, which counts against the pod's limit too)."""
    memory_mb, cpus = harness_budget(config)
    storage_mb = RUNNER_STORAGE_MB + KEPT_LOGS * config.rollout_log_mb + (APP_STORAGE_MB if app else 0)
    return {"cpu": round(cpus * 1000), "memory": memory_mb, "ephemeral-storage": storage_mb}


def rollout_resources(config: RunConfig, app: bool = False, task: bool = True) -> dict[str, dict[str, str]]:
    """The rollout container's requests and limits: each the task's (the plan item's, a template input) plus
    `runner_share`, written as an Argo expression over the inputs; without `task`, the runner's share alone. Each
    request equals its limit: the node reserves all the container may use, as a container runtime gives a Harbor
    task's container what it declares. The task's GPUs are a limit alone (`GPUS_OR_NULL`): Kubernetes takes an
    extended resource's request from its limit, and refuses a request that differs from it or a fraction
    (kubernetes.io/docs/tasks/manage-gpus/scheduling-gpus/).

    Every value is a Kubernetes quantity once Argo has evaluated it: a whole number with the suffix `m` (thousandths
    of a CPU) or `Mi` (MiB), which matches `^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$`
    (kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/); a GPU count is a bare whole number."""
    share = runner_share(config, app)
    quantities = {}
    for name, (task_input, factor, unit) in ROLLOUT_QUANTITIES.items():
        scaled = f"asInt(inputs.parameters.{task_input})" + (f" * {factor}" if factor != 1 else "")
        quantities[name] = f"{{{{={scaled} + {share[name]}}}}}{unit}" if task else f"{share[name]}{unit}"
    return {"requests": quantities, "limits": {**quantities, **({GPU: GPUS_OR_NULL} if task else {})}}


def rollout_pod_patch(config: RunConfig, app: bool = False) -> str:
    """The rollout template's podSpecPatch: `rollout_resources` on Argo's main container, whose own `resources`
    are the runner's share (`rollout_resources(task=False)`).

    A patch, not the container's `resources`: Argo reads a template's container as a Kubernetes Container, whose
    quantities must parse before any parameter is substituted, so a `{{...}}` there fails the whole Workflow
    ("quantities must match the regular expression", argoproj/argo-workflows#6939); a podSpecPatch is a string,
    substituted (expressions included) and then merged into the pod (Argo's examples/pod-spec-patch.yaml; its
    TestRetriesVariableInPodSpecPatch computes a memory limit this way). The strategic merge drops a null (the GPU
    count of a task without GPUs) only inside a map the container already has, and copies a map it lacks whole,
    nulls and all (k8s.io/apimachinery strategicpatch `mergeMap`), which a null quantity then reads as 0: so the
    container's own limits are never empty.

    The run's own `rollout_pod.pod_spec_patch` is merged into the same patch (`workflows.pods.merged_patch`): a
    template has one podSpecPatch, and the task's resources win over it."""
    ours = {"containers": [{"name": "main", "resources": rollout_resources(config, app)}]}
    patch = json.dumps(merged_patch(config.rollout_pod.pod_spec_patch, ours))
    return patch.replace(json.dumps(GPUS_OR_NULL), GPUS_OR_NULL)


def rollout_template(config: RunConfig, iteration: int, evaluation: bool = False, name: str = "rollout",
                     app: bool = False) -> Container:
    """One rollout in the task's image, the pod as its sandbox; retried only on infra_error; result.json to the
    proxy, which writes it to the store (`steps.proxy.results`): the pod has no store credentials and no S3 artifact,
    so Argo's executor there needs only the Kubernetes API (docs/workflows.md, "Network isolation").
    With `app`, for a task with an `[environment] app`, the pod also runs that app as its sidecar (`app_sidecar`)
    and takes the item's `app` as an input.

    No working_dir: the pod starts in the image's WORKDIR, which `--isolation pod` takes as the workspace
    (PYTHONSAFEPATH keeps that folder off the runner's import path). Its resources are the task's with the
    harness's budget and the runner's storage added (`rollout_resources`, set by `rollout_pod_patch`). Its `status`
    and `reward` are output parameters, which the Argo UI shows per node: files the runner writes into OUT after
    the agent stopped (OUT is root-only, 0700, and the agent a separate uid: `PodSandbox.create`), with defaults
    for a pod that died.
    An evaluation's rollout sends its result as the evaluation's. Each attempt of the step (`{{retries}}`: 0, 1,
    ...) runs as its own attempt id and its result goes into that id's folder (`steps.proxy.results`), so that a
    retry never overwrites the infra error before it: every attempt is counted.
    """
    out = "/tmp/rollout"
    inits, sidecars, volumes = ([*init_containers(config), task_init_container(config, evaluation)], [],
                                [EmptyDirVolume(name="openforge", mount_path=SHARED)])
    if app:
        app_inits, sidecar, app_volumes = app_sidecar(config)
        inits, sidecars, volumes = inits + app_inits, [sidecar], volumes + app_volumes
    placement = {**hera_placement(config.rollout_pod, {ROLE: "rollout"}, GPU_NODES_BARRED),
                 "pod_spec_patch": rollout_pod_patch(config, app)}
    return Container(
        name=name, image="{{inputs.parameters.image}}", **placement,
        inputs=[Parameter(name=n) for n in ("task", "sample", "rollout_id", "image", "deadline", *RESOURCE_INPUTS,
                                            "proxy_url", *(["app"] if app else []))],
        init_containers=inits, sidecars=sidecars or None, volumes=volumes,
        command=commands.rollout(config, f"{TASKS}/{{{{inputs.parameters.task}}}}",
                                 "{{inputs.parameters.rollout_id}}", "{{inputs.parameters.sample}}",
                                 "{{inputs.parameters.proxy_url}}", out,
                                 python=f"{SHARED}/python/bin/python3", isolation="pod", retry="{{retries}}",
                                 send_result="evaluation" if evaluation else "iteration"),
        env=admin_env(config) + [Env(name="PYTHONPATH", value=f"{SHARED}/app"),
                                 Env(name="PYTHONSAFEPATH", value="1"),
                                 Env(name="LD_LIBRARY_PATH", value=f"{SHARED}/python/lib"),
                                 Env(name="OPENFORGE_CACHE", value=SHARED)],
        outputs=[Parameter(name="status", value_from=ValueFrom(path=f"{out}/{layout.STATUS_FILE}", default=NO_STATUS)),
                 Parameter(name="reward", value_from=ValueFrom(path=f"{out}/{layout.REWARD_FILE}", default=NO_REWARD))],
        resources=ResourceRequirements(**rollout_resources(config, app, task=False)),
        # The runner keeps the OOM killer off itself (steps.sandbox.pod.protect_runner), which needs SYS_RESOURCE; the
        # agent runs as another uid and never holds it. Pod Security's baseline level refuses the capability:
        # `rollout_oom_guard: false` leaves it out there (the runner then notes that it is not protected).
        security_context=(SecurityContext(capabilities=Capabilities(add=["SYS_RESOURCE"]))
                          if config.rollout_oom_guard else None),
        automount_service_account_token=False,  # the agent has no business with the Kubernetes API
        # The pod's own service account: one with no cloud identity, since EKS's webhook gives the role's token to
        # every container of the pod and GKE's metadata server answers any of them (docs/workflows.md, "Credentials").
        service_account_name=config.rollout_service_account or None,
        executor=ExecutorConfig(service_account_name=config.service_account),  # Argo's wait container does
        # The plan's deadline (agent + verifier timeouts + the runner's margin) plus the setup's own budget: image
        # pulls and init containers spend the latter, the runner times its agent from the agent's start.
        active_deadline_seconds=f"{{{{=asInt(inputs.parameters.deadline) + {config.rollout_setup_timeout_s}}}}}",
        # Always: a deleted pod's node is an Error, an evicted one's Failed; the expression picks. No maxDuration:
        # Argo counts it from the first attempt's start, fails the retry past it and gives later attempts' pods what
        # is left of it as their deadline (`processNodeRetries`, `getDeadline` in workflow/controller).
        retry_strategy=RetryStrategy(limit=config.rollout_retries, retry_policy="Always",
                                     expression=RETRY_ON_INFRA_ERROR,
                                     backoff=Backoff(duration="15s", factor=2)),
    )


def rollout_templates(config: RunConfig, iteration: int, evaluation: bool = False, prefix: str = "") -> list[Container]:
    """`<prefix>rollout` and `<prefix>rollout-app` (`ROLLOUT_TEMPLATES`): the rollout pods of tasks without and with
    an `[environment] app`."""
    plain, with_app = (f"{prefix}{name}" for name in ROLLOUT_TEMPLATES)
    return [rollout_template(config, iteration, evaluation, plain),
            rollout_template(config, iteration, evaluation, with_app, app=True)]


def trajectories_template(config: RunConfig, iteration: int, evaluation: bool = False,
                          name: str = "trajectories") -> Container:
    """The iteration's (or its evaluation's) Parquet tables, from the results in S3 and the proxy's recorded calls."""
    results = (layout.eval_results_url if evaluation else layout.results_url)(config.run_url, iteration)
    return Container(
        name=name, image=image(config, "steps"), inputs=[Parameter(name="proxy_url")],
        command=commands.trajectories(config, "{{inputs.parameters.proxy_url}}", results, iteration,
                                      out=layout.eval_trajectories_url(config.run_url, iteration) if evaluation else None),
        env=admin_env(config) + s3_env(config), **step_pod(config, "2", "8Gi", labels={ROLE: "trajectories"}),
    )


def evaluate_template(config: RunConfig, iteration: int) -> Container:
    """The evaluation's summary.json from its results in S3 (`steps.evaluate`; its table is in the pod's log)."""
    return Container(name="evaluate", image=image(config, "steps"), working_dir="/opt/openforge/app",
                     command=commands.evaluate(config, iteration,
                                               dataset=commands.stored_dataset_url(config, evaluation=True)),
                     env=s3_env(config), **step_pod(config, "500m", "1Gi"))


def update_resources(config: RunConfig) -> dict[str, dict[str, str]]:
    """One update pod's requests and limits: `update_gpus` GPUs (per node, with `update_nodes`), and by default 8
    CPUs and 64Gi for each (one update process per GPU, each with its own loader threads and host copies of its
    shards) and `UPDATE_STORAGE`; `update_pod`'s own where it sets them."""
    gpus = config.update_gpus
    return requirements(config.update_pod, str(8 * gpus) if gpus else None, f"{64 * gpus}Gi" if gpus else None,
                        UPDATE_STORAGE, gpus=gpus)


def update_template(config: RunConfig, iteration: int) -> Container | Resource:
    """veRL on one iteration's trajectories: reads this checkpoint, writes the next (GPU). One pod; with
    `update_nodes` > 1, a JobSet of that many pods (`workflows.jobset`), created and watched by this step."""
    if config.update_nodes > 1:
        return update_nodes_template(config, iteration)
    return train_container(config, "update", commands.update(
        config, layout.run_partition_url(config.run_url, config.run, iteration), config.checkpoint_url(iteration),
        config.checkpoint_url(iteration + 1)))


def train_container(config: RunConfig, name: str, command: list[str]) -> Container:
    """One pod of the train image on the update's GPUs (`update_resources`), placement, `update_env` and deadline,
    with a memory-backed /dev/shm when it runs more than one process (`workflows.jobset.SHM_VOLUME`): the update's,
    and supervised fine-tuning's (`workflows.sft`)."""
    shm = ([EmptyDirVolume(name=jobset.SHM_VOLUME, mount_path=jobset.SHM_PATH, medium=jobset.SHM_MEDIUM)]
           if config.update_gpus > 1 else [])
    return Container(
        name=name, image=image(config, "train"), working_dir="/opt/openforge/app", command=command,
        env=s3_env(config) + [Env(name=key, value=value) for key, value in config.update_env.items()],
        resources=ResourceRequirements(**update_resources(config)), volumes=shm,
        # the JobSet's Job has the same (`workflows.jobset`); here counted from when a node's kubelet took the pod
        active_deadline_seconds=config.update_timeout_s, **hera_placement(config.update_pod),
    )


def update_nodes_template(config: RunConfig, iteration: int) -> Resource:
    """Creates the update's JobSet, owned by the Workflow (deleted with it), and waits for its terminal state;
    its name (`jobset.NAME`, one per Workflow) is the step's output `jobset`. The pods get the update pod's S3
    env and resources, and the Workflow's service account."""
    labels = {ROLE: "update", **update_labels(config, iteration), UPDATE_WORKFLOW_LABEL: "{{workflow.name}}"}
    env = [e.build().model_dump(by_alias=True, exclude_none=True) for e in s3_env(config)]
    resources = update_resources(config)
    manifest = jobset.update_jobset(config, iteration, image(config, "train"), env, resources, labels,
                                    config.service_account)
    return Resource(name="update", action="create", set_owner_reference=True, **hera_placement(config.steps_pod),
                    success_condition=jobset.SUCCESS_CONDITION, failure_condition=jobset.FAILURE_CONDITION,
                    manifest=yaml.safe_dump(manifest, sort_keys=False),
                    outputs=[Parameter(name="jobset", value_from=ValueFrom(json_path="{.metadata.name}"))])


def update_labels(config: RunConfig, iteration: int) -> dict[str, str]:
    """The labels of an iteration's update JobSet that name the checkpoint it writes: the run's and the iteration's."""
    return {RUN_LABEL: run_label(config), ITERATION_LABEL: str(iteration)}


def delete_update_template(config: RunConfig, name: str, labels: dict[str, str]) -> Resource:
    """Deletes the update JobSets labelled `labels` (none: nothing to do) and waits until they and their pods are
    gone (foreground cascade), so that no earlier update still writes the checkpoint the next one writes."""
    selector = ",".join(f"{key}={value}" for key, value in labels.items())
    return Resource(name=name, action="delete", flags=[jobset.CRD, "-l", selector, "--cascade=foreground", "--wait"],
                    **hera_placement(config.steps_pod))


def wait_template(config: RunConfig, iteration: int) -> Container:
    """Waits (CPU only) for the checkpoint the previous iteration's update writes (`steps.follow wait`)."""
    return Container(name="wait-checkpoint", image=image(config, "steps"), working_dir="/opt/openforge/app",
                     command=commands.wait_checkpoint(config, iteration), env=s3_env(config),
                     # the step gives up by itself after update_timeout_s, with a sentence saying why
                     **step_pod(config, "100m", "256Mi", deadline=False))


def step_pod(config: RunConfig, cpu: str, memory: str | None = None, labels: dict[str, str] | None = None,
             deadline: bool = True) -> dict:
    """A small step's Hera keyword arguments: its requests, `cpu` and `memory` and `STEP_STORAGE` unless `steps_pod`
    sets them, the group's placement and `labels`, and with `deadline` its `step_timeout_s`."""
    return {"resources": ResourceRequirements(**requirements(config.steps_pod, cpu, memory, STEP_STORAGE)),
            "active_deadline_seconds": config.step_timeout_s if deadline else None,
            **hera_placement(config.steps_pod, labels)}


def this_workflows(role: str) -> dict:
    """A podSelector for this Workflow's pods of one role."""
    return {"matchLabels": {WORKFLOW_POD_LABEL: "{{workflow.name}}", ROLE: role}}


def rollout_policy(config: RunConfig) -> dict:
    """The rollout pods' NetworkPolicy: no connection in; out, only this Workflow's serve pod on the proxy
    port, the config's `rollout_egress_cidrs` and (with `rollout_dns`) kube-dns. The agent shares the pod's
    network with the runner and Argo's executor, so what they need it can reach too (without credentials)."""
    egress: list[dict] = [{"to": [{"podSelector": this_workflows("serve")}],
                           "ports": [{"protocol": "TCP", "port": commands.PROXY_PORT}]}]
    if egress_cidrs(config):
        egress.append({"to": [{"ipBlock": {"cidr": cidr}} for cidr in egress_cidrs(config)]})
    if config.rollout_dns:
        dns = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
               "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
        egress.append({"to": [dns], "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "{{workflow.name}}-rollouts"},
            # Ingress listed with no rule: nothing may connect to a rollout pod (another rollout's agent included).
            "spec": {"podSelector": this_workflows("rollout"), "policyTypes": ["Ingress", "Egress"], "egress": egress}}


def serve_policy() -> dict:
    """The serve pod's NetworkPolicy: the proxy port accepts only this Workflow's rollout, trajectories and
    serve-ready pods, whether they connect to the pod or to the serve Service's ClusterIP, which kube-proxy (or the
    CNI's own Service handling) translates to the pod's IP before the policy is applied to it (vLLM listens on the pod's loopback only, `steps.serve`); the kubelet's probes come from the node, which
    NetworkPolicies always allow."""
    clients = [{"podSelector": this_workflows(role)} for role in ("rollout", "trajectories", shape.SERVE_READY)]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "{{workflow.name}}-serve"},
            "spec": {"podSelector": this_workflows("serve"), "policyTypes": ["Ingress"],
                     "ingress": [{"from": clients, "ports": [{"protocol": "TCP", "port": commands.PROXY_PORT}]}]}}


def policy_template(config: RunConfig, name: str, policy: dict) -> Resource:
    """Applies one NetworkPolicy, owned by the Workflow so that Kubernetes deletes it with the Workflow."""
    return Resource(name=name, action="apply", set_owner_reference=True,
                    manifest=yaml.safe_dump(policy, sort_keys=False), **hera_placement(config.steps_pod))


def isolation_policies(config: RunConfig) -> dict[str, dict]:
    """The NetworkPolicies the Workflow applies before its rollouts, by template name (none without `network_policy`)."""
    if not shape.isolation(config):
        return {}
    rollouts, serve = shape.ISOLATION_STEPS
    return {rollouts: rollout_policy(config), serve: serve_policy()}


def record_template(config: RunConfig, iteration: int) -> Container:
    """The exit handler's first step: the iteration's final phase into the run manifest, whatever happened."""
    return Container(
        name="record", image=image(config, "steps"), env=s3_env(config), **step_pod(config, "100m"),
        command=commands.record(config, iteration, "{{workflow.name}}", "{{workflow.status}}",
                                config.checkpoint_url(iteration), config.checkpoint_url(iteration + 1)),
    )


def report_template(config: RunConfig) -> Container:
    """The exit handler's second step: the run's report, rewritten in the store with this iteration in it."""
    return Container(name="report", image=image(config, "steps"), env=s3_env(config),
                     command=commands.report(config), **step_pod(config, "1", "2Gi"))


def exit_dag(delete_update: bool = False) -> DAG:
    """The exit handler (`shape.exit_handler`): `record`, then `report`. The outcome is recorded first; a report that
    fails is shown on its node and changes neither the record nor the Workflow's phase (`continueOn`). With
    `delete_update` (the update across nodes), a Workflow that did not succeed (stopped, failed) also deletes its
    update JobSet (`delete-update`), so that none runs on once it has ended, nor beside the one a retry creates."""
    return dag("exit", shape.exit_handler(delete_update))


def report_link(config: RunConfig) -> str:
    """The Workflow's description in the Argo UI (Markdown): a link to the run's report, at `report_url_base`
    when the config has one (a browser cannot open s3://), else its URL in the store as text."""
    index = layout.report_index_url(config.run_url)
    if config.report_url_base:
        return f"[Run report]({layout.browsable_url(index, config.store, config.report_url_base)})"
    return f"Run report: `{index}` (set report_url_base to link it)"


def dag(name: str, steps: list[shape.Step], parallelism: int | None = None) -> DAG:
    """A DAG template of the steps `workflows.shape` declares, one task each, in their order."""
    return DAG(name=name, parallelism=parallelism, tasks=[task(step) for step in steps])


def task(step: shape.Step) -> Task:
    """One step as an Argo DAG task on the template of its name: `depends` from its needs; a fan-out over the chunks
    its plan step lists (`withParam`), each on the step's chunk DAG (`chunk_dag`); the proxy's URL (the serve
    Service's ClusterIP, `PROXY_URL`) for the steps that call it; `continueOn` for a step that keeps going."""
    proxy_url, arguments, with_param, template = PROXY_URL, None, None, step.name
    if step.fanout:
        source = "result" if step.fanout == shape.PLANNED else f"parameters.{step.fanout}"
        with_param = f"{{{{tasks.{step.plan}.outputs.{source}}}}}"
        arguments, template = {"chunk": "{{item}}", "proxy_url": proxy_url}, f"{step.name}{CHUNK_SUFFIX}"
    elif step.name.endswith("trajectories") or step.name == shape.SERVE_READY:
        arguments = {"proxy_url": proxy_url}
    return Task(name=step.name, template=template, depends=step.depends or None, with_param=with_param,
                arguments=arguments, continue_on=ContinueOn(failed=True, error=True) if step.keep_going else None,
                when="{{workflow.status}} != Succeeded" if step.only_if_failed else None)


def chunk_dag(config: RunConfig, iteration: int, step: shape.Step, evaluation: bool = False) -> DAG:
    """One chunk of a rollout fan-out `step` (its input `chunk`, a number the plan step printed): `chunk-items` prints
    the chunk's planned rollouts from the store, one `step` pod per item (its fields as the rollout template's
    inputs), then `ended` once any of them succeeded.

    The chunk DAG ends as its `step` pods did taken together, as one fan-out did before chunks: Argo gives a DAG the
    phase of its leaf tasks, and a leaf that was Omitted takes the phase of the task before it
    (workflow/controller/dag.go `assessDAGPhase`), so the DAG Succeeded when one pod did (`ended` ran) and Failed
    when none did (`ended` Omitted after a Failed fan-out); the collect DAG's `<step>.AnySucceeded` then holds when
    any rollout of any chunk succeeded. `ended` is a suspend template of duration 0: no pod, and Argo resumes it at
    its next pass (workflow/controller/operator.go `executeSuspend`)."""
    fanout = FANOUTS[1] if step.fanout == shape.APP_ROLLOUTS else FANOUTS[0]  # app-rollouts-<K>, rollouts-<K>
    url = layout.plan_chunk_url(commands.plan_folder(config, iteration, evaluation), fanout,
                                "{{inputs.parameters.chunk}}")
    item = {n: f"{{{{item.{k}}}}}" for n, k in (("task", "task"), ("sample", "sample"), ("rollout_id", "rollout_id"),
                                                 ("image", "image"), ("deadline", "deadline_s"),
                                                 *((r, r) for r in RESOURCE_INPUTS))}
    app = {"app": "{{item.app}}"} if step.fanout == shape.APP_ROLLOUTS else {}
    rollouts = Task(name=step.name, template=step.name, depends="items",
                    with_param="{{tasks.items.outputs.result}}",
                    arguments={**item, **app, "proxy_url": "{{inputs.parameters.proxy_url}}"})
    ended = Task(name=ENDED, template=ENDED, depends=shape.Need(step.name, (shape.ANY_SUCCEEDED,)).term(alone=True))
    return DAG(name=f"{step.name}{CHUNK_SUFFIX}", inputs=[Parameter(name="chunk"), Parameter(name="proxy_url")],
               tasks=[Task(name="items", template=CHUNK_ITEMS, arguments={"url": url}), rollouts, ended])


def chunk_dags(config: RunConfig, iteration: int, evaluation: bool = False, prefix: str = "") -> list[DAG]:
    """The chunk DAGs of the fan-outs `<prefix>rollout` and `<prefix>rollout-app` (`chunk_dag`)."""
    return [chunk_dag(config, iteration, step, evaluation) for step in shape.fanout(prefix, ()) if step.fanout]


def chunk_templates(config: RunConfig) -> list[Container | Suspend]:
    """What every chunk DAG runs beside its rollouts: `chunk-items`, which prints one chunk of the plan from the
    store (`steps.plan chunk`: at most `steps.plan.CHUNK_BYTES`, under Argo's 256 KiB), retried as a small step that
    met a store's hiccup; and `ended`, a suspend of duration 0 (`chunk_dag`)."""
    items = Container(name=CHUNK_ITEMS, image=image(config, "steps"), working_dir="/opt/openforge/app",
                      inputs=[Parameter(name="url")], command=commands.plan_chunk("{{inputs.parameters.url}}"),
                      env=s3_env(config), retry_strategy=RetryStrategy(limit=3, retry_policy="Always",
                                                                        backoff=Backoff(duration="10s", factor=2)),
                      **step_pod(config, "100m", "256Mi"))
    return [items, Suspend(name=ENDED, duration="0")]


def collect_dag(config: RunConfig, evaluation: bool = False) -> DAG:
    """The `collect` DAG (`shape.collect`); the serve daemon stops when the DAG ends. How many rollouts run at once
    is the Workflow's `parallelism` (`run_workflow`): a DAG's own counts its children, and a fan-out by chunks
    makes those chunk DAGs rather than pods."""
    return dag("collect", shape.collect(config, evaluation))


def evaluation_templates(config: RunConfig, iteration: int, prefix: str) -> list[Container]:
    """The plan, rollout (and rollout-app) and trajectories templates of the evaluation of iteration `iteration`'s
    checkpoint, named `<prefix>plan`, ..., and its evaluate template."""
    return [plan_template(config, iteration, evaluation=True, name=f"{prefix}plan"),
            *rollout_templates(config, iteration, evaluation=True, prefix=prefix),
            *chunk_dags(config, iteration, evaluation=True, prefix=prefix),
            trajectories_template(config, iteration, evaluation=True, name=f"{prefix}trajectories"),
            evaluate_template(config, iteration)]


def iteration_workflow(config: RunConfig, iteration: int) -> Workflow:
    """Iteration `iteration` of the run as one Workflow (one per iteration keeps each object small); with
    `eval_every`, it evaluates the checkpoint it serves where that is due (`RunConfig.evaluates_at`)."""
    evaluation, nodes = config.evaluates_at(iteration), config.update_nodes > 1
    waits = shape.update_waits(config, iteration)
    delete = [delete_update_template(config, "clean-update", update_labels(config, iteration)),
              delete_update_template(config, "delete-update", {UPDATE_WORKFLOW_LABEL: "{{workflow.name}}"})
              ] if nodes else []
    templates = [dag("iteration", shape.iteration(config, iteration)), collect_dag(config, evaluation),
                 *serve_templates(config, iteration), plan_template(config, iteration),
                 *rollout_templates(config, iteration), *chunk_dags(config, iteration),
                 trajectories_template(config, iteration), update_template(config, iteration), *delete,
                 *([wait_template(config, iteration)] if waits else []), exit_dag(nodes),
                 record_template(config, iteration), report_template(config),
                 *(evaluation_templates(config, iteration, "eval-") if evaluation else []),
                 *([fetch_model_template(config)] if shape.fetches_model(config, iteration) else [])]
    return run_workflow(config, workflow_name(config, iteration), templates, {ITERATION_LABEL: str(iteration)})


def run_workflow(config: RunConfig, name: str, templates: list, labels: dict[str, str]) -> Workflow:
    """A Workflow of the run: its first template the entrypoint, the chunk DAGs' own templates and the
    NetworkPolicies' templates added, the run's label, the report link, the exit handler `exit`; pods collected on
    success, the Workflow kept a week, failed (its running pods stopped) `workflow_timeout_s` after it started (Argo's
    spec.activeDeadlineSeconds).

    At most `parallel_rollouts` + 1 of its pods run at once, the serve daemon one of them (spec.parallelism): Argo
    counts a Workflow's Pending and Running pods wherever they are nested (workflow/controller/operator.go
    `checkParallelism` with `getActivePods("")`, node_counters.go; each pod it creates counts at once,
    workflowpod.go `woc.activePods++`), while a DAG's own parallelism counts its direct children, Pods, Steps and
    DAGs alike (`getActiveChildren`), which for the rollouts are their chunk DAGs."""
    templates = [*templates, *chunk_templates(config),
                 *(policy_template(config, n, policy) for n, policy in isolation_policies(config).items())]
    return Workflow(
        name=name, namespace=config.namespace, labels={RUN_LABEL: run_label(config), **labels},
        annotations={"workflows.argoproj.io/description": report_link(config), RUN_NAME_ANNOTATION: config.run},
        entrypoint=templates[0].name, on_exit="exit", templates=templates,
        service_account_name=config.service_account, active_deadline_seconds=config.workflow_timeout_s,
        parallelism=config.parallel_rollouts + 1,
        pod_gc=PodGC(strategy="OnWorkflowSuccess"), ttl_strategy=TTLStrategy(seconds_after_success=7 * 24 * 3600),
    )
