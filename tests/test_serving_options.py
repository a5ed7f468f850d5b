"""Serving options, offline: the run config's vLLM keys, the one builder of vLLM's command line, the model
family's tool-call parser, and what the serve step refuses before it starts vLLM.

    .venv/bin/python -m pytest -q tests/test_serving_options.py     # ~10 s (reads vLLM's parser registries)

The reasoning parser on the real vLLM is `tests/test_reasoning.py`.
"""

import doctest
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import steps.proxy.__main__
import steps.vllm_server
import workflows.commands
from steps import serve
from steps.vllm_parsers import FAMILY_TOOL_CALL_PARSER, REASONING_PARSERS, TOOL_CALL_PARSERS, tool_call_parser_for
from steps.vllm_server import ServingOptions, vllm_command
from workflows import commands
from workflows.config import ConfigError, load_config

SHARED = ["--generation-config", "vllm", "--max-logprobs", "20", "--logprobs-mode", "processed_logprobs",
          "--enable-auto-tool-choice"]
CPU_ONLY = ["--dtype", "bfloat16", "--enforce-eager", "--distributed-executor-backend", "uni"]


def checkpoint(folder: Path, model_type: str, architecture: str) -> Path:
    """A folder with just the config.json that names the model's family."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": [architecture]}))
    return folder


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


@pytest.mark.parametrize("module", [steps.vllm_server, steps.proxy.__main__, workflows.commands])
def test_doctests(module):
    failures, tried = doctest.testmod(module)
    assert tried > 0 and failures == 0


def test_parser_names_are_the_installed_vllms():
    """The fixed lists config validation checks names against are vLLM's own registries (read here, where
    importing vLLM is fine), and every family maps to a parser vLLM has."""
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    assert TOOL_CALL_PARSERS == set(ToolParserManager.list_registered())
    assert REASONING_PARSERS == set(ReasoningParserManager.list_registered())
    assert set(FAMILY_TOOL_CALL_PARSER.values()) <= TOOL_CALL_PARSERS


def test_one_builder_for_cpu_and_gpu():
    """Both devices get the flags RL relies on; CPU adds its own, GPU its tensor parallel size and memory
    share; vllm_args come last; max_model_len 0 is vLLM's default on GPU and 32768 on CPU."""
    options = ServingOptions(tool_call_parser="hermes", reasoning_parser="qwen3", gpus=4,
                             gpu_memory_utilization=0.8, vllm_args=("--max-num-seqs", "128"))
    cpu = vllm_command("/m", "qwen3-4b", 8000, options, device="cpu")
    gpu = vllm_command("/m", "qwen3-4b", 8000, options, device="gpu")
    for argv in (cpu, gpu):
        assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
        assert " ".join(SHARED) in " ".join(argv)
        assert (flag(argv, "--tool-call-parser"), flag(argv, "--reasoning-parser")) == ("hermes", "qwen3")
        assert (flag(argv, "--served-model-name"), flag(argv, "--host"), flag(argv, "--port")) == \
            ("qwen3-4b", "127.0.0.1", "8000")
        assert argv[-2:] == ["--max-num-seqs", "128"]
    assert " ".join(CPU_ONLY) in " ".join(cpu) and not set(CPU_ONLY) & set(gpu)
    assert (flag(cpu, "--max-model-len"), flag(gpu, "--max-model-len")) == ("32768", None)
    assert (flag(gpu, "--tensor-parallel-size"), flag(gpu, "--gpu-memory-utilization")) == ("4", "0.8")
    assert "--tensor-parallel-size" not in cpu and "--gpu-memory-utilization" not in cpu
    short = ServingOptions(tool_call_parser="hermes", max_model_len=4096)
    assert flag(vllm_command("/m", "m", 1, short, device="cpu"), "--max-model-len") == "4096"
    assert flag(vllm_command("/m", "m", 1, short, device="gpu"), "--max-model-len") == "4096"
    assert "--reasoning-parser" not in vllm_command("/m", "m", 1, short)


def test_the_run_configs_options_reach_vllm_through_the_serve_step(tmp_path):
    """config -> `commands.serve` -> the serve step's parser -> the builder: nothing is lost on the way, on
    either device; left at their defaults, the keys add no flags and the family picks the parser."""
    config = load_config("configs/cluster-example.yaml",
                         ["tool_call_parser=llama3_json", "reasoning_parser=deepseek_r1", "max_model_len=8192",
                          "gpu_memory_utilization=0.75", "serve_gpus=2",
                          'vllm_args=["--max-num-seqs", "64", "--enable-prefix-caching"]'])
    for device in ("cpu", "gpu"):
        args = serve.parse_args(commands.serve(config, "/models/current", "s3://b/calls", 0, device=device)[3:])
        options = serve.serving_options(args)
        expected = ServingOptions("llama3_json", "deepseek_r1", 8192, 0.75 if device == "gpu" else 0.9, 2,
                                  ("--max-num-seqs", "64", "--enable-prefix-caching"))
        assert options == expected and args.model_name == "qwen3-4b"
    model = checkpoint(tmp_path / "qwen", "qwen3", "Qwen3ForCausalLM")
    plain = load_config(None, [f"model={model}"])
    args = serve.parse_args(commands.serve(plain, str(model), "calls", 0)[3:])
    assert serve.serving_options(args) == ServingOptions()
    assert flag(vllm_command(str(model), "tiny", 1, serve.serving_options(args)), "--tool-call-parser") == "hermes"


@pytest.mark.parametrize("args, key", [
    (["--max-model-len", "8192"], "max_model_len"),
    (["--max_model_len=8192"], "max_model_len"),  # vLLM reads underscores and `=` too
    (["--tool-call-parser=mistral"], "tool_call_parser"),
    (["--enable-auto-tool-choice"], "tool_call_parser"),
    (["--reasoning-parser", "qwen3"], "reasoning_parser"),
    (["--gpu-memory-utilization", "0.5"], "gpu_memory_utilization"),
    (["-tp", "2"], "serve_gpus"),
    (["--served-model-name", "x"], "model_name"),
    (["--model", "x"], "model"),
])
def test_vllm_args_may_not_set_what_a_key_sets(args, key):
    """A flag the builder sets is refused in one sentence that names the key to use instead."""
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"vllm_args={json.dumps(args)}"])
    flag_name = "--" + args[0].split("=")[0][2:].replace("_", "-") if args[0].startswith("--") else args[0]
    assert str(err.value).startswith(f"config key 'vllm_args' may not set {flag_name} (OpenForge sets it); use ")
    assert str(err.value).endswith(f"`{key}`")
    assert load_config(None, ['vllm_args=["--max-num-seqs", "64"]']).vllm_args  # a flag of its own passes


@pytest.mark.parametrize("flag_name", ["--port", "--host", "--generation-config", "--logprobs-mode", "--max-logprobs",
                                       "--logits-processors", "--tool-strict-level", "--trust-request-chat-template",
                                       "--api-key"])
def test_vllm_args_may_not_set_what_openforge_relies_on(flag_name):
    """Flags no key sets (loopback, sampling defaults, logprobs) are refused too, saying why."""
    with pytest.raises(ConfigError, match=f"'vllm_args' may not set {flag_name} \\(OpenForge sets it\\); use nothing"):
        load_config(None, [f'vllm_args=["{flag_name}=x"]'])


def test_vllm_args_is_a_list_of_strings():
    """YAML lists (and one string) load as a tuple of strings; anything else is one sentence."""
    assert load_config(None, ['vllm_args=["--max-num-seqs", "64"]']).vllm_args == ("--max-num-seqs", "64")
    assert load_config(None, ["vllm_args=--enable-prefix-caching"]).vllm_args == ("--enable-prefix-caching",)
    assert load_config(None, ["vllm_args="]).vllm_args == () == load_config(None).vllm_args
    for bad in ('["--max-num-seqs", 64]', "{a: 1}", "3"):
        with pytest.raises(ConfigError, match=r"config key 'vllm_args' must be a list of strings, e\.g\. .*, got"):
            load_config(None, [f"vllm_args={bad}"])


@pytest.mark.parametrize("override, message", [
    ("tool_call_parser=hermess", "config key 'tool_call_parser': vLLM has no parser 'hermess'; did you mean hermes?"),
    ("reasoning_parser=qwen", "config key 'reasoning_parser': vLLM has no parser 'qwen'; did you mean qwen3?"),
    ("gpu_memory_utilization=0", "config key 'gpu_memory_utilization' must be more than 0 and at most 1"),
    ("gpu_memory_utilization=1.5", "config key 'gpu_memory_utilization' must be more than 0 and at most 1"),
    ("max_model_len=-1", "config key 'max_model_len' must be 0 (vLLM's default) or more, got -1"),
])
def test_bad_serving_keys_are_one_sentence(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    key = override.split("=")[0]
    good = {"tool_call_parser": "hermes", "reasoning_parser": "qwen3", "gpu_memory_utilization": 1.0,
            "max_model_len": 0}[key]
    assert getattr(load_config(None, [f"{key}={good}"]), key) == good  # the control: a good value passes


def test_the_tiny_models_family_maps_to_hermes(tiny_model):
    assert tool_call_parser_for(tiny_model) == "hermes"


def test_an_unknown_family_is_a_config_error_naming_the_key(tmp_path):
    """A local model folder of a family with no known parser stops the run at config time, unless the
    run names the parser; a known family passes."""
    model = checkpoint(tmp_path / "gemma", "gemma3", "Gemma3ForCausalLM")
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"model={model}"])
    assert str(err.value) == (f"no tool-call parser is known for the checkpoint {model}'s model_type 'gemma3' "
                              f"(Gemma3ForCausalLM); set tool_call_parser to the one its chat template needs, "
                              f"e.g. hermes, llama3_json, mistral or qwen3_coder")
    assert load_config(None, [f"model={model}", "tool_call_parser=hermes"]).tool_call_parser == "hermes"
    assert load_config(None, [f"model={checkpoint(tmp_path / 'llama', 'llama', 'LlamaForCausalLM')}"])


def test_serve_exits_1_on_a_fetched_checkpoint_of_an_unknown_family(s3_server, monkeypatch, capsys, tmp_path):
    """The family of a checkpoint in S3 is only known once it is fetched: the serve step says so in one
    line and exits 1 before it starts vLLM; naming the parser gets past that point."""
    for key, value in s3_server["env"].items():
        monkeypatch.setenv(key, value)
    model = checkpoint(tmp_path / "gemma", "gemma3", "Gemma3ForCausalLM")
    url = f"s3://{s3_server['bucket']}/family/checkpoints/iteration-1"
    upload = f"import fsspec; fsspec.filesystem('s3').put({str(model)!r} + '/', {url!r}, recursive=True)"
    subprocess.run([sys.executable, "-c", upload], env={**os.environ, **s3_server["env"]}, check=True)
    fetched = tmp_path / "models" / "current"
    argv = ["--model", url, "--model-dir", str(fetched), "--model-name", "g", "--port", "1", "--store", "s"]
    code = serve.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1] == (
        f"error: no tool-call parser is known for the checkpoint {fetched}'s model_type 'gemma3' "
        f"(Gemma3ForCausalLM); set tool_call_parser to the one its chat template needs, e.g. hermes, "
        f"llama3_json, mistral or qwen3_coder")
    assert (fetched / "config.json").is_file()
    assert flag(vllm_command(fetched, "g", 1, serve.serving_options(serve.parse_args(
        argv + ["--tool-call-parser", "hermes"]))), "--tool-call-parser") == "hermes"


def test_the_serve_step_refuses_a_flag_it_sets(capsys):
    with pytest.raises(SystemExit) as exit_:
        serve.parse_args(["--model", "m", "--model-name", "n", "--port", "1", "--store", "s",
                          "--vllm-arg=--port=9"])
    assert exit_.value.code == 2
    assert "--vllm-arg may not set --port (OpenForge sets it)" in capsys.readouterr().err


def test_the_serve_step_always_forces_sampling_and_checks_it_before_vllm_loads(capsys):
    """Without --sampling the serve step's proxy still forces the neutral settings (it is never a plain
    recorder, where the harness would choose); a bad value stops it at parse time, before a model loads."""
    from steps import serve
    from steps.proxy.__main__ import parse_args as proxy_args
    from steps.sampling import NEUTRAL

    base = ["--model", "m", "--model-name", "tiny", "--port", "8100", "--store", "calls"]
    proxy = proxy_args([*serve.proxy_argv(serve.parse_args(base), 9000), "--admin-key", "k"])
    assert proxy.forced_sampling == NEUTRAL
    warm = serve.parse_args([*base, "--sampling", "temperature=0.7"])
    assert proxy_args([*serve.proxy_argv(warm, 9000), "--admin-key", "k"]).forced_sampling == {
        **NEUTRAL, "temperature": 0.7}
    with pytest.raises(SystemExit):
        serve.parse_args([*base, "--sampling", "top_k=-1"])
    assert "--sampling top_k must be 0 (off) or a whole number >= 1, got -1" in capsys.readouterr().err


def test_the_serve_step_gives_the_proxy_the_image_limit_of_a_vision_checkpoint_and_none_to_a_text_one(tmp_path):
    """The served checkpoint decides the proxy's images: a vision checkpoint gets the run's `--image-limit` and
    keeps tool results' images in the tool turn (its template renders them there); a text checkpoint gets 0, so
    an image is a 400 at the proxy instead of an error inside vLLM, and its template's tool turn is text only."""
    from steps import serve
    from steps.proxy.__main__ import parse_args as proxy_args
    from steps.tiny_model import build_tiny_model

    build_tiny_model(tmp_path / "vision", vision="qwen2_5_vl")
    build_tiny_model(tmp_path / "text")
    base = ["--model-name", "tiny", "--port", "8100", "--store", "calls", "--image-limit", "3"]
    for name, limit, tool_images in (("vision", 3, True), ("text", 0, False)):
        args = serve.parse_args([*base, "--model", str(tmp_path / name)])
        proxy = proxy_args([*serve.proxy_argv(args, 9000, str(tmp_path / name)), "--admin-key", "k"])
        assert (proxy.image_limit, proxy.tool_images) == (limit, tool_images), name
