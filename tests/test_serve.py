"""`python -m steps.serve` (the serve step of an iteration) with the real vLLM on CPU and the tiny model.

    .venv/bin/python -m pytest -q tests/test_serve.py      # ~1 min: vLLM starts once

Checks what the Argo daemon relies on: the checkpoint is fetched from S3 (a moto server on loopback)
without the optimizer state beside it, the proxy answers /health only once vLLM is ready, a model call
goes through it and is recorded, and stopping the step stops vLLM too.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from proxy_process import ProxyProcess
from steps.net import free_port
from steps.proxy.client import ProxyClient, ProxyClientError
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
            return ProxyClient(url, ADMIN_KEY, timeout_s=2, retries=0).health()
        except ProxyClientError:
            time.sleep(0.5)
    raise AssertionError(f"steps.serve did not answer /health within {timeout_s} s")


def test_serve_step_serves_vllm_through_the_proxy(tiny_model: Path, tmp_path: Path, s3_server: dict) -> None:
    """The serve command from workflows.commands, on CPU, on a checkpoint in S3: fetched without its
    optimizer state, ready, records a call, stops vLLM with it."""
    config = load_config(None, ["run=serve", f"model_name={MODEL_NAME}", "max_tokens_cap=8"])
    port = free_port()
    checkpoint = tmp_path / "checkpoint"  # as steps.update writes it: the model, optimizer/ and metrics.json
    shutil.copytree(tiny_model, checkpoint)
    (checkpoint / "optimizer").mkdir()
    (checkpoint / "optimizer" / "optim_world_size_1_rank_0.pt").write_bytes(b"\0" * 1000)
    (checkpoint / "metrics.json").write_text("{}")
    url = f"s3://{s3_server['bucket']}/serve/checkpoints/iteration-1"
    env = {**os.environ, **s3_server["env"], "OPENFORGE_ADMIN_KEY": ADMIN_KEY}
    upload = f"import fsspec; fsspec.filesystem('s3').put({str(checkpoint)!r} + '/', {url!r}, recursive=True)"
    subprocess.run([sys.executable, "-c", upload], env=env, check=True)
    model = tmp_path / "models" / "current"  # a folder of its own: the session's vLLM serves `tiny_model`
    argv = commands.serve(config, url, str(tmp_path / "calls"), 0, port=port, python=sys.executable,
                          model_dir=str(model))
    argv += ["--log", str(tmp_path / "vllm.log")]
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
        fetched = sorted(str(path.relative_to(model)) for path in model.rglob("*") if path.is_file())
        assert fetched == sorted(str(path.relative_to(tiny_model)) for path in tiny_model.rglob("*") if path.is_file())
        assert "fetched" in (tmp_path / "serve.log").read_text()  # progress, file by file
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)
    assert "vllm" not in subprocess.run(["pgrep", "-af", str(model)], capture_output=True, text=True).stdout


def test_a_checkpoint_url_with_nothing_there_is_one_line_and_exit_1(s3_server: dict, monkeypatch, capsys,
                                                                      tmp_path: Path) -> None:
    """Nothing under the URL: the step says so in one line before it starts vLLM."""
    from steps import serve

    for key, value in s3_server["env"].items():
        monkeypatch.setenv(key, value)
    url = f"s3://{s3_server['bucket']}/serve/checkpoints/missing"
    code = serve.main(["--model", url, "--model-dir", str(tmp_path / "m"), "--model-name", "x", "--port", "1", "--store", "s"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and err == f"error: cannot fetch the checkpoint {url}: no checkpoint files at {url}"
