"""A mixture-of-experts model end to end: the tiny Qwen3-MoE (`python -m steps.tiny_model OUT --moe`) runs the
embedded default's whole loop, and the weight swap serves the updated weights right.

vLLM 0.32 on CPU cannot reload a MoE model in place (`steps.vllm_server.reloads_in_place` says why), so the serve
step restarts vLLM on each new checkpoint. Shown with real parts: a 2-iteration local run (real vLLM, the proxy,
`direct` rollouts, the real veRL update, the restart swap, iteration 1 served by the restarted vLLM), then one serve
step on the base model that records a call in each dialect, is swapped to the run's updated checkpoint, and records
them again. Every recorded logprob is checked against Hugging Face's on the same tokens and weights; the in-place
reload of the same checkpoint is the failing control.
"""

import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from steps.net import free_port
from steps.proxy.client import ProxyClient, ProxyClientError
from steps.tiny_model import build_tiny_model
from steps.vllm_server import is_moe, reloads_in_place

REPO = Path(__file__).resolve().parents[1]
ADMIN_KEY = "moe-admin-key"
# |vLLM - Hugging Face| logprob on the same tokens, bf16 serving against an fp32 reference: the median is 0.02-0.05
# here, the mean 0.05-0.25, as a token whose router margin is near a tie may route to other experts (up to 3 nats);
# the in-place reload's mean was 7.4. Calls are compared by their median (robust to that tail), the update by its
# mean `logprob_gap`.
RIGHT_GAP, WRONG_GAP = 0.25, 1.0
RIGHT_UPDATE_GAP = 0.5
needs_train = pytest.mark.skipif(not (REPO / ".venv-train" / "bin" / "python").exists()
                                 and not os.environ.get("OPENFORGE_TRAIN_PYTHON"),
                                 reason="veRL's environment (.venv-train) is not set up: run `make train-setup`")


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-moe"), seed=0, moe=True)


def test_the_tiny_moe_model_is_qwen3_moe_and_built_the_same_every_time(moe_model, tmp_path, tiny_model):
    config = json.loads((moe_model / "config.json").read_text())
    assert config["model_type"] == "qwen3_moe" and config["num_experts_per_tok"] == 2
    assert config.get("num_local_experts", config.get("num_experts")) == 8
    again = build_tiny_model(tmp_path / "again", seed=0, moe=True)
    assert (again / "model.safetensors").read_bytes() == (moe_model / "model.safetensors").read_bytes()
    assert (again / "tokenizer.json").read_bytes() == (tiny_model / "tokenizer.json").read_bytes()
    assert (again / "chat_template.jinja").read_text() == (tiny_model / "chat_template.jinja").read_text()
    other = build_tiny_model(tmp_path / "other", seed=1, moe=True)  # control: the seed decides the weights
    assert (other / "model.safetensors").read_bytes() != (moe_model / "model.safetensors").read_bytes()


def test_a_moe_checkpoint_is_restarted_on_cpu_and_a_dense_one_reloaded(moe_model, tiny_model):
    assert is_moe(moe_model) and not is_moe(tiny_model)
    assert not reloads_in_place(moe_model, "cpu") and reloads_in_place(moe_model, "gpu")
    assert reloads_in_place(tiny_model, "cpu")


def test_the_restart_swap_holds_calls_at_the_gate_and_a_failed_restart_leaves_the_replica_out():
    """The proxy's swap with a `Restart` (what steps.serve hands it for a MoE model on CPU), on two fake vLLMs: no
    in-place reload is sent, a call made during the restart waits and is answered by the new weights with the new
    version; a restart that fails leaves its replica out (the control: the other one serves), and the next swap
    restarts it again."""
    import asyncio
    import threading

    from test_replicas import _call, _offline, _rollout

    from steps.proxy.weights import swap_weights

    async def check(fakes, replicas, gate) -> None:
        restarted, failing = [], threading.Event()

        def restart(index: int, weights_path: str) -> None:
            time.sleep(0.3)  # a vLLM start, in miniature
            if failing.is_set() and index == 1:
                raise RuntimeError("vLLM replica 1 exited with code 1 while starting")
            restarted.append((index, weights_path))
            fakes[index].weights, fakes[index].version = weights_path, "0"  # a fresh vLLM's own version

        swap = asyncio.create_task(swap_weights(gate, replicas, "ckpt-1", "1", restart))
        await asyncio.sleep(0.1)
        record, answer = await _call(replicas, gate, _rollout("r-0"))  # made while the replicas restart
        assert await swap == [] and sorted(restarted) == [(0, "ckpt-1"), (1, "ckpt-1")]
        assert answer == "weights ckpt-1" and record["weight_version"] == "1"
        assert all("/collective_rpc" not in fake.seen and fake.version == "1" for fake in fakes)

        failing.set()
        failures = [failure.info() for failure in await swap_weights(gate, replicas, "ckpt-2", "2", restart)]
        assert failures == [{"replica": 1, "stage": "restart",
                             "error": "vLLM replica 1 exited with code 1 while starting"}]
        assert [replica.state for replica in replicas.all] == ["live", "failed"]
        for name in ("r-1", "r-2", "r-3"):  # never the failed replica's weights
            record, answer = await _call(replicas, gate, _rollout(name))
            assert answer == "weights ckpt-2" and record["replica"] == 0 and record["weight_version"] == "2"
        failing.clear()
        assert await swap_weights(gate, replicas, "ckpt-3", "3", restart) == []
        assert [replica.state for replica in replicas.all] == ["live", "live"] and fakes[1].weights == "ckpt-3"

    _offline(check)


# --- the loop, and the swap against Hugging Face ----------------------------------------------------

def hf_logprobs(model_dir: Path, token_ids: list[int], start: int) -> list[float]:
    """Hugging Face's logprob of each of `token_ids[start:]` given the tokens before it, in fp32."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0].log_softmax(-1)
    return [logits[i - 1, token_ids[i]].item() for i in range(start, len(token_ids))]


def gap(call: dict, model_dir: Path) -> float:
    """Median |recorded - Hugging Face| logprob over a recorded call's response tokens."""
    prompt, response = call["prompt_token_ids"], call["response_token_ids"]
    reference = hf_logprobs(model_dir, prompt + response, len(prompt))
    return statistics.median(abs(a - b) for a, b in zip(call["response_logprobs"], reference))


def vllm_gap(vllm_url: str, model_dir: Path, token_ids: list[int]) -> float:
    """Median |vLLM - Hugging Face| prompt logprob of `token_ids` (vLLM asked directly, prefill path)."""
    body = {"model": "tiny", "prompt": token_ids, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 0}
    request = urllib.request.Request(f"{vllm_url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as answer:
        served = json.loads(answer.read())["choices"][0]["prompt_logprobs"]
    reference = hf_logprobs(model_dir, token_ids, 1)
    return statistics.median(abs(served[i][str(token_ids[i])]["logprob"] - reference[i - 1])
                             for i in range(1, len(token_ids)))


@pytest.fixture(scope="module")
def moe_run(moe_model, tmp_path_factory) -> Path:
    """Two iterations of the embedded default on the tiny MoE model (minutes: two vLLM starts, two updates)."""
    from test_local_run import always_training_update_config

    tmp_path = tmp_path_factory.mktemp("moe-run")
    store = tmp_path / "runs"
    update_config = always_training_update_config(tmp_path)
    settings = [f"store={store}", "run=moe", "iterations=2", "dataset=steps/tasks/toy", "tasks_per_iteration=1",
                "samples_per_task=4", "max_tokens_cap=16", "parallel_rollouts=4", f"model={moe_model}",
                f"update_config={update_config}"]
    done = subprocess.run([sys.executable, "workflows/submit.py", "--harness", "direct", *settings], cwd=REPO,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return store / "moe"


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(1800)  # the run's two vLLM starts and two updates, on 2 busy cores
@needs_train
def test_two_iterations_of_the_moe_model_run_locally_and_iteration_1_serves_the_update(moe_run, moe_model):
    from steps.contracts.table_files import partition_url, read_table

    for iteration in (0, 1):
        record = json.loads((moe_run / "manifest" / f"iteration-{iteration}.json").read_text())
        assert record["status"] == "Succeeded"
        partition = partition_url(str(moe_run / "trajectories"), "moe", iteration)
        assert read_table(partition, "rollouts").num_rows == 4 and read_table(partition, "samples").num_rows >= 4
        metrics = json.loads((moe_run / "checkpoints" / f"iteration-{iteration + 1}" / "metrics.json").read_text())
        assert metrics["tokens_trained"] > 0
        # The trainer's logprobs against those recorded: iteration 1's calls were served by the restarted vLLM on
        # iteration 1's checkpoint, which the update then trained from.
        assert metrics["logprob_gap"] < RIGHT_UPDATE_GAP, metrics
        assert record["metrics"]["logprob_gap"] == metrics["logprob_gap"]  # the manifest's, per iteration
    versions = {}
    for call_log in (moe_run / "calls" / "rollouts").glob("*/calls.jsonl"):
        for call in map(json.loads, call_log.read_text().splitlines()):
            versions.setdefault(call["rollout_id"].split("-")[0], set()).add(call["weight_version"])
            if call["rollout_id"].startswith("it1") and call["response_token_ids"]:
                assert gap(call, moe_run / "checkpoints" / "iteration-1") < RIGHT_GAP
    assert versions == {"it0": {"0"}, "it1": {"1"}}
    gaps = json.dumps([json.loads((moe_run / "checkpoints" / f"iteration-{i}" / "metrics.json").read_text())
                       ["logprob_gap"] for i in (1, 2)])
    print(f"MoE logprob_gap per iteration: {gaps}")


def start_serve(model: Path, store: Path, log: Path) -> tuple[subprocess.Popen, ProxyClient, str]:
    """`steps.serve` on `model` as "tiny" (vLLM + proxy); returns the process, the proxy's client and vLLM's own
    URL."""
    port = free_port()
    argv = [sys.executable, "-m", "steps.serve", "--model", str(model), "--model-name", "tiny", "--port", str(port),
            "--store", str(store), "--weight-version", "0", "--log", str(log.with_name("vllm.log"))]
    process = subprocess.Popen(argv, cwd=REPO, env={**os.environ, "OPENFORGE_ADMIN_KEY": ADMIN_KEY,
                                                    "PYTHONPATH": str(REPO)},
                               stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        if found := re.search(r"vLLM ready on (http://\S+);", log.read_text(errors="replace")):
            client = ProxyClient(f"http://127.0.0.1:{port}", ADMIN_KEY, timeout_s=2, retries=0)
            try:
                client.health()
                return process, ProxyClient(client.url, ADMIN_KEY), found.group(1)
            except ProxyClientError:
                pass
        time.sleep(1)
    process.kill()
    raise AssertionError(f"steps.serve did not start within 900 s:\n{log.read_text()[-3000:]}")


def calls_in_every_dialect(client: ProxyClient, name: str) -> list[dict]:
    """One plain temperature-0 call in each dialect, through the official SDKs; the recorded calls."""
    import test_proxy_vllm as dialects

    recorded = []
    for dialect, ask in dialects.ASK.items():
        rollout = client.register(f"{name}-{dialect}")
        ask(rollout, "plain", stream=False)
        (call,) = client.calls(rollout["rollout_id"]).calls
        assert call["dialect"] == dialect
        recorded.append(call)
    return recorded


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(1200)  # a vLLM start and a restart
@needs_train
def test_the_swap_restarts_vllm_on_the_update_and_an_in_place_reload_would_be_wrong(moe_run, moe_model, tmp_path):
    updated = moe_run / "checkpoints" / "iteration-1"
    process, client, vllm_url = start_serve(moe_model, tmp_path / "calls", tmp_path / "serve.log")
    try:
        base_calls = calls_in_every_dialect(client, "base")
        for call in base_calls:
            assert call["weight_version"] == "0" and gap(call, moe_model) < RIGHT_GAP
        token_ids = base_calls[0]["prompt_token_ids"] + base_calls[0]["response_token_ids"]
        assert vllm_gap(vllm_url, moe_model, token_ids) < RIGHT_GAP

        # The failing control: vLLM's own in-place reload of the updated checkpoint serves wrong logprobs.
        reload = urllib.request.Request(f"{vllm_url}/collective_rpc", data=json.dumps(
            {"method": "reload_weights", "kwargs": {"weights_path": str(updated)}}).encode(),
            headers={"content-type": "application/json"})
        urllib.request.urlopen(reload, timeout=300).read()
        reloaded_gap = vllm_gap(vllm_url, updated, token_ids)
        assert reloaded_gap > WRONG_GAP

        started = time.monotonic()
        answer = client.update_weights(str(updated), "1")
        restart_s = time.monotonic() - started
        assert answer["failed"] == [], answer
        print(f"restart swap took {restart_s:.1f} s")
        for call in calls_in_every_dialect(client, "updated"):
            assert call["weight_version"] == "1" and gap(call, updated) < RIGHT_GAP
        restarted_gap = vllm_gap(vllm_url, updated, token_ids)
        assert restarted_gap < RIGHT_GAP
        assert "restarted on" in (tmp_path / "serve.log").read_text()
        print(f"median |gap| to Hugging Face: in-place reload {reloaded_gap:.3f}, restart {restarted_gap:.3f}")
    finally:
        process.terminate()
        process.wait(timeout=120)
