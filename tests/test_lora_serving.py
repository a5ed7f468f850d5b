"""A LoRA run's serving on the real vLLM (CPU): the base model once, each version's adapter loaded at run time.

One vLLM with the serve step's LoRA flags (`ServingOptions(lora_rank=8)`) serves the tiny model; adapters in peft's
format are written here by hand (no peft in the serving environment). Through the recording proxy: calls before the
first swap are served by the base; after `POST /weights/update` with an adapter folder, by the adapter (logprobs
unlike the base's, equal to a call straight to vLLM naming the adapter); a second version is served fresh, with
vLLM's stale prefix cache (the same adapter name and path loaded again, no reset) as the failing control; each
call's record names its adapter. Also: what the serve fetches for a LoRA iteration (the adapter only), and
(offline, against tests/fake_vllm.py) the swap's guarantees with replicas: every replica loads the adapter, and
one that fails to is left out rather than serving the base.
"""

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import openai
import pytest
import torch
from safetensors.torch import load_file, save_file

from steps import serve
from steps.checkpoint import TRAINING_ONLY, fetch, publish
from steps.contracts import layout
from steps.contracts.layout import adapter_name
from steps.contracts.table_files import partition_url, read_table
from steps.vllm_server import ServingOptions, stop_vllm
from test_workflows import cluster_config, schema_errors, workflow_validator  # noqa: F401 (a fixture)
from vllm_process import start_vllm
from workflows.iteration import iteration_workflow
from workflows.lint import semantic_problems

REPO = Path(__file__).resolve().parents[1]
RANK = 8
TARGETS = ("q_proj", "v_proj")
# A prompt longer than many KV blocks, so that its prefix is cached and a stale cache shows.
PROMPT = " ".join(f"item {i} is the colour of the sea," for i in range(60))
MESSAGES = [{"role": "user", "content": PROMPT}]
SAME = 0.02  # logprob gap within which two servings are the same weights (bf16 on CPU)
APART = 0.2  # mean gap above which they are not


def write_adapter(folder: Path, model_dir: Path, seed: int, scale: float = 0.5) -> Path:
    """A rank-RANK adapter of q_proj and v_proj for the tiny model in `model_dir`, in peft's format (the key names
    and adapter_config.json peft's `save_pretrained` writes), with nonzero lora_B so that it changes the outputs."""
    config = json.loads((model_dir / "config.json").read_text())
    hidden, head_dim = config["hidden_size"], config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    out = {"q_proj": config["num_attention_heads"] * head_dim, "v_proj": config["num_key_value_heads"] * head_dim}
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module in TARGETS:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(RANK, hidden, generator=generator) * scale
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out[module], RANK, generator=generator) * scale
    folder.mkdir(parents=True, exist_ok=True)
    save_file({name: tensor.to(torch.bfloat16).contiguous() for name, tensor in tensors.items()},
              str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": 2 * RANK, "lora_dropout": 0.0,
        "target_modules": list(TARGETS), "bias": "none", "fan_in_fan_out": False, "modules_to_save": None,
        "base_model_name_or_path": str(model_dir)}))
    return folder


def post(base_url: str, path: str, body: dict) -> bytes:
    """One POST straight to vLLM; its answer's bytes."""
    request = urllib.request.Request(f"{base_url}{path}", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as answer:
        return answer.read()


def direct(base_url: str, model: str) -> list[float]:
    """The greedy reply's logprobs of a call straight to vLLM on `model` (the base, or an adapter loaded there)."""
    answer = json.loads(post(base_url, "/v1/chat/completions", {
        "model": model, "messages": MESSAGES, "max_tokens": 8, "temperature": 0, "logprobs": True}))
    return [entry["logprob"] for entry in answer["choices"][0]["logprobs"]["content"]]


def gap(a: list[float], b: list[float]) -> float:
    """The mean absolute logprob gap over the shared length (the tokens may part where the weights do)."""
    n = min(len(a), len(b))
    assert n > 0, "nothing to compare"
    return sum(abs(x - y) for x, y in zip(a[:n], b[:n])) / n


@pytest.fixture(scope="module")
def lora_vllm(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """vLLM on the tiny base model with the serve step's LoRA flags and environment."""
    server = start_vllm(tiny_model, log_path=tmp_path_factory.mktemp("lora-vllm") / "vllm.log", timeout_s=600,
                        options=ServingOptions(lora_rank=RANK))
    try:
        yield server
    finally:
        stop_vllm(server)


@pytest.fixture(scope="module")
def lora_proxy(proxy, lora_vllm):
    """The recording proxy in front of it, serving version 0 (the base), as the serve step starts it."""
    return proxy(lora_vllm.base_url, extra=["--weight-version", "0"])


def ask(lora_proxy, rollout_id: str) -> dict:
    """One greedy call of a new rollout through the proxy, as a harness makes it; its record."""
    rollout = lora_proxy.register(rollout_id)
    client = openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"], max_retries=0)
    client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0)
    [call] = lora_proxy.calls(rollout_id)
    return call


@pytest.mark.vllm
def test_each_version_is_served_by_its_own_adapter_and_the_records_name_it(lora_vllm, lora_proxy, tiny_model,
                                                                            tmp_path):
    base = direct(lora_vllm.base_url, "tiny")
    before = ask(lora_proxy, "before")
    assert before["weight_version"] == "0" and "adapter" not in before  # iteration 0: the base serves
    assert gap(before["response_logprobs"], base) < SAME

    first = write_adapter(tmp_path / "iteration-1", tiny_model, seed=1)
    answer = lora_proxy.client.update_weights(str(first), "1")
    assert answer["failed"] == [] and answer["weight_version"] == "1"
    one = ask(lora_proxy, "after-1")
    assert (one["weight_version"], one["adapter"]) == ("1", adapter_name("1"))
    assert gap(one["response_logprobs"], base) > APART, "the adapter did not change what was served"
    assert gap(one["response_logprobs"], direct(lora_vllm.base_url, adapter_name("1"))) < SAME

    second = write_adapter(tmp_path / "iteration-2", tiny_model, seed=2)
    assert lora_proxy.client.update_weights(str(second), "2")["failed"] == []
    two = ask(lora_proxy, "after-2")
    assert (two["weight_version"], two["adapter"]) == ("2", adapter_name("2"))
    assert gap(two["response_logprobs"], direct(lora_vllm.base_url, adapter_name("2"))) < SAME
    assert gap(two["response_logprobs"], one["response_logprobs"]) > APART
    [replica] = lora_proxy.client.request("GET", "/replicas")["replicas"]
    assert replica["adapter"] == adapter_name("2")
    models = json.loads(urllib.request.urlopen(f"{lora_vllm.base_url}/v1/models", timeout=30).read())["data"]
    assert adapter_name("1") not in {model["id"] for model in models}, "the old adapter was not unloaded"


@pytest.mark.vllm
def test_an_adapter_reloaded_at_its_old_name_and_path_is_served_fresh_through_the_proxy(lora_vllm, lora_proxy,
                                                                                       tiny_model, tmp_path):
    """The control first, straight on vLLM: new files loaded again under the same name and path, with no cache
    reset, are served with the old adapter's cached prefix. Then the proxy's swap of that case serves them fresh."""
    url, path = lora_vllm.base_url, tmp_path / "reused"
    fresh_b = direct_fresh(url, write_adapter(tmp_path / "reference-b", tiny_model, seed=4), "reference-b")

    write_adapter(path, tiny_model, seed=3)
    post(url, "/v1/load_lora_adapter", {"lora_name": "stale", "lora_path": str(path)})
    old = direct(url, "stale")  # fills the prefix cache under ("stale", path)
    post(url, "/v1/unload_lora_adapter", {"lora_name": "stale"})
    write_adapter(path, tiny_model, seed=4)  # adapter B's files, at A's path
    post(url, "/v1/load_lora_adapter", {"lora_name": "stale", "lora_path": str(path)})
    stale = direct(url, "stale")
    post(url, "/v1/unload_lora_adapter", {"lora_name": "stale"})
    assert gap(fresh_b, old) > APART, "adapters A and B do not differ enough to tell them apart"
    assert gap(stale, fresh_b) > APART, "the control did not show the stale prefix cache"

    # The proxy: version 7 is adapter A at `path`, then swapped again as version 7 with B's files at the same path.
    write_adapter(path, tiny_model, seed=3)
    assert lora_proxy.client.update_weights(str(path), "7")["failed"] == []
    served_a = ask(lora_proxy, "reused-a")
    write_adapter(path, tiny_model, seed=4)
    assert lora_proxy.client.update_weights(str(path), "7")["failed"] == []
    served_b = ask(lora_proxy, "reused-b")
    assert served_b["adapter"] == adapter_name("7")
    assert gap(served_a["response_logprobs"], old) < SAME
    assert gap(served_b["response_logprobs"], fresh_b) < SAME, "the proxy served a stale prefix cache"


def direct_fresh(url: str, folder: Path, name: str) -> list[float]:
    """The reference: `folder`'s adapter loaded under a name never used before, so nothing of it is cached."""
    post(url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)})
    try:
        return direct(url, name)
    finally:
        post(url, "/v1/unload_lora_adapter", {"lora_name": name})


def test_a_lora_iterations_serve_fetches_the_adapter_and_the_base_once(s3_server, monkeypatch, tiny_model, tmp_path):
    """Through the store (S3 on loopback): iteration 0's base and two LoRA checkpoints as the update writes them
    (adapter, `optimizer/`, `metrics.json`). The serve of iteration 1 fetches the base and the adapter alone; a
    serve following the update then fetches only the next adapter; a full-weight checkpoint would be the model."""
    for key, value in s3_server["env"].items():
        monkeypatch.setenv(key, value)
    import fsspec

    run = f"s3://{s3_server['bucket']}/lora-run"
    fs = fsspec.filesystem("s3")
    base_url = f"{run}/base-model"
    fs.put(f"{tiny_model}/", f"{base_url}/", recursive=True)
    for version in (1, 2):
        local = write_adapter(tmp_path / f"written-{version}", tiny_model, seed=version)
        (local / "optimizer").mkdir()
        (local / "optimizer" / "optim_world_size_1_rank_0.pt").write_bytes(b"\0" * 4 * local_bytes(local))
        (local / "metrics.json").write_text("{}")
        publish(local, layout.checkpoint_url(run, version, base_url))

    args = serve.parse_args(["--model", layout.checkpoint_url(run, 1, base_url), "--model-dir",
                             str(tmp_path / "pod" / "current"), "--model-name", "tiny", "--port", "1", "--store", "x",
                             "--lora-rank", str(RANK), "--base-model", base_url])
    model, adapter = serve.fetch_served(args)
    assert Path(model) == tmp_path / "pod" / "base" and Path(adapter) == tmp_path / "pod" / "current"
    assert sorted(p.name for p in Path(adapter).iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert local_bytes(Path(model)) == local_bytes(tiny_model)  # the base, once
    followed = fetch(layout.checkpoint_url(run, 2, base_url), tmp_path / "pod" / "followed" / "version-2",
                     skip=TRAINING_ONLY)
    adapter_bytes, full_bytes = local_bytes(followed), local_bytes(tiny_model)
    assert adapter_bytes == local_bytes(tmp_path / "written-2") - local_bytes(tmp_path / "written-2" / "optimizer") - 2
    assert adapter_bytes < full_bytes / 20, (adapter_bytes, full_bytes)
    print(f"fetched per LoRA iteration: {adapter_bytes} bytes; a full-weight iteration: {full_bytes} bytes")

    without = serve.parse_args(["--model", layout.checkpoint_url(run, 1, base_url), "--model-dir",
                                str(tmp_path / "other"), "--model-name", "tiny", "--port", "1", "--store", "x"])
    with pytest.raises(ValueError, match="--lora-rank"):  # an adapter served as if it were a model
        serve.fetch_served(without)


def local_bytes(folder: Path) -> int:
    """The bytes of every file under `folder`."""
    return sum(path.stat().st_size for path in Path(folder).rglob("*") if path.is_file())


def test_every_replica_loads_the_adapter_and_one_that_failed_serves_nothing_until_it_has(tmp_path, tiny_model):
    """Two fake replicas: the adapter's load fails on one, which is left out (its calls would be the base's, named
    as version 1); every call goes to the other, names the adapter as its model and is recorded with it. The next
    swap loads the next adapter on both and unloads the old one; both then serve it."""
    from fake_vllm import FakeVllm
    from steps.proxy.replicas import Replicas
    from steps.proxy.sessions import Rollout, WeightGate
    from steps.proxy.upstream import Upstream
    from steps.proxy.weights import swap_weights

    first = write_adapter(tmp_path / "iteration-1", tiny_model, seed=1)
    second = write_adapter(tmp_path / "iteration-2", tiny_model, seed=2)

    async def call(replicas, gate, name: str) -> tuple[dict, str]:
        served: dict = {}
        async with gate.call() as version:
            answer = await replicas.complete(Rollout(name, "digest", {}, created_at=0.0),
                                             {"messages": [{"role": "user", "content": "hi"}]}, served, version)
        return served, answer.content

    async def run() -> None:
        fakes = [FakeVllm(), FakeVllm()]
        upstreams = [Upstream(fake.url, connect_retries=0, model="tiny") for fake in fakes]
        for fake, upstream in zip(fakes, upstreams):
            await fake.start()
            await upstream.start()
        try:
            replicas, gate = Replicas(upstreams, "0"), WeightGate("0")
            assert (await call(replicas, gate, "r0"))[1] == "weights 0"  # the base, before any adapter
            fakes[1].fail_at = "load_lora_adapter"
            failures = await swap_weights(gate, replicas, str(first), "1")
            assert [(f.replica, f.stage) for f in failures] == [(1, "load_lora_adapter")]
            for n in range(4):
                served, content = await call(replicas, gate, f"r1-{n}")
                assert served == {"replica": 0, "weight_version": "1", "adapter": "policy-v1"}
                assert content == f"weights {first}"
            assert "/v1/chat/completions" not in fakes[1].seen[fakes[1].seen.index("/v1/load_lora_adapter"):]
            fakes[1].fail_at = None
            assert await swap_weights(gate, replicas, str(second), "2") == []
            assert [fake.adapters for fake in fakes] == [{"policy-v2": str(second)}] * 2  # policy-v1 unloaded
            answers = [await call(replicas, gate, f"r2-{n}") for n in range(8)]
            assert {served["replica"] for served, _ in answers} == {0, 1}  # the left-out one serves again
            assert {content for _, content in answers} == {f"weights {second}"}
            assert {served["adapter"] for served, _ in answers} == {"policy-v2"}
        finally:
            for fake, upstream in zip(fakes, upstreams):
                await upstream.close()
                await fake.stop()

    asyncio.run(run())


def test_a_lora_runs_argo_serve_fetches_the_base_once_and_follows_adapters(workflow_validator):  # noqa: F811
    """A LoRA run's iteration 1 on Argo (max_staleness 1: it serves checkpoint 0, then follows checkpoint 1): the serve
    step gets the rank and the base (iteration 0's checkpoint); the Workflow passes Argo's strict schema and the lint. The default render (`lora_rank` 0) has neither flag (the golden files say so)."""
    config = cluster_config("run=golden", "iterations=2", "max_staleness=1", "lora_rank=8")
    workflow = iteration_workflow(config, 1).to_dict()
    assert schema_errors(workflow_validator, workflow) == [] and semantic_problems(workflow) == []
    containers = {t["name"]: t["container"] for t in workflow["spec"]["templates"] if t.get("container")}
    serve_command = containers["serve"]["command"]
    base = config.checkpoint_url(0)
    assert serve_command[serve_command.index("--lora-rank") + 1] == "8"
    assert serve_command[serve_command.index("--base-model") + 1] == base
    assert "--follow-run-url" in serve_command  # each newer adapter, fetched alone (steps.follow)
    assert "--base-model" not in str(iteration_workflow(cluster_config("run=golden", "iterations=2"), 1).to_dict())


def test_a_rank_vllm_cannot_serve_is_refused_when_the_run_starts_and_others_round_up() -> None:
    from steps.settings import ConfigError
    from steps.vllm_server import lora_flags
    from workflows.config import load_config

    with pytest.raises(ConfigError, match="config key 'lora_rank' must be at most 512, the largest rank vLLM serves"):
        load_config(None, ["lora_rank=1024"], check_dataset=False)
    assert lora_flags(4)[2] == "8" and lora_flags(16)[2] == "16" and lora_flags(300)[2] == "320"


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(not (REPO / ".venv-train" / "bin" / "python").exists() and not os.environ.get("OPENFORGE_TRAIN_PYTHON"),
                    reason="veRL's environment (.venv-train) is not set up: run `make train-setup`")
def test_two_lora_iterations_run_locally_with_a_real_update_and_its_adapter_served(tiny_model, tmp_path):
    """The embedded default with `lora_rank: 8`: iteration 0 is served by the base, its real update writes an
    adapter, iteration 1 is served by that adapter (swapped in as `policy-v1`): the calls' records, the calls
    table and the manifest say so, and the adapter is not the base (its lora_B moved off zero)."""
    store = tmp_path / "runs"
    settings = [f"store={store}", "run=lora", "iterations=2", "dataset=steps/tasks/toy", "tasks_per_iteration=1",
                "samples_per_task=8", "max_tokens_cap=16", "parallel_rollouts=4", f"model={tiny_model}",
                "lora_rank=8", "lora_alpha=16", "learning_rate=0.01"]
    done = subprocess.run([sys.executable, "workflows/submit.py", "--harness", "direct", *settings], cwd=REPO,
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    run = store / "lora"
    adapter = run / "checkpoints" / "iteration-1"
    assert (adapter / "adapter_config.json").is_file() and not list(adapter.glob("model*.safetensors"))
    assert any(tensor.abs().max() > 0 for name, tensor in load_file(adapter / "adapter_model.safetensors").items()
               if "lora_B" in name), "the update left the adapter at the base"
    served = {}
    for call_log in (run / "calls" / "rollouts").glob("*/calls.jsonl"):
        for call in map(json.loads, call_log.read_text().splitlines()):
            served.setdefault(call["rollout_id"].split("-")[0], set()).add((call["weight_version"], call.get("adapter")))
    assert served == {"it0": {("0", None)}, "it1": {("1", adapter_name(1))}}
    records = {n: json.loads((run / "manifest" / f"iteration-{n}.json").read_text()) for n in (0, 1)}
    assert (records[0]["adapter"], records[1]["adapter"]) == (None, adapter_name(1))
    assert records[1]["status"] == "Succeeded"
    calls = read_table(partition_url(str(run / "trajectories"), "lora", 1), "calls").column("adapter").to_pylist()
    assert set(calls) == {adapter_name(1)}
    assert (run / "checkpoints" / "iteration-2" / "adapter_config.json").is_file()  # the second update's adapter
