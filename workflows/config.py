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
import re
from pathlib import Path

from steps import net, sampling, settings
from steps.fetch_model import hub_model
from steps.harnesses import ALL_HARNESSES as HARNESSES
from steps.plan import MAX_EVAL_K
from steps.settings import ConfigError
from steps.vllm_parsers import REASONING_PARSERS, TOOL_CALL_PARSERS, UnknownFamily, tool_call_parser_for
from steps.update import config as update_config
from steps.vllm_server import check_vllm_args
from workflows.commands import update_overrides
from steps.contracts.config import RunConfig
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
MIN_MAX_PIXELS = 28 * 28  # the smallest pixel cap that still holds one merged patch (Qwen2.5-VL's 2x2 of 14 px)
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
                "epochs", "eval_k", "update_nodes", "serve_replicas", "update_timeout_s", "driver_deadline_s"):
        if getattr(config, key) < 1:
            raise ConfigError(f"config key {key!r} must be at least 1, got {getattr(config, key)}")
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
    for key in ("serve_gpus", "update_gpus", "rollout_retries", "seed", "eval_every", "max_staleness",
                "harness_memory_mb"):
        if getattr(config, key) < 0:
            raise ConfigError(f"config key {key!r} must be 0 or more, got {getattr(config, key)}")
    check_serving(config)
    # A Secret's name is a DNS subdomain (kubernetes.io/docs/concepts/overview/working-with-objects/names/).
    secret = config.registry_secret
    if not (re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", secret) and len(secret) <= 253):
        raise ConfigError(f"config key 'registry_secret' must be a Kubernetes Secret's name (lower-case letters, "
                          f"digits, '-' and '.'), got {secret!r}")
    if config.learning_rate <= 0:
        raise ConfigError(f"config key 'learning_rate' must be more than 0, got {config.learning_rate}")
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
    if config.report_url_base and not config.report_url_base.startswith(("http://", "https://")):
        raise ConfigError(f"config key 'report_url_base' must be an http:// or https:// URL at which a browser opens "
                          f"the store's root (e.g. https://reports.example.com/runs), got {config.report_url_base!r}")
    if not config.argo_server_in_cluster.startswith(("http://", "https://")):
        raise ConfigError(f"config key 'argo_server_in_cluster' must be an http:// or https:// URL at which a pod reaches "
                          f"the Argo Server (e.g. https://argo-server.argo:2746), got {config.argo_server_in_cluster!r}")
    if config.upstream and not net.is_upstream_url(config.upstream):
        # Not echoed: a URL refused here may hold a password or a key.
        raise ConfigError(f"config key 'upstream' must be {net.UPSTREAM_URL}: the base of an OpenAI-compatible server")
    if check_dataset and config.eval_dataset and not dataset_path(config, config.eval_dataset).exists():
        raise ConfigError(f"eval_dataset {config.eval_dataset!r} does not exist (looked in "
                          f"{dataset_path(config, config.eval_dataset)}); give a task folder, a folder of task "
                          f"folders, or a .txt/.yaml list")
    if check_dataset and not dataset_path(config).exists():
        raise ConfigError(f"dataset {config.dataset!r} does not exist (looked in {dataset_path(config)}); "
                          f"give a task folder, a folder of task folders, or a .txt/.yaml list")


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
    model = Path(config.model) if Path(config.model).exists() else REPO_ROOT / config.model
    if not config.tool_call_parser and (model / "config.json").is_file():
        try:
            tool_call_parser_for(model)
        except UnknownFamily as exc:
            raise ConfigError(str(exc)) from None


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


def check_update_config(config: RunConfig) -> None:
    """The update step's own checks of its config file with the run's overrides, now rather than after the
    first iteration's rollouts (`steps.update.config`)."""
    try:
        update_config.load_config(REPO_ROOT / config.update_config, update_overrides(config))
    except ConfigError as exc:
        raise ConfigError(f"the update's config ({config.update_config} with the run's adv_estimator, learning_rate, "
                          f"epochs and seed): {exc}") from None


def dataset_path(config: RunConfig, dataset: str | None = None) -> Path:
    """The dataset (or another one, `dataset`) on this machine: absolute, or relative to the repository (where
    the steps image has it)."""
    path = Path(config.dataset if dataset is None else dataset)
    return path if path.is_absolute() else REPO_ROOT / path


def validate_for_argo(config: RunConfig) -> None:
    """What a cluster run needs beyond `validate`: pods share nothing but the store, so it must be S3 (and so
    must the model, unless it is a hub model, fetched into the store, or an `upstream` serves the evaluation and
    nothing is loaded)."""
    hub = config.model.startswith(HUB_SCHEME)
    for key in ("store", *(() if config.upstream or hub else ("model",))):
        if not getattr(config, key).startswith("s3://"):
            hub_too = " or a hub model, hf://org/name," if key == "model" else ""
            raise ConfigError(f"config key {key!r} must be an s3:// URL{hub_too} for an Argo run (pods share no "
                              f"folder), got {getattr(config, key)!r}")
    for key in ("dataset", "update_config"):
        if Path(getattr(config, key)).is_absolute():
            raise ConfigError(f"config key {key!r} must be relative to the repository for an Argo run "
                              f"(the images hold the repository at /opt/openforge/app), got {getattr(config, key)!r}")
    if config.s3_credentials == "pod-identity" and config.rollout_service_account in ("", config.service_account):
        raise ConfigError(f"config key 'rollout_service_account' must name a service account other than "
                          f"service_account ({config.service_account!r}) when s3_credentials is pod-identity: the "
                          f"rollout pods run the agent, which must not get the store's identity (docs/workflows.md, "
                          f"\"Credentials\")")
    for cidr in egress_cidrs(config):
        try:
            ipaddress.ip_network(cidr)
        except ValueError:
            raise ConfigError(f"config key 'rollout_egress_cidrs' must list CIDRs such as 10.0.0.1/32, separated by "
                              f"commas; {cidr!r} is not one") from None


def egress_cidrs(config: RunConfig) -> list[str]:
    """`rollout_egress_cidrs` as a list.

    >>> egress_cidrs(RunConfig(rollout_egress_cidrs=" 10.0.0.1/32, 10.96.0.0/12 ,"))
    ['10.0.0.1/32', '10.96.0.0/12']
    """
    return [cidr.strip() for cidr in config.rollout_egress_cidrs.split(",") if cidr.strip()]
