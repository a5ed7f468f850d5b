"""Real-model example configs and the update keys a run sets: checked offline, no cluster, no GPU.

`configs/qwen3-8b-codex.yaml` and `configs/qwen3-30b-a3b-codex.yaml` load, pass the run's checks and render
every Workflow through the real `submit.py --dry-run`, each valid against Argo's strict schema. A run's
`update_args` reach the update's command and its loader; a key the run sets itself is refused. The update's
micro-batch must hold `max_model_len` tokens. The update splits any sample count into near-equal mini-batches
(run in the training env too: `.venv-train/bin/python -m pytest tests/test_real_model_configs.py -k mini_batch`).
"""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from steps.contracts.config import RunConfig
from steps.update import ranks as update_ranks
from steps.update.config import load_config as load_update_config
from steps.update.train import check_inputs
from steps.update.batch import Sample
from test_workflows import schema_errors, workflow_validator  # noqa: F401 (a fixture)
from workflows import commands
from workflows.config import ConfigError, load_config, validate_for_argo

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = ["qwen3-8b-codex.yaml", "qwen3-30b-a3b-codex.yaml"]
QWEN3_8B = REPO / "configs" / "qwen3-8b-codex.yaml"


EXAMPLE_UPDATE_ARGS = yaml.safe_load(QWEN3_8B.read_text())["update_args"]


def write_config(folder: Path, **keys) -> Path:
    """The Qwen3-8B example with `keys` changed, as a YAML file in `folder`."""
    raw = {**yaml.safe_load(QWEN3_8B.read_text()), **keys}
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


# ---- the example configs ----

@pytest.mark.parametrize("name", EXAMPLES)
def test_example_config_dry_runs_into_schema_valid_workflows(name: str, workflow_validator) -> None:  # noqa: F811
    """`submit.py --dry-run` (the config checks, then every Workflow rendered and linted) succeeds, and each
    printed Workflow is valid against Argo's schema with no unknown key."""
    done = subprocess.run([sys.executable, "workflows/submit.py", "--config", f"configs/{name}", "--dry-run"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    workflows = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    config = load_config(REPO / "configs" / name)
    assert len(workflows) == config.iterations
    for workflow in workflows[:2]:  # the first serves the base model, the rest a checkpoint: one of each
        assert schema_errors(workflow_validator, workflow) == []


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_config_fits_a_thinking_model(name: str) -> None:
    """Each example leaves room to think before a tool call, parses Qwen3's thinking and tool calls, and its
    update's micro-batch holds the longest sample vLLM can make."""
    config = load_config(REPO / "configs" / name)
    update = load_update_config(REPO / config.update_config, commands.update_overrides(config))
    assert config.max_tokens_cap >= 16384 and config.max_model_len > config.max_tokens_cap
    assert (config.reasoning_parser, config.tool_call_parser) == ("qwen3", "hermes")
    assert update.max_tokens_per_micro_batch >= config.max_model_len
    validate_for_argo(config)


# ---- update_args ----

def test_update_args_reach_the_update_command_and_its_loader() -> None:
    """Each item of `update_args` is an override on the update's command line and is what its loader reads; the
    run's own keys still follow."""
    config = load_config(QWEN3_8B)
    command = commands.update(config, "trajectories", "checkpoint", "out")
    assert {"mini_batches=4", "correction=tis", "max_tokens_per_micro_batch=40960"} <= set(command)
    assert "learning_rate=1e-06" in command
    update = load_update_config(REPO / config.update_config, commands.update_overrides(config))
    assert (update.mini_batches, update.correction, update.max_tokens_per_micro_batch) == (4, "tis", 40960)
    assert load_update_config(REPO / config.update_config).mini_batches == 1  # control: the baked-in file's


@pytest.mark.parametrize("item, expected", [
    ("learning_rate=1e-5", "config key 'update_args' may not set 'learning_rate', which the run sets itself; "
                           "set the run's 'learning_rate' instead"),
    ("temperature=0.6", "may not set 'temperature', which the run sets itself; set the run's 'temperature'"),
    ("unmatched_sampling=top_p=0.9", "set the run's 'allow_unmatched_sampling' instead"),
    ("mini_batchs=4", "unknown config key 'mini_batchs' (in the override mini_batchs=4) (did you mean mini_batches?)"),
    ("mini_batches=0", "config key 'mini_batches' must be a whole number >= 1, got 0"),
    ("mini_batches", "config key 'update_args' takes key=value overrides of the update's config"),
])
def test_a_bad_update_arg_is_refused_in_one_sentence(item: str, expected: str, tmp_path: Path) -> None:
    """A key the run owns names the run key to set; an unknown or bad key is the update loader's own refusal."""
    with pytest.raises(ConfigError) as refused:
        load_config(write_config(tmp_path, update_args=[*EXAMPLE_UPDATE_ARGS, item]))
    assert expected in str(refused.value) and "\n" not in str(refused.value)
    load_config(write_config(tmp_path, update_args=EXAMPLE_UPDATE_ARGS))  # control: the list without it passes


# ---- the micro-batch holds the longest sample ----

def test_a_micro_batch_smaller_than_max_model_len_is_refused(tmp_path: Path) -> None:
    """16384 tokens per micro-batch under max_model_len 40960 would refuse a long sample after its rollouts ran:
    refused at load, naming both keys; the example's own 40960 passes."""
    small = write_config(tmp_path, update_args=[*EXAMPLE_UPDATE_ARGS, "max_tokens_per_micro_batch=16384"])
    with pytest.raises(ConfigError, match=r"max_tokens_per_micro_batch=16384 is less than max_model_len=40960"):
        load_config(small)
    assert load_config(QWEN3_8B).max_model_len == 40960  # control: the fixed config


def test_max_model_len_0_is_the_local_model_s_own_length(tiny_model: Path) -> None:
    """With max_model_len 0 the longest sample is the checkpoint's own length (its config.json: 32768 for the tiny
    model), so a 16384-token micro-batch is refused and the default 32768 passes."""
    with pytest.raises(ConfigError, match=r"16384 is less than max_model_len=0 \(the model's own 32768\)"):
        load_config(None, [f"model={tiny_model}", 'update_args=["max_tokens_per_micro_batch=16384"]'])
    assert load_config(None, [f"model={tiny_model}"]).max_model_len == 0  # control: the default micro-batch


def test_an_argo_run_must_set_max_model_len() -> None:
    """On Argo the model is not here to read its length from: 0 is refused in one sentence for a training run;
    set, it passes, and an eval run (no update) may leave it to vLLM."""
    config = load_config(QWEN3_8B, ["max_model_len=0"])
    with pytest.raises(ConfigError, match="config key 'max_model_len' must be set for an Argo run"):
        validate_for_argo(config)
    validate_for_argo(load_config(QWEN3_8B))  # control
    validate_for_argo(config, training=False)


def test_default_micro_batch_holds_cpu_serving_length() -> None:
    """The update's baked-in micro-batch holds what CPU serving allows (max_model_len 0 there), so a default run
    passes the check with no update_args."""
    from steps.vllm_server import CPU_MAX_MODEL_LEN

    assert load_update_config(REPO / RunConfig.update_config).max_tokens_per_micro_batch >= CPU_MAX_MODEL_LEN


# ---- near-equal mini-batches (no model is loaded; the training env runs these too) ----

def test_mini_batch_split_of_awkward_sample_counts() -> None:
    """7 samples in 3 mini-batches: 3, 2, 2, every sample once, in order; on 2 ranks each mini-batch is split
    between them with a filler row (7) where it is odd; fewer samples than mini-batches: one each."""
    assert update_ranks.mini_batch_sizes(7, 3) == [3, 2, 2]
    assert update_ranks.shard_rows(7, 3, 1) == [list(range(7))]
    shards = update_ranks.shard_rows(7, 3, 2)
    assert shards == [[0, 1, 3, 5], [2, 7, 4, 6]]
    assert sorted(row for shard in shards for row in shard if row != 7) == list(range(7))
    assert update_ranks.mini_batch_sizes(2, 4) == [1, 1]
    for samples in range(1, 40):
        for mini_batches in range(1, 9):
            sizes = update_ranks.mini_batch_sizes(samples, mini_batches)
            assert sum(sizes) == samples and max(sizes) - min(sizes) <= 1
            assert len(sizes) == min(samples, mini_batches)


def test_the_update_no_longer_refuses_a_sample_count_mini_batches_do_not_divide(tmp_path: Path) -> None:
    """7 samples of 4 rollouts with mini_batches 3 pass the update's input checks (before a model loads); the
    rule they replace, mini_batches dividing the count, would have refused them."""
    (tmp_path / "config.json").write_text('{"vocab_size": 100}')
    samples = [Sample(rollout_id=f"r{i // 2}", task="t", prompt_token_ids=[1, 2], response_token_ids=[3, 4],
                      response_mask=[1, 1], response_logprobs=[-0.5, -0.5], reward=float(i // 2 % 2))
               for i in range(7)]  # rollout r3 has one sample, the others two
    config = load_update_config(None, ["mini_batches=3"])
    assert len(samples) % config.mini_batches != 0  # control: the old rule's refusal
    check_inputs(samples, tmp_path, config)


@pytest.mark.slow
def test_the_update_trains_uneven_mini_batches_as_a_plain_loop_would(tiny_model: Path) -> None:
    """9 samples in 2 mini-batches (5, 4) through veRL's real worker: two AdamW steps, each on its consecutive
    rows with the whole batch's advantages, as a plain loop with one AdamW makes them (training env only)."""
    pytest.importorskip("verl", reason="verl==0.9.1 is not installed in this environment (the training env)")
    import torch
    from steps.update import batch as update_batch, train as update
    from update_reference import craft_samples, load_model, reference_update

    samples = craft_samples(tiny_model, seed=0)
    config = load_update_config(None, ["learning_rate=1e-3", "compute_dtype=fp32", "weight_decay=0.0",
                                       "mini_batches=2"])
    worker, metrics = update.run_update(samples, tiny_model, config)
    assert (metrics["samples"], metrics["optimizer_steps"]) == (9, 2)
    batch = update_batch.pad(samples, update_batch.rollout_advantages(samples, config))
    update_batch.correct(batch, torch.zeros_like(batch.rollout_log_probs), config)  # bypass: rollout logprobs
    model = load_model(tiny_model)
    adam = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, betas=tuple(config.betas),
                             weight_decay=config.weight_decay)
    for rows in (range(0, 5), range(5, 9)):
        reference_update(model, batch.rows(list(rows)), config, adam)
    trained = dict(worker.engine.get_per_tensor_param()[0])
    assert worst_difference(trained, model.state_dict()) < 1e-4
    one_step = load_model(tiny_model)  # control: one step on all 9 (mini_batches 1) is told apart
    reference_update(one_step, batch, config)
    assert worst_difference(trained, one_step.state_dict()) > 1e-4


def worst_difference(trained: dict, state: dict) -> float:
    """The largest absolute difference between the worker's parameters and a model's, by HF name."""
    return max((trained[name].detach() - state[name]).abs().max().item() for name in trained)


@pytest.mark.slow
def test_two_ranks_train_uneven_mini_batches_as_one_rank_does(tiny_model: Path, tmp_path: Path) -> None:
    """9 samples in 2 mini-batches (5, 4) through `python -m steps.update` on 1 rank and under torchrun on 2 (the
    first mini-batch's odd row pairs with a filler): the same two AdamW steps (training env only)."""
    pytest.importorskip("verl", reason="verl==0.9.1 is not installed in this environment (the training env)")
    from safetensors.torch import load_file
    from test_update_ranks import WEIGHTS, launcher_free_env, metrics, relative_difference, weights
    from update_reference import craft_samples, write_samples

    trajectories = write_samples(craft_samples(tiny_model, seed=0), tmp_path / "samples")
    config = tmp_path / "update.yaml"
    config.write_text((REPO / "configs" / "update.yaml").read_text()
                      + "compute_dtype: fp32\nweight_decay: 0.0\nmini_batches: 2\nserved_dtype: fp32\n")
    runs = {}
    for gpus in (1, 2):
        run = RunConfig(update_gpus=gpus, update_config=str(config), learning_rate=1e-3)
        command = commands.update(run, str(trajectories), str(tiny_model), str(tmp_path / f"ranks-{gpus}"),
                                  python=sys.executable)
        done = subprocess.run(command, cwd=REPO, env={**launcher_free_env(), "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, timeout=900)
        runs[gpus] = {"code": done.returncode, "stderr": done.stderr, "out": tmp_path / f"ranks-{gpus}"}
    assert metrics(runs[1])["optimizer_steps"] == metrics(runs[2])["optimizer_steps"] == 2
    base = load_file(str(tiny_model / "model.safetensors"))
    assert relative_difference(weights(runs[1]), weights(runs[2]), base) < WEIGHTS
