"""The update's samples, read and checked without torch: a `samples.parquet` table (`docs/trajectories.md`) read
into its row type, `steps.contracts.tables.SampleRow`, the one the trajectories step writes it with (a file must
have `SAMPLE_COLUMNS`), each sample refused in one sentence if the update cannot train on it.

`steps.update.skip` decides from these alone, before torch is imported, whether there is anything to train.
"""

import json
from dataclasses import fields
from pathlib import Path

import numpy as np

from steps.contracts.layout import table_url
from steps.contracts.tables import SampleRow, columns
from steps.update.config import ConfigError, UpdateConfig

# A training sample is a row of the `samples` table, read with the type the trajectories step writes it with.
Sample = SampleRow
# The columns a samples file must have: those the update trains on (the row's positional fields). The row's
# other columns are read where the table has them: a text run's table (or an older one) may lack some.
SAMPLE_COLUMNS = [row_field.name for row_field in fields(SampleRow) if not row_field.kw_only]


# The estimators whose advantages are relative to the task's group (all but reinforce_plus_plus, which
# whitens over the whole batch): a group whose rewards are all equal must get exactly 0.
GROUP_BASELINE_ESTIMATORS = ("grpo", "grpo_passk", "rloo", "reinforce_plus_plus_baseline", "gpg")


class SampleError(ValueError):
    """Unusable samples input: the message names the file or column."""


def describe(sample: Sample) -> str:
    """How a message names a sample: its rollout and sample index.

    >>> describe(Sample("it0-a", "a", [1], [2], [1], None, 1.0, sample_index=2))
    "rollout 'it0-a' sample 2"
    """
    return f"rollout {sample.rollout_id!r} sample {'?' if sample.sample_index is None else sample.sample_index}"


def check_sample(sample: Sample, vocab_size: int | None = None) -> None:
    """Refuses a sample the update cannot train on honestly, naming it and the field (a `SampleError`):
    a reward, loss weight or logprob that is not a finite number, a mask value other than 0 or 1, a token
    id that is not a whole number in [0, vocab_size) (only >= 0 when `vocab_size` is None)."""
    where = describe(sample)
    if not _is_finite(sample.reward):
        raise SampleError(f"{where}: reward is {sample.reward!r}; the update trains only on finite rewards")
    if not _is_finite(sample.loss_weight) or sample.loss_weight < 0:
        raise SampleError(f"{where}: loss_weight is {sample.loss_weight!r}; expected a finite number >= 0")
    limit = vocab_size if vocab_size is not None else float("inf")
    accepted = f"in [0, {vocab_size}), the checkpoint's vocabulary" if vocab_size is not None else ">= 0"
    for name in ("prompt_token_ids", "response_token_ids", "response_mask"):
        if getattr(sample, name) is None:
            raise SampleError(f"{where}: {name} is null; expected a list")
    for name in ("prompt_token_ids", "response_token_ids"):
        ids = getattr(sample, name)
        bad = next((i for i, token in enumerate(ids) if not (_is_whole(token) and 0 <= token < limit)), None)
        if bad is not None:
            raise SampleError(f"{where}: {name}[{bad}] is {ids[bad]!r}; token ids must be whole numbers {accepted}")
    bad = next((i for i, value in enumerate(sample.response_mask) if not (_is_whole(value) and value in (0, 1))), None)
    if bad is not None:
        raise SampleError(f"{where}: response_mask[{bad}] is {sample.response_mask[bad]!r}; expected 0 or 1")
    logprobs = sample.response_logprobs or []
    bad = next((i for i, value in enumerate(logprobs) if not _is_finite(value)), None)
    if bad is not None:
        raise SampleError(f"{where}: response_logprobs[{bad}] is {logprobs[bad]!r}; the sampler's logprobs must "
                          "be finite numbers (or the whole list null)")


def _is_whole(value) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _is_finite(value) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool) and \
        bool(np.isfinite(value))


def check_sampled_temperature(url: str, temperature: float) -> None:
    """Refuses samples drawn at another temperature than `temperature`, the one the update computes its logprobs
    at, as the calls table beside them records it (`url`: a samples.parquet file or its partition folder).
    Nothing to check without that table (a samples file alone) or where it has no temperature (older runs).
    Only the calls that went into a sample count."""
    import fsspec
    import pyarrow.parquet as pq

    calls = table_url(url.rsplit("/", 1)[0] if url.endswith(".parquet") else url, "calls")
    try:
        with fsspec.open(calls, "rb") as handle:
            table = pq.read_table(handle, columns=["temperature", "sample_index"])
    except (OSError, ValueError, KeyError):  # no calls table, or one without the column
        return
    used = {t for t, index in zip(table.column("temperature").to_pylist(), table.column("sample_index").to_pylist())
            if index is not None and t is not None}
    other = sorted(t for t in used if abs(t - temperature) > 1e-9)
    if other:
        raise SampleError(f"{calls}: the rollouts were sampled at temperature {other[0]:g} but the update would "
                          f"compute its logprobs at {temperature:g}; give temperature={other[0]:g} (a run passes its "
                          f"own `temperature`)")


def read_samples(url: str) -> list[Sample]:
    """Samples from a `samples.parquet` URL, or from the partition folder holding one (local or s3://)."""
    import fsspec
    import pyarrow.parquet as pq

    if not url.endswith(".parquet"):
        url = table_url(url, "samples")
    try:
        with fsspec.open(url, "rb") as handle:
            table = pq.read_table(handle)
    except (OSError, ValueError) as error:
        raise SampleError(f"{url}: cannot read samples ({error})") from error
    missing = [name for name in SAMPLE_COLUMNS if name not in table.column_names]
    if missing:
        raise SampleError(f"{url}: missing column(s) {', '.join(missing)}; needs {', '.join(SAMPLE_COLUMNS)}")
    present = [name for name in columns(SampleRow) if name in table.column_names]
    samples = []
    for number, row in enumerate(table.select(present).to_pylist()):
        row.setdefault("sample_index", f"row {number}")
        row["images"] = row.get("images") or []
        if not row["response_token_ids"]:
            continue
        if len(row["response_mask"] or []) != len(row["response_token_ids"]):
            raise SampleError(f"{url}: rollout {row['rollout_id']!r} sample {row['sample_index']}: response_mask is "
                              "not aligned with response_token_ids")
        if row["response_logprobs"] is not None and len(row["response_logprobs"]) != len(row["response_token_ids"]):
            row["response_logprobs"] = None  # unaligned: treated as unknown (trainer logprobs stand in)
        sample = Sample(**row)
        try:
            check_sample(sample)
        except SampleError as error:
            raise SampleError(f"{url}: {error}") from None
        samples.append(sample)
    if not samples:
        raise SampleError(f"{url}: no samples with response tokens")
    return samples


def flat_groups(groups, rewards: list[float]) -> set:
    """The groups whose rollouts all earned the same reward: under a group baseline they carry no signal.

    veRL's float32 group mean leaves rounding there (8 rewards of 0.6 gave each rollout +0.056 once divided
    by std + 1e-6), which AdamW's first step, normalised per parameter, turns into a full-size step.

    >>> sorted(flat_groups(["a", "a", "b", "b"], [0.6, 0.6, 0.0, 0.2]))
    ['a']
    """
    seen: dict = {}
    for group, reward in zip(groups, rewards):
        seen.setdefault(group, set()).add(reward)
    return {group for group, values in seen.items() if len(values) == 1}


def group_of(sample: Sample) -> str:
    """The group a sample's rollout is in for a group baseline: its task (a rollout without one is its own group).

    >>> group_of(Sample("it0-a-s0", "a", [1], [2], [1], None, 1.0)), group_of(Sample("r9", "", [1], [2], [1], None, 1.0))
    ('a', 'rollout:r9')
    """
    return sample.task or f"rollout:{sample.rollout_id}"


def signal_groups(samples: list[Sample], config: UpdateConfig) -> tuple[list[Sample], dict[str, int]]:
    """The samples to train on and how many task groups were kept and dropped (`groups_kept`, `groups_dropped`).

    With `drop_flat_groups` under a group-baseline estimator, the samples of every group whose rollouts all earned one
    reward are left out (DAPO's filter): their advantages are 0, so they would only dilute a token-mean loss and cost
    a forward and backward pass. When no group would be left, nothing is dropped here and the counts say so (kept 0):
    the update then decides as before (a skip, or an entropy bonus that still trains). Another estimator (reinforce++
    whitens over the whole batch, where a flat group still has an advantage) or `drop_flat_groups` false keeps all.

    >>> row = lambda rollout, task, reward: Sample(rollout, task, [1], [2], [1], None, reward)
    >>> batch = [row("r1", "a", 1.0), row("r2", "a", 1.0), row("r3", "b", 0.0), row("r4", "b", 1.0)]
    >>> kept, counts = signal_groups(batch, UpdateConfig())
    >>> [s.rollout_id for s in kept], counts
    (['r3', 'r4'], {'groups_kept': 1, 'groups_dropped': 1})
    >>> signal_groups(batch[:2], UpdateConfig())[1]  # nothing left: nothing dropped, the update skips
    {'groups_kept': 0, 'groups_dropped': 1}
    >>> signal_groups(batch, UpdateConfig(drop_flat_groups=False))[1]
    {'groups_kept': 2, 'groups_dropped': 0}
    """
    rollouts = {sample.rollout_id: sample for sample in samples}
    groups = [group_of(sample) for sample in rollouts.values()]
    flat = flat_groups(groups, [float(sample.reward) for sample in rollouts.values()])
    total = len(set(groups))
    if not config.drop_flat_groups or config.adv_estimator not in GROUP_BASELINE_ESTIMATORS:
        return samples, {"groups_kept": total, "groups_dropped": 0}
    counts = {"groups_kept": total - len(flat), "groups_dropped": len(flat)}
    if len(flat) == total:
        return samples, counts
    return [sample for sample in samples if group_of(sample) not in flat], counts


def reward_mean(samples: list[Sample]) -> float:
    """Mean reward over rollouts (each rollout once, however many samples it gave)."""
    rewards = {s.rollout_id: float(s.reward) for s in samples}
    return sum(rewards.values()) / len(rewards)


def check_inputs(samples: list[Sample], checkpoint: Path, config: UpdateConfig) -> None:
    """Refuses, before any model is loaded, samples the checkpoint cannot train on (`check_sample` with its
    vocabulary: a `SampleError`) and a config that does not fit them (a `ConfigError`)."""
    vocab, first = vocab_size(checkpoint), {}
    for sample in samples:
        check_sample(sample, vocab)
        other = first.setdefault(sample.rollout_id, sample)
        for name in ("reward", "task"):  # the advantage is per rollout: one reward in one task group
            if getattr(sample, name) != getattr(other, name):
                raise SampleError(
                    f"{describe(sample)}: {name} is {getattr(sample, name)!r} but "
                    f"{describe(other)} has {getattr(other, name)!r}; a rollout's samples share one")
    if config.lora_rank and "vision_config" in json.loads((checkpoint / "config.json").read_text()):
        # untested: veRL's peft wrapping of a vision tower, and vLLM serving an adapter on one
        raise ConfigError(f"lora_rank={config.lora_rank} but {checkpoint} is a vision-language model, which a LoRA "
                          "update does not train yet; set lora_rank to 0 (a full-weight update)")
    longest = max(samples, key=lambda s: len(s.prompt_token_ids) + len(s.response_token_ids))
    tokens = len(longest.prompt_token_ids) + len(longest.response_token_ids)
    if tokens > config.max_tokens_per_micro_batch:  # veRL's micro-batching asserts it, after the model loaded
        raise ConfigError(f"max_tokens_per_micro_batch={config.max_tokens_per_micro_batch} is less than "
                          f"{describe(longest)}'s {tokens} tokens; set it to at least {tokens}")


def vocab_size(checkpoint: Path) -> int | None:
    """The checkpoint's vocabulary size from its `config.json` (a multimodal one's `text_config`); None if
    it names none, and then token ids are only checked to be >= 0."""
    try:
        config = json.loads((checkpoint / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"--checkpoint {checkpoint}: no readable config.json ({error}); give a Hugging Face "
                          "model folder") from None
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return size if isinstance(size, int) and not isinstance(size, bool) else None
