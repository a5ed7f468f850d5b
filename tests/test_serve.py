"""`python -m steps.serve` (the serve step of an iteration) with the real vLLM on CPU and the tiny model.

    .venv/bin/python -m pytest -q tests/test_serve.py      # ~1 min: vLLM starts once

Checks what the Argo daemon relies on: the proxy answers /health only once vLLM is ready, a model
call goes through it and is recorded, and stopping the step stops vLLM too.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from steps.proxy.launch import ProxyProcess
from steps.vllm_server import free_port
from tests.conftest import ADMIN_KEY, MODEL_NAME
from workflows import commands
from workflows.config import load_config

pytestmark = pytest.mark.vllm


def wait_for_health(url: str, process: subprocess.Popen, timeout_s: float) -> dict:
    """Polls the proxy's /health until it answers; fails if the step exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"steps.serve exited with {process.returncode}"
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                return json.loads(resp.read())
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    raise AssertionError(f"steps.serve did not answer /health within {timeout_s} s")


def test_serve_step_serves_vllm_through_the_proxy(tiny_model: Path, tmp_path: Path) -> None:
    """The serve command from workflows.commands, on CPU: ready, records a call, stops vLLM with it."""
    config = load_config(None, ["run=serve", f"model_name={MODEL_NAME}", "max_tokens_cap=8"])
    port = free_port()
    model = tmp_path / "model"  # its own copy: the session's vLLM serves `tiny_model`, and must not be mistaken for ours
    shutil.copytree(tiny_model, model)
    argv = commands.serve(config, str(model), str(tmp_path / "calls"), 0, port=port, python=sys.executable)
    argv += ["--log", str(tmp_path / "vllm.log")]
    env = {**os.environ, "OPENFORGE_ADMIN_KEY": ADMIN_KEY}
    with open(tmp_path / "serve.log", "wb") as log:
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        health = wait_for_health(f"http://127.0.0.1:{port}", process, timeout_s=300)
        assert str(health["weight_version"]) == "0"
        proxy = ProxyProcess(process, port, ADMIN_KEY, tmp_path / "serve.log")
        rollout = proxy.register("serve-r0")
        body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}
        req = urllib.request.Request(f"{rollout['openai_base_url']}/chat/completions", data=json.dumps(body).encode(),
                                     headers={"authorization": f"Bearer {rollout['api_key']}",
                                              "content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            answer = json.loads(resp.read())
        assert answer["usage"]["completion_tokens"] <= 8  # the cap from the run config
        assert len(proxy.calls("serve-r0")) == 1
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)
    assert "vllm" not in subprocess.run(["pgrep", "-af", str(model)], capture_output=True, text=True).stdout
