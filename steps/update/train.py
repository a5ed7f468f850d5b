"""The policy update: train the served checkpoint on recorded samples with veRL's real `TrainingWorker`.

    python -m steps.update --trajectories URL --checkpoint DIR_OR_URL [--base-model DIR_OR_URL] --out DIR_OR_URL \\
        --config configs/update.yaml [key=value ...]

`--trajectories` is a `samples.parquet` file or the partition folder holding it (local or `s3://`,
schema in `docs/trajectories.md`); `--checkpoint` a Hugging Face model folder. The step computes
advantages per rollout with veRL's estimator grouped per task (GRPO by default), corrects for the
sampler with the recorded logprobs (bypass or truncated IS), runs veRL's FSDP2 update, and writes
the weights in the served dtype as Hugging Face sharded safetensors (`{out}/model-0000k-of-0000N.safetensors` +
`model.safetensors.index.json`, `steps.update.shards`) + the input's config and tokenizer files (a folder vLLM
loads or reloads), `{out}/optimizer/` (the fp32 master weights and AdamW's state, so the next update continues
this one; `carry_optimizer`) and `{out}/metrics.json`. With `lora_rank` > 0 only a LoRA adapter trains and
`{out}` holds it in peft's format instead of the weights (`--checkpoint` the previous adapter or the base model,
`--base-model` the base; docs/update.md, "LoRA"). Under torchrun (`steps.update.launch`, `update_gpus` > 1)
each rank trains its share of the batch (`steps.update.ranks`) and writes its own weight files and optimizer
shard; rank 0 the index and `metrics.json`; no rank gathers the model. When every rollout's advantage is 0
(each task's rollouts earned the same reward) there is no gradient: the worker is not built, the input
weights and optimiser state are copied to `--out` unchanged and `metrics.json` says `"skipped": "no
advantage"`. The same code runs on GPU and CPU; the CPU-only adjustments are in `steps.update.cpu` and
apply only without a GPU. A bad sample or config key is refused in one sentence (exit code 2) before any
model is loaded (`docs/update.md`).
"""

import importlib.util
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from steps.update import batch as update_batch, cpu as update_cpu, ranks as update_ranks, reshard, vision
from steps.update import shards as weight_shards
from steps import checkpoint as store
from steps.checkpoint import METRICS_FILE, OPTIMIZER_DIR, fetch, is_remote, publish, unmark
from steps.contracts.layout import ADAPTER_CONFIG
from steps.update.batch import Batch, Sample, check_sampled_temperature, read_samples
from steps.update.config import ConfigError, UpdateConfig, load_config
from steps.update.samples import check_inputs, signal_groups, vocab_size  # noqa: F401 (vocab_size: the tests read it here)
# What a skipped update (`steps.update.skip`, which decides before torch is imported) shares with this one.
from steps.update.skip import (CHECKPOINT_FILES, NO_ADVANTAGE, _copy_files, _write_folder, _write_text,  # noqa: F401
                               copy_checkpoint, optimizer_settings, parse_args, saved_optimizer, skipped_metrics,
                               write_skipped)

# The checkpoint's subfolder `OPTIMIZER_DIR` holds the training state in veRL's own format, one file per rank
# of each (`fsdp_checkpoint_manager.py`, `save_checkpoint`): `model_world_size_*_rank_*.pt` (the fp32 master
# weights' FSDP2 shard, so the next update continues from them and not from the served copy rounded to the
# served dtype), `optim_world_size_*_rank_*.pt` (AdamW's moments and step count) and `extra_state_*.pt` (lr
# scheduler and RNG), plus our `state.json`. What veRL's checkpoint manager saves there:
OPTIMIZER_CONTENTS = ["model", "optimizer", "extra"]
# A LoRA run's checkpoint (`lora_rank` > 0): the adapter in peft's format, no base weights (docs/update.md, "LoRA").
ADAPTER_FILES = [ADAPTER_CONFIG, "adapter_model.safetensors"]


def prepare_runtime() -> None:
    """Process-wide setup before veRL is imported: a one-process group by default, CPU adjustments if no GPU,
    the rank's own GPU if there are GPUs.

    A launcher (torchrun) that sets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* wins over these defaults.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if update_cpu.needed():
        update_cpu.apply()
        return
    # veRL's worker is made for Ray's actors, which each see one GPU, and never picks one: under torchrun every
    # rank sees all of its node's GPUs, so each takes its own.
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    # Alone, the one-rank group veRL would make (its backend, "cpu:gloo,cuda:nccl") with its store in memory; under
    # torchrun veRL makes the launcher's (`verl.utils.distributed.initialize_global_process_group_ray`).
    update_ranks.process_group("cpu:gloo,cuda:nccl", launched=False)


def attention(gpu: bool, flash_attn: bool) -> tuple[str, bool]:
    """The attention kernel and whether sequences are packed (veRL's `use_remove_padding`): veRL's default,
    flash-attention-2 on packed sequences, only on a GPU where `flash_attn` imports; else sdpa, unpacked (on a
    GPU without `flash_attn` veRL's default fails to load the model; packed, sdpa builds a tokens x tokens mask).

    >>> attention(gpu=True, flash_attn=True), attention(gpu=True, flash_attn=False), attention(False, True)
    (('flash_attention_2', True), ('sdpa', False), ('sdpa', False))
    """
    return ("flash_attention_2", True) if gpu and flash_attn else ("sdpa", False)


def lora_settings(config: UpdateConfig, adapter: Path | None) -> dict:
    """`HFModelConfig`'s LoRA fields: none when `lora_rank` is 0; else the rank, scale and target modules of a
    fresh adapter, or the `adapter` folder to continue training (veRL's `_build_lora_module` in
    `workers/engine/fsdp/transformer_impl.py`: `PeftModel.from_pretrained(..., is_trainable=True)`; the rank,
    scale and modules are then the adapter's own, `check_adapter`).

    >>> lora_settings(UpdateConfig(lora_rank=8), None)["target_modules"]
    'all-linear'
    """
    if not config.lora_rank:
        return {}
    # peft takes "all-linear" as a string only: as a list it would name a module called "all-linear"
    modules = "all-linear" if config.lora_target_modules == ["all-linear"] else list(config.lora_target_modules)
    return {"lora_rank": config.lora_rank, "lora_alpha": config.lora_alpha, "target_modules": modules,
            "lora_adapter_path": str(adapter) if adapter is not None else None}


def build_worker(checkpoint: Path, config: UpdateConfig, response_width: int | None = None,
                 load_contents: list[str] = OPTIMIZER_CONTENTS, adapter: Path | None = None):
    """veRL's `TrainingWorker` (FSDP2, AdamW) on the HF checkpoint, with veRL's `ppo_loss` set; with `lora_rank`
    > 0 on a LoRA adapter (`adapter`'s, else a fresh one), the only parameters that train (`lora_settings`).

    `load_contents`: what its `load_checkpoint` reads (`carried_contents`).
    `response_width` is the whole batch's (the longest response): `seq-mean-token-sum-norm` divides by it.
    Left to veRL (None) it divides by each micro-batch's own width, which depends on which rows a rank holds,
    so N ranks would not make the update one rank makes. Returns (worker, actor_config); actor_config is what
    the loss reads (clip ratios, policy loss).
    """
    from functools import partial

    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import (FSDPActorConfig, FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig,
                                     TrainingWorkerConfig)
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils.losses import ppo_loss

    cpu = update_cpu.needed()
    kernel, packed = attention(gpu=not cpu, flash_attn=importlib.util.find_spec("flash_attn") is not None)
    model = HFModelConfig(path=str(checkpoint), override_config={"attn_implementation": kernel},
                          use_remove_padding=packed, enable_gradient_checkpointing=False,
                          **lora_settings(config, adapter))
    engine = FSDPEngineConfig(use_dynamic_bsz=True, max_token_len_per_gpu=config.max_tokens_per_micro_batch,
                              infer_max_token_len_per_gpu=config.max_tokens_per_micro_batch, seed=config.seed,
                              mixed_precision={"param_dtype": config.compute_dtype, "reduce_dtype": "fp32",
                                               "buffer_dtype": "fp32"}, strategy="fsdp2",
                              **(update_cpu.ENGINE_OVERRIDES if cpu else {}))
    optim = FSDPOptimizerConfig(lr=config.learning_rate, weight_decay=config.weight_decay,
                                betas=tuple(config.betas), clip_grad=config.grad_clip,
                                total_training_steps=config.epochs * config.mini_batches)
    actor = FSDPActorConfig(
        strategy=engine.strategy, rollout_n=1, use_dynamic_bsz=True, fsdp_config=engine, optim=optim,
        clip_ratio=config.clip_ratio_high, clip_ratio_low=config.clip_ratio_low,
        clip_ratio_high=config.clip_ratio_high, clip_ratio_c=config.clip_ratio_c,
        loss_agg_mode=config.loss_agg_mode, entropy_coeff=config.entropy_coeff,
        loss_scale_factor=response_width if config.loss_agg_mode == "seq-mean-token-sum-norm" else None,
        policy_loss={"loss_mode": config.policy_loss}, use_torch_compile=engine.use_torch_compile)
    # A LoRA run trains the adapter alone, which is saved whole in fp32 (`save_adapter`): no master weights to keep.
    kept = [content for content in OPTIMIZER_CONTENTS if content != "model"] if config.lora_rank else OPTIMIZER_CONTENTS
    contents = CheckpointConfig(save_contents=kept, load_contents=[c for c in load_contents if c in kept])
    if config.lora_rank and adapter is None:  # peft draws a fresh lora_A at random: seeded, it is reproducible
        torch.manual_seed(config.seed)
    worker = TrainingWorker(TrainingWorkerConfig(model_type="language_model", model_config=model,
                                                 engine_config=engine, optimizer_config=optim,
                                                 checkpoint_config=contents))
    worker.reset()
    worker.set_loss_fn(partial(ppo_loss, config=actor))
    return worker, actor


def trainer_logprobs(worker, batch: Batch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The trainer's logprobs and entropies on each response token, [samples, response length], no update."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    td = batch.to_tensordict(temperature)
    tu.assign_non_tensor(td, calculate_entropy=True, compute_loss=False)
    output = worker.infer_batch(td)
    log_probs = no_padding_2_padding(tu.get(output, "log_probs"), td).float()
    entropy = no_padding_2_padding(tu.get(output, "entropy"), td).float()
    return log_probs, entropy


def batch_logprobs(worker, batch: Batch, shards: list[list[int]], rank: int,
                   temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`trainer_logprobs` of the whole batch on every rank: each rank computes its shard's, then all gather, so
    every rank corrects the whole batch and its metrics are the same everywhere."""
    width = batch.responses.shape[1]
    mine = trainer_logprobs(worker, batch.rows(shards[rank]), temperature)
    log_probs, entropy = (update_ranks.gather_rows(_widen(t, width), shards, len(batch.prompts)) for t in mine)
    return log_probs, entropy


def policy_tensordict(part: Batch, config: UpdateConfig, real: int, rows: int):
    """One mini-batch's TensorDict for the update's `ppo_loss`: `real` samples (what sequence-mean losses divide
    by) in `rows` rows over all ranks, fillers included."""
    from verl.utils import tensordict_utils as tu

    td = part.to_tensordict(config.temperature)
    tu.assign_non_tensor(td, calculate_entropy=config.entropy_coeff != 0, global_batch_size=real,
                         mini_batch_size=rows, epochs=1, seed=config.seed,
                         dataloader_kwargs={"shuffle": False}, compute_loss=True)
    return td


def train(worker, batch: Batch, config: UpdateConfig, world_size: int = 1, samples: int | None = None,
          tensordict: Callable = policy_tensordict) -> dict:
    """`epochs` passes over the mini-batches (`ranks.mini_batch_sizes`), one optimiser step each; returns veRL's
    metrics, each a list over the steps. `tensordict(part, config, real, rows)` makes a mini-batch's input to the
    worker's loss (the update's; supervised fine-tuning's, `steps.sft.train.sft_tensordict`).

    `batch` is this rank's shard (`ranks.shard_rows`) of a batch of `samples` real samples (default: all its
    rows, one rank). Each mini-batch is its own call of veRL's `train_mini_batch`, which takes one
    `mini_batch_size` (the global one, fillers included) and one `global_batch_size` (the real samples the
    sequence-mean losses divide by) per call: near-equal mini-batches differ by a sample, so one call could not
    size them all. In order and unshuffled, as veRL's own epochs over one call would run them.
    """
    from verl.utils import tensordict_utils as tu

    parts, first = [], 0
    for size in update_ranks.mini_batch_sizes(samples if samples is not None else len(batch.loss_weights),
                                              config.mini_batches):
        per_rank = -(-size // world_size)
        parts.append((batch.rows(list(range(first, first + per_rank))), size, per_rank * world_size))
        first += per_rank
    metrics: dict[str, list] = {}
    for _ in range(config.epochs):
        for part, real, rows in parts:
            td = tensordict(part, config, real, rows)
            for key, value in tu.get(worker.train_mini_batch(td), "metrics").items():
                metrics.setdefault(key, []).extend(value if isinstance(value, list) else [value])
    return metrics


def no_gradient(advantages: dict[str, float], config: UpdateConfig) -> bool:
    """True when the loss has no gradient: every advantage is 0 and no entropy bonus is trained.

    >>> no_gradient({"a": 0.0, "b": 0.0}, UpdateConfig()), no_gradient({"a": 0.5, "b": -0.5}, UpdateConfig())
    (True, False)
    """
    return config.entropy_coeff == 0 and all(value == 0 for value in advantages.values())


def carried_contents(folder: Path, saved: dict | None) -> list[str]:
    """What of `OPTIMIZER_CONTENTS` the update loads from the saved state `folder` (`saved`: its `state.json`, None
    when nothing is carried): all of it where the fp32 master weights are there, else (a checkpoint written
    before they were saved) the optimiser state alone, the weights then being the served ones."""
    ranks, saved_ranks = update_ranks.current(), (saved or {}).get("world_size", 1)
    # at the saved world size a rank fetched only its own shard from a remote checkpoint (`steps.checkpoint.fetch_rank`)
    needed = [ranks.rank] if saved_ranks == ranks.world_size else range(saved_ranks)
    if saved and all(reshard.weights_file(folder, saved_ranks, rank).is_file() for rank in needed):
        return OPTIMIZER_CONTENTS
    return [content for content in OPTIMIZER_CONTENTS if content != "model"]


def check_gpus() -> None:
    """Refuses, on a machine with GPUs, more ranks per node than it has GPUs (a `ConfigError`); every rank of the
    node sees the same numbers, so all refuse together."""
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if torch.cuda.is_available() and per_node > torch.cuda.device_count():
        raise ConfigError(f"update_gpus={per_node} but this node has {torch.cuda.device_count()} GPU(s); set "
                          "update_gpus to at most that (one update process per GPU)")


def adapter_of(checkpoint: Path, base: Path | None, config: UpdateConfig) -> Path | None:
    """The LoRA adapter `checkpoint` holds (the previous update's), or None (the base model: a fresh adapter).
    Refuses an adapter without `base`, with another rank than `lora_rank`, or in a run without LoRA."""
    if not (checkpoint / ADAPTER_CONFIG).is_file():
        return None
    rank = json.loads((checkpoint / ADAPTER_CONFIG).read_text()).get("r")
    if not config.lora_rank:
        raise ConfigError(f"--checkpoint {checkpoint} is a LoRA adapter (rank {rank}) but lora_rank is 0; set "
                          "lora_rank to its rank and give its base model with --base-model")
    if base is None:
        raise ConfigError(f"--checkpoint {checkpoint} is a LoRA adapter; give its base model with --base-model")
    if rank != config.lora_rank:
        raise ConfigError(f"lora_rank={config.lora_rank} but the adapter in --checkpoint {checkpoint} has rank "
                          f"{rank}; set lora_rank to {rank}")
    return checkpoint


def run_update(samples: list[Sample], checkpoint: Path, config: UpdateConfig, images_url: str | None = None,
               max_pixels: int = 0, base: Path | None = None):
    """Advantages, correction and veRL's update on `samples` (their images read from `images_url`). Returns
    (worker, metrics) for saving; the worker is None when there was nothing to train (`no_gradient`).

    With `lora_rank` > 0 the model is `base` and `checkpoint` the adapter on it (`adapter_of`); iteration 0's
    checkpoint is the base model itself, and a fresh adapter is made on it (also when nothing trains, so that
    every LoRA checkpoint is an adapter)."""
    adapter = adapter_of(checkpoint, base, config)
    model = base if adapter is not None else checkpoint
    check_inputs(samples, model, config)
    everything, (samples, groups) = samples, signal_groups(samples, config)  # the flat groups left out
    # before any model is loaded: a sample whose images do not match its image tokens is refused here
    image_inputs = vision.batch_inputs(samples, model, images_url, max_pixels)
    if image_inputs is not None:  # a vision checkpoint: its micro-batches without images train too
        vision.patch_text_only_batches()
    saved, optimizer_state = saved_optimizer(checkpoint, config)
    check_gpus()
    prepare_runtime()
    started = time.perf_counter()
    # The same samples on every rank give the same advantages everywhere: no rank needs another's.
    advantages = update_batch.rollout_advantages(samples, config)
    steps_before = saved["optimizer_steps_total"] if saved else 0
    # Logprobs the trainer cannot reproduce: every metrics.json of the run says so.
    unmatched = {"unmatched_sampling": config.unmatched_sampling} if config.unmatched_sampling else {}
    lora = {"adapter": "continued" if adapter else "fresh"} if config.lora_rank else {}
    if no_gradient(advantages, config) and (adapter is not None or not config.lora_rank):
        return None, {**lora, **skipped_metrics(samples, config, saved, optimizer_state, started)}
    contents = carried_contents(checkpoint / OPTIMIZER_DIR, saved)
    worker, _ = build_worker(model, config, max(len(s.response_token_ids) for s in samples), contents, adapter)
    if no_gradient(advantages, config):  # a LoRA run's first update: the fresh adapter is saved untrained
        return worker, {**unmatched, **lora, "skipped": NO_ADVANTAGE, **groups,
                        "reward_mean": update_batch.reward_mean(samples), "samples": len(samples),
                        "optimizer_steps": 0, "tokens_trained": 0, "optimizer_state": optimizer_state,
                        "optimizer_steps_total": 0, "total_s": time.perf_counter() - started}
    ranks = update_ranks.current()
    if saved and saved.get("world_size", 1) == ranks.world_size:
        worker.load_checkpoint(str(checkpoint / OPTIMIZER_DIR))
    elif saved:  # veRL loads only the files of its own world size
        reshard.load(worker.engine.optimizer, checkpoint / OPTIMIZER_DIR, saved.get("world_size", 1))
        if "model" in contents:
            reshard.load_weights(worker.engine.module, checkpoint / OPTIMIZER_DIR, saved.get("world_size", 1))
    shards = update_ranks.shard_rows(len(samples), config.mini_batches, ranks.world_size)
    batch = update_batch.pad([*samples, update_batch.FILLER], advantages)
    if image_inputs is not None:
        filler = ({}, vision.text_position_ids(2))
        batch = update_batch.with_images(batch, [*samples, update_batch.FILLER], [*image_inputs, filler])
    trainer_lp, entropy = batch_logprobs(worker, batch, shards, ranks.rank, config.temperature)
    correction = update_batch.correct(batch, trainer_lp, config)
    train_started = time.perf_counter()
    train_metrics = train(worker, batch.rows(shards[ranks.rank]), config, ranks.world_size, len(samples))
    train_s = time.perf_counter() - train_started
    mask = batch.response_mask.bool()
    tokens = int(mask.sum())
    steps = config.epochs * len(update_ranks.mini_batch_sizes(len(samples), config.mini_batches))
    metrics = {
        "loss": _mean(train_metrics["loss"]), "grad_norm": _mean(train_metrics["grad_norm"]),
        "entropy": float(entropy[mask].mean()) if tokens else 0.0,
        "reward_mean": update_batch.reward_mean(everything), **groups,
        "logprob_gap": correction.pop("logprob_gap"),
        "samples": len(samples), "optimizer_steps": steps,
        "optimizer_state": optimizer_state,
        "optimizer_steps_total": steps_before + steps,
        "tokens_trained": tokens * config.epochs,
        "train_s": train_s, "tokens_per_s": tokens * config.epochs / train_s, **correction,
        "total_s": time.perf_counter() - started, **unmatched, **lora,
    }
    return worker, metrics


def _widen(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """[rows, width]: a shard's per-token tensor right-padded with 0 to the batch's response width."""
    return torch.nn.functional.pad(tensor, (0, width - tensor.shape[1]))


def strict_metrics(metrics: dict) -> dict:
    """`metrics` as strict JSON holds them: a number that is not finite (a NaN loss, an infinite grad norm,
    whose step veRL skips) becomes null and is named in `"not_finite"`.

    >>> strict_metrics({"loss": float("nan"), "grad_norm": 1.5, "samples": 2})
    {'loss': None, 'grad_norm': 1.5, 'samples': 2, 'not_finite': ['loss']}
    """
    bad = sorted(key for key, value in metrics.items() if isinstance(value, float) and not math.isfinite(value))
    if not bad:
        return metrics
    return {**{key: None if key in bad else value for key, value in metrics.items()}, "not_finite": bad}


def _mean(values) -> float:
    """Mean of a veRL metric (a list over mini-batches, or one value)."""
    values = values if isinstance(values, list) else [values]
    return float(sum(float(v) for v in values) / len(values))


def save_checkpoint(worker, checkpoint: Path, out: Path, config: UpdateConfig | None = None,
                    first: bool = True) -> Path:
    """Write the updated weights in `config.served_dtype` as sharded safetensors with their index
    (`steps.update.shards`: each rank its own files, at most `max_file_bytes` each), and (the `first` rank) the
    input's config and tokenizer files. Every rank calls it and says what it wrote and held (`shards.save`)."""
    config = config or UpdateConfig()
    # veRL's export: each parameter gathered whole on every rank in turn, named as Hugging Face names it
    # (transformer_impl.py, `get_per_tensor_param`); only its owner keeps it
    params, _ = worker.engine.get_per_tensor_param()
    saved = weight_shards.save(params, out, weight_shards.SERVED_DTYPES[config.served_dtype], config.max_file_bytes)
    _progress(f"rank {update_ranks.current().rank} wrote {len(saved['files'])} weight file(s) of {saved['bytes']} "
              f"bytes and held at most {saved['held']} bytes while saving (the model: {saved['model_bytes']} bytes)")
    if first:
        _copy_files([checkpoint / name for name in CHECKPOINT_FILES], out)
    return out


def save_adapter(worker, out: Path, base_model: str, write: bool = True) -> Path:
    """Write the trained LoRA adapter to `out` in peft's format: `adapter_model.safetensors` (peft's names,
    `base_model.model.<module>.lora_A.weight`, which vLLM's loader parses: `vllm/lora/utils.py`
    `parse_fine_tuned_lora_name`) and `adapter_config.json` naming `base_model` (the run's base model).

    Every rank calls it: each adapter tensor is gathered whole on every rank (FSDP2's `full_tensor`, a collective)
    and only the one with `write` writes. The adapter is small (rank x width per wrapped module), so holding it all
    on one rank is fine; the base weights are neither gathered nor written.
    """
    module = worker.engine.module  # FSDP2 wraps veRL's PeftModel in place: peft's methods are still there
    # peft's own names (`...lora_A.default.weight`); its save_pretrained drops the adapter name
    tensors = {name: (value.full_tensor() if hasattr(value, "full_tensor") else value).detach().to("cpu")
               for name, value in module.state_dict().items() if "lora_" in name}
    if not write:
        return out
    module.peft_config["default"].base_model_name_or_path = base_model
    partial = out / ".adapter.partial"
    shutil.rmtree(partial, ignore_errors=True)
    module.save_pretrained(str(partial), state_dict=tensors)
    out.mkdir(parents=True, exist_ok=True)
    for name in ADAPTER_FILES:  # peft also writes a README.md model card, which is not kept
        os.replace(partial / name, out / name)
    shutil.rmtree(partial)
    return out


def save_optimizer(worker, out: Path, config: UpdateConfig, steps_total: int, owner: bool = True) -> Path:
    """Write the optimiser state to `out/optimizer/` with veRL's checkpoint manager, plus `state.json`
    (`optimizer_settings` and the optimiser steps taken since the base model).

    Every rank calls it and writes its shard (`optim_world_size_N_rank_R.pt`); the `owner` of `out` (rank 0
    where the ranks share it, every rank where each has its own) prepares the partial folder and renames it.
    """
    target = out / OPTIMIZER_DIR
    partial = target.with_name(f".{target.name}.partial")
    if owner:
        shutil.rmtree(partial, ignore_errors=True)
    update_ranks.barrier()
    worker.save_checkpoint(str(partial))  # veRL's: rank 0 makes the folder, then every rank its shard
    update_ranks.barrier()
    if owner:
        state = {**optimizer_settings(config), "optimizer_steps_total": steps_total}
        (partial / "state.json").write_text(json.dumps(state, indent=2) + "\n")
        _write_folder(target, None)
    update_ranks.barrier()
    return target


def _progress(line: str) -> None:
    print(f"steps.update: {line}", file=sys.stderr, flush=True)


def write_output(worker, checkpoint: Path, out: Path, metrics: dict, config: UpdateConfig,
                 ranks: update_ranks.Ranks = update_ranks.Ranks(), owner: bool = True, base_model: str = "") -> None:
    """The new checkpoint in `out`: the trained weights (with `lora_rank` > 0 the adapter only, on `base_model`)
    and optimiser state, or the input's unchanged when nothing was trained (`worker` None); then `metrics.json`,
    strict JSON, last. Every rank calls it; rank 0 writes all but the other ranks' optimizer shards (`owner`: as
    `save_optimizer`)."""
    if worker is None:
        if ranks.first:
            write_skipped(checkpoint, out, config)
    elif config.lora_rank:
        save_adapter(worker, out, base_model, write=ranks.first)
    else:
        save_checkpoint(worker, checkpoint, out, config, first=ranks.first)
    if worker is not None and config.carry_optimizer:
        save_optimizer(worker, out, config, metrics["optimizer_steps_total"], owner=owner)
    if ranks.first:
        _write_text(out / METRICS_FILE, json.dumps(metrics, indent=2, allow_nan=False) + "\n")


def publish_output(local: Path, url: str, ranks: update_ranks.Ranks, trained: bool) -> None:
    """Uploads the new checkpoint from each rank's own folder: the other ranks their weight files and optimizer
    shards (on other nodes, rank 0 has not got them), then, once every rank is done, rank 0 everything it wrote."""
    if trained and not ranks.first:
        store.publish_rank(local, url, ranks.rank)
    if trained:
        update_ranks.barrier()
    if ranks.first:
        publish(local, url)


def report_io(ranks: update_ranks.Ranks) -> None:
    """This rank's whole count, its writes included, as one stderr line: `steps.update: io {JSON}`."""
    print(f"steps.update: io {json.dumps(store.io_counts(ranks.rank))}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Load samples and config, update, write the checkpoint and metrics. Exit code 2 on a bad config or input
    (one sentence on stderr, before any model is loaded), 1 when the output cannot be written."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    ranks = update_ranks.current()
    # Every rank reads the same inputs and refuses the same ones before any collective, so none waits on
    # another that stopped; each says why where the launcher reads it (`ranks.refuse`), which prints it once.
    say = _progress if ranks.first else lambda line: None
    try:
        config = load_config(args.config, args.overrides)
        samples = read_samples(args.trajectories)
        check_sampled_temperature(args.trajectories, config.temperature)
    except (ConfigError, update_batch.SampleError) as error:
        return update_ranks.refuse(f"steps.update: {error}")
    node = store.node_folder()  # the weights are fetched once per node into it (`steps.checkpoint.fetch_rank`)
    with tempfile.TemporaryDirectory(prefix="openforge-update-") as tmp:
        checkpoint = store.fetch_rank(args.checkpoint, Path(tmp) / "in", ranks.rank, ranks.world_size,
                                      ranks.local_rank, node, progress=say)
        base = None
        if args.base_model:  # a LoRA run's base model, fetched as the weights are: once per node
            base = checkpoint if args.base_model == args.checkpoint else store.fetch_rank(
                args.base_model, Path(tmp) / "base", ranks.rank, ranks.world_size, ranks.local_rank,
                node / "base" if node is not None else None, progress=say)
        try:
            worker, metrics = run_update(samples, checkpoint, config, args.images or None, args.max_pixels, base)
        except (ConfigError, update_batch.SampleError) as error:
            return update_ranks.refuse(f"steps.update: {error}")
        if worker is None and ranks.first:  # the input is copied unchanged, every rank's optimizer state with it
            store.fetch_shards(args.checkpoint, checkpoint, progress=say)
        metrics = strict_metrics(metrics)
        if "not_finite" in metrics:
            say(f"warning: {', '.join(metrics['not_finite'])} not finite, written as null")
        # each rank's reads, all done by now (its writes follow metrics.json: its last stderr line, `report_io`)
        metrics["io"] = update_ranks.gather_objects(store.io_counts(ranks.rank))
        # a local --out is one folder all ranks share (one node, or a shared file system); a remote one is
        # written by each rank into its own temporary folder first
        local_out = Path(tmp) / "out" if is_remote(args.out) else fetch(args.out, Path(tmp))
        try:
            if ranks.first:  # a rewrite (a retried update) is not complete before it is written
                unmark(args.out)
            update_ranks.barrier()  # before any rank writes a file of it
            write_output(worker, checkpoint, local_out, metrics, config, ranks,
                         owner=ranks.first or is_remote(args.out), base_model=args.base_model or args.checkpoint)
            if is_remote(args.out):
                publish_output(local_out, args.out, ranks, trained=worker is not None)
        except OSError as error:  # a full disk, a lost store: the infrastructure's, retried like one
            print(f"steps.update: cannot write the new checkpoint to {args.out} ({type(error).__name__}: {error})",
                  file=sys.stderr)
            return 1
    # the node's weights are removed by its last rank done (a failed rank's pod and its temporary folder go)
    store.release(node, ranks.local_rank, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    report_io(ranks)
    if ranks.first:
        print(json.dumps(metrics, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
