"""A real veRL SFT step on the tiny model through `python workflows/submit.py sft`, on samples built from a real
recording (tests/sft_recording.py: the scripted model's oracle through `submit.py eval --upstream`, kept by reward).

    OPENFORGE_SERVE_PYTHON=$PWD/.venv/bin/python PYTHONPATH=$PWD .venv-train/bin/python -m pytest -q tests/test_sft_train.py

The recording, `submit.py` and its samples step run in the serving environment (its Python, OPENFORGE_SERVE_PYTHON),
the training step in this one (OPENFORGE_TRAIN_PYTHON).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl==0.9.1 is not installed in this environment (the training env)")
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from sft_recording import REPO, record_eval, serving_python  # noqa: E402
from steps.contracts import layout  # noqa: E402
from steps.update.samples import read_samples  # noqa: E402


def nll(model_dir: Path, samples, masked: bool = True) -> float:
    """The reference: the mean negative log-likelihood, under transformers' own forward in fp32, of every sample's
    response tokens whose mask is 1 (all of them with `masked` False), over all such tokens of all samples."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for sample in samples:
            ids = torch.tensor([sample.prompt_token_ids + sample.response_token_ids])
            logprobs = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
            targets = ids[0, 1:]
            chosen = logprobs.gather(1, targets[:, None])[:, 0][len(sample.prompt_token_ids) - 1:]
            mask = torch.tensor(sample.response_mask if masked else [1] * len(chosen), dtype=torch.bool)
            total, count = total - float(chosen[mask].sum()), count + int(mask.sum())
    return total / count


@pytest.mark.slow
def test_an_sft_step_lowers_the_nll_of_the_recorded_answers_and_writes_a_loadable_checkpoint(
        tiny_model: Path, tmp_path: Path) -> None:
    """`submit.py sft --from RUN` builds the samples and runs veRL's `sft_loss` through the update's worker: its
    first loss equals the reference masked-mean NLL on the base weights (control: the NLL over every response
    token, tool output included, is another number); two steps change the parameters, and the written
    checkpoint, loaded by transformers, has a lower NLL on the same answers."""
    recorded = record_eval(tmp_path / "recording")
    store = recorded.parent
    env = {**{k: v for k, v in os.environ.items() if k != "ARGO_SERVER"}, "PYTHONPATH": str(REPO),
           "OPENFORGE_TRAIN_PYTHON": sys.executable}
    done = subprocess.run([serving_python(), "workflows/submit.py", "sft", "--from", recorded.name, "--model",
                           str(tiny_model), "--min-reward", "1", f"store={store}", "run=warm", "learning_rate=1e-3",
                           "epochs=2", "update_args=[compute_dtype=fp32, served_dtype=fp32]"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = json.loads(done.stdout.splitlines()[-1])
    checkpoint = Path(printed["checkpoint"])
    assert checkpoint == store / "warm" / "checkpoints" / "iteration-1"
    samples = read_samples(layout.run_partition_url(str(store / "warm"), "warm", 0))
    assert printed["samples"]["samples"] == len(samples) == 2 and printed["samples"]["kept_rollouts"] == 2
    before = nll(tiny_model, samples)
    metrics = printed["metrics"]
    assert metrics == json.loads((checkpoint / "metrics.json").read_text())
    assert abs(metrics["loss"] - before) < 1e-5 * before, (metrics["loss"], before)
    assert abs(nll(tiny_model, samples, masked=False) - before) > 0.1  # the control: the mask decides the loss
    assert metrics["optimizer_steps"] == 2 and metrics["losses"][1] < metrics["losses"][0]
    assert metrics["tokens_trained"] == 2 * sum(sum(s.response_mask) for s in samples)
    base = load_file(tiny_model / "model.safetensors")
    trained = {}
    for shard in sorted(checkpoint.glob("model-*.safetensors")):
        trained.update(load_file(shard))
    assert set(trained) == set(base)
    changed = sum(int((trained[name] != base[name]).sum()) for name in base)
    assert changed > 0.5 * sum(t.numel() for t in base.values())
    assert nll(checkpoint, samples) < before - 0.5  # lower NLL of the recorded answers
    assert (checkpoint / "optimizer" / "state.json").is_file() and (checkpoint / "tokenizer.json").is_file()
    # recorded as the SFT run's iteration 0: `eval --checkpoint warm:1` evaluates what it wrote
    from workflows.submit import resolve_checkpoint

    assert resolve_checkpoint(str(store), "warm:1")["checkpoint"] == str(checkpoint)


@pytest.mark.slow
def test_two_ranks_fine_tune_as_one_rank_does(tiny_model: Path, tmp_path: Path) -> None:
    """The SFT command the run builds with `update_gpus: 2` (torchrun, gloo on CPU, FSDP2 over both ranks) against
    `update_gpus: 1` on the same 9 samples in 3 mini-batches (a filler evens each out): the same losses and the same
    weights within the update's 2-rank tolerance (tests/test_update_ranks.py). The control: one rank on rank 0's
    share alone (what a rank that normalised by its own tokens would train on) lands elsewhere."""
    from steps.update import ranks as update_ranks, shards
    from test_update_ranks import METRICS, UPDATE, WEIGHTS, launcher_free_env, relative_difference
    from update_reference import craft_samples, write_samples
    from steps.contracts.config import RunConfig
    from workflows import commands

    samples = craft_samples(tiny_model, seed=0)
    assert len(samples) == 9
    update_config = tmp_path / "update.yaml"
    update_config.write_text((REPO / "configs" / "update.yaml").read_text() + "\n".join(UPDATE) + "\n")

    def sft(run: str, gpus: int, rows: list) -> tuple[dict, dict]:
        config = RunConfig(run=run, store=str(tmp_path), model=str(tiny_model), update_gpus=gpus,
                           update_config=str(update_config), learning_rate=1e-3)
        write_samples(rows, Path(layout.run_partition_url(config.run_url, run, 0)))
        argv = commands.sft(config, str(tiny_model), sys.executable)
        assert ("steps.update.launch" in argv) == (gpus > 1)
        done = subprocess.run(argv, cwd=REPO, env={**launcher_free_env(), "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        out = Path(layout.checkpoint_url(config.run_url, 1, config.model))
        return json.loads(done.stdout.splitlines()[-1]), shards.read_weights(out)

    base = load_file(tiny_model / "model.safetensors")
    one_metrics, one = sft("one", 1, samples)
    two_metrics, two = sft("two", 2, samples)
    assert one_metrics["optimizer_steps"] == two_metrics["optimizer_steps"] == 3
    assert two_metrics["losses"] == pytest.approx(one_metrics["losses"], rel=METRICS)
    assert two_metrics["tokens_trained"] == one_metrics["tokens_trained"]
    assert relative_difference(one, two, base) < WEIGHTS
    _, half = sft("half", 1, [samples[row] for row in update_ranks.shard_rows(9, 3, 2)[0]])
    assert relative_difference(one, half, base) > 100 * WEIGHTS  # the control


@pytest.mark.slow
def test_lora_sft_trains_an_adapter_that_merges_into_a_model_with_a_lower_nll(tiny_model: Path, tmp_path: Path) -> None:
    """`lora_rank: 8` (the run's key, passed by `commands.sft`): only a fresh adapter trains, the checkpoint is peft's
    adapter folder on the student (no full weights), its losses fall, and merged by `steps.export --merge` it is a model
    whose NLL of the answers is lower than the student's. An adapter given as the student is refused in one sentence
    (the control: the same command on the full model ran above)."""
    from test_update_ranks import UPDATE, launcher_free_env
    from update_reference import craft_samples, write_samples
    from steps.contracts.config import RunConfig
    from workflows import commands

    samples = craft_samples(tiny_model, seed=0)
    update_config = tmp_path / "update.yaml"
    update_config.write_text((REPO / "configs" / "update.yaml").read_text() + "\n".join(UPDATE) + "\n")
    env = {**launcher_free_env(), "PYTHONPATH": str(REPO)}

    def sft(run: str, student: Path) -> subprocess.CompletedProcess:
        config = RunConfig(run=run, store=str(tmp_path), model=str(student), update_config=str(update_config),
                           learning_rate=1e-2, epochs=3, lora_rank=8, lora_alpha=16)
        write_samples(samples, Path(layout.run_partition_url(config.run_url, run, 0)))
        argv = commands.sft(config, str(student), sys.executable)
        assert "lora_rank=8" in argv
        return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)

    done = sft("lora", tiny_model)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads(done.stdout.splitlines()[-1])
    adapter = tmp_path / "lora" / "checkpoints" / "iteration-1"
    assert (metrics["adapter"], metrics["lora_rank"], metrics["optimizer_steps"]) == ("fresh", 8, 9)
    assert metrics["losses"][-1] < metrics["losses"][0]
    assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
    assert not list(adapter.glob("model*.safetensors"))  # the adapter alone
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == str(tiny_model)
    merged = tmp_path / "merged"
    exported = subprocess.run([sys.executable, "-m", "steps.export", "--checkpoint", str(adapter), "--out",
                               str(merged), "--merge", "--dtype", "fp32"], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=600)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert nll(merged, samples) < nll(tiny_model, samples) - 0.1
    refused = sft("on-adapter", adapter)
    assert refused.returncode == 2 and "is a LoRA adapter; fine-tune a full model" in refused.stderr
    assert "Traceback" not in refused.stderr
