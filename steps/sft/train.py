"""Supervised fine-tuning on SFT samples with veRL's real `TrainingWorker` and its `sft_loss`: the update's worker
(`steps.update.train.build_worker`, FSDP2, AdamW) with the loss swapped, writing a checkpoint of the update's layout.

    python -m steps.sft --samples URL --checkpoint DIR_OR_URL --out DIR_OR_URL [--config configs/update.yaml] \\
        [key=value ...]

`--samples` is a `samples.parquet` (or its folder) as `steps.sft.samples` writes it, the trajectories step's schema;
`--checkpoint` the student. The loss is veRL's `sft_loss`: the mean negative log-likelihood of the tokens whose
`response_mask` is 1 (the assistant's), over all of a mini-batch's such tokens. `epochs` passes of `mini_batches`
AdamW steps at `learning_rate` (the update's config and keys; advantages, clipping and corrections play no part).
`--out` gets what an update writes (`steps.update.train.write_output`): the weights in `served_dtype` as sharded
safetensors with the input's config and tokenizer files, `optimizer/` and `metrics.json`, so a run starts from it
with `model=<out>`. With `lora_rank` > 0 a fresh LoRA adapter on the student is all that trains, and `--out` is
that adapter in peft's format (as a LoRA update writes it) on the base `--checkpoint`: `python -m steps.export
--merge` makes it a full model a run starts from. A bad sample or config is one sentence and exit code 2 before a
model loads.

Under torchrun (`steps.update.launch`, as `workflows.commands.sft` builds it with `update_gpus` > 1) it runs as
the update does: every rank reads every sample and trains its share of each mini-batch
(`steps.update.ranks.shard_rows`, fillers evening them out), FSDP2 shards the model over all ranks, each rank
writes its own weight files and optimizer shard, rank 0 the rest. `sft_loss` divides by the trained tokens
of the whole mini-batch over all ranks (veRL's engine all-reduces `batch_num_tokens`), so N ranks take the step
one rank takes.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

from steps import checkpoint as store
from steps.contracts.layout import ADAPTER_CONFIG
from steps.update import batch as update_batch, ranks as update_ranks
from steps.update.batch import Batch, Sample, read_samples
from steps.update.config import ConfigError, UpdateConfig, load_config
from steps.update.samples import check_inputs
from steps.update.train import (build_worker, prepare_runtime, publish_output, report_io, strict_metrics,
                                train as update_train, write_output)

# What a fresh SFT's optimiser state is, in metrics.json's `optimizer_state` (the update's word for it).
FRESH = "fresh: supervised fine-tuning starts its own"


def loss_mask(batch: Batch) -> torch.Tensor:
    """veRL's `loss_mask` for `sft_loss` in its no-padding layout: per row, 0 on the prompt's tokens, then the
    response mask, as one nested [prompt + response] row (the update's tensordict sets it to the padded response
    mask, which `sft_loss` would misread as covering the whole sequence).

    >>> rows = [Sample("a", "t", [5, 6], [7, 8], [1, 0], None, 1.0),
    ...         Sample("b", "t", [5], [7, 8, 9], [1, 0, 1], None, 1.0)]
    >>> [row.tolist() for row in loss_mask(update_batch.pad(rows, {"a": 0.0, "b": 0.0})).unbind()]
    [[0.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]]
    """
    width = batch.prompts.shape[1]
    rows = []
    for attention, mask in zip(batch.attention_mask, batch.response_mask):
        prompt, response = int(attention[:width].sum()), int(attention[width:].sum())
        rows.append(torch.cat([torch.zeros(prompt, dtype=mask.dtype), mask[:response]]))
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def sft_tensordict(batch: Batch, config: UpdateConfig, real: int, rows: int):
    """The no-padding TensorDict of this rank's part of one mini-batch (`real` samples in `rows` rows over all
    ranks), its loss mask rebuilt (`loss_mask`), told to train it whole."""
    from verl.utils import tensordict_utils as tu

    td = batch.to_tensordict(1.0)  # SFT's likelihood is the model's own: no sampling temperature
    td["loss_mask"] = loss_mask(batch)
    tu.assign_non_tensor(td, calculate_entropy=False, global_batch_size=real, mini_batch_size=rows, epochs=1,
                         seed=config.seed, dataloader_kwargs={"shuffle": False}, compute_loss=True)
    return td


def build_sft_worker(checkpoint: Path, config: UpdateConfig):
    """The update's worker on `checkpoint`, fresh optimiser, with veRL's `sft_loss` as its loss."""
    from verl.workers.utils.losses import sft_loss

    worker, _ = build_worker(checkpoint, config, None, load_contents=[])
    worker.set_loss_fn(partial(sft_loss, config=None))
    return worker


def train(worker, samples: list[Sample], config: UpdateConfig) -> dict:
    """`epochs` passes of `mini_batches` consecutive near-equal mini-batches (`ranks.mini_batch_sizes`), one AdamW
    step each, this rank training its share of each (`ranks.shard_rows`); returns veRL's metrics, each a list over
    the steps."""
    ranks = update_ranks.current()
    shards = update_ranks.shard_rows(len(samples), config.mini_batches, ranks.world_size)
    rows = [*samples, update_batch.FILLER]  # row len(samples): the filler (no trained token)
    batch = update_batch.pad(rows, {sample.rollout_id: 0.0 for sample in rows})
    return update_train(worker, batch.rows(shards[ranks.rank]), config, ranks.world_size, len(samples),
                        tensordict=sft_tensordict)


def run_sft(samples: list[Sample], checkpoint: Path, config: UpdateConfig):
    """Checks, builds the worker, trains; returns (worker, metrics) for `write_output`. With `lora_rank` > 0 only a
    fresh LoRA adapter on the student trains (the update's `lora_settings`), and the adapter is what is written."""
    if (checkpoint / ADAPTER_CONFIG).is_file():
        raise ConfigError(f"--checkpoint {checkpoint} is a LoRA adapter; fine-tune a full model (export the adapter "
                          "merged first: python -m steps.export --merge)")
    check_inputs(samples, checkpoint, config)
    prepare_runtime()
    started = time.perf_counter()
    worker = build_sft_worker(checkpoint, config)
    trained = train(worker, samples, config)
    steps = config.epochs * len(update_ranks.mini_batch_sizes(len(samples), config.mini_batches))
    tokens = sum(sum(sample.response_mask) for sample in samples)
    losses = [float(value) for value in trained["loss"]]
    metrics = {"sft": True, "loss": losses[0], "losses": losses, "final_loss": losses[-1],
               "grad_norm": float(sum(float(v) for v in trained["grad_norm"]) / len(trained["grad_norm"])),
               "samples": len(samples), "optimizer_steps": steps, "optimizer_state": FRESH,
               "optimizer_steps_total": steps, "tokens_trained": tokens * config.epochs,
               "total_s": time.perf_counter() - started,
               **({"adapter": "fresh", "lora_rank": config.lora_rank} if config.lora_rank else {})}
    return worker, metrics


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m steps.sft", description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", required=True, help="samples.parquet (or its folder), local or s3://")
    p.add_argument("--checkpoint", required=True, help="the student: a Hugging Face folder or s3:// URL")
    p.add_argument("--out", required=True, help="where the fine-tuned checkpoint is written (folder or s3://)")
    p.add_argument("--config", help="the update's flat YAML config, configs/update.yaml (default: its defaults)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="overrides of the config's keys")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Read, check, train, write; exit code 2 on a bad input (one sentence, said by every rank, printed once by the
    launcher), 1 when the output cannot be written. As `steps.update.train.main` does, rank by rank."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    ranks = update_ranks.current()
    try:
        config = load_config(args.config, args.overrides)
        samples = read_samples(args.samples)
    except (ConfigError, update_batch.SampleError) as error:
        return update_ranks.refuse(f"steps.sft: {error}")
    node = store.node_folder()  # the weights are fetched once per node into it (`steps.checkpoint.fetch_rank`)
    with tempfile.TemporaryDirectory(prefix="openforge-sft-") as tmp:
        checkpoint = store.fetch_rank(args.checkpoint, Path(tmp) / "in", ranks.rank, ranks.world_size,
                                      ranks.local_rank, node, optimizer=False)
        try:
            worker, metrics = run_sft(samples, checkpoint, config)
        except (ConfigError, update_batch.SampleError) as error:
            return update_ranks.refuse(f"steps.sft: {error}")
        metrics = strict_metrics(metrics)
        local_out = Path(tmp) / "out" if store.is_remote(args.out) else store.fetch(args.out, Path(tmp))
        try:
            if ranks.first:
                store.unmark(args.out)
            update_ranks.barrier()  # before any rank writes a file of it
            write_output(worker, checkpoint, local_out, metrics, config, ranks,
                         owner=ranks.first or store.is_remote(args.out), base_model=args.checkpoint)
            if store.is_remote(args.out):
                publish_output(local_out, args.out, ranks, trained=True)
        except OSError as error:
            print(f"steps.sft: cannot write the checkpoint to {args.out} ({type(error).__name__}: {error})",
                  file=sys.stderr)
            return 1
    store.release(node, ranks.local_rank, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    report_io(ranks)
    if ranks.first:
        print(json.dumps(metrics, allow_nan=False))
    return 0
