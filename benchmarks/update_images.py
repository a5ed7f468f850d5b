"""Update tokens/s on samples with screenshots against text samples of the same token count, side by side.

    .venv-train/bin/python benchmarks/update_images.py [--samples 8] [--response-len 64] [--repeats 3]

Builds the tiny vision model (`steps.tiny_model --vision`, Qwen2.5-VL) and two samples tables of `--samples`
samples each: one whose prompts show one 1280x720 screenshot each (252 image tokens at the tiny model's pixel
cap; the images stored in a run's image folder), one whose prompts are text ids of exactly the same lengths,
trained on the tiny text model (the vision model's text part without the tower: veRL 0.9.1 cannot train a
vision model on a micro-batch without images, `docs/update.md`).
Runs the update command the run builds (`workflows.commands.update`, one rank, CPU, production bf16) on
each, alternately, `--repeats` times, and prints the median and the spread (min-max) of the step's own
`tokens_per_s` (trained tokens / seconds of veRL's `train_mini_batch`) and of `total_s` (the whole step but
model loading and saving: the images' reading and processing, the logprob pass, the training).
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from steps.tiny_model import build_tiny_model  # noqa: E402
from steps.update.batch import Sample  # noqa: E402
from test_update_vision import image_prompt, screenshot, store_image  # noqa: E402
from update_reference import write_samples  # noqa: E402
from workflows import commands  # noqa: E402
from steps.contracts.config import RunConfig  # noqa: E402


def tables(root: Path, checkpoint: Path, count: int, response_len: int) -> tuple[Path, Path, Path]:
    """The image samples' and the text samples' folders, and the image folder; rewards alternate in one task."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng, images = random.Random(0), root / "calls" / "images"
    image_samples, text_samples = [], []
    for index in range(count):
        data = screenshot(index)
        prompt = image_prompt(checkpoint, [data], f"Step {index}: click the blue button.")
        response = [rng.randrange(10, 4000) for _ in range(response_len)]
        common = dict(task="click", response_token_ids=response, response_mask=[1] * response_len,
                      response_logprobs=None, reward=float(index % 2), sample_index=0)
        image_samples.append(Sample(rollout_id=f"r{index}", prompt_token_ids=prompt,
                                    images=[store_image(images, data)], **common))
        text_samples.append(Sample(rollout_id=f"r{index}", prompt_token_ids=[rng.randrange(10, 4000) for _ in prompt],
                                   **common))
    folders = []
    for name, samples in (("image", image_samples), ("text", text_samples)):
        folder = write_samples(samples, root / name)
        table = pq.read_table(folder / "samples.parquet")
        column = pa.array([sample.images or [] for sample in samples], pa.list_(pa.string()))
        pq.write_table(table.append_column("images", column), folder / "samples.parquet")
        folders.append(folder)
    return folders[0], folders[1], images


def run(trajectories: Path, checkpoint: Path, out: Path, run_url: Path) -> dict:
    """One update as a run launches it; its metrics."""
    config = RunConfig(store=str(run_url.parent), run=run_url.name, learning_rate=1e-5)
    argv = commands.update(config, str(trajectories), str(checkpoint), str(out), python=sys.executable)
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the update on {trajectories.name} samples failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads((out / "metrics.json").read_text())


def spread(values: list[float]) -> str:
    """Median and min-max, as the table prints them.

    >>> spread([3.0, 1.0, 2.0])
    '2.00 (1.00-3.00)'
    """
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str] | None = None) -> None:
    """Builds the model and tables, runs the updates alternately, prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--response-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "run"
        checkpoint = build_tiny_model(Path(tmp) / "model", vision="qwen2_5_vl")
        # veRL 0.9.1 fails a micro-batch without images on a vision model (docs/update.md): the text samples
        # train the tiny text model, the vision model's text part alone
        text_model = build_tiny_model(Path(tmp) / "text-model")
        image_folder, text_folder, _ = tables(root, checkpoint, args.samples, args.response_len)
        results = {"image": [], "text": []}
        for repeat in range(args.repeats):
            for name, folder, model in (("image", image_folder, checkpoint), ("text", text_folder, text_model)):
                results[name].append(run(folder, model, Path(tmp) / f"out-{name}-{repeat}", root))
        print(f"{args.samples} samples, {args.response_len} trained tokens each, one 1280x720 screenshot per image "
              f"prompt (252 image tokens); {args.repeats} runs each, alternately; median (min-max)")
        print("| samples | tokens/s (train_mini_batch) | total_s (step, no load/save) |")
        print("|---|---|---|")
        for name, metrics in results.items():
            print(f"| {name} | {spread([m['tokens_per_s'] for m in metrics])} | "
                  f"{spread([m['total_s'] for m in metrics])} |")


if __name__ == "__main__":
    main()
