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
import time
from dataclasses import dataclass
from pathlib import Path

from steps import net, sampling, settings
from steps.harnesses import ALL_HARNESSES as HARNESSES
from steps.plan import MAX_EVAL_K
from steps.sandbox.common import MIB, Bounds
from steps.settings import ConfigError
from steps.vllm_parsers import REASONING_PARSERS, TOOL_CALL_PARSERS, UnknownFamily, tool_call_parser_for
from steps.vllm_server import check_vllm_args
from workflows import layout


REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO_ROOT / "configs" / "default.yaml"
# More update nodes than any cluster this targets, refused at load rather than at run time; the JobSet's pod names
# are checked against JobSet's 63 characters up to here (workflows.jobset, tests/test_workflows.py).
MAX_UPDATE_NODES = 1000
MIN_MAX_PIXELS = 28 * 28  # the smallest pixel cap that still holds one merged patch (Qwen2.5-VL's 2x2 of 14 px)


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs; the same object drives the Argo workflows and the local runner."""

    harness: str = "codex"
    run: str = ""  # empty: <harness>-<UTC timestamp>, filled in by `with_run_name`
    model: str = "runs/tiny-model"  # base checkpoint: local folder or s3:// URL
    model_name: str = "tiny"
    dataset: str = "steps/tasks/builtin"
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
    # the update: its own flat YAML (steps/update/config.py), plus these run-level settings as overrides
    update_config: str = "configs/update.yaml"
    adv_estimator: str = "grpo"  # veRL's advantage estimator: grpo, rloo, ... (steps/update/config.py)
    learning_rate: float = 1e-6  # AdamW's, constant
    epochs: int = 1  # passes over the iteration's samples
    # where everything goes
    store: str = "runs"  # local folder or s3:// URL
    s3_endpoint: str = ""  # e.g. http://minio.openforge.svc:9000; empty: AWS
    report_url_base: str = ""  # an http(s) URL serving the store's root to browsers: the Workflows link the report there
    # the cluster (used only with an Argo server)
    argo_server: str = ""  # empty: run locally
    namespace: str = "openforge"
    service_account: str = "openforge"
    s3_secret: str = "openforge-s3"  # keys access-key, secret-key
    admin_secret: str = "openforge-admin"  # key admin-key
    image_registry: str = "ghcr.io/openforge"
    image_tag: str = "0.1.0"
    serve_gpus: int = 1  # per replica: vLLM's tensor parallelism
    update_gpus: int = 1  # per update node: torchrun's processes there (FSDP2 shards the model over all of them)
    update_nodes: int = 1  # more than 1: the update runs as a JobSet across that many pods (docs/workflows.md)
    update_timeout_s: int = 6 * 3600  # update_nodes > 1: the JobSet fails this long after it started, Pending included
    rollout_retries: int = 3
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
    rollout_egress_cidrs: str = ""  # comma-separated CIDRs rollout pods may reach too: Argo's executor needs the
    # Kubernetes API server and the S3 endpoint (the preflight names the API server's addresses)
    rollout_dns: bool = False  # let rollout pods ask kube-dns (the executor reaching S3 by name needs it)
    rollout_oom_guard: bool = True  # the rollout container gets SYS_RESOURCE so its runner outlives an OOM kill

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
    model = Path(config.model) if Path(config.model).exists() else REPO_ROOT / config.model
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
    """The update step's own checks of its config file with the run's overrides, now rather than after the
    first iteration's rollouts (`steps.update.config`)."""
    from steps.update import config as update_config
    from workflows.commands import update_overrides  # here: commands imports this module

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
    must the model, unless an `upstream` serves the evaluation and nothing is loaded)."""
    for key in ("store", *(() if config.upstream else ("model",))):
        if not getattr(config, key).startswith("s3://"):
            raise ConfigError(f"config key {key!r} must be an s3:// URL for an Argo run (pods share no folder), "
                              f"got {getattr(config, key)!r}")
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
