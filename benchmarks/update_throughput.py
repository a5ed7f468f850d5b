"""Tokens/s of the policy update: veRL's `TrainingWorker` (as `steps.update` runs it) vs a plain reference loop.

    .venv-train/bin/python benchmarks/update_throughput.py [--tasks 8] [--prompt-len 128] \\
        [--response-len 384] [--steps 3] [--compute-dtype fp32]

Builds the tiny model (2 layers, hidden 128), crafts `4 * tasks` samples of ~prompt+response tokens
(`tests/update_reference.py`), then times `--steps` update steps on the same batch through each path after
one warm-up step: the worker's `train_mini_batch` (FSDP2, no padding, dynamic micro-batches) and the
reference loop (HF forward on the padded batch, veRL's policy loss, AdamW). Trained tokens are the
`response_mask` tokens; all tokens include prompts. On a machine without a GPU the CPU adjustments of
`steps.update.cpu` apply, so this is the CPU figure; the same script gives the GPU one.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from steps.update import batch as update_batch, train as update  # noqa: E402
from steps.tiny_model import build_tiny_model  # noqa: E402
from steps.update.config import load_config  # noqa: E402
from update_reference import craft_samples, load_model, reference_update  # noqa: E402


def time_steps(step, steps: int) -> float:
    """Seconds per call of `step()`, averaged over `steps` calls after one warm-up call."""
    step()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - started) / steps


def main() -> None:
    """Build, craft, time both paths, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=8, help="task groups; 4 samples each")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--response-len", type=int, default=384)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--compute-dtype", default="fp32", choices=["fp32", "bf16"])
    args = parser.parse_args()
    config = load_config(None, ["learning_rate=1e-5", f"compute_dtype={args.compute_dtype}"])
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
    trained = int(batch.response_mask.sum())
    total = int(batch.attention_mask.sum())
    print(f"{len(samples)} samples, {total} tokens ({trained} trained), {args.steps} steps, "
          f"{torch.get_num_threads()} threads, compute {args.compute_dtype}, "
          f"device {'cuda' if torch.cuda.is_available() else 'cpu'}")
    print(f"{'path':<22}{'s/step':>10}{'trained tok/s':>16}{'all tok/s':>12}")
    for name, seconds in (("veRL TrainingWorker", verl_s), ("reference loop", reference_s)):
        print(f"{name:<22}{seconds:>10.3f}{trained / seconds:>16.0f}{total / seconds:>12.0f}")
    print(f"veRL / reference throughput: {reference_s / verl_s:.2f}x")


if __name__ == "__main__":
    main()
