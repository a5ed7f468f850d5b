"""`steps.export`'s LoRA merge equals peft's own `merge_and_unload` (the training environment has peft; the serving
one, where exports run, does not, which is why the merge is written with torch alone).

    OPENFORGE_SERVE_PYTHON=$PWD/.venv/bin/python .venv-train/bin/python -m pytest -q tests/test_export_peft.py
"""

from pathlib import Path

import pytest

peft = pytest.importorskip("peft", reason="peft is in the training environment (.venv-train)")
torch = pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402

from steps import export  # noqa: E402
from steps.tiny_model import build_tiny_model  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.mark.parametrize("rslora", [False, True], ids=["lora", "rslora"])
def test_the_merge_equals_peft_merge_and_unload(rslora: bool, tmp_path: Path) -> None:
    """A peft adapter (every linear layer, B moved off its zero start) saved with `save_pretrained` and merged by
    `steps.export.merged` gives peft's merged weights (control: the base's target weights differ from them)."""
    from transformers import AutoModelForCausalLM

    base_dir = build_tiny_model(tmp_path / "base", seed=0)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, use_rslora=rslora)
    wrapped = peft.get_peft_model(model, config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in wrapped.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    wrapped.save_pretrained(tmp_path / "adapter")
    reference = {name: tensor.float() for name, tensor in wrapped.merge_and_unload().state_dict().items()}
    base = load_file(str(base_dir / "model.safetensors"))
    ours = dict(export.merged(export.tensors(export.weight_files(base_dir), torch.float32), tmp_path / "adapter",
                              torch.float32))
    assert set(ours) == set(base)
    for name, tensor in ours.items():
        assert torch.allclose(tensor, reference[name], atol=1e-6), name
    moved = [name for name in ours if name.endswith("q_proj.weight")]
    assert moved and all(not torch.allclose(base[name].float(), reference[name], atol=1e-4) for name in moved)
