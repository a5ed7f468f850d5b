"""A skipped update decided before torch is imported (`steps.update.skip`): the samples prove there is no gradient,
so `python -m steps.update` copies the checkpoint and writes the skip's `metrics.json` without torch or veRL.

Runs in the training environment: the control is the update's own path (`steps.update.train`, veRL's estimator),
whose files and metrics the early path must reproduce.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("verl", reason="verl==0.9.1 is not installed in this environment (the training env)")

from steps.tiny_model import build_tiny_model  # noqa: E402
from steps.update import skip, train  # noqa: E402
from steps.update.config import UpdateConfig  # noqa: E402
from steps.update.samples import SAMPLE_COLUMNS  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with an optimiser state a carried update copies (its settings the default config's)."""
    folder = build_tiny_model(tmp_path_factory.mktemp("tiny-skip"), seed=0)
    optimizer = folder / "optimizer"
    optimizer.mkdir()
    state = {**train.optimizer_settings(UpdateConfig()), "optimizer_steps_total": 3}
    (optimizer / "state.json").write_text(json.dumps(state))
    (optimizer / "optim_world_size_1_rank_0.pt").write_bytes(b"adam moments stand-in")
    return folder


def write_samples(folder: Path, rewards: list[float]) -> Path:
    """One sample per rollout, two tasks alternating, the given rewards."""
    rows = [{"rollout_id": f"r{i}", "task": f"task-{i % 2}", "prompt_token_ids": [11, 12, 13],
             "response_token_ids": [21, 22, 23], "response_mask": [1, 0, 1], "response_logprobs": [-0.5, 0.0, -1.0],
             "reward": reward, "loss_weight": 1.0} for i, reward in enumerate(rewards)]
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{name: row[name] for name in SAMPLE_COLUMNS} for row in rows]),
                   folder / "samples.parquet")
    return folder


def argv(trajectories: Path, checkpoint: Path, out: Path, *overrides: str) -> list[str]:
    return ["--trajectories", str(trajectories), "--checkpoint", str(checkpoint), "--out", str(out), *overrides]


def imported(stderr: str) -> set[str]:
    """The modules `python -X importtime` reports as imported."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def files(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def test_a_provable_skip_imports_no_torch_and_writes_what_the_update_writes(checkpoint: Path, tmp_path: Path) -> None:
    """Every task's rollouts earned one reward: `python -m steps.update` imports neither torch nor veRL, and writes
    the same files (weights, config, tokenizer, optimiser state) and the same metrics as the update's own skip
    (control: `steps.update.train`, which decides with veRL's estimator). The import check's control: importing
    the update itself shows torch."""
    trajectories = write_samples(tmp_path / "flat", [1.0, 0.0, 1.0, 0.0])
    early = subprocess.run([sys.executable, "-X", "importtime", "-m", "steps.update",
                            *argv(trajectories, checkpoint, tmp_path / "early")],
                           env=ENV, capture_output=True, text=True, timeout=120)
    assert early.returncode == 0, early.stderr
    assert not {name for name in imported(early.stderr) if name.split(".")[0] in ("torch", "verl")}
    assert "no advantage" in early.stderr
    control = subprocess.run([sys.executable, "-X", "importtime", "-c", "import steps.update.train"],
                             env=ENV, capture_output=True, text=True, timeout=120)
    assert "torch" in imported(control.stderr)

    assert train.main(argv(trajectories, checkpoint, tmp_path / "update")) == 0
    written, expected = files(tmp_path / "early"), files(tmp_path / "update")
    assert "optimizer/optim_world_size_1_rank_0.pt" in expected and "model.safetensors" in expected
    assert written.keys() == expected.keys()
    assert all(written[name] == expected[name] for name in expected if name != "metrics.json")
    metrics, reference = (json.loads(found["metrics.json"]) for found in (written, expected))
    assert metrics.pop("total_s") >= 0 and reference.pop("total_s") >= 0
    # each says its store transfers as rank 0 alone (the update's counts are this process's, other tests' included)
    assert [(io["rank"], sorted(io)) for io in metrics.pop("io")] == [(io["rank"], sorted(io))
                                                                       for io in reference.pop("io")]
    assert metrics == reference == {"skipped": "no advantage", "groups_kept": 0, "groups_dropped": 2,
                                    "reward_mean": 0.5, "samples": 4,
                                    "optimizer_steps": 0, "tokens_trained": 0, "optimizer_state": "copied unchanged",
                                    "optimizer_steps_total": 3}


@pytest.mark.parametrize("rewards, overrides", [
    ([1.0, 0.0, 0.5, 0.0], []),  # task-0's rollouts earned 1.0 and 0.5: a gradient
    ([1.0, 0.0, 1.0, 0.0], ["adv_estimator=reinforce_plus_plus"]),  # whitened over the batch: not provable here
    ([1.0, 0.0, 1.0, 0.0], ["entropy_coeff=0.01"]),  # the entropy bonus trains without an advantage
    ([1.0, 0.0, 1.0, 0.0], ["max_tokens_per_micro_batch=4"]),  # refused by the update, in its words
], ids=["unequal-rewards", "batch-estimator", "entropy-bonus", "refused-input"])
def test_what_cannot_be_proved_a_skip_takes_the_updates_path(rewards, overrides, checkpoint: Path,
                                                             tmp_path: Path) -> None:
    """The early path declines (None: the update runs as before) and writes nothing; control: the same samples
    with equal rewards per task and the default config are skipped early."""
    trajectories = write_samples(tmp_path / "in", rewards)
    assert skip.main(argv(trajectories, checkpoint, tmp_path / "out", *overrides)) is None
    assert not (tmp_path / "out").exists()
    flat = write_samples(tmp_path / "flat", [1.0, 0.0, 1.0, 0.0])
    assert skip.main(argv(flat, checkpoint, tmp_path / "control")) == 0
    assert (tmp_path / "control" / "metrics.json").exists()
