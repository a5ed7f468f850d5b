"""A run's settings: one flat YAML file loaded into `RunConfig`, with `key=value` overrides.

    config = load_config("configs/cluster-example.yaml", ["iterations=3", "harness=direct"])

`configs/default.yaml` holds every key with the embedded default's value; a `--config FILE` only
names what it changes. Every problem (an unknown key, a value of the wrong type, an unknown harness,
a dataset that is not there) is a `ConfigError` with one sentence naming the field, raised before
anything starts.
"""

import dataclasses
import difflib
import ipaddress
import json
import re
from pathlib import Path
from urllib.parse import urlsplit


from steps import net, sampling, settings, tracking
from steps.fetch_model import hub_model
from steps.harnesses import ALL_HARNESSES as HARNESSES
from steps.plan import MAX_EVAL_K
from steps.settings import ConfigError
from steps.vllm_parsers import REASONING_PARSERS, TOOL_CALL_PARSERS, UnknownFamily, tool_call_parser_for
from steps.update import config as update_config
from steps.vllm_server import VLLM_LORA_RANKS, check_vllm_args, is_vision
from workflows import datasets
from workflows.commands import RUN_UPDATE_KEYS, update_overrides
from steps.contracts.config import PodSettings, RunConfig
from steps.contracts.layout import HUB_SCHEME


REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO_ROOT / "configs" / "default.yaml"
# More update nodes than any cluster this targets, refused at load rather than at run time; the JobSet's pod names
# are checked against JobSet's 63 characters up to here (workflows.jobset, tests/test_workflows.py).
MAX_UPDATE_NODES = 1000
S3_CREDENTIALS = ("secret", "pod-identity")  # `s3_credentials`: keys from `s3_secret`, or the pod's cloud identity
# An AWS region code (us-east-1, eu-central-2, us-gov-west-1, ap-southeast-4): docs.aws.amazon.com/general/latest/gr/
# rande.html. Other S3-compatible stores name theirs freely (MinIO's default is us-east-1): only the shape is checked.
REGION = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
# vLLM's keys for a model's length, in its order (model_arch_config_convertor.derive_max_model_len_and_key).
MODEL_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                     "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
MIN_MAX_PIXELS = 28 * 28  # the smallest pixel cap that still holds one merged patch (Qwen2.5-VL's 2x2 of 14 px)
POD_GROUPS = ("serve_pod", "rollout_pod", "update_pod", "steps_pod")  # RunConfig's PodSettings, one per pod group
# Kubernetes' quantity syntax, a sign left out (kubernetes.io/docs/reference/kubernetes-api/common-definitions/
# quantity/): "8", "500m", "64Gi", "1e3".
QUANTITY = re.compile(r"^[0-9.]+([eEinumkKMGTP]*[-+]?[0-9]*)$")
# A label value (Kueue's queue name) and an object name (a PriorityClass):
# kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set, .../names/.
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
# A Toleration's fields and the values Kubernetes accepts for two of them (core/v1 Toleration).
TOLERATION_FIELDS = ("key", "operator", "value", "effect", "tolerationSeconds")
TOLERATION_CHOICES = {"operator": ("Exists", "Equal"), "effect": ("NoSchedule", "PreferNoSchedule", "NoExecute")}
RESOURCE_FIELDS = ("cpu", "memory", "ephemeral_storage", "cpu_limit", "memory_limit", "ephemeral_storage_limit")
# The update's NCCL settings (`check_update_network`). An extended resource is a qualified name `domain/name`
# (kubernetes.io/docs/concepts/configuration/manage-resources-containers/#extended-resources); the GPUs are
# `update_gpus`'. Env names: NCCL's, PyTorch's for it, libfabric's and aws-ofi-nccl's, UCX's; never one that names a
# credential. Values: the characters NCCL's and the plugins' settings use (`=mlx5_0:1`, `^lo,docker`, `AWS Libfabric`),
# no `$`, which Kubernetes would expand as `$(VAR)`.
RDMA_RESOURCE = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
UPDATE_ENV_NAME = re.compile(r"(NCCL|TORCH_NCCL|FI|OFI_NCCL|UCX)_[A-Z0-9_]+")
UPDATE_ENV_SECRET = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|CREDENTIAL")
UPDATE_ENV_VALUE = re.compile(r"[A-Za-z0-9 _.,:;=^/+@-]{0,256}")
EGRESS_AUTO = "auto"  # rollout_egress_cidrs: the API server's addresses, read from the cluster at submit
TINY_VISION_MODEL = "runs/tiny-vision-model"  # configs/gui.yaml's model: built by the local runner like the tiny model
# Folders the local runner builds when missing: never read as hub ids, though they look like `org/name`.
BUILT_MODELS = (RunConfig.model, TINY_VISION_MODEL)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                check_dataset: bool = True) -> RunConfig:
    """Defaults, then the YAML file at `path`, then `key=value` overrides; checked field by field
    (`steps.settings`: strict types, a renamed or misspelt key named)."""
    config = with_hub_model(settings.load(RunConfig, [DEFAULT_CONFIG, *([path] if path else [])], overrides))
    validate(config, check_dataset=check_dataset)
    return config


def with_hub_model(config: RunConfig) -> RunConfig:
    """The config with a hub `model` spelt `hf://org/name[@revision]`: a bare `org/name[@revision]` is one when no
    such folder exists here or in the repository (an existing folder wins) and the local runner does not build it;
    decided once, here, so that every step after reads the same `model`."""
    model = config.model
    if model.startswith(HUB_SCHEME) or model in BUILT_MODELS or "://" in model:
        return config
    if Path(model).exists() or (REPO_ROOT / model).exists() or (hub := hub_model(model)) is None:
        return config
    return dataclasses.replace(config, model=str(hub))


def from_dict(raw: dict) -> RunConfig:
    """A RunConfig from a stored run's flat dict (its manifest), checked as a config file is; keys renamed
    since the run started are read under their new names."""
    return settings.from_dict(RunConfig, settings.with_new_names(raw))


def validate(config: RunConfig, check_dataset: bool = True) -> None:
    """Checks the values that have a fixed set of answers; raises ConfigError on the first bad one."""
    if config.harness not in HARNESSES:
        close = difflib.get_close_matches(config.harness, HARNESSES, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ConfigError(f"unknown harness {config.harness!r}; {hint}choose one of {', '.join(HARNESSES)}")
    for key in ("iterations", "tasks_per_iteration", "samples_per_task", "max_tokens_cap", "parallel_rollouts",
                "epochs", "eval_k", "update_nodes", "serve_replicas", "update_timeout_s", "driver_deadline_s",
                "workflow_timeout_s", "serve_timeout_s", "step_timeout_s"):
        if getattr(config, key) < 1:
            raise ConfigError(f"config key {key!r} must be at least 1, got {getattr(config, key)}")
    if config.workflow_timeout_s < config.serve_timeout_s + config.update_timeout_s:
        # the update starts once collect (which the serve pod outlives) has ended: docs/workflows.md, "Deadlines"
        raise ConfigError(f"config key 'workflow_timeout_s' ({config.workflow_timeout_s}) must be at least "
                          f"serve_timeout_s + update_timeout_s ({config.serve_timeout_s + config.update_timeout_s}), "
                          f"or the Workflow's deadline stops an iteration whose steps are within their own")
    if config.update_nodes > MAX_UPDATE_NODES:
        raise ConfigError(f"config key 'update_nodes' must be at most {MAX_UPDATE_NODES}, got {config.update_nodes}")
    if config.eval_k > MAX_EVAL_K:
        raise ConfigError(f"config key 'eval_k' must be at most {MAX_EVAL_K} (tries per task), got {config.eval_k}")
    if config.serve_replicas > 1 and config.upstream:
        raise ConfigError("config key 'serve_replicas' starts vLLM servers, but 'upstream' serves instead of vLLM; "
                          "set serve_replicas to 1 or leave out upstream")
    if config.upstream_model and not config.upstream:
        raise ConfigError("config key 'upstream_model' names the model an upstream serves; give the upstream too "
                          "(--upstream URL, the key 'upstream'), or leave it out")
    for key in ("rollout_log_mb", "graded_max_files", "graded_copy_s", "store_quota_mb", "store_quota_calls",
                "image_pixel_limit", "request_image_mb"):
        if getattr(config, key) < 1:
            raise ConfigError(f"config key {key!r} must be at least 1 (a limit; docs/reliability.md), "
                              f"got {getattr(config, key)}")
    for key in ("serve_gpus", "update_gpus", "rollout_retries", "rollout_setup_timeout_s", "seed", "eval_every",
                "max_staleness", "harness_memory_mb", "keep_checkpoints"):
        if getattr(config, key) < 0:
            raise ConfigError(f"config key {key!r} must be 0 or more, got {getattr(config, key)}")
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in config.pin_checkpoints):
        raise ConfigError(f"config key 'pin_checkpoints' must be a list of iteration numbers (ints 0 or more), "
                          f"got {list(config.pin_checkpoints)}")
    check_serving(config)
    # A Secret's name is a DNS subdomain (kubernetes.io/docs/concepts/overview/working-with-objects/names/).
    secret = config.registry_secret
    if not (re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", secret) and len(secret) <= 253):
        raise ConfigError(f"config key 'registry_secret' must be a Kubernetes Secret's name (lower-case letters, "
                          f"digits, '-' and '.'), got {secret!r}")
    check_pods(config)
    check_update_network(config)
    if config.learning_rate <= 0:
        raise ConfigError(f"config key 'learning_rate' must be more than 0, got {config.learning_rate}")
    check_lora(config)
    check_learning_signal(config)
    settings = sampling.settings(config)
    for key, value in settings.items():
        if why := sampling.problem(key, value):
            raise ConfigError(f"config key {key!r} {why}")
    if (unmatched := sampling.unmatched(settings)) and not config.allow_unmatched_sampling:
        neutral = " and ".join(f"{key}: {sampling.NEUTRAL[key]}" for key in unmatched)
        raise ConfigError(f"config key {', '.join(map(repr, unmatched))} ({sampling.describe(unmatched)}) reshapes the "
                          f"sampled distribution in a way the update cannot reproduce (it computes logprobs at the "
                          f"run's temperature only); keep {neutral}, or set allow_unmatched_sampling: true to train "
                          f"on such samples anyway")
    if not config.store:
        raise ConfigError("config key 'store' is empty; give a local folder or an s3:// URL")
    check_hub_model(config)
    if not (REPO_ROOT / config.update_config).is_file():
        raise ConfigError(f"update_config {config.update_config!r} is not a file; give the update step's flat YAML, "
                          f"relative to the repository (e.g. configs/update.yaml)")
    check_update_config(config)
    check_access(config)
    check_trackers(config)
    if config.report_url_base and not config.report_url_base.startswith(("http://", "https://")):
        raise ConfigError(f"config key 'report_url_base' must be an http:// or https:// URL at which a browser opens "
                          f"the store's root (e.g. https://reports.example.com/runs), got {config.report_url_base!r}")
    if not config.argo_server_in_cluster.startswith(("http://", "https://")):
        raise ConfigError(f"config key 'argo_server_in_cluster' must be an http:// or https:// URL at which a pod reaches "
                          f"the Argo Server (e.g. https://argo-server.argo:2746), got {config.argo_server_in_cluster!r}")
    if config.upstream and not net.is_upstream_url(config.upstream):
        # Not echoed: a URL refused here may hold a password or a key.
        raise ConfigError(f"config key 'upstream' must be {net.UPSTREAM_URL}: the base of an OpenAI-compatible server")
    check_judge(config)
    if not config.dataset_registry:
        raise ConfigError("config key 'dataset_registry' is empty; give the URL or path of Harbor's registry.json")
    for key in ("eval_dataset", "dataset") if check_dataset else ():
        if getattr(config, key):
            datasets.check_dataset(config, key, REPO_ROOT)
            judged = [] if config.judge_upstream else datasets.judged_tasks(getattr(config, key), REPO_ROOT)
            if judged:
                raise ConfigError(f"config key {key!r}: task {judged[0]!r} has a verifier that asks a judge model "
                                  f"([verifier] judge), and the run has none; set judge_upstream and judge_model")


def check_judge(config: RunConfig) -> None:
    """The judge's keys (`judge_upstream`, `judge_model`, `judge_secret`): a ConfigError on the first bad one."""
    if config.judge_upstream and not net.is_upstream_url(config.judge_upstream):
        # Not echoed: a URL refused here may hold a password or a key.
        accepted = net.UPSTREAM_URL.replace("OPENFORGE_UPSTREAM_API_KEY", "judge_secret")
        raise ConfigError(f"config key 'judge_upstream' must be {accepted}: the base of an OpenAI-compatible server")
    if bool(config.judge_upstream) != bool(config.judge_model):
        raise ConfigError("config keys 'judge_upstream' and 'judge_model' go together: the judge's base URL and the "
                          "model it is asked for; set both, or neither")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", config.judge_secret) or len(config.judge_secret) > 253:
        raise ConfigError(f"config key 'judge_secret' must be a Kubernetes Secret's name (lower-case letters, digits, "
                          f"'-' and '.'), got {config.judge_secret!r}")


def check_trackers(config: RunConfig) -> None:
    """The experiment trackers (`steps.tracking`): known names, each once, what each needs, and its library here, so
    that a run that would log nowhere is refused before anything starts."""
    for name in config.trackers:
        if name not in tracking.TRACKERS:
            raise ConfigError(f"config key 'trackers' takes {', '.join(tracking.TRACKERS)} (any of them, each once), "
                              f"got {name!r}")
    if len(set(config.trackers)) < len(config.trackers):
        raise ConfigError(f"config key 'trackers' names a tracker twice: {list(config.trackers)}")
    if not config.tracker_project.strip() or "/" in config.tracker_project:
        raise ConfigError(f"config key 'tracker_project' must be a W&B project and MLflow experiment name (no '/'), "
                          f"got {config.tracker_project!r}")
    uri = config.mlflow_tracking_uri
    if "mlflow" in config.trackers and not re.match(r"(https?|sqlite|postgresql|mysql|mssql|databricks)(\+\w+)?:", uri):
        raise ConfigError(f"config key 'mlflow_tracking_uri' must be the MLflow tracking server's http(s):// URL or "
                          f"a database URI such as sqlite:///mlflow.db when trackers has mlflow, got {uri!r}")
    try:
        password = urlsplit(uri).password
    except ValueError:  # a malformed host ("http://[::1"): MLflow refuses it when the tracker starts, in one line
        password = None
    if password is not None:  # not echoed: it would go on into the manifest and the logs
        raise ConfigError("config key 'mlflow_tracking_uri' must not hold a password (the config is kept in the run's "
                          "manifest); give it by env: MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_PASSWORD (on a cluster "
                          "from mlflow_secret), or the database's own (PGPASSWORD)")
    for key in ("wandb_secret", "mlflow_secret"):
        if not OBJECT_NAME.fullmatch(getattr(config, key)):
            raise ConfigError(f"config key {key!r} must be a Kubernetes Secret's name (lower-case letters, digits, "
                              f"'-' and '.'), got {getattr(config, key)!r}")
    if missing := tracking.missing_libraries(config.trackers):
        raise ConfigError(f"config key 'trackers' names {', '.join(missing)}, whose library this Python lacks; "
                          f"install OpenForge's tracking extra (pip install -e '.[tracking]') or leave it out")


def check_access(config: RunConfig) -> None:
    """The keys that say how the store and the Argo server are reached: a ConfigError on the first bad one."""
    if config.s3_credentials not in S3_CREDENTIALS:
        raise ConfigError(f"config key 's3_credentials' must be one of {', '.join(S3_CREDENTIALS)} (keys from "
                          f"s3_secret, or the pods' cloud identity), got {config.s3_credentials!r}")
    if config.s3_region and not REGION.fullmatch(config.s3_region):
        raise ConfigError(f"config key 's3_region' must be a region code such as us-west-2, or empty, "
                          f"got {config.s3_region!r}")
    if config.s3_endpoint and not config.s3_endpoint.startswith(("http://", "https://")):
        raise ConfigError(f"config key 's3_endpoint' must be an http:// or https:// URL (e.g. "
                          f"http://minio.openforge.svc:9000), or empty for AWS, got {config.s3_endpoint!r}")
    if config.argo_ca_secret and not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", config.argo_ca_secret):
        raise ConfigError(f"config key 'argo_ca_secret' must be a Kubernetes Secret's name (lower-case letters, "
                          f"digits, '-' and '.') holding ca.crt, or empty, got {config.argo_ca_secret!r}")
    if config.argo_ca_bundle and config.argo_insecure_tls:
        raise ConfigError("config keys 'argo_ca_bundle' and 'argo_insecure_tls' contradict each other: verify the "
                          "Argo server with the CA bundle, or accept any certificate, not both")
    if config.argo_ca_bundle and not Path(config.argo_ca_bundle).is_file():
        raise ConfigError(f"config key 'argo_ca_bundle' (or env ARGO_CA_BUNDLE) must be a PEM file of the CA that "
                          f"signed the Argo server's certificate; {config.argo_ca_bundle!r} is not a file")


def check_serving(config: RunConfig) -> None:
    """vLLM's options: known parser names, a parser for the model's family when the model is a folder here,
    a sane GPU share, and no flag in `vllm_args` that OpenForge sets itself."""
    for key, known in (("tool_call_parser", TOOL_CALL_PARSERS), ("reasoning_parser", REASONING_PARSERS)):
        if getattr(config, key) and getattr(config, key) not in known:
            close = difflib.get_close_matches(getattr(config, key), known, n=1)
            hint = f"did you mean {close[0]}?" if close else f"vLLM 0.32 knows {', '.join(sorted(known))}"
            raise ConfigError(f"config key {key!r}: vLLM has no parser {getattr(config, key)!r}; {hint}")
    if config.max_model_len < 0:
        raise ConfigError(f"config key 'max_model_len' must be 0 (vLLM's default) or more, got {config.max_model_len}")
    if not 0 < config.gpu_memory_utilization <= 1:
        raise ConfigError(f"config key 'gpu_memory_utilization' must be more than 0 and at most 1 (the share of "
                          f"each GPU's memory vLLM may take), got {config.gpu_memory_utilization}")
    try:
        check_vllm_args(config.vllm_args, where="config key 'vllm_args'")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    check_vision_serving(config)
    model = model_folder(config)
    if not config.tool_call_parser and (model / "config.json").is_file():
        try:
            tool_call_parser_for(model)
        except UnknownFamily as exc:
            raise ConfigError(str(exc)) from None


def check_pods(config: RunConfig) -> None:
    """Each pod group's settings (`PodSettings`) as Kubernetes will accept them, and the serve pod's /dev/shm."""
    for group in POD_GROUPS:
        check_pod_settings(group, getattr(config, group))
    if not QUANTITY.match(config.serve_shm):
        raise ConfigError(f"config key 'serve_shm' must be a Kubernetes quantity such as 16Gi, "
                          f"got {config.serve_shm!r}")
    if config.rollout_pod != dataclasses.replace(config.rollout_pod, **dict.fromkeys(RESOURCE_FIELDS, "")):
        raise ConfigError("config key 'rollout_pod' cannot set cpu, memory, ephemeral_storage or their limits: a "
                          "rollout pod gets its task's (task.toml's [environment]) with the harness's budget added")
    if config.update_nodes > 1 and config.update_pod.pod_spec_patch:
        raise ConfigError("config key 'update_pod.pod_spec_patch' is Argo's podSpecPatch, and with update_nodes > 1 "
                          "the update's pods are the JobSet's, not Argo's; set the other update_pod keys instead")


def check_update_network(config: RunConfig) -> None:
    """The update's NCCL settings: RDMA resources and the host network only across nodes, each resource a qualified
    name with a count, each env name NCCL's or its network plugin's and each value plain text."""
    for key in ("update_rdma_resources", "update_host_network"):
        if getattr(config, key) and config.update_nodes < 2:
            raise ConfigError(f"config key {key!r} is for the update across nodes (update_nodes > 1); within one pod "
                              f"NCCL needs no network, so leave it out or raise update_nodes")
    for name, count in config.update_rdma_resources.items():
        if not RDMA_RESOURCE.fullmatch(name) or name == "nvidia.com/gpu" or count < 1:
            raise ConfigError(f"config key 'update_rdma_resources' must map extended resource names (domain/name, "
                              f"e.g. rdma/ib or vpc.amazonaws.com/efa; GPUs are update_gpus) to counts of at least 1, "
                              f"got {name!r}: {count!r}")
    for name, value in config.update_env.items():
        if not UPDATE_ENV_NAME.fullmatch(name) or UPDATE_ENV_SECRET.search(name):
            raise ConfigError(f"config key 'update_env' takes only NCCL_*, TORCH_NCCL_*, FI_*, OFI_NCCL_* or UCX_* "
                              f"names (none naming a key, secret, token or password), got {name!r}")
        if not UPDATE_ENV_VALUE.fullmatch(value):
            raise ConfigError(f"config key 'update_env.{name}' must be at most 256 letters, digits, spaces and "
                              f"_.,:;=^/+@- (no $), got {value[:40]!r}")


def check_pod_settings(group: str, pod: PodSettings) -> None:
    """One group's quantities, names, tolerations and patch, each refused with one sentence naming its key."""
    for name in RESOURCE_FIELDS:
        if getattr(pod, name) and not QUANTITY.match(getattr(pod, name)):
            raise ConfigError(f"config key '{group}.{name}' must be a Kubernetes quantity such as 8, 500m or 64Gi "
                              f"(empty: OpenForge's), got {getattr(pod, name)!r}")
    if not LABEL_VALUE.match(pod.queue):
        raise ConfigError(f"config key '{group}.queue' must be a Kueue LocalQueue's name (a label value: at most 63 "
                          f"letters, digits, '-', '_' or '.'), got {pod.queue!r}")
    if pod.priority_class and not OBJECT_NAME.match(pod.priority_class):
        raise ConfigError(f"config key '{group}.priority_class' must be a PriorityClass's name (lower case letters, "
                          f"digits, '-' and '.'), got {pod.priority_class!r}")
    for toleration in pod.tolerations:
        check_toleration(group, toleration)
    containers = pod.pod_spec_patch.get("containers", [])
    if not isinstance(containers, list) or not all(isinstance(c, dict) and "name" in c for c in containers):
        raise ConfigError(f"config key '{group}.pod_spec_patch' must list its containers each with its name (the "
                          f"strategic merge matches them by name; Argo's is main), got {containers!r}")


def check_toleration(group: str, toleration: dict) -> None:
    """A Kubernetes Toleration: its known fields only, a known operator and effect, whole seconds."""
    unknown = [name for name in toleration if name not in TOLERATION_FIELDS]
    if unknown:
        raise ConfigError(f"config key '{group}.tolerations' has a toleration with the unknown field {unknown[0]!r}; "
                          f"a toleration has {', '.join(TOLERATION_FIELDS)}")
    for name, choices in TOLERATION_CHOICES.items():
        if name in toleration and toleration[name] not in choices:
            raise ConfigError(f"config key '{group}.tolerations' has {name} {toleration[name]!r}; "
                              f"give one of {', '.join(choices)}")
    seconds = toleration.get("tolerationSeconds", 0)
    if not isinstance(seconds, int) or isinstance(seconds, bool):
        raise ConfigError(f"config key '{group}.tolerations' has tolerationSeconds "
                          f"{toleration['tolerationSeconds']!r}; give whole seconds")


def check_hub_model(config: RunConfig) -> None:
    """A hub `model` names a repository as the hub spells them, and `hub_endpoint` is an http(s) URL."""
    if config.model.startswith(HUB_SCHEME) and hub_model(config.model) is None:
        raise ConfigError(f"config key 'model' names a hub model as hf://org/name[@revision] (letters, digits, '-', "
                          f"'_' and '.'), got {config.model!r}")
    if not config.hub_endpoint.startswith(("http://", "https://")):
        raise ConfigError(f"config key 'hub_endpoint' must be an http:// or https:// URL (the hub's, e.g. "
                          f"https://huggingface.co), got {config.hub_endpoint!r}")


def check_vision_serving(config: RunConfig) -> None:
    """The vision keys: at least one image per prompt, a pixel cap of 0 (the checkpoint's) or at least one
    merged patch, and a chat template file that is there."""
    if config.image_limit < 1:
        raise ConfigError(f"config key 'image_limit' must be 1 or more (images per prompt), got {config.image_limit}")
    if config.max_pixels != 0 and config.max_pixels < MIN_MAX_PIXELS:
        raise ConfigError(f"config key 'max_pixels' must be 0 (the checkpoint's cap) or at least {MIN_MAX_PIXELS} "
                          f"(one merged patch of 28x28 pixels), got {config.max_pixels}")
    template = Path(config.chat_template)
    if config.chat_template and not (template.is_file() or (REPO_ROOT / template).is_file()):
        raise ConfigError(f"config key 'chat_template' must be empty (the checkpoint's) or a Jinja template file, "
                          f"and {config.chat_template!r} is not a file")


CURRICULA = ("off", "pass_rate")  # how the plan chooses an iteration's tasks (steps.curriculum)


def check_learning_signal(config: RunConfig) -> None:
    """Refuses learning-signal keys out of range: a curriculum that is not one of `CURRICULA`, its bounds outside
    0 <= curriculum_min_pass < curriculum_max_pass <= 1, a pass reward of 0 or less, a window or fill rounds below
    1."""
    if config.curriculum not in CURRICULA:
        raise ConfigError(f"config key 'curriculum' must be one of {', '.join(CURRICULA)}, got {config.curriculum!r}")
    for key in ("curriculum_window", "max_fill_rounds"):
        if getattr(config, key) < 1:
            raise ConfigError(f"config key {key!r} must be at least 1, got {getattr(config, key)}")
    if config.curriculum_pass_reward <= 0:
        raise ConfigError(f"config key 'curriculum_pass_reward' must be more than 0 (the reward a pass needs), got "
                          f"{config.curriculum_pass_reward}")
    if not 0 <= config.curriculum_min_pass < config.curriculum_max_pass <= 1:
        raise ConfigError(f"config keys 'curriculum_min_pass' and 'curriculum_max_pass' must satisfy 0 <= min < max "
                          f"<= 1 (pass rates), got {config.curriculum_min_pass} and {config.curriculum_max_pass}")


def check_lora(config: RunConfig) -> None:
    """Refuses LoRA keys the update would refuse (`steps.update.config`), now rather than at the first update."""
    if config.lora_rank < 0:
        raise ConfigError(f"config key 'lora_rank' must be 0 (LoRA off) or more, got {config.lora_rank}")
    if config.lora_rank > VLLM_LORA_RANKS[-1]:  # vLLM's --max-lora-rank takes no more (steps.vllm_server.lora_flags)
        raise ConfigError(f"config key 'lora_rank' must be at most {VLLM_LORA_RANKS[-1]}, the largest rank vLLM "
                          f"serves, got {config.lora_rank}")
    if config.lora_alpha < 1:
        raise ConfigError(f"config key 'lora_alpha' must be at least 1, got {config.lora_alpha}")
    if not config.lora_target_modules or not all(name.strip() for name in config.lora_target_modules):
        raise ConfigError(f"config key 'lora_target_modules' must be a non-empty list of module names (e.g. "
                          f"[q_proj, v_proj]) or [all-linear], got {list(config.lora_target_modules)}")
    if config.lora_rank and (config.model == TINY_VISION_MODEL or is_vision(model_folder(config))):
        raise ConfigError(f"config key 'lora_rank' is {config.lora_rank} but the model {config.model!r} is a "
                          "vision-language model, which a LoRA update does not train yet; set lora_rank to 0")
    check_model_cache(config)


def check_model_cache(config: RunConfig) -> None:
    """Refuses a `model_cache_volume` that is no claim's name, or that a full-weight run would not use."""
    cache = config.model_cache_volume
    # A PersistentVolumeClaim's name is a DNS-1123 subdomain (Kubernetes' pkg/apis/core/validation/validation.go,
    # ValidatePersistentVolumeName, NameIsDNSSubdomain, which ValidatePersistentVolumeClaim applies).
    if cache and not (re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", cache) and len(cache) <= 253):
        raise ConfigError(f"config key 'model_cache_volume' must be a PersistentVolumeClaim's name (a DNS-1123 "
                          f"subdomain: lower-case letters, digits, '-' and '.'), or empty, got {cache!r}")
    if cache and config.lora_rank <= 0:
        raise ConfigError("config key 'model_cache_volume' caches a LoRA run's base model across iterations; set "
                          "lora_rank above 0, or leave it empty (a full-weight run serves a new model each iteration)")


def check_update_config(config: RunConfig) -> None:
    """The update step's own checks of its config file with the run's overrides (`update_args` and the keys the
    run sets), now rather than after the first iteration's rollouts (`steps.update.config`); and that its
    micro-batch holds the longest sample the served model can make (`check_micro_batch`)."""
    for item in config.update_args:
        key = item.partition("=")[0].strip()
        if "=" not in item:
            raise ConfigError(f"config key 'update_args' takes key=value overrides of the update's config "
                              f"(e.g. \"mini_batches=4\"), got {item!r}")
        if key in RUN_UPDATE_KEYS:
            raise ConfigError(f"config key 'update_args' may not set {key!r}, which the run sets itself; set the "
                              f"run's {RUN_UPDATE_KEYS[key]!r} instead")
    try:
        update = update_config.load_config(REPO_ROOT / config.update_config, update_overrides(config))
    except ConfigError as exc:
        raise ConfigError(f"the update's config ({config.update_config} with the run's update_args, adv_estimator, "
                          f"learning_rate, epochs and seed): {exc}") from None
    if not config.upstream:  # an upstream is only evaluated: nothing is trained
        check_micro_batch(config, update.max_tokens_per_micro_batch)


def check_micro_batch(config: RunConfig, micro_batch: int) -> None:
    """Refuses a micro-batch smaller than the longest sample: a sample (a call's prompt + response) is at most
    `max_model_len` tokens and is never split over micro-batches, and the update refuses a longer one only after
    the iteration's rollouts ran (`steps.update.samples.check_inputs`). `max_model_len` 0 is the model's own length,
    read from its config.json when it is a folder here; elsewhere it is checked by `validate_for_argo`."""
    longest = config.max_model_len or model_length(model_folder(config))
    if longest and micro_batch < longest:
        source = f"max_model_len={config.max_model_len}" if config.max_model_len else \
            f"max_model_len=0 (the model's own {longest})"
        raise ConfigError(f"the update's max_tokens_per_micro_batch={micro_batch} is less than {source}, so a "
                          f"sample that long would be refused after its rollouts ran; set update_args: "
                          f"[\"max_tokens_per_micro_batch={longest}\"] or more, or a smaller max_model_len")


def model_folder(config: RunConfig) -> Path:
    """The model as a folder on this machine (it may not be one: an s3:// URL, a hub id, one not built yet)."""
    return Path(config.model) if Path(config.model).exists() else REPO_ROOT / config.model


def model_length(folder: Path) -> int:
    """The longest prompt + response the checkpoint in `folder` takes as vLLM derives it with no max_model_len:
    the smallest of its text config's length keys (vLLM 0.32
    `ModelArchConfigConvertorBase.derive_max_model_len_and_key`; rope scaling, which no checkpoint here ships, is
    not applied); 0 when there is no readable config.json.

    >>> model_length(Path("/nonexistent"))
    0
    """
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    text = raw.get("text_config") or raw
    lengths = [text[key] for key in MODEL_LENGTH_KEYS if isinstance(text.get(key), int)]
    return text["model_max_length"] if isinstance(text.get("model_max_length"), int) else min(lengths, default=0)


# The most rollouts an iteration's Workflow plans without node-status offload. Argo stores a Workflow as one object
# and, past MAX_WORKFLOW_SIZE (1 MiB by default, workflow/packer/packer.go `getMaxWorkflowSize`), gzips its
# status.nodes into status.compressedNodes; when the object is still larger it fails the Workflow unless the controller
# offloads node status to its database (workflow/hydrator/hydrator.go `Dehydrate`). Each rollout is a Retry node and
# a Pod node, about 3.9 KB of node status (its item in their names and inputs), about 190 bytes compressed (the model
# in tests/argo_status.py: 1,000 rollouts 0.25 MB compressed, 10,000 2.3 MB). 2,000 keep it under half the limit,
# which leaves room for retried attempts (a Pod node each) and failure messages.
MAX_ROLLOUTS_WITHOUT_OFFLOAD = 2000


def planned_rollouts(config: RunConfig, tasks: int, eval_tasks: int, evaluation: bool = False) -> int:
    """The most rollouts one Workflow of the run plans, given its datasets' task counts: an iteration's
    `tasks_per_iteration` (at most the dataset's `tasks`) x `samples_per_task`, with `eval_every` its evaluation's
    `eval_tasks` x `eval_k` beside them; an eval run's (`evaluation`) `eval_tasks` x `eval_k`.

    >>> planned_rollouts(RunConfig(tasks_per_iteration=64, samples_per_task=8, eval_every=5, eval_k=3), 14, 500)
    1612
    """
    evaluated = eval_tasks * config.eval_k
    if evaluation:
        return evaluated
    return min(config.tasks_per_iteration, tasks) * config.samples_per_task + (evaluated if config.eval_every else 0)


def check_workflow_size(config: RunConfig, tasks: int, eval_tasks: int, evaluation: bool = False) -> None:
    """A ConfigError when a Workflow of the run plans more than `MAX_ROLLOUTS_WITHOUT_OFFLOAD` rollouts
    (`planned_rollouts`) and the config does not say that the Argo controller offloads node status."""
    planned = planned_rollouts(config, tasks, eval_tasks, evaluation)
    if planned > MAX_ROLLOUTS_WITHOUT_OFFLOAD and not config.argo_node_status_offload:
        raise ConfigError(f"a Workflow of this run plans up to {planned} rollouts, more than "
                          f"{MAX_ROLLOUTS_WITHOUT_OFFLOAD} without the Argo controller's node status offload: enable "
                          f"persistence.nodeStatusOffLoad in workflow-controller-configmap and set "
                          f"argo_node_status_offload: true, or plan fewer (docs/workflows.md, \"Size\")")


def validate_for_argo(config: RunConfig, training: bool = True) -> None:
    """What a cluster run needs beyond `validate`: pods share nothing but the store, so it must be S3 (and so
    must the model, unless it is a hub model, fetched into the store, or an `upstream` serves the evaluation and
    nothing is loaded); a `training` run must set `max_model_len`, which its update's micro-batch is checked
    against."""
    if training and config.fill_batch:
        raise ConfigError("config key 'fill_batch' is for the local runner only: an Argo iteration's DAG plans its "
                          "rollouts once, so set fill_batch: false (dropping flat groups and the curriculum still apply)")
    hub = config.model.startswith(HUB_SCHEME)
    for key in ("store", *(() if config.upstream or hub else ("model",))):
        if not getattr(config, key).startswith("s3://"):
            hub_too = " or a hub model, hf://org/name," if key == "model" else ""
            raise ConfigError(f"config key {key!r} must be an s3:// URL{hub_too} for an Argo run (pods share no "
                              f"folder), got {getattr(config, key)!r}")
    if training and not config.max_model_len:  # the model is not here to read its length from
        raise ConfigError("config key 'max_model_len' must be set for an Argo run (0, the model's own length, "
                          "cannot be read before the model is fetched), e.g. 40960 for Qwen3; the update's "
                          "max_tokens_per_micro_batch must be at least that")
    # The datasets go to the store at submit (workflows.datasets); the update's config is read in the images.
    if Path(config.update_config).is_absolute():
        raise ConfigError(f"config key 'update_config' must be relative to the repository for an Argo run "
                          f"(the images hold it at /opt/openforge/app), got {config.update_config!r}")
    if config.s3_credentials == "pod-identity" and config.rollout_service_account in ("", config.service_account):
        raise ConfigError(f"config key 'rollout_service_account' must name a service account other than "
                          f"service_account ({config.service_account!r}) when s3_credentials is pod-identity: the "
                          f"rollout pods run the agent, which must not get the store's identity (docs/workflows.md, "
                          f"\"Credentials\")")
    for cidr in egress_cidrs(config):
        try:
            ipaddress.ip_network(cidr)
        except ValueError:
            raise ConfigError(f"config key 'rollout_egress_cidrs' must be auto or list CIDRs such as 10.0.0.1/32, "
                              f"separated by commas; {cidr!r} is not one") from None


def egress_auto(config: RunConfig) -> bool:
    """Whether `rollout_egress_cidrs` is `auto`: the driver reads the API server's addresses from the cluster at
    submit (`workflows.preflight.with_api_server`); until then the rollout pods' policy lists no CIDR."""
    return config.rollout_egress_cidrs.strip() == EGRESS_AUTO


def egress_cidrs(config: RunConfig) -> list[str]:
    """`rollout_egress_cidrs` as a list (none for an unresolved `auto`).

    >>> egress_cidrs(RunConfig(rollout_egress_cidrs=" 10.0.0.1/32, 10.96.0.0/12 ,"))
    ['10.0.0.1/32', '10.96.0.0/12']
    >>> egress_cidrs(RunConfig(rollout_egress_cidrs="auto"))
    []
    """
    if egress_auto(config):
        return []
    return [cidr.strip() for cidr in config.rollout_egress_cidrs.split(",") if cidr.strip()]
