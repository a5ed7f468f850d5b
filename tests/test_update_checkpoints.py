"""The update's checkpoints: served-dtype sharded safetensors written by every rank, fp32 master weights per rank.

Real updates of the tiny model (veRL's worker, FSDP2; 2 ranks are the run's own torchrun command, gloo on CPU),
as few as the checks allow on 2 shared cores: 1 and 2 ranks from the base model (`one`, `two`; the 2-rank one
with a small `max_file_bytes`, so each rank writes several files), then one update on each of them at the other
world size (`two_from_one`: 1 -> 2 ranks, `one_from_two`: 2 -> 1), and the control `restarted`: `one_from_two`
with `carry_optimizer` off, which starts from the served weights. The learning rate is the run's default 1e-6:
each step moves a weight by about 1e-6, far below bf16's resolution at the tiny model's weights (~1e-3), so the
served bf16 copy barely changes while the fp32 master weights do.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl==0.9.1 is not installed in this environment (the training env)")
torch = pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402

from steps.contracts.config import RunConfig  # noqa: E402
from steps.tiny_model import build_tiny_model  # noqa: E402
from steps.update import shards, train as update_train  # noqa: E402
from test_update_ranks import launcher_free_env  # noqa: E402
from update_reference import craft_samples, write_samples  # noqa: E402
from workflows import commands  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
LEARNING_RATE = 1e-6
SMALL_FILES = 300_000  # bytes: the 2-rank update's cap, under its 2.7 MB of bf16 weights
UPDATE = ["compute_dtype: fp32", "weight_decay: 0.0", "mini_batches: 1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The tiny model and the module's five updates, each named by what it did."""
    root = tmp_path_factory.mktemp("checkpoints")
    base = build_tiny_model(root / "base", seed=0)
    samples = write_samples(craft_samples(base, seed=0), root / "samples")
    config = root / "update.yaml"
    config.write_text((REPO / "configs" / "update.yaml").read_text() + "\n".join(UPDATE) + "\n")

    def update(name: str, gpus: int, start: Path, *overrides: str) -> dict:
        run = RunConfig(update_gpus=gpus, update_config=str(config), learning_rate=LEARNING_RATE)
        argv = [*commands.update(run, str(samples), str(start), str(root / name), python=sys.executable), *overrides]
        if gpus == 1:  # in this process: no second import of veRL (seconds on 2 cores)
            assert argv[1:3] == ["-m", "steps.update"]
            return {"code": update_train.main(argv[3:]), "stderr": "", "out": root / name}
        done = subprocess.run(argv, cwd=REPO, env={**launcher_free_env(), "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, timeout=900)
        return {"code": done.returncode, "stderr": done.stderr, "out": root / name}

    result = {"base": base, "two": update("two", 2, base, f"max_file_bytes={SMALL_FILES}")}
    result["one"] = update("one", 1, base)
    result["two_from_one"] = update("two-from-one", 2, result["one"]["out"], "correction=tis")
    result["one_from_two"] = update("one-from-two", 1, result["two"]["out"], "correction=tis")
    result["restarted"] = update("restarted", 1, result["two"]["out"], "correction=tis", "carry_optimizer=false",
                                 "served_dtype=fp32")
    return result


def out(run: dict) -> Path:
    assert run["code"] == 0, run["stderr"][-3000:]
    return run["out"]


def masters(folder: Path) -> dict[str, torch.Tensor]:
    """The fp32 master weights a checkpoint's `optimizer/` holds, whole: each rank's dim-0 shard joined in rank
    order (`steps.update.reshard`)."""
    world_size = json.loads((folder / update_train.OPTIMIZER_DIR / "state.json").read_text())["world_size"]
    saved = [torch.load(folder / update_train.OPTIMIZER_DIR / f"model_world_size_{world_size}_rank_{rank}.pt",
                        weights_only=False) for rank in range(world_size)]
    local = [{name: value.to_local() if hasattr(value, "to_local") else value for name, value in shard.items()}
             for shard in saved]
    return {name: torch.cat([shard[name] for shard in local]) for name in local[0]}


def mean_move(weights: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> float:
    """Mean |weights - start| over every weight."""
    total = sum(float((weights[name].double() - start[name].double()).abs().sum()) for name in start)
    return total / sum(tensor.numel() for tensor in start.values())


def changed(weights: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> float:
    """The fraction of weights that differ from `start`."""
    return sum(int((weights[name].float() != start[name].float()).sum()) for name in start) / sum(
        tensor.numel() for tensor in start.values())


def test_each_rank_writes_its_own_size_capped_files_in_the_served_dtype(runs: dict) -> None:
    """Hugging Face's sharded layout: `model-0000k-of-0000N.safetensors` and an index naming every weight's
    file, with the served dtype (bf16) and the input's config and tokenizer; no single `model.safetensors`.
    With the small cap the 2 ranks write several files, each under the cap unless it is one tensor bigger
    than it; the index's total is the files' tensors' bytes."""
    for name, files in (("one", 1), ("two", None)):
        folder = out(runs[name])
        index = json.loads((folder / shards.INDEX_FILE).read_text())
        written = sorted(path.name for path in folder.glob("*.safetensors"))
        count = len(written)
        assert written == [shards.file_name(k, count) for k in range(1, count + 1)]
        assert files is None or count == files
        assert set(index["weight_map"].values()) == set(written)
        weights = shards.read_weights(folder)
        assert set(weights) == set(index["weight_map"]) == set(load_file(str(runs["base"] / "model.safetensors")))
        assert {tensor.dtype for tensor in weights.values()} == {torch.bfloat16}
        assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in weights.values())
        assert {"config.json", "tokenizer.json", "metrics.json"} <= {path.name for path in folder.iterdir()}
    folder = out(runs["two"])
    assert len(list(folder.glob("*.safetensors"))) >= 4
    for path in folder.glob("*.safetensors"):
        tensors = load_file(str(path))
        assert len(tensors) == 1 or sum(t.numel() * t.element_size() for t in tensors.values()) <= SMALL_FILES


def test_no_rank_holds_more_than_one_file_and_the_tensor_in_flight_while_saving(runs: dict) -> None:
    """Each of the 2 ranks says what it wrote and held at most while saving: its share of the weights (20-80%:
    whole tensors), and at most the cap plus the largest tensor in fp32 (in flight) and in bf16 (its served
    copy). Control: that bound is under the whole model in fp32, what rank 0 held when it gathered every
    weight before, so a rank that kept every weight would fail it."""
    folder, stderr = out(runs["two"]), runs["two"]["stderr"]
    lines = [line for line in stderr.splitlines() if "held at most" in line]
    assert len(lines) == 2, stderr[-3000:]
    weights = shards.read_weights(folder)
    largest = max(t.numel() for t in weights.values()) * (4 + 2)
    model = sum(t.numel() * t.element_size() for t in weights.values())
    files = [int(line.split(" wrote ")[1].split()[0]) for line in lines]
    written = [int(line.split(" weight file(s) of ")[1].split()[0]) for line in lines]
    assert sum(files) == len(list(folder.glob("*.safetensors"))) and max(files) >= 2
    assert sum(written) == model and all(0.2 * model < share < 0.8 * model for share in written)
    for line in lines:
        held = int(line.split("held at most ")[1].split()[0])
        assert 0 < held <= SMALL_FILES + largest < 2 * model, line


def test_the_served_weights_are_the_trainers_own_in_the_served_dtype(runs: dict) -> None:
    """Exactly: every written weight is the fp32 master weight the ranks saved, rounded to bf16, for 1 and for
    2 ranks (on 2 ranks joined from both ranks' shards); and 2 ranks trained what 1 did (fp32, rounding only).
    Control: the base model's weights are not the 2-rank update's master weights."""
    for name in ("one", "two"):
        served, master = shards.read_weights(out(runs[name])), masters(out(runs[name]))
        assert set(served) == set(master)
        for key, tensor in master.items():
            assert torch.equal(served[key], tensor.to(torch.bfloat16)), (name, key)
    one, two = masters(out(runs["one"])), masters(out(runs["two"]))
    base = {k: v.float() for k, v in load_file(str(runs["base"] / "model.safetensors")).items()}
    assert mean_move(one, two) < 0.01 * mean_move(one, base)
    assert mean_move(two, base) > 0.5 * LEARNING_RATE


def test_the_fp32_master_weights_carry_an_update_below_bf16s_resolution(runs: dict) -> None:
    """A step of lr 1e-6 moves the master weights but hardly the served bf16 copy; the next update, at another
    world size (2 -> 1 and 1 -> 2 ranks), continues from the master weights, so two steps are in them. Control:
    the same update with `carry_optimizer` off starts from the served copy, and one step's move is all it has."""
    base = {k: v.float() for k, v in load_file(str(runs["base"] / "model.safetensors")).items()}
    first = masters(out(runs["two"]))
    assert changed(first, base) > 0.5 and changed(shards.read_weights(out(runs["two"])), base) < 0.01
    for name in ("one_from_two", "two_from_one"):
        again = masters(out(runs[name]))
        assert mean_move(again, base) > 1.6 * mean_move(first, base), name
    restarted = shards.read_weights(out(runs["restarted"]))  # fp32: the trainer's weights
    assert {tensor.dtype for tensor in restarted.values()} == {torch.float32}
    assert mean_move(restarted, base) < 1.3 * mean_move(first, base)
    metrics = json.loads((out(runs["one_from_two"]) / "metrics.json").read_text())
    assert metrics["optimizer_state"] == "carried, resharded from world size 2"


def test_transformers_loads_the_sharded_folder(runs: dict, tmp_path: Path) -> None:
    """The serving env's transformers loads the 2-rank folder (several files, index) with no missing or
    unexpected weight, and its logits are those of the trainer's fp32 master weights cast to bf16.
    Control: the fp32 master weights uncast give other logits, so the comparison sees the served dtype."""
    from safetensors.torch import save_file

    master = masters(out(runs["two"]))
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in master.items()}, str(tmp_path / "bf16.safetensors"))
    save_file({k: v.contiguous() for k, v in master.items()}, str(tmp_path / "fp32.safetensors"))
    script = """
import json, sys, torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
folder, bf16, fp32 = sys.argv[1:]
model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, output_loading_info=True)
ids = torch.tensor([[11, 400, 37, 2048, 5, 999, 123, 77]])
logits = lambda m: m(input_ids=ids).logits.float()
with torch.no_grad():
    served = logits(model)
    model.load_state_dict(load_file(bf16))
    same = float((logits(model) - served).abs().max())
    model = model.float()
    model.load_state_dict(load_file(fp32))
    other = float((logits(model) - served).abs().max())
print(json.dumps({"missing": sorted(info["missing_keys"]), "unexpected": sorted(info["unexpected_keys"]), "same": same,
                  "other": other}))
"""
    python = os.environ.get("OPENFORGE_SERVE_PYTHON") or sys.executable
    done = subprocess.run([python, "-c", script, str(out(runs["two"])), str(tmp_path / "bf16.safetensors"),
                           str(tmp_path / "fp32.safetensors")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert not result["missing"] and not result["unexpected"]
    assert result["same"] == 0.0 and result["other"] > 0.0


def test_a_skipped_update_copies_the_sharded_layout(runs: dict, tmp_path: Path) -> None:
    """`copy_checkpoint` (a skipped update) copies every weight file and the index, byte for byte, and the
    master weights with the optimiser state."""
    source = out(runs["two"])
    copy = update_train.copy_checkpoint(source, tmp_path / "copy")
    names = sorted(path.name for path in source.glob("*.safetensors*"))
    assert shards.INDEX_FILE in names and len(names) > 2
    for name in names:
        assert (copy / name).read_bytes() == (source / name).read_bytes(), name
    assert sorted(p.name for p in (copy / "optimizer").glob("model_world_size_2_rank_*.pt")) == [
        "model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"]
    assert shards.weight_files(copy) == [copy / name for name in names if name != shards.INDEX_FILE]


def test_a_file_never_passes_the_cap_unless_one_tensor_does(tmp_path: Path) -> None:
    """`shards.save` alone (one process): tensors fill files up to the cap, a tensor bigger than the cap is a
    file of its own, the weights read back are the tensors in the served dtype, and a rewrite of the folder
    leaves no earlier layout's file (a single `model.safetensors` there before is gone, so the index and the
    files agree). Control: the same tensors under a cap that holds them all make one file."""
    tensors = [(f"layer.{i}.weight", torch.randn(100, 10)) for i in range(7)]
    tensors.append(("embed.weight", torch.randn(1000, 10)))
    (tmp_path / "model.safetensors").write_bytes(b"an earlier layout")
    saved = shards.save(iter(tensors), tmp_path, torch.bfloat16, 5000)
    files = sorted(tmp_path.glob("*.safetensors"))
    assert [path.name for path in files] == saved["files"] == [shards.file_name(k, 5) for k in range(1, 6)]
    assert [len(load_file(str(path))) for path in files] == [2, 2, 2, 1, 1]
    assert all(path.stat().st_size < 5000 + 1000 for path in files[:4])
    weights = shards.read_weights(tmp_path)
    assert all(torch.equal(weights[name], tensor.to(torch.bfloat16)) for name, tensor in tensors)
    assert saved["held"] == 1000 * 10 * (4 + 2) and saved["bytes"] == saved["model_bytes"] == 34000
    assert len(shards.save(iter(tensors), tmp_path / "one", torch.bfloat16, 10**6)["files"]) == 1
