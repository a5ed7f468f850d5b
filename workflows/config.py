"""A run's settings: one flat YAML file loaded into `RunConfig`, with `key=value` overrides.

    config = load_config("configs/cluster-example.yaml", ["iterations=3", "harness=direct"])

`configs/default.yaml` holds every key with the embedded default's value; a `--config FILE` only
names what it changes. Every problem (an unknown key, a value of the wrong type, an unknown harness,
a dataset that is not there) is a `ConfigError` with one sentence naming the field, raised before
anything starts.
"""

import difflib
import ipaddress
import json
from pathlib import Path

from steps import net, sampling, settings
from steps.harnesses import ALL_HARNESSES as HARNESSES
from steps.plan import MAX_EVAL_K
from steps.settings import ConfigError
from steps.vllm_parsers import REASONING_PARSERS, TOOL_CALL_PARSERS, UnknownFamily, tool_call_parser_for
from steps.update import config as update_config
from steps.vllm_server import check_vllm_args
from workflows.commands import RUN_UPDATE_KEYS, update_overrides
from steps.contracts.config import RunConfig


REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO_ROOT / "configs" / "default.yaml"
# More update nodes than any cluster this targets, refused at load rather than at run time; the JobSet's pod names
# are checked against JobSet's 63 characters up to here (workflows.jobset, tests/test_workflows.py).
MAX_UPDATE_NODES = 1000
# vLLM's keys for a model's length, in its order (model_arch_config_convertor.derive_max_model_len_and_key).
MODEL_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                     "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
MIN_MAX_PIXELS = 28 * 28  # the smallest pixel cap that still holds one merged patch (Qwen2.5-VL's 2x2 of 14 px)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                check_dataset: bool = True) -> RunConfig:
    """Defaults, then the YAML file at `path`, then `key=value` overrides; checked field by field
    (`steps.settings`: strict types, a renamed or misspelt key named)."""
    config = settings.load(RunConfig, [DEFAULT_CONFIG, *([path] if path else [])], overrides)
    validate(config, check_dataset=check_dataset)
    return config


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
                "epochs", "eval_k", "update_nodes", "serve_replicas", "update_timeout_s"):
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
    if not (REPO_ROOT / config.update_config).is_file():
        raise ConfigError(f"update_config {config.update_config!r} is not a file; give the update step's flat YAML, "
                          f"relative to the repository (e.g. configs/update.yaml)")
    check_update_config(config)
    if config.report_url_base and not config.report_url_base.startswith(("http://", "https://")):
        raise ConfigError(f"config key 'report_url_base' must be an http:// or https:// URL at which a browser opens "
                          f"the store's root (e.g. https://reports.example.com/runs), got {config.report_url_base!r}")
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
    the iteration's rollouts ran (`steps.update.train.check_inputs`). `max_model_len` 0 is the model's own length,
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


def dataset_path(config: RunConfig, dataset: str | None = None) -> Path:
    """The dataset (or another one, `dataset`) on this machine: absolute, or relative to the repository (where
    the steps image has it)."""
    path = Path(config.dataset if dataset is None else dataset)
    return path if path.is_absolute() else REPO_ROOT / path


def validate_for_argo(config: RunConfig, training: bool = True) -> None:
    """What a cluster run needs beyond `validate`: pods share nothing but the store, so it must be S3 (and so
    must the model, unless an `upstream` serves the evaluation and nothing is loaded); a `training` run must set
    `max_model_len`, which its update's micro-batch is checked against."""
    for key in ("store", *(() if config.upstream else ("model",))):
        if not getattr(config, key).startswith("s3://"):
            raise ConfigError(f"config key {key!r} must be an s3:// URL for an Argo run (pods share no folder), "
                              f"got {getattr(config, key)!r}")
    if training and not config.max_model_len:  # the model is not here to read its length from
        raise ConfigError("config key 'max_model_len' must be set for an Argo run (0, the model's own length, "
                          "cannot be read before the model is fetched), e.g. 40960 for Qwen3; the update's "
                          "max_tokens_per_micro_batch must be at least that")
    for key in ("dataset", "update_config"):
        if Path(getattr(config, key)).is_absolute():
            raise ConfigError(f"config key {key!r} must be relative to the repository for an Argo run "
                              f"(the images hold the repository at /opt/openforge/app), got {getattr(config, key)!r}")
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
