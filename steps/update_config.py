"""The update step's config: a flat YAML (`configs/update.yaml`) loaded into `UpdateConfig`, `key=value` overrides."""

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import yaml

CORRECTIONS = ("bypass", "tis")
COMPUTE_DTYPES = ("bf16", "fp32")
# veRL's outcome-reward estimators that need nothing but rewards and groups (no critic, no baselines).
ADV_ESTIMATORS = ("grpo", "grpo_passk", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gpg")


class ConfigError(ValueError):
    """A bad config field: the message names it and what would be accepted."""


@dataclass
class UpdateConfig:
    """Hyperparameters of one policy update (meanings in `configs/update.yaml`)."""

    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    grad_clip: float = 1.0
    carry_optimizer: bool = True
    epochs: int = 1
    mini_batches: int = 1
    policy_loss: str = "vanilla"
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    entropy_coeff: float = 0.0
    adv_estimator: str = "grpo"
    norm_adv_by_std_in_grpo: bool = True
    correction: str = "bypass"
    tis_threshold: float = 2.0
    temperature: float = 1.0
    max_tokens_per_micro_batch: int = 16384
    compute_dtype: str = "bf16"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.correction not in CORRECTIONS:
            raise ConfigError(f"correction={self.correction!r}: use one of {', '.join(CORRECTIONS)}")
        for name in ("epochs", "mini_batches", "max_tokens_per_micro_batch"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)}: must be a positive integer")
        if self.adv_estimator not in ADV_ESTIMATORS:
            raise ConfigError(f"adv_estimator={self.adv_estimator!r}: use one of {', '.join(ADV_ESTIMATORS)}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ConfigError(f"compute_dtype={self.compute_dtype!r}: use one of {', '.join(COMPUTE_DTYPES)}")
        if self.temperature <= 0:
            raise ConfigError(f"temperature={self.temperature}: must be > 0")


def _convert(name: str, raw: str, kind: type):
    """Parse an override's text as the field's type (YAML syntax, so `betas=[0.9,0.95]` works)."""
    value = yaml.safe_load(raw)
    if kind is float and not isinstance(value, bool):
        try:
            value = float(value)  # YAML reads "3e-6" (no dot) as a string
        except (TypeError, ValueError):
            pass
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ConfigError(f"{name}={raw!r}: expected a {kind.__name__}")
    return value


def load_config(path: str | Path | None, overrides: list[str] = ()) -> UpdateConfig:
    """`UpdateConfig` from a flat YAML file (None: the defaults) with `key=value` overrides applied.

    >>> load_config(None, ["lr=3e-6", "correction=tis"]).lr
    3e-06
    """
    fields = {f.name: f for f in dataclasses.fields(UpdateConfig)}
    values = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as error:
            raise ConfigError(f"{path}: cannot read the config ({error})") from error
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a flat mapping of UpdateConfig fields")
        values.update(loaded)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r}: write it as key=value")
        if key not in fields:
            raise ConfigError(f"override {key!r}: not a config field; fields are {', '.join(fields)}")
        values[key] = _convert(key, raw, eval_type(fields[key].type))
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"{path}: unknown field(s) {', '.join(unknown)}; fields are {', '.join(fields)}")
    for key, value in values.items():
        if eval_type(fields[key].type) is float and isinstance(value, int | str) and not isinstance(value, bool):
            values[key] = _convert(key, str(value), float)
    return UpdateConfig(**values)


def eval_type(annotation) -> type:
    """The runtime type of a field annotation (`float`, `int`, `str`, `bool`, or `list` for lists)."""
    if isinstance(annotation, str):
        return {"float": float, "int": int, "str": str, "bool": bool}.get(annotation, list)
    return list if getattr(annotation, "__origin__", None) is list else annotation
