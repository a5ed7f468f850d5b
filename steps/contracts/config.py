"""The run's config type: every key a run has, its type and default (`configs/default.yaml` writes them all).

    from steps.contracts.config import RunConfig
    RunConfig(harness="direct", iterations=3).checkpoint_url(1)

Loading and checking a config (the YAML files, `key=value` overrides, the checks that know the harnesses, the
parsers and the datasets) is `workflows.config`'s; this module holds only the type, so that every step reads a
stored run's config (the manifest's `run.json`) without importing the wiring above it.
"""

import dataclasses
import time
from dataclasses import dataclass, field
from typing import NewType

from steps.contracts import layout
from steps.contracts.limits import MIB, Bounds


# A Kubernetes quantity ("8", "500m", "64Gi"): text, though a config may write a plain number (`cpu: 8`).
Quantity = NewType("Quantity", str)
# The taint GPU node pools commonly carry (GKE puts it on GPU nodes of a cluster that has other nodes too:
# cloud.google.com/kubernetes-engine/docs/how-to/gpus): the serve and update pods tolerate it, no other pod does.
GPU_TAINT_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@dataclass(frozen=True)
class PodSettings:
    """Where and with what one group of the Workflow's pods runs (serve, rollout, update, steps): one mapping key
    of the run's config (`serve_pod: {cpu: 16, node_selector: {pool: h100}}`), whose unset fields keep the group's
    defaults (docs/config.md, "Pods")."""

    node_selector: dict[str, str] = field(default_factory=dict)  # node labels the pods must have
    tolerations: tuple[dict, ...] = ()  # Kubernetes tolerations: key, operator, value, effect, tolerationSeconds
    avoid_gpu_nodes: bool = False  # never on a node labelled nvidia.com/gpu.present=true (but a GPU task's rollout)
    priority_class: str = ""  # a PriorityClass's name; empty: the cluster's default
    queue: str = ""  # a Kueue LocalQueue: the label kueue.x-k8s.io/queue-name; empty: no queue
    cpu: Quantity = Quantity("")  # requests; empty: OpenForge's own for each pod (the rollout's: its task's)
    memory: Quantity = Quantity("")
    ephemeral_storage: Quantity = Quantity("")
    cpu_limit: Quantity = Quantity("")  # limits; empty: none (the rollout's: its task's)
    memory_limit: Quantity = Quantity("")
    ephemeral_storage_limit: Quantity = Quantity("")
    pod_spec_patch: dict = field(default_factory=dict)  # pod spec fields merged into the group's pods (podSpecPatch)


def gpu_pods() -> PodSettings:
    """The serve and update pods' defaults: they tolerate the GPU taint."""
    return PodSettings(tolerations=(GPU_TAINT_TOLERATION,))


def cpu_pods() -> PodSettings:
    """The rollout and small steps' defaults: kept off GPU nodes."""
    return PodSettings(avoid_gpu_nodes=True)


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs; the same object drives the Argo workflows and the local runner."""

    harness: str = "codex"
    run: str = ""  # empty: <harness>-<UTC timestamp>, filled in by `with_run_name`
    model: str = "runs/tiny-model"  # base checkpoint: local folder, s3:// URL, or hub model hf://org/name[@revision]
    hub_endpoint: str = "https://huggingface.co"  # where a hub `model` is fetched from (steps/fetch_model.py)
    model_name: str = "tiny"
    dataset: str = "steps/tasks/builtin"  # a path here, an s3:// prefix of task folders, or harbor://NAME@VERSION
    # Harbor's registry.json (a URL or a file) that `harbor://NAME@VERSION` datasets are looked up in
    dataset_registry: str = "https://raw.githubusercontent.com/laude-institute/harbor/main/registry.json"
    iterations: int = 2
    tasks_per_iteration: int = 4
    samples_per_task: int = 2
    max_tokens_cap: int = 256
    # how vLLM serves the model (docs/serving.md)
    tool_call_parser: str = ""  # empty: the one of the checkpoint's family (steps/vllm_parsers.py)
    reasoning_parser: str = ""  # empty: none, reasoning stays in the text
    max_model_len: int = 0  # 0: vLLM's default (the model's own) on GPU, 32768 on CPU
    gpu_memory_utilization: float = 0.9
    vllm_args: tuple[str, ...] = ()  # passed to vLLM last, e.g. ["--enable-prefix-caching"]
    # how vLLM serves a vision checkpoint (its config.json has a vision_config; docs/serving.md)
    image_limit: int = 4  # images per prompt: vLLM's --limit-mm-per-prompt (the proxy refuses more)
    max_pixels: int = 0  # the image processor's pixel cap per image; 0: the checkpoint's preprocessor_config.json
    chat_template: str = ""  # a chat template file for vLLM's --chat-template; empty: the checkpoint's own
    # how vLLM samples every rollout token (steps/sampling.py): the proxy forces these on every call, whatever
    # the harness sent, and the update computes its logprobs at `temperature`
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    allow_unmatched_sampling: bool = False  # true: train on samples drawn with settings the trainer cannot reproduce
    parallel_rollouts: int = 4
    seed: int = 0
    # scale (docs/serving.md, docs/workflows.md)
    serve_replicas: int = 1  # vLLM servers behind the one proxy; each rollout stays on the replica it was given
    max_staleness: int = 0  # 0: synchronous; S >= 1: the next rollouts overlap the update, trained up to S versions behind
    # evaluation (docs/eval.md): `submit.py eval` runs, and a training run's held-out evaluations
    eval_every: int = 0  # training runs: evaluate the served checkpoint every N iterations; 0: never
    eval_dataset: str = ""  # empty: `dataset`
    eval_k: int = 3  # tries per task: pass@k and pass^k are computed for this k
    upstream: str = ""  # eval runs: an OpenAI-compatible server already running, served behind the proxy instead of vLLM
    upstream_model: str = ""  # the model name that upstream serves; empty: `model_name`
    # the judge a task's verifier may ask for its reward (`[verifier] judge`; docs/proxy.md, "The judge route"): any
    # OpenAI-compatible base URL, reached only through the proxy's judge route, asked for `judge_model`; its key
    # comes from the Secret `judge_secret` (key api-key) on Argo, from OPENFORGE_JUDGE_UPSTREAM_API_KEY locally
    judge_upstream: str = ""
    judge_model: str = ""
    # supervised fine-tuning (docs/training.md): `submit.py sft` keeps recorded rollouts whose reward is at least this
    sft_min_reward: float = 1.0
    # the update: its own flat YAML (steps/update/config.py), plus these run-level settings as overrides
    update_config: str = "configs/update.yaml"
    # more of the update's keys as key=value overrides of update_config (e.g. ["mini_batches=4"]): a cluster's
    # train image has configs/update.yaml baked in, so this is how a run changes any other update key
    update_args: tuple[str, ...] = ()
    adv_estimator: str = "grpo"  # veRL's advantage estimator: grpo, rloo, ... (steps/update/config.py)
    # learning signal (docs/update.md, "Groups without signal"; docs/trajectories.md, "Choosing tasks")
    drop_flat_groups: bool = True  # the update leaves out task groups whose rollouts all earned one reward
    fill_batch: bool = False  # local runner: roll out more tasks while groups are flat (DAPO's dynamic sampling)
    max_fill_rounds: int = 2  # with fill_batch: at most this many extra plans per iteration
    curriculum: str = "off"  # off: tasks rotate through a seeded shuffle; pass_rate: by each task's recent pass rate
    curriculum_window: int = 4  # pass_rate: the pass rate is of the last N iterations' rollouts of the task
    curriculum_min_pass: float = 0.0  # pass_rate: a task at or below this pass rate rests (never solved)
    curriculum_max_pass: float = 1.0  # pass_rate: a task at or above this pass rate rests (always solved)
    curriculum_pass_reward: float = 1.0  # pass_rate: a rollout passes at this reward or more (pass@k's 1)
    learning_rate: float = 1e-6  # AdamW's, constant
    epochs: int = 1  # passes over the iteration's samples
    # LoRA: the update trains and saves only a low-rank adapter on the base model (docs/update.md, "LoRA")
    lora_rank: int = 0  # the adapter's rank; 0: off, the whole model trains
    lora_alpha: int = 16  # the adapter's scale is lora_alpha / lora_rank
    lora_target_modules: tuple[str, ...] = ("all-linear",)  # module names the adapter wraps; "all-linear": every linear
    # a PersistentVolumeClaim every Argo serve pod mounts, where a LoRA run's base is fetched once, not per iteration
    # (steps.model_cache); empty: each iteration's serve pod fetches the base into its emptyDir
    model_cache_volume: str = ""
    # where everything goes
    store: str = "runs"  # local folder or s3:// URL
    s3_endpoint: str = ""  # e.g. http://minio.openforge.svc:9000; empty: AWS (s3.<s3_region>.amazonaws.com)
    s3_region: str = ""  # e.g. us-west-2: every pod's and the driver's AWS_REGION; empty: the SDK's own default
    report_url_base: str = ""  # an http(s) URL serving the store's root to browsers: the Workflows link the report there
    # experiment tracking (docs/tracking.md): the driver logs the config, then each iteration's report numbers
    trackers: tuple[str, ...] = ()  # any of wandb, mlflow, tensorboard; empty: none
    tracker_project: str = "openforge"  # the W&B project and the MLflow experiment the run is logged in
    mlflow_tracking_uri: str = ""  # mlflow: its tracking server (http(s)://...) or database (sqlite:///...)
    tensorboard_dir: str = ""  # tensorboard: a folder or s3:// URL for its event files; empty: the run's tracking/tensorboard
    wandb_secret: str = "openforge-wandb"  # on a cluster: the Secret (key api-key) the driver's WANDB_API_KEY comes from
    mlflow_secret: str = "openforge-mlflow"  # on a cluster: the Secret (keys token, username, password) of MLFLOW_TRACKING_*
    keep_checkpoints: int = 0  # keep the last N checkpoints (and the base, evaluated, pinned, served); 0: keep all
    pin_checkpoints: tuple[int, ...] = ()  # iterations whose checkpoints `keep_checkpoints` never deletes
    # the cluster (used only with an Argo server)
    argo_server: str = ""  # empty: run locally
    argo_server_in_cluster: str = "https://argo-server.argo:2746"  # the Argo Server as a pod reaches it: the --detach driver's
    driver_deadline_s: int = 7 * 24 * 3600  # --detach: each attempt of the driver pod is stopped after this long
    namespace: str = "openforge"
    service_account: str = "openforge"
    s3_secret: str = "openforge-s3"  # keys access-key, secret-key
    # secret: the pods' S3 keys come from s3_secret; pod-identity: from their service account's cloud identity
    # (EKS IRSA, GKE Workload Identity); the rollout pods reach no store either way (docs/workflows.md, "Credentials")
    s3_credentials: str = "secret"
    rollout_service_account: str = ""  # the rollout pods' (the agents'), with no cloud identity; empty: service_account
    argo_ca_bundle: str = ""  # a PEM file of the CA that signed the Argo server's certificate; env ARGO_CA_BUNDLE wins
    argo_ca_secret: str = ""  # --detach: a Secret (key ca.crt) with the CA of argo_server_in_cluster's certificate
    argo_insecure_tls: bool = False  # accept any certificate from the Argo server (a warning says so); --argo-insecure
    # the Argo controller offloads node status to its database (persistence.nodeStatusOffLoad): needed above
    # workflows.config.MAX_ROLLOUTS_WITHOUT_OFFLOAD rollouts per Workflow (docs/workflows.md, "Size")
    argo_node_status_offload: bool = False
    admin_secret: str = "openforge-admin"  # key admin-key
    hub_secret: str = "openforge-hub"  # key token: the token for a gated or private hub `model`; optional
    judge_secret: str = "openforge-judge"  # key api-key: the judge_upstream's key, in the serve pod only; optional
    image_registry: str = "ghcr.io/openforge"
    image_tag: str = "0.1.0"  # OpenForge's own images; task images are tagged with their content (steps/plan.py)
    registry_secret: str = "openforge-registry"  # a docker-registry Secret (key .dockerconfigjson): task image pushes
    serve_gpus: int = 1  # per replica: vLLM's tensor parallelism
    update_gpus: int = 1  # per update node: torchrun's processes there (FSDP2 shards the model over all of them)
    update_nodes: int = 1  # more than 1: the update runs as a JobSet across that many pods (docs/workflows.md)
    update_timeout_s: int = 6 * 3600  # the update's deadline: its pod's, or across nodes its JobSet's Job's
    # NCCL between the update's nodes (docs/workflows.md, "The network between update nodes"): extended resources
    # each JobSet pod requests, an RDMA device plugin's ({"rdma/ib": 1}, {"vpc.amazonaws.com/efa": 32}); env for NCCL
    # and its network plugin in every update pod (NCCL_*, FI_*, ...: settings, never a secret); the node's network
    update_rdma_resources: dict[str, int] = field(default_factory=dict)
    update_env: dict[str, str] = field(default_factory=dict)
    update_host_network: bool = False  # the JobSet pods on their nodes' network (hostNetwork), not the pod network
    # where the pods run and what they request, by group (docs/config.md, "Pods")
    serve_pod: PodSettings = field(default_factory=gpu_pods)
    rollout_pod: PodSettings = field(default_factory=cpu_pods)
    update_pod: PodSettings = field(default_factory=gpu_pods)
    steps_pod: PodSettings = field(default_factory=cpu_pods)  # plan, trajectories, evaluate, record, report, ...
    serve_shm: Quantity = Quantity("16Gi")  # the serve pod's memory-backed /dev/shm (vLLM's tensor parallelism)
    # deadlines (docs/workflows.md, "Deadlines"): each Workflow's, the serve daemon's, each small step's
    workflow_timeout_s: int = 24 * 3600
    serve_timeout_s: int = 12 * 3600
    step_timeout_s: int = 2 * 3600
    rollout_retries: int = 3
    # seconds a rollout pod may spend before its runner starts (image pulls, init containers), on top of its deadline
    rollout_setup_timeout_s: int = 600
    # what one rollout may take and leave behind (docs/reliability.md, "Limits")
    harness_memory_mb: int = 0  # the harness's own memory beside the task's memory_mb; 0: the harness's own allowance
    rollout_log_mb: int = Bounds.log_bytes // MIB  # each log a rollout keeps (its output, session logs, the verifier's)
    graded_max_files: int = Bounds.graded_files  # files (and folders) of the graded paths copied to the verifier; more: 0
    graded_copy_s: int = int(Bounds.graded_seconds)  # seconds that copy may take; longer: reward 0
    store_quota_mb: int = 128  # bytes the proxy stores for one rollout (call records, new images); past it: refused
    store_quota_calls: int = 2048  # calls the proxy stores for one rollout; past it: refused
    image_pixel_limit: int = 40_000_000  # decoded pixels (width x height) of one image a harness sends; more: a 400
    request_image_mb: int = 32  # image bytes in one request; more: a 400
    memo_max_age: str = "72h"
    # network isolation of the rollout pods (docs/workflows.md, "Network isolation")
    network_policy: bool = True  # the Workflow applies NetworkPolicies: rollout pods reach only the proxy
    rollout_egress_cidrs: str = "auto"  # comma-separated CIDRs rollout pods may reach too: Argo's executor needs the
    # Kubernetes API server's addresses; "auto": the `kubernetes` endpoints (and ClusterIP), read at submit
    rollout_dns: bool = False  # let rollout pods ask kube-dns (nothing of OpenForge's needs it: all is by IP)
    rollout_oom_guard: bool = True  # the rollout container gets SYS_RESOURCE so its runner outlives an OOM kill

    def store_env(self) -> dict[str, str]:
        """The store's endpoint and region as the environment s3fs, boto3 and Argo's executor read (no credentials):
        what every pod gets and what the driver sets for itself, so that all of them reach the same store.

        >>> RunConfig(s3_endpoint="http://minio:9000", s3_region="eu-west-1").store_env()["AWS_DEFAULT_REGION"]
        'eu-west-1'
        """
        region = {"AWS_REGION": self.s3_region, "AWS_DEFAULT_REGION": self.s3_region} if self.s3_region else {}
        return {**({"AWS_ENDPOINT_URL": self.s3_endpoint} if self.s3_endpoint else {}), **region}

    def with_run_name(self) -> "RunConfig":
        """This config with `run` filled in when it was left empty."""
        if self.run:
            return self
        return dataclasses.replace(self, run=f"{self.harness}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")

    @property
    def run_url(self) -> str:
        """The run's folder or URL in the store; everything the run writes lives under it."""
        return layout.run_url(self.store, self.run)

    def checkpoint_url(self, iteration: int) -> str:
        """The checkpoint iteration `iteration` serves: the base model, then what the previous update wrote."""
        return layout.checkpoint_url(self.run_url, iteration, self.model)

    def evaluates_at(self, iteration: int) -> bool:
        """Whether a training run evaluates the checkpoint iteration `iteration` serves: every `eval_every`
        iterations from 0, and the final checkpoint (the one iteration `iterations` would serve).

        >>> [i for i in range(6) if RunConfig(iterations=5, eval_every=2).evaluates_at(i)]
        [0, 2, 4, 5]
        """
        return self.eval_every > 0 and (iteration % self.eval_every == 0 or iteration == self.iterations)

    def evaluated(self, iteration: int | str) -> tuple[str, str]:
        """(what an evaluation of iteration `iteration`'s checkpoint serves, the model name it is served as): the
        checkpoint, or with `upstream` that server and its model.

        >>> RunConfig(upstream="http://10.0.0.5:8000", upstream_model="m").evaluated(0)
        ('http://10.0.0.5:8000', 'm')
        """
        if self.upstream:
            return self.upstream, self.upstream_model or self.model_name
        return self.checkpoint_url(int(iteration)), self.model_name

    @property
    def evaluation_dataset(self) -> str:
        """The dataset evaluations run on: `eval_dataset`, else the run's `dataset` (an eval run's `--dataset`)."""
        return self.eval_dataset or self.dataset

    def to_dict(self) -> dict:
        """The config as a flat dict (what the run manifest stores)."""
        return dataclasses.asdict(self)
