"""The real vLLM server on CPU as a subprocess for tests and benchmarks, built by the serve step's own
`steps.vllm_server.vllm_command`.

    with serve_vllm(model_dir, name="tiny") as server:
        server.base_url           # http://127.0.0.1:PORT, healthy, one warm-up call done

    server = spawn_vllm(model_dir)  # or: start now, and wait for it only when it is needed
    wait_ready(server)

vLLM's own output goes to a log file; if vLLM dies while starting, the error quotes that log's tail.
"""

import json
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from steps.net import free_port
from steps.vllm_server import ServingOptions, VllmServer, spawn, stop_vllm, vllm_command, wait_healthy


def start_vllm(model_dir: Path, name: str = "tiny", port: int | None = None, log_path: Path | None = None,
               timeout_s: float = 240.0, kv_cache_gib: int = 1, warm_up: bool = True,
               options: ServingOptions = ServingOptions()) -> VllmServer:
    """Starts vLLM serving `model_dir` and returns once `/health` answers (and one warm-up call ran)."""
    server = spawn_vllm(model_dir, name, port, log_path, kv_cache_gib, options)
    try:
        wait_ready(server, timeout_s, warm_up)
    except BaseException:
        stop_vllm(server)
        raise
    return server


def spawn_vllm(model_dir: Path, name: str = "tiny", port: int | None = None, log_path: Path | None = None,
               kv_cache_gib: int = 1, options: ServingOptions = ServingOptions()) -> VllmServer:
    """Starts vLLM serving `model_dir` and returns at once, while it loads (`wait_ready` waits for it)."""
    model_dir = Path(model_dir).resolve()
    port = port or free_port()
    log_path = Path(log_path or model_dir.parent / f"vllm-{port}.log")
    return spawn(vllm_command(model_dir, name, port, options), model_dir, name, port, log_path, kv_cache_gib)


def wait_ready(server: VllmServer, timeout_s: float = 240.0, warm_up: bool = True) -> None:
    """Returns once `/health` answers (and one warm-up call ran); raises with vLLM's log tail if it died."""
    wait_healthy(server, timeout_s)
    if warm_up:
        warm_up_call(server)


def warm_up_call(server: VllmServer) -> dict:
    """One short chat call with token ids and logprobs: the first such call is slow, let it be this one."""
    body = {"model": server.name, "messages": [{"role": "user", "content": "warm up"}], "max_tokens": 2,
            "temperature": 0, "logprobs": True, "return_token_ids": True}
    req = urllib.request.Request(f"{server.base_url}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


@contextmanager
def serve_vllm(model_dir: Path, **kwargs) -> Iterator[VllmServer]:
    """`start_vllm` as a context manager: the server is stopped however the block ends."""
    server = start_vllm(model_dir, **kwargs)
    try:
        yield server
    finally:
        stop_vllm(server)
