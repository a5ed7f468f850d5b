"""The update step's config: a flat YAML (`configs/update.yaml`) loaded into `UpdateConfig`, `key=value` overrides.

Every field is checked when an `UpdateConfig` is made, so a bad config stops the step before a model is
loaded: an unknown key, a value of the wrong type, a value out of range or a misspelt choice is a
`ConfigError` with one sentence naming the key and what it accepts. Types are strict: a whole number is
not written as '2', a boolean is YAML's unquoted true/false (or yes/no, on/off), never a quoted string
such as 'no'. A number field also takes a plain string that reads as a number ("3e-6": YAML 1.1 reads
an exponent without a dot as a string), never NaN or infinity.
"""

import dataclasses
import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

CORRECTIONS = ("bypass", "tis")
COMPUTE_DTYPES = ("bf16", "fp32")
# veRL's outcome-reward estimators that need nothing but rewards and groups (no critic, no baselines).
ADV_ESTIMATORS = ("grpo", "grpo_passk", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gpg")
# veRL 0.9.1's registered policy losses (core_algos.POLICY_LOSS_REGISTRY) but "bypass_mode", which wants
# veRL's own rollout-correction config: `correction` does that here.
POLICY_LOSSES = ("vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro",
                 "cispo")
# veRL 0.9.1's loss aggregations (core_algos.agg_loss).
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
CHOICES = {"correction": CORRECTIONS, "compute_dtype": COMPUTE_DTYPES, "adv_estimator": ADV_ESTIMATORS,
           "policy_loss": POLICY_LOSSES, "loss_agg_mode": LOSS_AGG_MODES}
# Each number field's allowed range: (test, what the message says is accepted).
RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "lr": (lambda v: v > 0, "a number > 0"),
    "weight_decay": (lambda v: v >= 0, "a number >= 0"),
    "grad_clip": (lambda v: v > 0, "a number > 0"),
    "epochs": (lambda v: v >= 1, "a whole number >= 1"),
    "mini_batches": (lambda v: v >= 1, "a whole number >= 1"),
    "clip_ratio_low": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "clip_ratio_high": (lambda v: v >= 0, "a number >= 0"),
    "clip_ratio_c": (lambda v: v > 1, "a number > 1 (veRL's dual-clip bound)"),
    "entropy_coeff": (lambda v: v >= 0, "a number >= 0"),
    "tis_threshold": (lambda v: v > 0, "a number > 0"),
    "temperature": (lambda v: v > 0, "a number > 0"),
    "max_tokens_per_micro_batch": (lambda v: v >= 1, "a whole number >= 1"),
    "seed": (lambda v: 0 <= v < 2**32, "a whole number in [0, 2**32)"),
}
TYPE_WORDS = {float: "a number", int: "a whole number", bool: "true or false (a YAML boolean, unquoted)",
              str: "a string", list: "a list of two numbers in [0, 1), e.g. [0.9, 0.999]"}


class ConfigError(ValueError):
    """A bad config field: the message names it and what would be accepted."""


@dataclass
class UpdateConfig:
    """Hyperparameters of one policy update (meanings in `configs/update.yaml`); checked when made."""

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
    temperature: float = 1.0  # set by the run: the temperature its rollouts were sampled at
    unmatched_sampling: str = ""  # set by the run: sampling it cannot reproduce ("top_p=0.9"), named in the metrics
    max_tokens_per_micro_batch: int = 16384
    compute_dtype: str = "bf16"
    seed: int = 0

    def __post_init__(self) -> None:
        for item in dataclasses.fields(self):
            setattr(self, item.name, checked(item.name, getattr(self, item.name), eval_type(item.type)))


def checked(name: str, value, kind: type):
    """`value` for field `name` of type `kind` (ints become floats in a float field), or a ConfigError.

    >>> checked("lr", 1, float), checked("betas", [0.9, 0.95], list)
    (1.0, [0.9, 0.95])
    """
    shown = f"{name}={value!r}"
    if kind is list:
        if not (isinstance(value, list | tuple) and len(value) == 2
                and all(_is_number(beta) and 0 <= beta < 1 for beta in value)):
            raise ConfigError(f"{shown}: expected {TYPE_WORDS[list]}")
        return [float(beta) for beta in value]
    if kind is float and _is_number(value):
        value = float(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        unquote = " (written without quotes)" if isinstance(value, str) and kind is int else ""
        raise ConfigError(f"{shown}: expected {RANGES[name][1] if name in RANGES else TYPE_WORDS[kind]}{unquote}")
    if kind is float and not math.isfinite(value):
        raise ConfigError(f"{shown}: expected {RANGES[name][1] if name in RANGES else 'a finite number'}")
    if name in RANGES and not RANGES[name][0](value):
        raise ConfigError(f"{shown}: expected {RANGES[name][1]}")
    if name in CHOICES and value not in CHOICES[name]:
        close = difflib.get_close_matches(value, CHOICES[name], n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"{shown}: use one of {', '.join(CHOICES[name])}{hint}")
    return value


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _as_number(value, kind: type):
    """A float field's plain string that reads as a number, as that number (YAML 1.1 reads "3e-6" as a
    string); anything else unchanged, for `checked` to judge."""
    if kind is float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def load_config(path: str | Path | None, overrides: list[str] = ()) -> UpdateConfig:
    """`UpdateConfig` from a flat YAML file (None: the defaults) with `key=value` overrides applied.

    An override's value is read as YAML, so `betas=[0.9,0.95]` and `carry_optimizer=false` work.

    >>> load_config(None, ["lr=3e-6", "correction=tis"]).lr
    3e-06
    """
    fields = {f.name: f for f in dataclasses.fields(UpdateConfig)}
    values, sources = {}, {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as error:
            raise ConfigError(f"{path}: cannot read the config ({error})") from error
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a flat mapping of UpdateConfig fields")
        values.update((str(key), value) for key, value in loaded.items())
        sources.update((str(key), str(path)) for key in loaded)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r}: write it as key=value")
        values[key], sources[key] = (yaml.safe_load(raw) if raw.strip() else None), f"override {item!r}"
    for key in values:
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else f"the keys are {', '.join(fields)}"
            raise ConfigError(f"unknown config key {key!r} ({sources[key]}); {hint}")
    return UpdateConfig(**{key: _as_number(value, eval_type(fields[key].type)) for key, value in values.items()})


def eval_type(annotation) -> type:
    """The runtime type of a field annotation (`float`, `int`, `str`, `bool`, or `list` for lists)."""
    if isinstance(annotation, str):
        return {"float": float, "int": int, "str": str, "bool": bool}.get(annotation, list)
    return list if getattr(annotation, "__origin__", None) is list else annotation
