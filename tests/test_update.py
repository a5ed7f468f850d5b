"""The policy update through veRL's real `TrainingWorker` (FSDP2) on CPU, with the tiny model.

Needs the training environment (torch + verl==0.9.1, see `docs/update.md`); skipped where verl is not
importable. One update runs once per module and is checked against a plain reference loop built from
veRL's own policy loss + AdamW (`update_reference.py`).
"""

import importlib.util
import os
import json
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl==0.9.1 is not installed in this environment (the training env)")
torch = pytest.importorskip("torch")

from steps import update, update_batch  # noqa: E402
from steps.tiny_model import build_tiny_model  # noqa: E402
from steps.update_config import load_config  # noqa: E402
from update_reference import craft_samples, load_model, reference_update, response_logprobs  # noqa: E402

# fp32 compute so that the worker and the reference loop agree to float rounding; a large lr so that
# one step visibly moves the weights.
OVERRIDES = ["lr=1e-3", "compute_dtype=fp32", "weight_decay=0.0"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model (seed 0) for this module."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-update"), seed=0)


@pytest.fixture(scope="module")
def samples(checkpoint: Path) -> list[update_batch.Sample]:
    """9 samples from 7 rollouts in 2 tasks; logprobs from the model itself."""
    return craft_samples(checkpoint, seed=0)


@pytest.fixture(scope="module")
def updated(checkpoint: Path, samples, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One update through veRL's worker, its saved checkpoint, and the reference loop on the same batch."""
    config = load_config(None, OVERRIDES)
    worker, metrics = update.run_update(samples, checkpoint, config)
    out = update.save_checkpoint(worker, checkpoint, tmp_path_factory.mktemp("updated"))
    update.save_optimizer(worker, out, config, metrics["optimizer_steps_total"])
    params = parameters(worker)
    batch = update_batch.pad(samples, update_batch.rollout_advantages(samples, config))
    update_batch.correct(batch, torch.zeros_like(batch.rollout_log_probs), config)  # bypass: rollout logprobs
    model = load_model(checkpoint)
    reference = reference_update(model, batch, config)
    return {"metrics": metrics, "out": out, "params": params, "reference": reference, "model": model,
            "config": config, "batch": batch, "adam": adam_state(worker)}


def parameters(worker) -> dict[str, torch.Tensor]:
    """The worker's parameters by HF name, copied."""
    return {name: tensor.detach().clone() for name, tensor in worker.engine.get_per_tensor_param()[0]}


def adam_state(worker) -> list[dict[str, torch.Tensor]]:
    """AdamW's per-parameter state (step, exp_avg, exp_avg_sq) of the worker's optimiser, copied, in order."""
    state = worker.engine.optimizer.state_dict()["state"]
    return [{key: (value.to_local() if hasattr(value, "to_local") else value).detach().clone()
             for key, value in state[index].items()} for index in sorted(state)]


@pytest.fixture(scope="module")
def continued(updated: dict, checkpoint: Path, samples) -> dict:
    """A second update from the first's checkpoint, with and without its optimiser state, and one continuous
    worker that takes both steps in a row on the same batch."""
    config = updated["config"]
    carried, carried_metrics = update.run_update(samples, updated["out"], config)
    off = load_config(None, [*OVERRIDES, "carry_optimizer=false"])
    fresh, fresh_metrics = update.run_update(samples, updated["out"], off)
    continuous, _ = update.build_worker(checkpoint, config)
    for _ in range(2):
        update.train(continuous, updated["batch"], config)
    return {"carried": parameters(carried), "carried_adam": adam_state(carried), "carried_metrics": carried_metrics,
            "fresh": parameters(fresh), "fresh_adam": adam_state(fresh), "fresh_metrics": fresh_metrics,
            "continuous": parameters(continuous), "continuous_adam": adam_state(continuous)}


def test_grpo_advantages_are_per_rollout_grouped_by_task(samples) -> None:
    """veRL's GRPO on rollouts, so the split rollout counts once in its group."""
    advantages = update_batch.rollout_advantages(samples, load_config(None, []))
    assert len(advantages) == 7
    for task in ("0", "1"):
        group = [value for rollout, value in advantages.items() if rollout.startswith(f"t{task}-")]
        assert abs(sum(group)) < 1e-5 and max(group) > 0 > min(group)


def test_a_group_whose_rewards_are_all_equal_gets_exactly_no_advantage() -> None:
    """8 rewards of 0.6: veRL's float32 group mean alone would leave +0.056 on each (rounding / (std + 1e-6))."""
    samples = [update_batch.Sample(f"t{task}-r{i}", str(task), [1], [2], [1], None, reward)
               for task, rewards in ((0, [0.6] * 8), (1, [0.0, 0.2, 0.4, 0.4])) for i, reward in enumerate(rewards)]
    for estimator in update_batch.GROUP_BASELINE_ESTIMATORS:
        advantages = update_batch.rollout_advantages(samples, load_config(None, [f"adv_estimator={estimator}"]))
        assert [advantages[f"t0-r{i}"] for i in range(8)] == [0.0] * 8, estimator
    assert update.no_gradient({k: v for k, v in advantages.items() if k.startswith("t0-")}, load_config(None, []))


def test_worker_update_equals_reference_loop(updated: dict) -> None:
    """Loss, grad norm and updated weights of veRL's worker match the plain loop's."""
    metrics, reference = updated["metrics"], updated["reference"]
    assert metrics["loss"] == pytest.approx(reference["loss"], rel=1e-4, abs=1e-6)
    assert metrics["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-4)
    state = updated["model"].state_dict()
    worst = max((updated["params"][name] - state[name]).abs().max().item() for name in updated["params"])
    assert worst < 1e-4  # after one AdamW step of lr 1e-3
    assert metrics["logprob_gap"] < 1e-4  # rollout logprobs came from the same weights
    assert metrics["tokens_trained"] == int(updated["batch"].response_mask.sum())
    assert metrics["reward_mean"] == pytest.approx(3 / 7)
    assert metrics["entropy"] > 0


def test_the_first_update_starts_a_fresh_optimizer_and_saves_it(updated: dict) -> None:
    """The base model has no optimiser state; the update saves AdamW's, as it was after the step."""
    assert updated["metrics"]["optimizer_state"] == "fresh: the checkpoint has no optimizer state"
    assert updated["metrics"]["optimizer_steps_total"] == 1
    folder = updated["out"] / update.OPTIMIZER_DIR
    assert json.loads((folder / "state.json").read_text())["optimizer_steps_total"] == 1
    saved = torch.load(folder / "optim_world_size_1_rank_0.pt", weights_only=False)["state"]
    assert len(saved) == len(updated["adam"])
    for index, state in enumerate(updated["adam"]):
        assert torch.equal(saved[index]["exp_avg"].to_local(), state["exp_avg"]) and state["exp_avg"].abs().sum() > 0
        assert int(state["step"]) == 1


def test_a_second_update_continues_the_optimizer_like_one_run(continued: dict) -> None:
    """Carried: step count 2 and the same moments and weights as two steps of one worker; off: neither."""
    assert continued["carried_metrics"]["optimizer_state"] == "carried"
    assert continued["carried_metrics"]["optimizer_steps_total"] == 2
    assert continued["fresh_metrics"]["optimizer_state"] == "fresh: carry_optimizer is off"
    for carried, continuous in zip(continued["carried_adam"], continued["continuous_adam"], strict=True):
        assert int(carried["step"]) == int(continuous["step"]) == 2
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.allclose(carried[key], continuous[key], rtol=1e-4, atol=1e-9), key
    assert all(int(state["step"]) == 1 for state in continued["fresh_adam"])
    carried_gap = max((continued["carried"][name] - tensor).abs().max().item()
                      for name, tensor in continued["continuous"].items())
    fresh_gap = max((continued["fresh"][name] - tensor).abs().max().item()
                    for name, tensor in continued["continuous"].items())
    assert carried_gap < 1e-5  # after two AdamW steps of lr 1e-3
    assert fresh_gap > 1e-4  # a fresh optimiser's first step is ~lr on every parameter


def test_an_optimizer_state_saved_with_another_lr_is_not_carried(updated: dict) -> None:
    """veRL's load would bring back the saved lr over the config's, so a changed lr starts fresh."""
    saved, why = update.saved_optimizer(updated["out"], load_config(None, [*OVERRIDES, "lr=2e-3"]))
    assert saved is None and why == "fresh: saved with another lr"
    assert update.saved_optimizer(updated["out"], updated["config"])[1] == "carried"


def test_parameters_change(updated: dict, checkpoint: Path) -> None:
    """Every trained matrix moved."""
    original = load_model(checkpoint).state_dict()
    moved = [name for name, tensor in updated["params"].items() if not torch.equal(tensor, original[name])]
    assert len(moved) == len(updated["params"])


def test_masked_tokens_get_no_gradient(checkpoint: Path, samples, updated: dict) -> None:
    """Garbage advantages / old logprobs on response_mask 0 tokens change neither loss nor grad norm."""
    config = updated["config"]
    worker, _ = update.build_worker(checkpoint, config)
    batch = update_batch.pad(samples, update_batch.rollout_advantages(samples, config))
    update_batch.correct(batch, torch.zeros_like(batch.rollout_log_probs), config)
    masked = batch.response_mask == 0
    batch.advantages[masked] = 1e3
    batch.old_log_probs[masked] = -30.0
    batch.rollout_is_weights[masked] = 5.0
    metrics = update.train(worker, batch, config)
    assert masked.any()
    assert metrics["loss"][0] == pytest.approx(updated["metrics"]["loss"], rel=1e-5, abs=1e-7)
    assert metrics["grad_norm"][0] == pytest.approx(updated["metrics"]["grad_norm"], rel=1e-5)


def test_checkpoint_loads_and_changes_output(updated: dict, checkpoint: Path, samples) -> None:
    """The written folder is a complete HF model with the trained weights; it moved the policy the right way."""
    out = updated["out"]
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        path.name for path in out.iterdir()}
    loaded, original = load_model(out), load_model(checkpoint)
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, updated["params"][name]), name
    advantages = update_batch.rollout_advantages(samples, updated["config"])
    changed, improvement = 0, 0.0
    for sample in samples:
        prompt = torch.tensor([sample.prompt_token_ids])
        with torch.no_grad():
            before = original.generate(prompt, max_new_tokens=8, do_sample=False)
            after = loaded.generate(prompt, max_new_tokens=8, do_sample=False)
        changed += not torch.equal(before, after)
        gain = (sum(response_logprobs(loaded, sample.prompt_token_ids, sample.response_token_ids))
                - sum(response_logprobs(original, sample.prompt_token_ids, sample.response_token_ids)))
        improvement += advantages[sample.rollout_id] * gain
    assert changed >= 1  # greedy output differs for at least one prompt
    assert improvement > 0  # sampled responses with positive advantage got likelier, negative ones less


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None and not os.environ.get("OPENFORGE_SERVE_PYTHON"),
                    reason="vLLM is not installed here and OPENFORGE_SERVE_PYTHON names no serving env's Python")
def test_vllm_reloads_checkpoint_and_output_changes(updated: dict, samples, vllm_server: str,
                                                    tiny_model: Path) -> None:
    """The real vLLM reloads the written folder in place (`reload_weights`) and its greedy output changes."""
    import httpx

    def greedy() -> list[str]:
        bodies = [{"model": "tiny", "prompt": s.prompt_token_ids, "max_tokens": 8, "temperature": 0} for s in samples]
        return [httpx.post(f"{vllm_server}/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
                for body in bodies]

    def reload(folder: Path) -> None:
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}
        httpx.post(f"{vllm_server}/collective_rpc", json=body, timeout=120).raise_for_status()

    before = greedy()
    reload(updated["out"])
    try:
        after = greedy()
    finally:
        reload(tiny_model)  # the session's server serves seed-0 weights to the other tests
    assert after != before


def test_cli_trains_on_samples_parquet(checkpoint: Path, samples, tmp_path: Path) -> None:
    """`python -m steps.update` end to end on a samples Parquet file, with TIS correction."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{name: getattr(sample, name) for name in update_batch.SAMPLE_COLUMNS} for sample in samples]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "samples.parquet")
    code = update.main(["--trajectories", str(tmp_path), "--checkpoint", str(checkpoint), "--out",
                        str(tmp_path / "out"), "--config", "configs/update.yaml", "correction=tis",
                        "compute_dtype=fp32"])
    assert code == 0
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["rollout_is_mean"] == pytest.approx(1.0, abs=1e-3)
    assert (tmp_path / "out" / "model.safetensors").exists()
    assert update.main(["--trajectories", str(tmp_path), "--checkpoint", str(checkpoint), "--out",
                        str(tmp_path / "bad"), "correction=nope"]) == 2


def test_cli_skips_the_step_when_no_rollout_has_an_advantage(updated: dict, samples, tmp_path: Path) -> None:
    """Every task's rollouts earned the same reward: no gradient, so no worker; the weights and the optimiser
    state are copied unchanged."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{**{name: getattr(sample, name) for name in update_batch.SAMPLE_COLUMNS}, "reward": 0.5}
            for sample in samples]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "samples.parquet")
    checkpoint = updated["out"]
    assert update.main(["--trajectories", str(tmp_path), "--checkpoint", str(checkpoint), "--out",
                        str(tmp_path / "out"), *OVERRIDES]) == 0
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["skipped"] == update.NO_ADVANTAGE and metrics["optimizer_steps"] == 0
    assert metrics["optimizer_state"] == "copied unchanged" and metrics["optimizer_steps_total"] == 1
    assert metrics["reward_mean"] == pytest.approx(0.5)
    optimizer = [f"{update.OPTIMIZER_DIR}/{path.name}" for path in (checkpoint / update.OPTIMIZER_DIR).glob("*.*")]
    assert len(optimizer) >= 3  # optim_*.pt, extra_state_*.pt, state.json
    for name in ("model.safetensors", "config.json", "tokenizer.json", *optimizer):
        assert (tmp_path / "out" / name).read_bytes() == (checkpoint / name).read_bytes(), name
