"""LoRA in the update (`lora_rank` > 0): veRL's real `TrainingWorker` trains only a peft adapter on the tiny
model, saves it in peft's format with its optimiser state, the next update continues it, and the real vLLM
(CPU, `--enable-lora`) serving the adapter on the base model gives the trainer's logprobs.

Needs the training environment (verl, peft); the vLLM test also the serving env's Python
(`OPENFORGE_SERVE_PYTHON`, as in tests/test_update.py). Two updates run once per module through the CLI
(`python -m steps.update ... --base-model`) and every slow test reads them; besides, two skipped updates, one
2-rank update under torchrun and, for the vLLM comparison, one more worker: about 4 minutes on 2 shared cores
with vLLM's start (which runs beside the updates).
"""

import hashlib
import importlib.util
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl==0.9.1 is not installed in this environment (the training env)")
torch = pytest.importorskip("torch")

from steps.net import free_port  # noqa: E402
from steps.tiny_model import build_tiny_model  # noqa: E402
from steps.update import batch as update_batch, train as update  # noqa: E402
from steps.update.config import load_config  # noqa: E402
from steps.vllm_server import ServingOptions, VllmServer, spawn, stop_vllm, vllm_command  # noqa: E402
from update_reference import craft_samples, write_samples  # noqa: E402
from vllm_process import wait_ready  # noqa: E402

RANK = 8
# fp32 compute so that the first update's fresh adapter (lora_B = 0) is exactly the base; a large learning rate
# and 4 AdamW steps (2 epochs x 2 mini-batches) so that lora_B moves the logprobs far from the base's, which makes
# the base model a meaningful failing control for the vLLM comparison.
OVERRIDES = [f"lora_rank={RANK}", "learning_rate=1e-2", "compute_dtype=fp32", "weight_decay=0.0", "mini_batches=2",
             "epochs=2"]
STEPS = 4
ADAPTER = "policy-v2"  # the name vLLM serves the second update's adapter under
VLLM_TEST = "test_vllm_serves_the_adapter_with_the_trainers_logprobs_and_the_base_model_is_far_off"


def digest(folder: Path) -> dict[str, str]:
    """Every file's SHA-256 under `folder`, by relative path."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model (seed 0): the run's base model and iteration 0's checkpoint."""
    return build_tiny_model(tmp_path_factory.mktemp("lora-base"), seed=0)


@pytest.fixture(scope="module")
def lora_vllm(request: pytest.FixtureRequest, base: Path,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer | None]:
    """vLLM serving the base model as "tiny" with LoRA on (`--enable-lora --max-lora-rank`, runtime loading
    allowed), started with the module's first test and not waited for, so that it loads while the updates run;
    None when the vLLM test is not selected."""
    if not any(item.name == VLLM_TEST for item in request.session.items):
        yield None
        return
    options = ServingOptions(lora_rank=RANK)  # the serve step's own LoRA flags (`steps.vllm_server.lora_flags`)
    port = free_port()
    server = spawn(vllm_command(base.resolve(), "tiny", port, options), base.resolve(), "tiny", port,
                   tmp_path_factory.mktemp("lora-vllm") / "vllm.log")
    try:
        yield server
    finally:
        stop_vllm(server)


@pytest.fixture(scope="module")
def updates(base: Path, lora_vllm, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two updates through the CLI as a run makes them: iteration 0 from the base model (a fresh adapter),
    iteration 1 from the first's adapter folder, both with `--base-model`."""
    root = tmp_path_factory.mktemp("lora-updates")
    samples = craft_samples(base, seed=0)
    trajectories = write_samples(samples, root / "trajectories")
    before = digest(base)
    outs = [root / "iteration-1", root / "iteration-2"]
    for checkpoint, out in zip([base, outs[0]], outs):
        assert update.main(["--trajectories", str(trajectories), "--checkpoint", str(checkpoint), "--base-model",
                            str(base), "--out", str(out), *OVERRIDES]) == 0
    return {"outs": outs, "samples": samples, "trajectories": trajectories, "base_before": before,
            "metrics": [json.loads((out / update.METRICS_FILE).read_text()) for out in outs]}


def adapter_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The adapter's tensors by their stored (peft) names."""
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


@pytest.mark.slow
def test_the_update_writes_only_the_adapter_in_peft_format(updates: dict, base: Path) -> None:
    """The checkpoint is peft's adapter folder naming the base model, its optimizer state and metrics: no base
    weights, a small fraction of the base's bytes, the base folder untouched; the adapter trained (lora_B != 0)."""
    for out in updates["outs"]:
        names = sorted(path.name for path in out.iterdir())
        assert names == ["adapter_config.json", "adapter_model.safetensors", "metrics.json", "optimizer"], names
        config = json.loads((out / "adapter_config.json").read_text())
        assert config["r"] == RANK and config["lora_alpha"] == 16 and config["peft_type"] == "LORA"
        assert config["base_model_name_or_path"] == str(base)
        tensors = adapter_tensors(out)
        # peft's names, which vLLM's loader parses (vllm/lora/utils.py parse_fine_tuned_lora_name)
        assert all(name.startswith("base_model.model.model.layers.") and
                   name.endswith((".lora_A.weight", ".lora_B.weight")) for name in tensors), sorted(tensors)[:4]
        assert len(tensors) == 2 * 2 * 7  # 2 layers x 7 projections (all-linear) x (A, B)
        assert max(t.abs().max().item() for name, t in tensors.items() if "lora_B" in name) > 1e-2
        adapter_bytes = (out / "adapter_model.safetensors").stat().st_size
        assert adapter_bytes * 10 < (base / "model.safetensors").stat().st_size
    assert digest(base) == updates["base_before"]


@pytest.mark.slow
def test_the_optimizer_state_holds_only_the_adapters_parameters(updates: dict) -> None:
    """AdamW's moments exist for the adapter's tensors only, shaped like them; the base's far more tensors have
    none (the control: the model has many more parameters than the adapter)."""
    out = updates["outs"][0]
    state = torch.load(out / update.OPTIMIZER_DIR / "optim_world_size_1_rank_0.pt", weights_only=False)
    shapes = sorted(tuple(entry["exp_avg"].shape) for entry in state["state"].values())
    tensors = adapter_tensors(out)
    assert shapes == sorted(tuple(t.shape) for t in tensors.values())
    base_tensors = len(state["param_groups"][0]["params"]) - len(tensors)
    assert base_tensors > len(tensors) // 2 and len(state["state"]) == len(tensors)
    assert all(entry["exp_avg_sq"].abs().sum() > 0 for entry in state["state"].values())


@pytest.mark.slow
def test_the_next_update_continues_the_adapter_and_its_optimizer(updates: dict) -> None:
    """Iteration 1 loads iteration 0's adapter (its trainer logprobs are no longer the base's, against which the
    samples were made) and carries AdamW's state (step counts continue)."""
    first, second = updates["metrics"]
    assert first["adapter"] == "fresh" and first["optimizer_state"] == "fresh: the checkpoint has no optimizer state"
    assert first["logprob_gap"] < 1e-4  # a fresh adapter (lora_B = 0) is the base exactly
    assert second["adapter"] == "continued" and second["optimizer_state"] == "carried"
    assert second["logprob_gap"] > 0.1  # the trained adapter moved the model away from the base
    assert second["optimizer_steps_total"] == 2 * STEPS
    state = torch.load(updates["outs"][1] / update.OPTIMIZER_DIR / "optim_world_size_1_rank_0.pt",
                       weights_only=False)
    assert {int(entry["step"]) for entry in state["state"].values()} == {2 * STEPS}  # a fresh one would hold 4


@pytest.mark.slow
def test_a_skipped_update_copies_the_adapter_folder_unchanged(updates: dict, tmp_path: Path, base: Path) -> None:
    """No advantage: the adapter and its optimizer state are copied as they are, no base weights appear."""
    equal_rewards(updates["samples"], tmp_path)
    source = updates["outs"][1]
    assert update.main(["--trajectories", str(tmp_path), "--checkpoint", str(source), "--base-model", str(base),
                        "--out", str(tmp_path / "out"), *OVERRIDES]) == 0
    copied = digest(tmp_path / "out")
    assert json.loads((tmp_path / "out" / update.METRICS_FILE).read_text())["skipped"] == update.NO_ADVANTAGE
    del copied["metrics.json"]
    assert copied == {name: value for name, value in digest(source).items() if name != "metrics.json"}


@pytest.mark.slow
def test_a_skipped_first_update_still_writes_a_fresh_adapter(updates: dict, tmp_path: Path, base: Path) -> None:
    """No advantage in iteration 0: the checkpoint is a fresh adapter (lora_B = 0: the base model exactly), not
    a copy of the base weights, so that every checkpoint of a LoRA run is an adapter; the control is the
    skipped later update above, which copies."""
    equal_rewards(updates["samples"], tmp_path)
    assert update.main(["--trajectories", str(tmp_path), "--checkpoint", str(base), "--base-model", str(base),
                        "--out", str(tmp_path / "out"), *OVERRIDES]) == 0
    assert not list((tmp_path / "out").glob("model*.safetensors"))
    metrics = json.loads((tmp_path / "out" / update.METRICS_FILE).read_text())
    assert metrics["skipped"] == update.NO_ADVANTAGE and metrics["adapter"] == "fresh"
    tensors = adapter_tensors(tmp_path / "out")
    assert len(tensors) == 28 and all(t.abs().max() == 0 for name, t in tensors.items() if "lora_B" in name)


def equal_rewards(samples: list[update_batch.Sample], folder: Path) -> None:
    """`samples` with every reward 0.5 (no advantage anywhere) as `folder`/samples.parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{**{name: getattr(s, name) for name in update_batch.SAMPLE_COLUMNS}, "reward": 0.5} for s in samples]
    pq.write_table(pa.Table.from_pylist(rows), folder / "samples.parquet")


def test_an_adapter_without_its_base_model_or_of_another_rank_is_refused(tmp_path: Path) -> None:
    """An adapter folder as --checkpoint needs its base model, LoRA on and the adapter's rank: one sentence each
    (the CLI's exit code 2, before a model loads); a model folder is no adapter (a fresh one is made on it)."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 4}))
    lora, off = load_config(None, [f"lora_rank={RANK}"]), load_config(None, [])
    cases = [(None, lora, "is a LoRA adapter; give its base model with --base-model"),
             (tmp_path, off, "is a LoRA adapter \\(rank 4\\) but lora_rank is 0"),
             (tmp_path, lora, f"lora_rank={RANK} but the adapter in --checkpoint .* has rank 4; set lora_rank to 4")]
    for base, config, message in cases:
        with pytest.raises(update.ConfigError, match=message):
            update.adapter_of(adapter, base, config)
    assert update.adapter_of(tmp_path, tmp_path, lora) is None
    assert update.adapter_of(adapter, tmp_path, load_config(None, ["lora_rank=4"])) == adapter


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None and not os.environ.get("OPENFORGE_SERVE_PYTHON"),
                    reason="vLLM is not installed here and OPENFORGE_SERVE_PYTHON names no serving env's Python")
def test_vllm_serves_the_adapter_with_the_trainers_logprobs_and_the_base_model_is_far_off(
        updates: dict, lora_vllm: VllmServer, base: Path) -> None:
    """vLLM (bf16) loads the second update's adapter at run time (`POST /v1/load_lora_adapter`) and samples with
    it; the trainer on base + that adapter gives nearly the same logprobs on those tokens (`logprob_gap`). The
    control: the same prompts sampled from the base model (`"model": "tiny"`) are far off the trainer's."""
    import httpx

    wait_ready(lora_vllm)
    url, adapter = lora_vllm.base_url, updates["outs"][1]
    response = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": ADAPTER, "lora_path": str(adapter)},
                          timeout=120)
    assert response.status_code == 200, response.text

    def sampled(model: str) -> list[update_batch.Sample]:
        rng, samples = random.Random(7), []
        for task in range(2):
            for index in range(3):
                prompt = [rng.randrange(10, 4000) for _ in range(12)]
                body = {"model": model, "prompt": prompt, "max_tokens": 24, "temperature": 1.0, "logprobs": 0,
                        "ignore_eos": True, "return_token_ids": True, "seed": 100 * task + index}
                choice = httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()["choices"][0]
                samples.append(update_batch.Sample(
                    rollout_id=f"t{task}-r{index}", task=f"task-{task}", prompt_token_ids=prompt,
                    response_token_ids=choice["token_ids"], response_mask=[1] * len(choice["token_ids"]),
                    response_logprobs=choice["logprobs"]["token_logprobs"], reward=float(index % 2),
                    loss_weight=1.0))
        return samples

    config = load_config(None, [f"lora_rank={RANK}"])  # production bf16 compute, as vLLM serves
    worker, _ = update.build_worker(base, config, adapter=adapter)
    gaps = {}
    for model in (ADAPTER, "tiny"):
        samples = sampled(model)
        batch = update_batch.pad(samples, {s.rollout_id: 0.0 for s in samples})
        trainer, _ = update.trainer_logprobs(worker, batch, 1.0)
        mask = batch.response_mask.bool()
        gaps[model] = float((trainer - batch.rollout_log_probs).abs()[mask].mean())
    print(f"trainer vs vLLM mean |logprob gap|: adapter {gaps[ADAPTER]:.4f}, base model {gaps['tiny']:.4f}")
    assert gaps[ADAPTER] < 0.08
    assert gaps["tiny"] > 10 * gaps[ADAPTER]


@pytest.mark.slow
def test_two_ranks_write_the_adapter_one_rank_writes_and_one_rank_continues_it(updates: dict, base: Path,
                                                                              tmp_path: Path) -> None:
    """The run's own update command (`workflows.commands.update`: torchrun, 2 gloo ranks, the run's LoRA keys and
    `--base-model`) from the base model: each rank gathers the adapter's tensors, rank 0 writes the same adapter
    the 1-rank update wrote (float rounding: the ranks sum gradients in another order), and each rank saves AdamW's
    state of its shard of the adapter only. The control: the adapter moved far more than the two differ.
    Then one rank continues that adapter (its optimizer state resharded from 2 ranks to 1)."""
    import subprocess
    import sys

    from safetensors.torch import load_file

    from steps.contracts.config import RunConfig
    from workflows import commands

    run = RunConfig(update_gpus=2, model=str(base), lora_rank=RANK, learning_rate=1e-2)
    argv = commands.update(run, str(updates["trajectories"]), str(base), str(tmp_path / "out"), python=sys.executable)
    assert argv[argv.index("--base-model") + 1] == str(base)
    env = {key: value for key, value in os.environ.items()
           if key not in {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}}
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([*argv, *OVERRIDES[2:]], cwd=repo, env={**env, "PYTHONPATH": str(repo)},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    two, one = load_file(str(tmp_path / "out" / "adapter_model.safetensors")), adapter_tensors(updates["outs"][0])
    assert sorted(two) == sorted(one)
    moved = sum(float(one[name].norm() ** 2) for name in one if "lora_B" in name) ** 0.5
    differ = sum(float((two[name] - one[name]).norm() ** 2) for name in one) ** 0.5
    print(f"2 ranks vs 1: adapter difference {differ:.2e}, lora_B moved {moved:.2e}")
    assert differ < 1e-3 * moved
    for rank in range(2):
        state = torch.load(tmp_path / "out" / update.OPTIMIZER_DIR / f"optim_world_size_2_rank_{rank}.pt",
                           weights_only=False)["state"]
        assert len(state) == len(one)  # each rank holds its shard of every adapter tensor's moments, nothing else

    # Resharding: one rank continues the 2-rank adapter, its AdamW state gathered from both ranks' files, and
    # lands where the 1-rank run's own continuation landed. The control is the step count: a fresh optimizer
    # would restart it at 4.
    resharded = tmp_path / "resharded"
    assert update.main(["--trajectories", str(updates["trajectories"]), "--checkpoint", str(tmp_path / "out"),
                        "--base-model", str(base), "--out", str(resharded), *OVERRIDES]) == 0
    metrics = json.loads((resharded / update.METRICS_FILE).read_text())
    assert metrics["optimizer_state"] == "carried, resharded from world size 2"
    assert metrics["optimizer_steps_total"] == 2 * STEPS
    state = torch.load(resharded / update.OPTIMIZER_DIR / "optim_world_size_1_rank_0.pt", weights_only=False)
    assert {int(entry["step"]) for entry in state["state"].values()} == {2 * STEPS}
    after, reference = adapter_tensors(resharded), adapter_tensors(updates["outs"][1])
    moved = sum(float((reference[name] - one[name]).norm() ** 2) for name in one) ** 0.5
    differ = sum(float((after[name] - reference[name]).norm() ** 2) for name in one) ** 0.5
    print(f"resharded 2 -> 1: adapter difference {differ:.2e}, the second update moved it {moved:.2e}")
    assert differ < 1e-2 * moved
