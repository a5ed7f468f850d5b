"""The run's LoRA keys (`lora_rank`, `lora_alpha`, `lora_target_modules`): checked when the run starts, passed to
the update as overrides with the base model (`workflows.commands.update`), and refused in `update_args`. No model
is loaded; the update itself is tests/test_update_lora.py (the train env)."""

import pytest

from steps.contracts.config import RunConfig
from steps.update.config import load_config as load_update_config
from workflows import commands
from workflows.config import ConfigError, check_update_config, load_config

BAD = [  # (override, what the sentence says)
    ("lora_rank=-1", "config key 'lora_rank' must be 0 (LoRA off) or more, got -1"),
    ("lora_alpha=0", "config key 'lora_alpha' must be at least 1, got 0"),
    ("lora_target_modules=[]", "config key 'lora_target_modules' must be a non-empty list of module names"),
    ("lora_target_modules=['']", "config key 'lora_target_modules' must be a non-empty list of module names"),
]


@pytest.mark.parametrize("override, message", BAD, ids=[case[0] for case in BAD])
def test_a_bad_lora_key_is_refused_in_one_sentence_when_the_run_starts(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, ["lora_rank=8", override], check_dataset=False)


def test_a_lora_run_is_valid_and_lora_is_off_by_default() -> None:
    """The control: good values pass, and the update's own config takes what the run passes it."""
    config = load_config(None, ["lora_rank=16", "lora_alpha=32", "lora_target_modules=[q_proj, v_proj]"],
                         check_dataset=False)
    check_update_config(config)
    update = load_update_config("configs/update.yaml", commands.update_overrides(config))
    assert (update.lora_rank, update.lora_alpha, update.lora_target_modules) == (16, 32, ["q_proj", "v_proj"])
    assert load_config(None, [], check_dataset=False).lora_rank == 0 and "--base-model" not in commands.update(RunConfig(), "t", "c", "o")


def test_the_update_of_a_lora_run_reads_the_previous_adapter_on_the_base_model() -> None:
    """Every iteration's update gets iteration 0's checkpoint as `--base-model`; its `--checkpoint` is the previous
    update's adapter folder (iteration 0's: the base model itself)."""
    config = RunConfig(lora_rank=8, model="s3://bucket/models/base", store="s3://bucket/runs", run="demo")
    for iteration in (0, 3):
        argv = commands.update(config, "t", config.checkpoint_url(iteration), config.checkpoint_url(iteration + 1))
        assert argv[argv.index("--base-model") + 1] == "s3://bucket/models/base"
        assert argv[argv.index("--checkpoint") + 1] == config.checkpoint_url(iteration)


def test_update_args_may_not_set_the_runs_lora_keys() -> None:
    """Serving loads the adapter the run's keys describe: the update may not train another."""
    with pytest.raises(ConfigError, match="may not set 'lora_rank', which the run sets itself"):
        load_config(None, ["update_args=[lora_rank=4]"], check_dataset=False)


def test_lora_on_a_vision_language_model_is_refused_at_load_and_by_the_update(tmp_path) -> None:
    """A LoRA update of a vision-language model is untested (veRL's peft wrapping of the vision tower, vLLM's adapter
    on one): refused when the run starts (a folder whose config.json has a `vision_config`, or configs/gui.yaml's
    built tiny vision model) and by the update's own input check. The control: the same folder without its
    `vision_config` passes both."""
    from steps.update.samples import Sample, check_inputs

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen2_5_vl", "vocab_size": 100, "vision_config": {"depth": 2}}')
    sample = Sample("it0-a", "a", [1], [2], [1], None, 1.0)
    for name in (str(model), "runs/tiny-vision-model"):
        with pytest.raises(ConfigError, match="is a vision-language model, which a LoRA update does not train yet"):
            load_config(None, ["lora_rank=8", f"model={name}"], check_dataset=False)
    with pytest.raises(ConfigError, match="is a vision-language model, which a LoRA update does not train yet"):
        check_inputs([sample], model, load_update_config("configs/update.yaml", ["lora_rank=8"]))
    (model / "config.json").write_text('{"model_type": "qwen2", "vocab_size": 100}')
    assert load_config(None, ["lora_rank=8", f"model={model}"], check_dataset=False).lora_rank == 8
    check_inputs([sample], model, load_update_config("configs/update.yaml", ["lora_rank=8"]))
