"""The update step's config: a flat YAML (`configs/update.yaml`) loaded into `UpdateConfig`, `key=value` overrides.

Every field is checked when an `UpdateConfig` is made, so a bad config stops the step before a model is
loaded: an unknown key, a value of the wrong type, a value out of range or a misspelt choice is a
`ConfigError` with one sentence naming the key and what it accepts. Reading, overrides and the strict
types are the run's too (`steps.settings`); the ranges and choices below are the update's own.
"""

from dataclasses import dataclass, field
from pathlib import Path

from steps import settings
from steps.settings import ConfigError

__all__ = ["ConfigError", "UpdateConfig", "load_config"]

CORRECTIONS = ("bypass", "tis")
COMPUTE_DTYPES = ("bf16", "fp32")
SERVED_DTYPES = ("bf16", "fp16", "fp32")  # the written weights' (steps.update.shards.SERVED_DTYPES)
# veRL's outcome-reward estimators that need nothing but rewards and groups (no critic, no baselines).
ADV_ESTIMATORS = ("grpo", "grpo_passk", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gpg")
# veRL 0.9.1's registered policy losses (core_algos.POLICY_LOSS_REGISTRY) but "bypass_mode", which wants
# veRL's own rollout-correction config: `correction` does that here.
POLICY_LOSSES = ("vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro",
                 "cispo")
# veRL 0.9.1's loss aggregations (core_algos.agg_loss).
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
CHOICES = {"correction": CORRECTIONS, "compute_dtype": COMPUTE_DTYPES, "served_dtype": SERVED_DTYPES,
           "adv_estimator": ADV_ESTIMATORS,
           "policy_loss": POLICY_LOSSES, "loss_agg_mode": LOSS_AGG_MODES}
# Each field's allowed range: (test, what the message says is accepted).
RANGES: dict[str, settings.Range] = {
    "learning_rate": (lambda v: v > 0, "a number > 0"),
    "weight_decay": (lambda v: v >= 0, "a number >= 0"),
    "betas": (lambda v: len(v) == 2 and all(0 <= beta < 1 for beta in v),
              "a list of two numbers in [0, 1), e.g. [0.9, 0.999]"),
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
    "max_file_bytes": (lambda v: v >= 1, "a whole number >= 1"),
    "lora_rank": (lambda v: v >= 0, "a whole number >= 0 (0: LoRA off)"),
    "lora_alpha": (lambda v: v >= 1, "a whole number >= 1"),
    "lora_target_modules": (lambda v: len(v) >= 1 and all(name.strip() for name in v),
                            "a non-empty list of module names, e.g. [q_proj, v_proj], or [all-linear]"),
}


@dataclass
class UpdateConfig:
    """Hyperparameters of one policy update (meanings in `configs/update.yaml`); checked when made."""

    learning_rate: float = 1e-6
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
    drop_flat_groups: bool = True  # set by the run: leave out task groups whose rollouts all earned one reward
    norm_adv_by_std_in_grpo: bool = True
    correction: str = "bypass"
    tis_threshold: float = 2.0
    temperature: float = 1.0  # set by the run: the temperature its rollouts were sampled at
    unmatched_sampling: str = ""  # set by the run: sampling it cannot reproduce ("top_p=0.9"), named in the metrics
    max_tokens_per_micro_batch: int = 32768
    compute_dtype: str = "bf16"
    served_dtype: str = "bf16"
    max_file_bytes: int = 5_000_000_000
    seed: int = 0
    lora_rank: int = 0  # set by the run: > 0 trains a LoRA adapter of this rank, not the model
    lora_alpha: int = 16
    lora_target_modules: list[str] = field(default_factory=lambda: ["all-linear"])

    def __post_init__(self) -> None:
        for name, kind in settings.field_types(UpdateConfig).items():
            setattr(self, name, settings.coerce(name, kind, getattr(self, name), RANGES.get(name), CHOICES.get(name)))


def load_config(path: str | Path | None, overrides: list[str] = ()) -> UpdateConfig:
    """`UpdateConfig` from a flat YAML file (None: the defaults) with `key=value` overrides applied.

    >>> load_config(None, ["learning_rate=3e-6", "correction=tis"]).learning_rate
    3e-06
    """
    return settings.load(UpdateConfig, [path] if path is not None else [], overrides, RANGES, CHOICES)
