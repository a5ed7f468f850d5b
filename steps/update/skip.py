"""A skipped update without torch: when the samples alone prove there is no gradient, the input checkpoint is copied
to `--out` with the `metrics.json` of a skip before torch or veRL is imported (`python -m steps.update` tries this
first; `steps.update.train` is the update itself and writes the same skip when it finds no gradient later).

    python -m steps.update --trajectories URL --checkpoint DIR_OR_URL --out DIR_OR_URL [--config F] [key=value ...]

Provably no gradient: no entropy bonus (`entropy_coeff` 0) and, under a group-baseline estimator
(`GROUP_BASELINE_ESTIMATORS`: GRPO, RLOO, ...), every task group's rollouts earned one reward, so every advantage
is 0 (`steps.update.batch.rollout_advantages` sets such groups to exactly 0). Anything else (another estimator,
samples with images, a LoRA run, a refused input) goes the normal way, which decides and refuses as before.
This module also owns what both paths share: the files a checkpoint copies, the optimiser state's settings, the
folder writes that a reader never sees half done, and the step's command line.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from steps import settings
from steps.checkpoint import METRICS_FILE, OPTIMIZER_DIR, fetch, io_counts, is_remote, publish, unmark
from steps.contracts.layout import ADAPTER_CONFIG
from steps.update.config import ConfigError, UpdateConfig, load_config
from steps.update.samples import (GROUP_BASELINE_ESTIMATORS, Sample, SampleError, check_inputs,
                                  check_sampled_temperature, flat_groups, group_of, read_samples, reward_mean,
                                  signal_groups)

DESCRIPTION = "The policy update: train the served checkpoint on recorded samples with veRL's real `TrainingWorker`."
# `metrics.json`'s "skipped" value when no step was taken: every rollout's advantage was 0.
NO_ADVANTAGE = "no advantage"
# Files copied from the input checkpoint so the output folder is a complete model for vLLM.
# A vision model's processor files come along (its image processor, its processor's and chat template).
CHECKPOINT_FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                    "special_tokens_map.json", "chat_template.jinja", "chat_template.json", "vocab.json",
                    "merges.txt", "added_tokens.json", "preprocessor_config.json", "processor_config.json",
                    "video_preprocessor_config.json"]

def optimizer_settings(config: UpdateConfig) -> dict:
    """What a saved optimiser state records: AdamW's hyperparameters, which it must have been saved with to be
    carried, and the world size (veRL's files are one shard per rank; another is resharded).

    >>> optimizer_settings(UpdateConfig())["betas"]
    [0.9, 0.999]
    """
    return {"learning_rate": config.learning_rate, "betas": list(config.betas),
            "weight_decay": config.weight_decay, "world_size": int(os.environ.get("WORLD_SIZE", "1"))}


def saved_optimizer(checkpoint: Path, config: UpdateConfig) -> tuple[dict | None, str]:
    """The checkpoint's `state.json` when its optimiser state is to be carried, else None; and, for metrics,
    "carried" or "fresh: " and why.

    A state saved with another learning_rate, betas or weight decay starts fresh: veRL's load would restore
    the saved values and silently override the config's. A state saved by another number of ranks carries,
    resharded (`steps.update.reshard`).
    """
    if not config.carry_optimizer:
        return None, "fresh: carry_optimizer is off"
    path = checkpoint / OPTIMIZER_DIR / "state.json"
    if not path.is_file():
        return None, "fresh: the checkpoint has no optimizer state"
    # a state saved before `lr` was renamed still carries
    saved, wanted = settings.with_new_names(json.loads(path.read_text())), optimizer_settings(config)
    changed = [name for name, value in wanted.items() if name != "world_size" and saved.get(name) != value]
    if changed:
        return None, f"fresh: saved with another {', '.join(changed)}"
    ranks = saved.get("world_size", 1)
    return saved, "carried" if ranks == wanted["world_size"] else f"carried, resharded from world size {ranks}"


def copy_checkpoint(checkpoint: Path, out: Path, optimizer: bool = True) -> Path:
    """The input checkpoint's weights, config, tokenizer files and (`optimizer`) optimiser state in `out`,
    unchanged (a skipped update)."""
    out.mkdir(parents=True, exist_ok=True)
    _copy_files(sorted(checkpoint.glob("*.safetensors*")) + [checkpoint / name for name in CHECKPOINT_FILES]
                + [checkpoint / ADAPTER_CONFIG], out)
    if optimizer and (checkpoint / OPTIMIZER_DIR).is_dir():
        _write_folder(out / OPTIMIZER_DIR, lambda folder: shutil.copytree(checkpoint / OPTIMIZER_DIR, folder))
    return out


def _copy_files(paths: list[Path], out: Path) -> None:
    """Copies those of `paths` that exist into `out`, each under a partial name renamed when complete."""
    for path in paths:
        if path.is_file():
            partial = out / f".{path.name}.partial"
            shutil.copyfile(path, partial)
            os.replace(partial, out / path.name)


def _write_text(path: Path, text: str) -> None:
    """`path` holds `text` whole or is untouched: written under a partial name, renamed when complete."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_text(text)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _write_folder(target: Path, fill) -> Path:
    """`fill` writes a fresh partial folder, which then replaces `target`: a reader never sees half of it
    (`fill` None: the ranks wrote it already, `save_optimizer`)."""
    partial = target.with_name(f".{target.name}.partial")
    if fill is not None:
        shutil.rmtree(partial, ignore_errors=True)
        fill(partial)
    if target.exists():
        shutil.rmtree(target)
    os.replace(partial, target)
    return target


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The CLI: URLs, the config file, and `key=value` overrides."""
    parser = argparse.ArgumentParser(prog="python -m steps.update", description=DESCRIPTION)
    parser.add_argument("--trajectories", required=True, help="samples.parquet file or its partition folder")
    parser.add_argument("--checkpoint", required=True, help="Hugging Face model folder (local or s3://)")
    parser.add_argument("--base-model", default="", help="with lora_rank > 0: the base model folder (local or "
                        "s3://) that --checkpoint's adapter is on; --checkpoint may be the base model itself")
    parser.add_argument("--out", required=True, help="folder for the new checkpoint and metrics.json")
    parser.add_argument("--images", default="", help="the run's image folder (local or s3://), where the "
                        "samples' images are stored by SHA-256; needed only when samples name images")
    parser.add_argument("--max-pixels", type=int, default=0, help="the pixel cap serving gave vLLM (the run's "
                        "max_pixels); 0: the checkpoint's own image processor's")
    parser.add_argument("--config", default="configs/update.yaml", help="flat YAML of UpdateConfig fields")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of config fields")
    return parser.parse_args(argv)


def provably_no_gradient(samples: list[Sample], config: UpdateConfig) -> bool:
    """True when every advantage is 0 and no entropy bonus is trained, proved from the rewards alone: a
    group-baseline estimator and one reward per task group (a rollout without a task is its own group). False
    where that cannot be shown without the estimator itself (the normal path then decides).

    >>> row = lambda rollout, task, reward: Sample(rollout, task, [1], [2], [1], None, reward)
    >>> flat = [row("r1", "a", 1.0), row("r2", "a", 1.0), row("r3", "b", 0.0), row("r4", "b", 0.0)]
    >>> provably_no_gradient(flat, UpdateConfig()), provably_no_gradient([*flat, row("r5", "b", 1.0)], UpdateConfig())
    (True, False)
    >>> provably_no_gradient(flat, UpdateConfig(adv_estimator="reinforce_plus_plus"))
    False
    """
    if config.entropy_coeff != 0 or config.adv_estimator not in GROUP_BASELINE_ESTIMATORS:
        return False
    rollouts = {sample.rollout_id: sample for sample in samples}
    groups = [group_of(sample) for sample in rollouts.values()]
    return len(flat_groups(groups, [float(sample.reward) for sample in rollouts.values()])) == len(set(groups))


def skipped_metrics(samples: list[Sample], config: UpdateConfig, saved: dict | None, optimizer_state: str,
                    started: float) -> dict:
    """`metrics.json` of an update that took no step (`started`: its `time.perf_counter()` start), with the task
    groups it kept and dropped (`signal_groups`: none kept)."""
    unmatched = {"unmatched_sampling": config.unmatched_sampling} if config.unmatched_sampling else {}
    return {**unmatched, "skipped": NO_ADVANTAGE, **signal_groups(samples, config)[1],
            "reward_mean": reward_mean(samples), "samples": len(samples),
            "optimizer_steps": 0, "tokens_trained": 0,
            "optimizer_state": "copied unchanged" if saved else optimizer_state,
            "optimizer_steps_total": saved["optimizer_steps_total"] if saved else 0,
            "total_s": time.perf_counter() - started}


def write_skipped(checkpoint: Path, out: Path, config: UpdateConfig) -> None:
    """The input checkpoint copied to `out` unchanged (its optimiser state too when carried), said on stderr."""
    print(f"steps.update: {NO_ADVANTAGE}: every task's rollouts earned the same reward, so there is no gradient; "
          "the weights and optimizer state are copied unchanged", file=sys.stderr, flush=True)
    copy_checkpoint(checkpoint, out, optimizer=config.carry_optimizer)


def main(argv: list[str] | None = None) -> int | None:
    """The skip, when provable, done without torch: 0 once the copy and its `metrics.json` are at `--out`; None
    when the normal path must run (a gradient, an estimator this cannot prove, images, or an input it refuses).

    Under torchrun every rank decides the same from the same inputs; rank 0 alone writes, as in the normal path.
    """
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        config = load_config(args.config, args.overrides)
        samples = read_samples(args.trajectories)
        check_sampled_temperature(args.trajectories, config.temperature)
    except (ConfigError, SampleError):
        return None  # refused by the normal path, in its words
    # A LoRA run goes the normal way: its first update writes a fresh adapter even when nothing trains.
    if config.lora_rank or any(sample.images for sample in samples) or not provably_no_gradient(samples, config):
        return None
    if os.environ.get("RANK", "0") != "0":
        return 0
    with tempfile.TemporaryDirectory(prefix="openforge-update-") as tmp:
        checkpoint = fetch(args.checkpoint, Path(tmp) / "in")
        try:
            check_inputs(samples, checkpoint, config)
        except (ConfigError, SampleError):
            return None
        started = time.perf_counter()
        saved, optimizer_state = saved_optimizer(checkpoint, config)
        metrics = {**skipped_metrics(samples, config, saved, optimizer_state, started), "io": [io_counts()]}
        out = Path(tmp) / "out" if is_remote(args.out) else fetch(args.out, Path(tmp))
        try:
            unmark(args.out)
            write_skipped(checkpoint, out, config)
            _write_text(out / METRICS_FILE, json.dumps(metrics, indent=2, allow_nan=False) + "\n")
            if is_remote(args.out):
                publish(out, args.out)
        except OSError as error:
            print(f"steps.update: cannot write the new checkpoint to {args.out} ({type(error).__name__}: {error})",
                  file=sys.stderr)
            return 1
    print(json.dumps(metrics, allow_nan=False))
    return 0
