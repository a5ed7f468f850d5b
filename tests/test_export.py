"""`python -m steps.export`: a run's checkpoint as a standard Hugging Face folder, in both weight layouts (the
single fp32 `model.safetensors` and the sharded one with an index) and as a LoRA adapter or merged into its base;
loaded by transformers (logits equal to the source weights cast to the dtype), the merged one served by vLLM, written
to S3 (moto on loopback), pushed through huggingface_hub's API (a recording stand-in: not the hub), and refused in one
sentence where the input or the output folder is wrong.
"""

import json
import math
import shutil
import urllib.request
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from steps import export, manifest
from vllm_process import serve_vllm

PROMPT = [11, 12, 13, 14, 15, 16, 17, 18]
TARGETS = ("q_proj", "v_proj", "o_proj", "up_proj")
RANK, ALPHA = 4, 8
METRICS = {"loss": 0.125, "reward_mean": 0.5, "optimizer_steps": 1}


def _model_files(source: Path, target: Path, generation: bool = True) -> None:
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                 *(["generation_config.json"] if generation else [])):
        shutil.copyfile(source / name, target / name)


def _finish(folder: Path) -> None:
    (folder / "optimizer").mkdir()
    (folder / "optimizer" / "state.json").write_text("{}")
    (folder / "metrics.json").write_text(json.dumps(METRICS))


def _adapter(base: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A LoRA adapter on TARGETS in peft's saved names, both A and B non-zero so the merge shows."""
    generator = torch.Generator().manual_seed(1)
    adapter = {}
    for name, weight in base.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module.rsplit(".", 1)[-1] in TARGETS:
            out_features, in_features = weight.shape
            adapter[f"base_model.model.{module}.lora_A.weight"] = torch.randn(RANK, in_features, generator=generator) * 0.3
            adapter[f"base_model.model.{module}.lora_B.weight"] = torch.randn(out_features, RANK, generator=generator) * 0.3
    return adapter


@pytest.fixture(scope="module")
def trained(tiny_model: Path) -> dict[str, torch.Tensor]:
    """The tiny model's weights, moved a little, in fp32 (what the update wrote before checkpoints were sharded)."""
    generator = torch.Generator().manual_seed(0)
    return {name: tensor.float() + 0.01 * torch.randn(tensor.shape, generator=generator)
            for name, tensor in load_file(str(tiny_model / "model.safetensors")).items()}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, trained: dict) -> Path:
    """A run folder: its manifest, iteration 1 (one fp32 file, no generation config), iteration 2 (the same weights
    in two shards and an index), iteration 3 (a LoRA adapter on the base), iteration 4 (unfinished: no metrics)."""
    root = tmp_path_factory.mktemp("export") / "demo"
    manifest.write_run_config(str(root), {"model": str(tiny_model), "temperature": 0.7, "top_p": 0.95})
    folders = {n: root / "checkpoints" / f"iteration-{n}" for n in (1, 2, 3, 4)}
    for folder in folders.values():
        folder.mkdir(parents=True)
    save_file(trained, str(folders[1] / "model.safetensors"), metadata={"format": "pt"})
    _model_files(tiny_model, folders[1], generation=False)
    names = sorted(trained)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in halves.items():
        save_file({name: trained[name] for name in part}, str(folders[2] / file), metadata={"format": "pt"})
    index = {"metadata": {"total_size": 0}, "weight_map": {n: f for f, part in halves.items() for n in part}}
    (folders[2] / "model.safetensors.index.json").write_text(json.dumps(index))
    _model_files(tiny_model, folders[2])
    base = load_file(str(tiny_model / "model.safetensors"))
    save_file(_adapter(base), str(folders[3] / "adapter_model.safetensors"))
    (folders[3] / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": RANK, "lora_alpha": ALPHA, "target_modules": list(TARGETS), "lora_dropout": 0.0,
        "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(tiny_model)}))
    save_file(trained, str(folders[4] / "model.safetensors"))
    _model_files(tiny_model, folders[4])
    for n in (1, 2, 3):
        _finish(folders[n])
    return root


def run_export(run: Path, iteration: int, out: Path | str, *extra: str) -> int:
    return export.main(["--run", str(run), "--iteration", str(iteration), "--out", str(out), *extra])


def logits(folder: Path, dtype: torch.dtype, state: dict | None = None, hooks=None) -> torch.Tensor:
    """The model's logits on PROMPT: the folder's own weights, or `state` cast to `dtype` in its architecture."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    if state is not None:
        model.load_state_dict({name: tensor.to(dtype) for name, tensor in state.items()}, strict=True)
    if hooks:
        hooks(model)
    with torch.no_grad():
        return model(torch.tensor([PROMPT])).logits[0].float()


def tensors_of(folder: Path) -> dict[str, torch.Tensor]:
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    found = {}
    for file in sorted(set(index.values())):
        with safe_open(str(folder / file), framework="pt") as handle:
            found.update({name: handle.get_tensor(name) for name in handle.keys()})
    assert set(found) == set(index)
    return found


def test_both_weight_layouts_export_to_one_sharded_folder_that_transformers_loads(run: Path, tmp_path: Path,
                                                                                  tiny_model: Path, trained) -> None:
    """The single fp32 file and the two shards with an index give the same bf16 shards, index, config, tokenizer,
    generation config and model card, nothing of training; transformers' logits equal the source weights cast to
    bf16 exactly (control: the fp32 source's differ)."""
    outs = {n: tmp_path / f"iteration-{n}" for n in (1, 2)}
    for n, out in outs.items():
        assert run_export(run, n, out, "--max-shard-size", "500KB") == 0
    names = {path.name for path in outs[1].iterdir()}
    shards = sorted(name for name in names if name.startswith("model-"))
    assert len(shards) >= 3 and shards[-1].endswith(f"-of-{len(shards):05d}.safetensors")
    assert names == {*shards, "model.safetensors.index.json", "config.json", "generation_config.json",
                     "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "README.md"}
    assert names == {path.name for path in outs[2].iterdir()}
    one, two = tensors_of(outs[1]), tensors_of(outs[2])
    assert all(tensor.dtype == torch.bfloat16 and torch.equal(tensor, two[name]) for name, tensor in one.items())
    assert json.loads((outs[1] / "config.json").read_text())["dtype"] == "bfloat16"
    # iteration 1 had no generation config: written from the run's sampling; iteration 2's is its own
    assert json.loads((outs[1] / "generation_config.json").read_text())["temperature"] == 0.7
    assert json.loads((outs[2] / "generation_config.json").read_text()) == \
        json.loads((tiny_model / "generation_config.json").read_text())
    card = (outs[1] / "README.md").read_text()
    assert "demo iteration 1" in card and str(tiny_model) in card and "| reward_mean | 0.5 |" in card
    exported = logits(outs[1], torch.bfloat16)
    assert torch.equal(exported, logits(tiny_model, torch.bfloat16, trained))
    assert not torch.equal(exported, logits(tiny_model, torch.float32, trained))


def lora_hooks(adapter: dict[str, torch.Tensor]):
    """Adds each target module's LoRA path, x A^T B^T (alpha / r), to its output: the adapter as peft runs it
    unmerged, computed apart from any weight merge."""
    def install(model) -> None:
        for key, a in adapter.items():
            if ".lora_A." not in key:
                continue
            module_name = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            b = adapter[key.replace(".lora_A.", ".lora_B.")]
            module = model.get_submodule(module_name)
            module.register_forward_hook(lambda _, args, output, a=a, b=b: output + (ALPHA / RANK) * (args[0] @ a.T @ b.T))
    return install


def test_a_lora_checkpoint_exports_as_its_adapter_or_merged_into_its_base(run: Path, tmp_path: Path,
                                                                          tiny_model: Path) -> None:
    """Without --merge: peft's adapter folder (as peft's `save_pretrained` writes it) and a card naming the base. With --merge: a full folder
    whose logits equal the base model running the adapter unmerged (control: the base alone's differ)."""
    assert run_export(run, 3, tmp_path / "adapter") == 0
    assert {path.name for path in (tmp_path / "adapter").iterdir()} == {
        "adapter_config.json", "adapter_model.safetensors", "README.md"}  # the tokenizer is the base's
    card = (tmp_path / "adapter" / "README.md").read_text()
    assert "library_name: peft" in card and f"Base model: `{tiny_model}`" in card
    assert run_export(run, 3, tmp_path / "merged", "--merge", "--dtype", "fp32") == 0
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    adapter = load_file(str(run / "checkpoints" / "iteration-3" / "adapter_model.safetensors"))
    merged = logits(tmp_path / "merged", torch.float32)
    reference = logits(tiny_model, torch.float32, hooks=lora_hooks(adapter))
    # fp32 rounding of W + BA against x W + x A B over the layers: up to 5e-4 on logits of about 7 seen (the matmul's
    # reduction order changes with the threads torch gets); the control below is 0.1 and more.
    assert torch.allclose(merged, reference, rtol=1e-4, atol=1e-3), (merged - reference).abs().max()
    assert (logits(tiny_model, torch.float32) - reference).abs().max() > 0.1
    assert run_export(run, 3, tmp_path / "merged-bf16", "--merge") == 0
    assert {tensor.dtype for tensor in tensors_of(tmp_path / "merged-bf16").values()} == {torch.bfloat16}


@pytest.mark.vllm
def test_vllm_serves_the_merged_export(run: Path, tmp_path: Path, tiny_model: Path) -> None:
    """vLLM (CPU, bf16) loads the merged bf16 export; its logprobs match transformers' on that folder (control: the
    base model's logprobs on the same tokens are far off)."""
    out = tmp_path / "merged"
    assert run_export(run, 3, out, "--merge") == 0
    with serve_vllm(out, name="exported", warm_up=False) as server:
        body = {"model": "exported", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 0,
                "return_token_ids": True}
        request = urllib.request.Request(f"{server.base_url}/v1/completions", data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            choice = json.loads(response.read())["choices"][0]
    tokens, served = choice["token_ids"], choice["logprobs"]["token_logprobs"]

    def logprobs(folder: Path) -> list[float]:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
        with torch.no_grad():
            full = model(torch.tensor([PROMPT + tokens])).logits[0].float().log_softmax(-1)
        return [float(full[len(PROMPT) - 1 + i, token]) for i, token in enumerate(tokens)]

    gap = sum(abs(a - b) for a, b in zip(served, logprobs(out))) / len(tokens)
    base_gap = sum(abs(a - b) for a, b in zip(served, logprobs(tiny_model))) / len(tokens)
    assert gap < 0.1 and base_gap > 3 * max(gap, 0.05), (gap, base_gap)


def test_an_export_to_s3_writes_the_folder_there(run: Path, s3_server: dict, monkeypatch) -> None:
    """`--out s3://...`: the same folder in the bucket; a second export there is refused (not empty) unless --force
    (the control)."""
    import fsspec

    for key, value in s3_server["env"].items():
        monkeypatch.setenv(key, value)
    url = f"s3://{s3_server['bucket']}/exports/demo-1"
    assert run_export(run, 1, url) == 0
    fs, path = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    names = {name.rsplit("/", 1)[1] for name in fs.find(path)}
    assert {"model-00001-of-00001.safetensors", "model.safetensors.index.json", "config.json", "README.md",
            "tokenizer.json"} <= names and "metrics.json" not in names
    assert run_export(run, 1, url) == 2
    assert run_export(run, 1, url, "--force") == 0


@pytest.mark.parametrize("case", ["no-such-iteration", "unfinished", "out-not-empty", "bad-shard-size"])
def test_bad_input_is_refused_in_one_sentence(case: str, run: Path, tmp_path: Path, capsys) -> None:
    """Each refusal is one line, exit 2, nothing written; the control (iteration 1 into an empty folder, or with
    --force) exports."""
    out = tmp_path / "out"
    argv = {"no-such-iteration": (9, []), "unfinished": (4, []), "out-not-empty": (1, []),
            "bad-shard-size": (1, ["--max-shard-size", "lots"])}[case]
    if case == "out-not-empty":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    assert run_export(run, argv[0], out, *argv[1]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("steps.export: ") and {
        "no-such-iteration": "has no such iteration", "unfinished": "has no metrics.json, so its update has not",
        "out-not-empty": "is not empty", "bad-shard-size": "is not a size"}[case] in line, line
    assert not any(path.suffix == ".safetensors" for path in out.glob("*"))
    control = ["--force"] if case == "out-not-empty" else []
    assert run_export(run, 1, out, *control) == 0


def test_push_to_hub_creates_the_repo_and_uploads_the_folder(run: Path, tmp_path: Path, monkeypatch) -> None:
    """`--push-to-hub`: huggingface_hub's `HfApi(token=HF_TOKEN)`, `create_repo(exist_ok=True)`, then
    `upload_folder` of the finished export. A recording stand-in for `HfApi`: this is not tested against the hub."""
    import huggingface_hub

    calls = []

    class RecordingApi:
        def __init__(self, token=None) -> None:
            calls.append(("init", token))

        def create_repo(self, **kwargs):
            calls.append(("create_repo", kwargs))
            return f"https://huggingface.co/{kwargs['repo_id']}"

        def upload_folder(self, **kwargs):
            calls.append(("upload_folder", kwargs, sorted(p.name for p in Path(kwargs["folder_path"]).iterdir())))

    monkeypatch.setattr(huggingface_hub, "HfApi", RecordingApi)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    assert run_export(run, 1, tmp_path / "out", "--push-to-hub", "me/demo") == 0
    assert calls[0] == ("init", "hf_test")
    assert calls[1] == ("create_repo", {"repo_id": "me/demo", "repo_type": "model", "exist_ok": True})
    assert calls[2][1]["repo_id"] == "me/demo" and calls[2][1]["folder_path"] == str(tmp_path / "out")
    assert "model.safetensors.index.json" in calls[2][2] and "README.md" in calls[2][2]


def test_shard_sizes_parse_as_huggingface_hub_counts_them() -> None:
    """GB is 10**9 bytes, GiB 2**30; a size that is not one is refused (control: valid ones parse)."""
    assert export.parse_size("5GB") == 5 * 10**9 and export.parse_size("1.5GiB") == math.floor(1.5 * 2**30)
    with pytest.raises(export.ExportError, match="is not a size"):
        export.parse_size("5 parsecs")
