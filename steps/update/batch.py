"""Samples in, veRL's padded batch out: per-rollout advantages, loss weights and the rollout-logprob correction.

The samples are read and checked in `steps.update.samples` (no torch there: a skipped update needs only them);
veRL's layout: prompts left-padded, responses right-padded, `response_mask` 1 only on sampled tokens.
"""

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

from steps.update.config import UpdateConfig
# The samples' reading and checks, used here and by the modules that import them from this one.
from steps.update.samples import (GROUP_BASELINE_ESTIMATORS, SAMPLE_COLUMNS, Sample, SampleError,  # noqa: F401
                                  check_sample, check_sampled_temperature, describe, flat_groups, read_samples,
                                  reward_mean)

# The empty sample that evens out a mini-batch over the update's ranks (`steps.update.ranks.shard_rows`): one
# prompt and one response token (veRL needs both), none trained, no advantage, no loss weight.
FILLER = Sample(rollout_id="", task=None, prompt_token_ids=[0], response_token_ids=[0], response_mask=[0],
                response_logprobs=[0.0], reward=0.0, loss_weight=0.0)


@dataclass
class Batch:
    """veRL's padded batch for a list of samples ([samples, length] tensors)."""

    prompts: torch.Tensor
    responses: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    rollout_log_probs: torch.Tensor  # 0 where unknown
    has_rollout_log_probs: torch.Tensor  # [samples] bool
    advantages: torch.Tensor
    loss_weights: torch.Tensor  # [samples]
    old_log_probs: torch.Tensor | None = None
    rollout_is_weights: torch.Tensor | None = field(default=None)
    # A vision model's batch (`with_images`): [samples, 4, length] mrope positions, each row's images' features.
    position_ids: torch.Tensor | None = None
    multi_modal_inputs: list[dict] | None = None

    def rows(self, indices: list[int]) -> "Batch":
        """The batch of these rows (in this order, repeats allowed): a rank's shard."""
        index = torch.tensor(indices, dtype=torch.long)
        pick = lambda value: [value[i] for i in indices] if isinstance(value, list) else value[index]  # noqa: E731
        return dataclasses.replace(self, **{f.name: pick(getattr(self, f.name)) for f in dataclasses.fields(self)
                                            if getattr(self, f.name) is not None})

    def to_tensordict(self, temperature: float):
        """The no-padding TensorDict veRL's worker takes (`left_right_2_no_padding` of the padded batch); a
        vision model's carries each row's `multi_modal_inputs` beside it, which veRL keeps with the row."""
        from verl import DataProto
        from verl.workers.utils.padding import left_right_2_no_padding

        position_ids = self.position_ids
        if position_ids is None:
            position_ids = (self.attention_mask.cumsum(-1) - 1).clamp(min=0)
        non_tensors = {}
        if self.multi_modal_inputs is not None:
            non_tensors["multi_modal_inputs"] = np.empty(len(self.multi_modal_inputs), dtype=object)
            non_tensors["multi_modal_inputs"][:] = self.multi_modal_inputs
        tensors = {"prompts": self.prompts, "responses": self.responses,
                   "input_ids": torch.cat([self.prompts, self.responses], dim=1),
                   "attention_mask": self.attention_mask, "position_ids": position_ids,
                   "response_mask": self.response_mask, "advantages": self.advantages}
        if self.old_log_probs is not None:
            tensors["old_log_probs"] = self.old_log_probs
        if self.rollout_is_weights is not None:
            tensors["rollout_is_weights"] = self.rollout_is_weights
        data = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info={"temperature": temperature})
        out = left_right_2_no_padding(data.to_tensordict())
        if self.position_ids is not None:
            # torch's `as_nested_tensor` (veRL's conversion) takes rows of (4, length) that all have one length
            # as ragged in their 4: a batch of same-length samples then fails to split into micro-batches
            from verl.utils.tensordict_utils import nested_tensor_from_tensor_list

            rows = [positions[:, mask.bool()] for positions, mask in zip(position_ids, self.attention_mask)]
            out["position_ids"] = nested_tensor_from_tensor_list(rows, ragged_idx=2)
        return out


def rollout_advantages(samples: list[Sample], config: UpdateConfig) -> dict[str, float]:
    """One advantage per rollout from veRL's estimator, rollouts grouped by task.

    Computed on rollouts, not samples, so a rollout split into many samples counts once in its group.
    """
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    rollouts = {sample.rollout_id: sample for sample in samples}
    ids = list(rollouts)
    rewards = torch.tensor([[float(rollouts[i].reward)] for i in ids], dtype=torch.float32)
    groups = np.array([rollouts[i].task or f"rollout:{i}" for i in ids], dtype=object)
    algo = AlgoConfig(adv_estimator=config.adv_estimator, norm_adv_by_std_in_grpo=config.norm_adv_by_std_in_grpo)
    estimator = get_adv_estimator_fn(config.adv_estimator)
    kwargs = {"norm_adv_by_std_in_grpo": config.norm_adv_by_std_in_grpo} if config.adv_estimator == "grpo" else {}
    advantages, _ = estimator(token_level_rewards=rewards, response_mask=torch.ones_like(rewards), index=groups,
                              config=algo, **kwargs)
    grouped = config.adv_estimator in GROUP_BASELINE_ESTIMATORS
    flat = flat_groups(groups, rewards[:, 0].tolist()) if grouped else set()
    return {rollout_id: 0.0 if groups[row] in flat else float(advantages[row, 0])
            for row, rollout_id in enumerate(ids)}


def _pad(rows: list[list], width: int, left: bool, dtype: torch.dtype) -> torch.Tensor:
    """[rows, width] tensor of `rows`, zero-padded on the left (prompts) or right (responses)."""
    out = torch.zeros(len(rows), width, dtype=dtype)
    for i, row in enumerate(rows):
        if not row:
            continue
        if left:
            out[i, width - len(row):] = torch.tensor(row, dtype=dtype)
        else:
            out[i, :len(row)] = torch.tensor(row, dtype=dtype)
    return out


def pad(samples: list[Sample], advantages: dict[str, float]) -> Batch:
    """veRL's padded batch: prompts left-padded, responses right-padded, advantages on sampled tokens.

    `FILLER` rows get no advantage without a key of their own, so no real rollout's id (even "") is overwritten:

    >>> rollout = Sample("", "a", [1], [2], [1], None, 1.0)
    >>> pad([rollout, FILLER], {"": 0.5}).advantages.tolist(), pad([FILLER], {}).advantages.tolist()
    ([[0.5], [0.0]], [[0.0]])
    """
    prompt_width = max(len(s.prompt_token_ids) for s in samples)
    response_width = max(len(s.response_token_ids) for s in samples)
    prompts = _pad([s.prompt_token_ids for s in samples], prompt_width, True, torch.long)
    responses = _pad([s.response_token_ids for s in samples], response_width, False, torch.long)
    prompt_real = _pad([[1] * len(s.prompt_token_ids) for s in samples], prompt_width, True, torch.long)
    response_real = _pad([[1] * len(s.response_token_ids) for s in samples], response_width, False, torch.long)
    response_mask = _pad([s.response_mask for s in samples], response_width, False, torch.float32)
    logprobs = [s.response_logprobs or [] for s in samples]  # finite: `check_sample`
    rollout_log_probs = _pad(logprobs, response_width, False, torch.float32) * response_mask
    advantage = torch.tensor([0.0 if s is FILLER else advantages[s.rollout_id] for s in samples],
                             dtype=torch.float32)
    return Batch(
        prompts=prompts, responses=responses, attention_mask=torch.cat([prompt_real, response_real], dim=1),
        response_mask=response_mask, rollout_log_probs=rollout_log_probs,
        has_rollout_log_probs=torch.tensor([s.response_logprobs is not None for s in samples]),
        advantages=advantage[:, None] * response_mask,
        loss_weights=torch.tensor([float(s.loss_weight) for s in samples], dtype=torch.float32))


def with_images(batch: Batch, samples: list[Sample], inputs: list[tuple[dict, torch.Tensor]]) -> Batch:
    """`batch` (of `samples`) as a vision model trains on it: each row's (4, length) position ids (`inputs`,
    over its prompt then response) laid out as its tokens are, and its `multi_modal_inputs` ({} for a text row).

    >>> rows = [Sample("a", "t", [5, 6], [7], [1], None, 1.0), Sample("b", "t", [5], [7, 8], [1, 1], None, 1.0)]
    >>> positions = [torch.arange(3).expand(4, 3) + 10 * row for row in range(2)]
    >>> with_images(pad(rows, {"a": 0.0, "b": 0.0}), rows, [({}, p) for p in positions]).position_ids[:, 0].tolist()
    [[0, 1, 2, 0], [0, 10, 11, 12]]
    """
    prompt_width = batch.prompts.shape[1]
    out = torch.zeros(len(samples), 4, batch.attention_mask.shape[1], dtype=torch.long)
    for row, (sample, (_, positions)) in enumerate(zip(samples, inputs, strict=True)):
        prompt = len(sample.prompt_token_ids)
        out[row, :, prompt_width - prompt:prompt_width] = positions[:, :prompt]
        out[row, :, prompt_width:prompt_width + positions.shape[1] - prompt] = positions[:, prompt:]
    return dataclasses.replace(batch, position_ids=out, multi_modal_inputs=[features for features, _ in inputs])


def correct(batch: Batch, trainer_log_probs: torch.Tensor, config: UpdateConfig) -> dict[str, float]:
    """Set the batch's old logprobs and per-token loss weights for the configured correction; return metrics.

    bypass: the sampler's logprobs are the PPO old logprobs (the trainer's where a sample has none).
    tis: the trainer's are, and veRL's token-level truncated IS weights correct for the sampler.
    Either way each token's loss is also multiplied by its sample's `loss_weight`.
    """
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

    known = batch.has_rollout_log_probs[:, None].float() * batch.response_mask
    rollout = torch.where(known.bool(), batch.rollout_log_probs, trainer_log_probs)
    gap = ((rollout - trainer_log_probs).abs() * known).sum() / known.sum().clamp(min=1)
    metrics = {"logprob_gap": float(gap), "samples_without_rollout_logprobs":
               int((~batch.has_rollout_log_probs).sum())}
    weights = batch.loss_weights[:, None].expand_as(batch.response_mask).clone()
    if config.correction == "bypass":
        batch.old_log_probs = rollout
    else:
        batch.old_log_probs = trainer_log_probs
        is_weights, is_metrics = compute_rollout_correction_weights(
            log_ratio=trainer_log_probs - rollout, response_mask=batch.response_mask, rollout_is="token",
            rollout_is_threshold=config.tis_threshold)
        weights = weights * is_weights
        metrics["rollout_is_mean"] = float(is_metrics.get("rollout_corr/rollout_is_mean",
                                                          is_metrics.get("rollout_is_mean", 0.0)))
    batch.rollout_is_weights = weights * batch.response_mask
    return metrics
