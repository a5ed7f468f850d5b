"""Tokens/s of the policy update on 1 rank against N, as a run launches it (`steps.update`, under torchrun past 1).

    .venv-train/bin/python benchmarks/update_throughput.py [--device cpu] [--gpus 2] [--repeats 3] \\
        [--tasks 8] [--prompt-len 128] [--response-len 384] [--epochs 1]
    .venv-train/bin/python benchmarks/update_throughput.py --device gpu --gpus 8 --model DIR   # a GPU machine
    .venv-train/bin/python benchmarks/update_throughput.py --reference   # veRL's worker against a plain loop

Builds the tiny model (2 layers, hidden 128; `--model` takes a Hugging Face folder instead), crafts
`4 * tasks` samples of ~prompt+response tokens (`tests/update_reference.py`) and runs the update command
`workflows.commands.update` builds with `update_gpus` 1 and `--gpus`, alternately, `--repeats` times each.
The figure is the step's own `tokens_per_s` (trained tokens x epochs / the seconds of veRL's
`train_mini_batch`, from `metrics.json`): model loading, the logprob pass and saving are left out.
`--device cpu` hides any GPU from the update (gloo ranks, each with cores / ranks threads); `--device gpu`
needs `--gpus` GPUs and computes in bf16.

`--reference` is the older comparison in one process: `--steps` update steps through veRL's
`train_mini_batch` (FSDP2, no padding, dynamic micro-batches) against the reference loop (HF forward on
the padded batch, veRL's policy loss, AdamW) on the same batch.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from steps.tiny_model import build_tiny_model  # noqa: E402
from update_reference import craft_samples, load_model, reference_update, write_samples  # noqa: E402
from workflows import commands  # noqa: E402
from steps.contracts.config import RunConfig  # noqa: E402


def update_tokens_per_s(ranks: int, trajectories: Path, checkpoint: Path, out: Path, config: Path,
                        device: str) -> float:
    """One update run with `ranks` processes; its trained tokens per second of training."""
    run = RunConfig(update_gpus=ranks, update_config=str(config), learning_rate=1e-5)
    argv = commands.update(run, str(trajectories), str(checkpoint), str(out), python=sys.executable)
    env = {**os.environ, "PYTHONPATH": str(REPO), **({"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {})}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the update on {ranks} rank(s) failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads((out / "metrics.json").read_text())["tokens_per_s"]


def compare_ranks(args: argparse.Namespace) -> None:
    """1 rank against `--gpus` ranks, alternately, `--repeats` runs each; prints the table."""
    if args.device == "gpu" and torch.cuda.device_count() < args.gpus:
        sys.exit(f"--device gpu --gpus {args.gpus}: this machine has {torch.cuda.device_count()} GPU(s)")
    dtype = "bf16" if args.device == "gpu" else "fp32"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        checkpoint = Path(args.model) if args.model else build_tiny_model(root / "model", seed=0)
        samples = craft_samples(checkpoint, seed=0, prompt_len=args.prompt_len, response_len=args.response_len,
                                rollouts_per_task=(3,) * args.tasks)
        trajectories = write_samples(samples, root / "samples")
        config = root / "update.yaml"
        config.write_text((REPO / "configs" / "update.yaml").read_text() +
                          f"compute_dtype: {dtype}\ncarry_optimizer: false\nepochs: {args.epochs}\n")
        figures: dict[int, list[float]] = {1: [], args.gpus: []}
        for repeat in range(args.repeats):
            for ranks in figures:
                started = time.perf_counter()
                figures[ranks].append(update_tokens_per_s(ranks, trajectories, checkpoint, root / f"out-{ranks}",
                                                          config, args.device))
                print(f"run {repeat + 1}/{args.repeats}, {ranks} rank(s): {figures[ranks][-1]:.0f} trained tok/s "
                      f"({time.perf_counter() - started:.0f} s in all)", file=sys.stderr)
    tokens = sum(sum(s.response_mask) for s in samples)
    print(f"{len(samples)} samples, {tokens} trained tokens, {args.epochs} epoch(s), {args.device}, compute {dtype}, "
          f"{os.cpu_count()} cores, {args.repeats} runs each")
    print(f"{'ranks':<8}{'trained tok/s, median':>24}{'min - max':>18}")
    for ranks, values in figures.items():
        print(f"{ranks:<8}{statistics.median(values):>24.0f}{f'{min(values):.0f} - {max(values):.0f}':>18}")
    print(f"{args.gpus} ranks / 1 rank: {statistics.median(figures[args.gpus]) / statistics.median(figures[1]):.2f}x")


def time_steps(step, steps: int) -> float:
    """Seconds per call of `step()`, averaged over `steps` calls after one warm-up call."""
    step()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - started) / steps


def compare_reference(args: argparse.Namespace) -> None:
    """veRL's worker against the reference loop in this process, on the same batch; prints the table."""
    from steps.update import batch as update_batch, train as update
    from steps.update.config import load_config

    config = load_config(None, ["learning_rate=1e-5", "compute_dtype=fp32"])
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = build_tiny_model(Path(tmp), seed=0)
        samples = craft_samples(checkpoint, seed=0, prompt_len=args.prompt_len, response_len=args.response_len,
                                rollouts_per_task=(3,) * args.tasks)
        update.prepare_runtime()
        worker, _ = update.build_worker(checkpoint, config)
        batch = update_batch.pad(samples, update_batch.rollout_advantages(samples, config))
        trainer_lp, _ = update.trainer_logprobs(worker, batch, config.temperature)
        update_batch.correct(batch, trainer_lp, config)
        verl_s = time_steps(lambda: update.train(worker, batch, config), args.steps)
        model = load_model(checkpoint)
        reference_s = time_steps(lambda: reference_update(model, batch, config), args.steps)
    trained, total = int(batch.response_mask.sum()), int(batch.attention_mask.sum())
    print(f"{len(samples)} samples, {total} tokens ({trained} trained), {args.steps} steps, "
          f"{torch.get_num_threads()} threads, compute fp32, device {'cuda' if torch.cuda.is_available() else 'cpu'}")
    print(f"{'path':<22}{'s/step':>10}{'trained tok/s':>16}{'all tok/s':>12}")
    for name, seconds in (("veRL TrainingWorker", verl_s), ("reference loop", reference_s)):
        print(f"{name:<22}{seconds:>10.3f}{trained / seconds:>16.0f}{total / seconds:>12.0f}")
    print(f"veRL / reference throughput: {reference_s / verl_s:.2f}x")


def main() -> None:
    """Parse the flags, run the comparison asked for."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--gpus", type=int, default=2, help="ranks compared with 1 (GPUs with --device gpu)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each, alternating")
    parser.add_argument("--model", help="a Hugging Face model folder instead of the tiny model")
    parser.add_argument("--tasks", type=int, default=8, help="task groups; 4 samples each")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--response-len", type=int, default=384)
    parser.add_argument("--epochs", type=int, default=1, help="passes over the samples in each update")
    parser.add_argument("--reference", action="store_true", help="veRL's worker against the plain loop instead")
    parser.add_argument("--steps", type=int, default=3, help="with --reference: timed steps after a warm-up")
    args = parser.parse_args()
    compare_reference(args) if args.reference else compare_ranks(args)


if __name__ == "__main__":
    main()
