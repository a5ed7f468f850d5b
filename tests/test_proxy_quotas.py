"""What the proxy stores of one rollout is bounded (docs/proxy.md, "Limits"): a rollout flooding its own session
with padded calls is refused once it reaches `store_quota_mb` or `store_quota_calls`, in its dialect's error
shape, before the upstream call, with no index taken and nothing stored; another rollout goes on; a restarted
proxy reads the counts back from the store (a local log, S3 objects).

The proxy is the real `python -m steps.proxy`; the upstream is the scripted vLLM double (tests/scripted_model.py),
which keeps every body it was sent, so a refused call is seen never to reach it. The padding is random, as the
red team's was, so the store's sharing of requests between calls saves nothing of it. The last test runs real
harnesses into the quota: each stops at the refusal (no retries) and its rollout is graded.
"""

import base64
import io
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from PIL import Image as PILImage

from proxy_process import start_proxy, stop_proxy
from steps.proxy.config import ProxyConfig
from steps.rollout import run_rollout
from steps.tasks import BUILTIN_DATASET
from test_harnesses import installed_exe
from test_rollout import ADMIN_KEY, oracle, spec_for
from workflows import commands
from steps.contracts.config import RunConfig

from workflows.config import load_config

PAD = 300_000  # bytes of random padding per call: the fourth call takes a rollout past 1 MiB
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


def body(dialect: str, padding: int = PAD, content: list | str = "hi") -> dict:
    """A small request of `dialect` with `padding` random characters in a field the proxy does not read."""
    pad = secrets.token_hex(padding // 2)
    if dialect == "chat":
        return {"model": "tiny", "messages": [{"role": "user", "content": content}], "padding": pad}
    if dialect == "responses":
        return {"model": "tiny", "input": [{"type": "message", "role": "user", "content": content}], "padding": pad}
    return {"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": content}], "padding": pad}


def call(rollout: dict, dialect: str, request: dict) -> tuple[int, dict]:
    """(status, JSON answer) of one call of the registered `rollout`."""
    base = rollout["anthropic_base_url"] if dialect == "messages" else rollout["openai_base_url"].removesuffix("/v1")
    answer = httpx.post(base + PATHS[dialect], json=request, timeout=60,
                        headers={"authorization": f"Bearer {rollout['api_key']}", "x-api-key": rollout["api_key"]})
    return answer.status_code, answer.json()


def log_size(proxy, rollout_id: str) -> int:
    path = Path(proxy.store, "rollouts", rollout_id, "calls.jsonl")
    return path.stat().st_size if path.exists() else 0


def refusal(dialect: str, answer: dict) -> str:
    """The message of a quota refusal, checked to be in the dialect's own error shape."""
    if dialect == "messages":
        assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error", answer
        return answer["error"]["message"]
    assert answer["error"]["type"] == "invalid_request_error" and answer["error"]["code"] == "store_quota_exceeded", answer
    return answer["error"]["message"]


@pytest.mark.parametrize("dialect", list(PATHS))
@pytest.mark.parametrize("quota", ["bytes", "calls"])
def test_a_store_flood_is_refused_at_the_quota_before_the_upstream_in_the_dialects_shape(proxy, scripted, dialect,
                                                                                       quota):
    limit = ["--store-quota-mb", "1"] if quota == "bytes" else ["--store-quota-calls", "3"]
    served = proxy(scripted.url, extra=limit)
    flood, other = served.register(f"flood-{dialect}"), served.register(f"other-{dialect}")
    sent, statuses = len(scripted.exchanges), []
    for _ in range(6):
        status, answer = call(flood, dialect, body(dialect))
        statuses.append(status)
    answered = 4 if quota == "bytes" else 3  # 3 x 300 KB < 1 MiB: the fourth is admitted, and passes it
    assert statuses == [200] * answered + [400] * (6 - answered)
    message = refusal(dialect, answer)
    assert ("1 MiB" in message and "(store_quota_mb)" in message) if quota == "bytes" else \
        ("made 3 calls" in message and "(store_quota_calls)" in message), message
    calls = served.calls(flood["rollout_id"])
    assert [c["call_index"] for c in calls] == list(range(answered)) and {c["status"] for c in calls} == {"ok"}
    assert len(scripted.exchanges) == sent + answered  # the refused calls never went upstream
    stored = log_size(served, flood["rollout_id"])
    assert call(flood, dialect, body(dialect))[0] == 400
    assert log_size(served, flood["rollout_id"]) == stored and len(scripted.exchanges) == sent + answered
    # control: the quota is the flooding rollout's own; another rollout of the same proxy is answered and stored
    assert call(other, dialect, body(dialect))[0] == 200 and len(scripted.exchanges) == sent + answered + 1
    assert [c["status"] for c in served.calls(other["rollout_id"])] == ["ok"]


def test_without_a_quota_the_same_flood_is_stored_whole(proxy, scripted):
    """The control of the test above: with the quotas off (0) every padded call is answered and stored."""
    served = proxy(scripted.url, extra=["--store-quota-mb", "0", "--store-quota-calls", "0"])
    flood = served.register("flood-unlimited")
    assert [call(flood, "chat", body("chat"))[0] for _ in range(6)] == [200] * 6
    assert log_size(served, "flood-unlimited") > 6 * PAD


def test_calls_sent_at_once_cannot_pass_the_quota_together(proxy, scripted):
    """16 padded calls at once: the requests of calls in flight count against the quota, so no more are admitted
    than fit (each call is refused or answered; none is stored past the fourth)."""
    served = proxy(scripted.url, extra=["--store-quota-mb", "1"])
    flood = served.register("flood-at-once")
    requests = [body("chat") for _ in range(16)]
    with ThreadPoolExecutor(16) as pool:
        statuses = [status for status, _ in pool.map(lambda request: call(flood, "chat", request), requests)]
    assert sorted(statuses) == [200] * 4 + [400] * 12
    assert len(served.calls("flood-at-once")) == 4


def noise_png(side: int = 300) -> bytes:
    """A PNG of random grey pixels (~90 KB: PNG cannot compress noise)."""
    out = io.BytesIO()
    PILImage.frombytes("L", (side, side), secrets.token_bytes(side * side)).save(out, format="PNG")
    return out.getvalue()


def test_an_image_counts_once_against_the_quota_of_the_rollout_that_stored_it(proxy, scripted):
    """Each screenshot is stored once, so sending one again costs its rollout's quota only a small record. (The
    scripted model counts a token per 3 bytes of the data URL, so the first record of each new screenshot holds
    ~40k prompt ids, ~300 KB.) Control: twelve calls of one screenshot stay under 1 MiB, where counting its 90 KB
    with every call would pass 1 MiB by the ninth; three new ones pass it."""
    served = proxy(scripted.url, extra=["--store-quota-mb", "1"])
    rollout = served.register("screenshots")
    shots = [noise_png() for _ in range(4)]
    assert all(80_000 < len(shot) < 100_000 for shot in shots)

    def screenshot(png: bytes) -> dict:
        url = f"data:image/png;base64,{base64.b64encode(png).decode()}"
        return body("chat", padding=0, content=[{"type": "text", "text": "look"},
                                                {"type": "image_url", "image_url": {"url": url}}])

    assert [call(rollout, "chat", screenshot(shots[0]))[0] for _ in range(12)] == [200] * 12
    assert [call(rollout, "chat", screenshot(shot))[0] for shot in shots[1:]] == [200, 200, 400]
    status, answer = call(rollout, "chat", screenshot(shots[0]))
    assert status == 400 and "(store_quota_mb)" in answer["error"]["message"]
    log = Path(served.store, "rollouts", "screenshots", "calls.jsonl").read_bytes()
    assert base64.b64encode(shots[0])[:1000] not in log  # its bytes are the image file's, counted apart


@pytest.mark.parametrize("store", ["local", "s3"])
def test_a_restarted_proxy_reads_each_rollouts_counts_back_from_the_store(scripted, s3_server, tmp_path, store):
    """Two calls, a restart, then calls until refused: the byte quota is reached after as many padded calls as
    without the restart, the call quota after as many calls (counting from zero again, the restarted proxy
    would answer them all)."""
    url = str(tmp_path / "store") if store == "local" else f"s3://{s3_server['bucket']}/quota-{secrets.token_hex(4)}"
    env = s3_server["env"] if store == "s3" else None

    def run(extra: list[str], rollout_id: str, before: list[int], after: int, padding: int) -> list[int]:
        proxy = start_proxy(scripted.url, url, ADMIN_KEY, extra=extra, env=env, log_path=tmp_path / "proxy.log")
        try:
            rollout = proxy.register(rollout_id)
            statuses = [call(rollout, "chat", body("chat", padding))[0] for _ in before]
        finally:
            stop_proxy(proxy)
        proxy = start_proxy(scripted.url, url, ADMIN_KEY, port=proxy.port, extra=extra, env=env,
                            log_path=tmp_path / "proxy.log")
        try:
            statuses += [call(rollout, "chat", body("chat", padding))[0] for _ in range(after)]
            assert [c["call_index"] for c in proxy.calls(rollout_id)] == list(range(statuses.count(200)))
        finally:
            stop_proxy(proxy)
        return statuses

    assert run(["--store-quota-mb", "1"], "bytes", [1, 2], 4, PAD) == [200, 200, 200, 200, 400, 400]
    assert run(["--store-quota-calls", "3"], "calls", [1, 2], 3, 0) == [200, 200, 200, 400, 400]


@pytest.mark.parametrize("harness", [pytest.param(harness, marks=() if harness == "direct" else pytest.mark.harness)
                                     for harness in ("direct", "codex", "claude-code")])  # direct: no CLI
def test_a_harness_refused_at_its_quota_stops_and_its_rollout_is_graded(scripted, proxy, tmp_path, harness):
    """A real harness meets the quota: its first call (the task's oracle as a tool call) is answered, its next is
    refused. It does not retry the refusal (a 400: Codex runs without retries; Claude Code retries 429s, 5xx
    and, its key coming from apiKeyHelper, 401 and 403, ten times over ~4 minutes, but not a 400), so it ends at
    once, and the rollout is graded on what was done: reward 1, not an infra_error. Control (direct, no quota):
    the same rollout makes its second call."""
    if harness != "direct":
        installed_exe(harness)  # skips when the harness is not installed
    served = proxy(scripted.url, extra=["--store-quota-calls", "1"])
    scripted.set_commands([oracle("hello-file")])
    started = time.monotonic()
    result = run_rollout(spec_for(served, BUILTIN_DATASET / "hello-file", harness, tmp_path))
    log = Path(result.paths.get("harness_log", "/dev/null")).read_text()[-3000:]
    assert (result.status, result.reward, result.num_calls) == ("ok", 1.0, 1), f"{result}\n{log}"
    assert time.monotonic() - started < 60, log  # no backoff and retries of a refusal that stays
    assert "store_quota_calls" in log or harness == "direct", log
    if harness == "direct":
        unlimited = proxy(scripted.url, extra=["--store-quota-calls", "0"])
        result = run_rollout(spec_for(unlimited, BUILTIN_DATASET / "hello-file", harness, tmp_path))
        assert (result.status, result.reward, result.num_calls) == ("ok", 1.0, 2)


def test_the_run_configs_limits_reach_the_proxy_through_the_serve_step():
    """config -> `commands.serve` -> the serve step's parser -> the proxy's flags -> ProxyConfig; left at the
    run's defaults they add no flag (the proxy's defaults are the run's)."""
    from steps import serve
    from steps.proxy.__main__ import parse_args

    keys = ("store_quota_mb", "store_quota_calls", "image_pixel_limit", "request_image_mb")
    assert {key: getattr(ProxyConfig, key) for key in keys} == {key: getattr(RunConfig, key) for key in keys}
    config = load_config(None, ["run=x", "store_quota_mb=64", "store_quota_calls=100", "image_pixel_limit=1000000",
                                "request_image_mb=8"])
    for argv in (commands.serve(config, "/models/current", "calls", 0),
                 commands.serve(load_config(None, ["run=x", "upstream=http://10.0.0.5:8000", "store_quota_mb=64",
                                                   "store_quota_calls=100", "image_pixel_limit=1000000",
                                                   "request_image_mb=8"]), "", "calls", 0)):
        args = serve.parse_args(argv[3:])
        proxy_argv = serve.upstream_proxy_argv(args) if args.upstream else serve.proxy_argv(args, 8000)
        proxy_config = parse_args([*proxy_argv, "--admin-key", "k"])
        assert [getattr(proxy_config, key) for key in keys] == [64, 100, 1_000_000, 8]
    plain = commands.serve(load_config(None, ["run=x"]), "/models/current", "calls", 0)
    assert not any(flag in plain for flag in ("--store-quota-mb", "--image-pixel-limit"))
    assert parse_args(serve.proxy_argv(serve.parse_args(plain[3:]), 8000) + ["--admin-key", "k"]).store_quota_mb == 128
