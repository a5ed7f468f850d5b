"""Test helpers for the update: crafted samples from the tiny model, their Parquet file, and a plain reference
update loop.

The reference loop is what veRL's worker must equal: the same HF model, veRL's own policy loss
(`core_algos.get_policy_loss_fn`) on the same padded batch, clip by global norm, one AdamW step.
Also used by `benchmarks/update_throughput.py`.
"""

import random
from pathlib import Path

import torch

from steps.update.batch import Batch, Sample
from steps.update.config import UpdateConfig


def load_model(checkpoint: Path):
    """The HF model in float32 with sdpa attention, as the worker loads it on CPU."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32, attn_implementation="sdpa")


@torch.no_grad()
def response_logprobs(model, prompt: list[int], response: list[int], temperature: float = 1.0) -> list[float]:
    """The model's logprob of each response token after the prompt (a plain forward)."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float() / temperature
    return logits.log_softmax(-1).gather(-1, ids[0, len(prompt):, None])[:, 0].tolist()


def craft_samples(checkpoint: Path, seed: int = 0, prompt_len: int = 12, response_len: int = 20,
                  rollouts_per_task: tuple[int, ...] = (4, 3)) -> list[Sample]:
    """Samples in task groups with mixed rewards; the last rollout of each task is split into two samples.

    Responses have a masked "tool output" stretch in the middle; rollout logprobs come from the model
    itself (0 where masked), so the rollout/trainer gap is ~0.
    """
    rng = random.Random(seed)
    model = load_model(checkpoint)
    samples = []
    for task, count in enumerate(rollouts_per_task):
        for index in range(count):
            rollout_id, reward = f"t{task}-r{index}", float(index % 2 == task % 2)
            parts = 2 if index == count - 1 else 1
            for _ in range(parts):
                prompt = [rng.randrange(10, 4000) for _ in range(prompt_len + rng.randrange(4))]
                response = [rng.randrange(10, 4000) for _ in range(response_len - rng.randrange(6))]
                mask = [0 if len(response) // 3 <= i < len(response) // 2 else 1 for i in range(len(response))]
                logprobs = [lp * m for lp, m in zip(response_logprobs(model, prompt, response), mask)]
                samples.append(Sample(rollout_id=rollout_id, task=f"task-{task}", prompt_token_ids=prompt,
                                      response_token_ids=response, response_mask=mask, response_logprobs=logprobs,
                                      reward=reward, loss_weight=1.0 / parts))
    return samples


def write_samples(samples: list[Sample], folder: Path) -> Path:
    """`samples` as a samples.parquet in `folder` (the update's columns plus sample_index)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from steps.update.batch import SAMPLE_COLUMNS

    columns = [*SAMPLE_COLUMNS, "sample_index"]
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([{name: getattr(s, name) for name in columns} for s in samples]),
                   folder / "samples.parquet")
    return folder


def actor_config(config: UpdateConfig):
    """A fresh veRL actor config carrying the loss settings (the policy losses read it)."""
    from verl.workers.config import FSDPActorConfig

    return FSDPActorConfig(strategy="fsdp2", rollout_n=1, use_dynamic_bsz=True, clip_ratio=config.clip_ratio_high,
                           clip_ratio_low=config.clip_ratio_low, clip_ratio_high=config.clip_ratio_high,
                           clip_ratio_c=config.clip_ratio_c, loss_agg_mode=config.loss_agg_mode,
                           policy_loss={"loss_mode": config.policy_loss})


def reference_update(model, batch: Batch, config: UpdateConfig, optimizer=None) -> dict[str, float]:
    """One update of `model` in place with veRL's policy loss and torch's AdamW (`optimizer`, to continue one
    across steps; default a fresh one); returns loss and grad norm."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    prompt_width = batch.prompts.shape[1]
    input_ids = torch.cat([batch.prompts, batch.responses], dim=1)
    position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    optimizer = optimizer or torch.optim.AdamW(model.parameters(), lr=config.learning_rate,
                                               betas=tuple(config.betas), weight_decay=config.weight_decay)
    model.train()
    logits = model(input_ids=input_ids, attention_mask=batch.attention_mask, position_ids=position_ids).logits
    logits = logits[:, prompt_width - 1:-1].float() / config.temperature
    log_probs = logits.log_softmax(-1).gather(-1, batch.responses[..., None])[..., 0]
    loss, _ = get_policy_loss_fn(config.policy_loss)(
        old_log_prob=batch.old_log_probs, log_prob=log_probs, advantages=batch.advantages,
        response_mask=batch.response_mask.bool(), loss_agg_mode=config.loss_agg_mode,
        config=actor_config(config), rollout_is_weights=batch.rollout_is_weights)
    optimizer.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    return {"loss": float(loss.detach()), "grad_norm": float(grad_norm)}
