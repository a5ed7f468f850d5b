"""A task group whose rollouts all earned one reward is not trained on: the real veRL update (tiny model, CPU, fp32)
on a batch with such a group ends with the very weights of the update on the batch without it.

Needs the training environment (torch + verl==0.9.1); the fast checks of the filter are in
`tests/test_learning_signal.py`.
"""

from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl==0.9.1 is not installed in this environment (the training env)")
torch = pytest.importorskip("torch")

from steps.tiny_model import build_tiny_model  # noqa: E402
from steps.update import train as update  # noqa: E402
from steps.update.config import load_config  # noqa: E402
from update_reference import craft_samples  # noqa: E402

# fp32 so that two updates on the same samples agree exactly; a large lr so that one step visibly moves the weights
OVERRIDES = ["learning_rate=1e-3", "compute_dtype=fp32", "weight_decay=0.0", "served_dtype=fp32"]


def parameters(worker) -> dict[str, torch.Tensor]:
    """The worker's parameters by Hugging Face name, copied."""
    return {name: tensor.detach().clone() for name, tensor in worker.engine.get_per_tensor_param()[0]}


@pytest.mark.slow
def test_a_flat_group_is_dropped_counted_and_not_trained_on(tmp_path: Path) -> None:
    """Two mixed groups and one whose rollouts all earned 1: the update drops the flat one (counted), trains on the
    mixed ones, and lands on the weights of the update given the mixed ones alone. The control: with
    drop_flat_groups=false the flat group's tokens are in the batch (more tokens trained), and the weights moved."""
    checkpoint = build_tiny_model(tmp_path / "tiny", seed=0)
    mixed = craft_samples(checkpoint, seed=0)
    flat = [replace(sample, rollout_id=f"flat-{sample.rollout_id}", task="task-flat", reward=1.0)
            for sample in mixed if sample.task == "task-0"]
    config = load_config(None, OVERRIDES)
    worker, dropped = update.run_update([*mixed, *flat], checkpoint, config)
    with_drop = parameters(worker)
    del worker
    worker, alone = update.run_update(mixed, checkpoint, config)
    without_flat = parameters(worker)
    del worker
    worker, kept = update.run_update([*mixed, *flat], checkpoint, load_config(None, [*OVERRIDES,
                                                                                     "drop_flat_groups=false"]))
    del worker
    assert (dropped["groups_kept"], dropped["groups_dropped"]) == (2, 1)
    assert "skipped" not in dropped and dropped["optimizer_steps"] >= 1  # not skipped: groups were left
    assert dropped["samples"] == len(mixed) and dropped["tokens_trained"] == alone["tokens_trained"]
    assert all(torch.equal(with_drop[name], without_flat[name]) for name in with_drop)
    assert (kept["groups_kept"], kept["groups_dropped"]) == (3, 0)
    assert kept["samples"] == len(mixed) + len(flat) and kept["tokens_trained"] > dropped["tokens_trained"]
    base = update.build_worker(checkpoint, config)[0]
    before = parameters(base)
    assert any(not torch.equal(before[name], with_drop[name]) for name in before)  # the update did move the weights
