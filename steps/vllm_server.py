"""Start and stop vLLM's OpenAI-compatible server on CPU as a subprocess (tests, the local runner).

    python -m steps.vllm_server MODEL_DIR [--name NAME] [--port PORT] [--log FILE]

serves MODEL_DIR until interrupted; from Python, `with serve_vllm(model_dir) as server: server.base_url`.
The command and environment are the ones checked in `shared/notes/vllm-cpu.md`: eager mode, one
process executor, the hermes tool parser, and logprobs from the processed (sampling) distribution,
which is what RL needs. vLLM's own output goes to a log file; if vLLM dies while starting, the error
quotes that log's tail.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"


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


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def vllm_command(model_dir: Path, name: str, port: int, max_model_len: int = 32768) -> list[str]:
    """The server's command line (the `vllm` console script is broken in vllm-cpu, so `-m`).

    It runs on `$OPENFORGE_SERVE_PYTHON` when set: serving and training live in separate environments,
    and a process of the training one may need to start vLLM from the serving one."""
    return [
        os.environ.get("OPENFORGE_SERVE_PYTHON") or sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", name, "--host", HOST, "--port", str(port),
        "--dtype", "bfloat16", "--max-model-len", str(max_model_len), "--enforce-eager",
        "--distributed-executor-backend", "uni", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--max-logprobs", "20", "--logprobs-mode", "processed_logprobs",
        "--generation-config", "vllm",  # sampling defaults are vLLM's, never the checkpoint's
    ]


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


def start_vllm(model_dir: Path, name: str = "tiny", port: int | None = None, log_path: Path | None = None,
               timeout_s: float = 240.0, kv_cache_gib: int = 1, warm_up: bool = True) -> VllmServer:
    """Starts vLLM serving `model_dir` and returns once `/health` answers (and one warm-up call ran)."""
    model_dir = Path(model_dir).resolve()
    port = port or free_port()
    log_path = Path(log_path or model_dir.parent / f"vllm-{port}.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        # Its own session, so that stopping it also ends the engine-core child process.
        process = subprocess.Popen(vllm_command(model_dir, name, port), env=vllm_env(kv_cache_gib),
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    server = VllmServer(process, model_dir, name, port, log_path)
    try:
        wait_healthy(server, timeout_s)
        if warm_up:
            warm_up_call(server)
    except BaseException:
        stop_vllm(server)
        raise
    return server


def wait_healthy(server: VllmServer, timeout_s: float) -> None:
    """Polls `/health` until it answers 200; raises with vLLM's log tail if vLLM exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"vLLM exited with code {server.process.returncode} while starting; "
                               f"last lines of {server.log_path}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(f"{server.base_url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"vLLM did not become healthy within {timeout_s:.0f} s; "
                       f"last lines of {server.log_path}:\n{server.log_tail()}")


def warm_up_call(server: VllmServer) -> dict:
    """One short chat call with token ids and logprobs: the first such call is slow, let it be this one."""
    body = {"model": server.name, "messages": [{"role": "user", "content": "warm up"}], "max_tokens": 2,
            "temperature": 0, "logprobs": True, "return_token_ids": True}
    req = urllib.request.Request(f"{server.base_url}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def stop_vllm(server: VllmServer, grace_s: float = 20.0) -> None:
    """Stops the server and every process it started: SIGTERM to its process group, SIGKILL after `grace_s`."""
    if server.process.poll() is None:
        _signal_group(server, signal.SIGTERM)
        try:
            server.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(server, signal.SIGKILL)  # whatever is left: the engine core, its workers
    server.process.wait()


def _signal_group(server: VllmServer, sig: signal.Signals) -> None:
    try:
        os.killpg(server.process.pid, sig)
    except ProcessLookupError:
        pass


@contextmanager
def serve_vllm(model_dir: Path, **kwargs) -> Iterator[VllmServer]:
    """`start_vllm` as a context manager: the server is stopped however the block ends."""
    server = start_vllm(model_dir, **kwargs)
    try:
        yield server
    finally:
        stop_vllm(server)


def main(argv: list[str] | None = None) -> None:
    """Serves a model until Ctrl-C, printing where."""
    p = argparse.ArgumentParser(prog="python -m steps.vllm_server", description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir", type=Path)
    p.add_argument("--name", default="tiny", help="served model name")
    p.add_argument("--port", type=int)
    p.add_argument("--log", type=Path, help="vLLM's log file (default: next to the model folder)")
    args = p.parse_args(argv)
    try:
        with serve_vllm(args.model_dir, name=args.name, port=args.port, log_path=args.log) as server:
            print(json.dumps({"base_url": server.base_url, "model": server.name, "log": str(server.log_path)}),
                  flush=True)
            server.process.wait()
    except KeyboardInterrupt:
        pass
    except RuntimeError as err:
        sys.exit(str(err))


if __name__ == "__main__":
    sys.exit(main())
