"""Every harness completes a real task through the real recording proxy, recorded token-exactly.

    python -m steps.harnesses install --all      # once; .ci/run does it
    pytest -m harness tests/test_harnesses.py

Each test runs the real harness CLI (pinned npm version), headless, with a throwaway HOME and a fresh
workdir, against a proxy rollout whose upstream is `tests/scripted_model.py`: a double of vLLM's
server, because a small random model cannot call tools. The script has the shell tool read `answer.txt`
before it exists (a failure), write `hello` into it, read it back, (for a harness with a plan tool) set a
plan, then answers "done". The test checks the file on disk, that every call the proxy recorded carries
exactly the token ids and logprobs the upstream returned, and the behaviour analytics of what the proxy
recorded (steps/analytics). Another has the shell tool write `env` into a file: the rollout's key is there
only for a harness whose `KEY_IN_TOOL_ENV` says so (none now; Codex without its environment policy is the
control), and that rollout, which never reads back what it wrote, is not self-verified.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import msgspec
import orjson
import pytest
from scripted_model import ScriptedModel

from steps.analytics import rollout_behaviour
from steps.analytics.dialects import READERS
from steps.harnesses import HARNESSES, Endpoint, codex, default_prefix
from steps.harnesses.base import installed_version, node_bin_dir
from steps.proxy import chat, messages, responses
from proxy_process import ProxyProcess
from steps.proxy.protocol import decode

pytestmark = pytest.mark.harness

INSTRUCTION = "Write the word hello into a file named answer.txt in the current directory."
COMMAND = "echo hello > answer.txt"
READ_BACK = "cat answer.txt"  # run first too, before the file exists: a failed tool result
HARNESS_TIMEOUT_S = 180
# A plan the scripted model sets with the harness's plan tool, 2 of 3 items done (only opencode's pinned
# version offers one: docs/analytics.md).
PLANS = {"opencode": {"tool": "todowrite", "arguments": {"todos": [
    {"content": "write answer.txt", "status": "completed", "priority": "high"},
    {"content": "read it back", "status": "completed", "priority": "high"},
    {"content": "tidy up", "status": "pending", "priority": "low"}]}}}
# Each harness's first request as recorded from its pinned CLI: the tools it offers, counted independently
# of the analytics' readers.
FIRST_REQUESTS = Path(__file__).parent / "data" / "harness_requests"


def script(name: str) -> list:
    """What the scripted model does in the main test: fail, write, read back, (plan)."""
    return [READ_BACK, COMMAND, READ_BACK] + ([PLANS[name]] if name in PLANS else [])


@pytest.fixture(scope="module")
def scripted() -> ScriptedModel:
    """The scripted vLLM double on a free loopback port."""
    with ScriptedModel(model="tiny", commands=[COMMAND]) as server:
        yield server


@pytest.fixture(scope="module")
def harness_proxy(proxy: Callable[..., ProxyProcess], scripted: ScriptedModel) -> ProxyProcess:
    """The real proxy (`python -m steps.proxy`, a subprocess) with the scripted model upstream."""
    return proxy(scripted.url)


def installed_exe(name: str) -> Path:
    """The pinned harness's executable, or skip the test when it is not installed (or harness CLIs are off for
    this run: OPENFORGE_TEST_HARNESS_CLIS=off, `make test-fast`)."""
    harness = HARNESSES[name]
    if harness.NPM_PACKAGE is not None and os.environ.get("OPENFORGE_TEST_HARNESS_CLIS") == "off":
        pytest.skip(f"harness CLIs are off for this run (OPENFORGE_TEST_HARNESS_CLIS=off): {name}")
    prefix = default_prefix(name, harness.VERSION)
    if harness.NPM_PACKAGE is None:  # built in: nothing to install
        return harness.install(prefix)
    exe = prefix / "node_modules" / ".bin" / harness.BINARY
    if installed_version(prefix, harness.NPM_PACKAGE) != harness.VERSION or not exe.exists() \
            or not (node_bin_dir() / "node").exists():
        pytest.skip(f"{name} {harness.VERSION} is not installed; run: python -m steps.harnesses install {name}")
    return exe


def run_harness(argv: list[str], env: dict[str, str], workdir: Path) -> subprocess.CompletedProcess:
    """Run the harness headless; on timeout kill its whole process group and report what it printed."""
    process = subprocess.Popen(argv, env=env, cwd=workdir, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=HARNESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"harness ran past {HARNESS_TIMEOUT_S} s\nstdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-3000:]}")
    finally:
        # Harnesses leave helpers behind (shell snapshots, language servers); none may outlive the test.
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def upstream_messages(dialect: str, request: dict) -> bytes:
    """The messages the proxy sends vLLM for a recorded request, as canonical JSON."""
    module = {module.NAME: module for module in (chat, messages, responses)}[dialect]
    req, raw = decode(orjson.dumps(request), module.Request, fields=module.RAW_FIELDS)
    return orjson.dumps(orjson.loads(msgspec.json.encode(module.to_upstream(req, raw)))["messages"])


def token_record(ids: list[int], response_ids: list[int], logprobs: list[float]) -> tuple:
    """A hashable summary of one call's tokens, to compare recorded calls with upstream answers."""
    return tuple(ids), tuple(response_ids), tuple(logprobs)


@pytest.mark.parametrize("name", list(HARNESSES))
def test_harness_completes_task_through_proxy(name: str, scripted: ScriptedModel,
                                              harness_proxy: ProxyProcess, tmp_path: Path) -> None:
    harness = HARNESSES[name]
    exe = installed_exe(name)
    scripted.set_commands(script(name))
    rollout_id = f"{name}-{uuid.uuid4().hex[:8]}"
    rollout = harness_proxy.register(rollout_id, {"harness": name})
    endpoint = Endpoint(openai_base_url=rollout["openai_base_url"],
                        anthropic_base_url=rollout["anthropic_base_url"],
                        api_key=rollout["api_key"], model="tiny")
    home, workdir = tmp_path / "home", tmp_path / "work"
    workdir.mkdir()
    env = harness.prepare(home, workdir, endpoint)

    started = time.monotonic()
    done = run_harness(harness.command(INSTRUCTION, workdir, exe), env, workdir)
    seconds = time.monotonic() - started
    calls = harness_proxy.calls(rollout_id)
    harness_proxy.client.close(rollout_id)
    context = (f"{name} exited {done.returncode} after {seconds:.1f} s with {len(calls)} calls\n"
               f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}\n"
               f"proxy log:\n{harness_proxy.log_tail()}")

    answer = workdir / "answer.txt"
    assert answer.exists() and answer.read_text().strip() == "hello", context
    assert len(calls) >= 2, context  # the tool call, then the final answer
    assert [call["call_index"] for call in calls] == list(range(len(calls))), context
    assert {call["dialect"] for call in calls} == {harness.DIALECT}, context
    assert {call["status"] for call in calls} == {"ok"}, context
    assert any(call["finish_reason"] == "tool_calls" for call in calls), context

    # Token-exact: each recorded call holds what the upstream returned for one of its exchanges.
    recorded = collections.Counter(
        token_record(call["prompt_token_ids"], call["response_token_ids"], call["response_logprobs"])
        for call in calls)
    upstream = collections.Counter(
        token_record(exchange["response"]["prompt_token_ids"],
                     exchange["response"]["choices"][0]["token_ids"],
                     [entry["logprob"] for entry in exchange["response"]["choices"][0]["logprobs"]["content"]])
        for exchange in scripted.exchanges)
    assert recorded == upstream, context

    # Each recorded request (stored as the bytes it adds to the call before) is whole again: translated
    # anew, it gives exactly the messages the upstream received for one of the exchanges.
    assert (collections.Counter(upstream_messages(harness.DIALECT, call["request"]) for call in calls)
            == collections.Counter(orjson.dumps(exchange["request"]["messages"]) for exchange in scripted.exchanges)), context
    assert_behaviour(name, calls, context)
    print(f"{name}: {len(calls)} calls in {seconds:.1f} s")


def assert_behaviour(name: str, calls: list[dict], context: str) -> None:
    """The behaviour analytics of the recorded calls are what the script did."""
    harness, behaviour = HARNESSES[name], rollout_behaviour(calls, name)
    context = f"{behaviour}\n{context}"
    shell_tools = [tool for tool in harness.SHELL_TOOLS if f'"{tool}"' in behaviour.tool_counts]
    assert shell_tools, f"no call of {harness.SHELL_TOOLS} in {behaviour.tool_counts}\n{context}"
    counts = {shell_tools[0]: 3, **({PLANS[name]["tool"]: 1} if name in PLANS else {})}
    side_calls = sum(1 for call in calls if not call["request"].get("tools"))  # titles: no tools offered
    # Whether the failed read's result states its exit code, as the harness's own reader sees the CLI's text.
    failure_seen = harness.exit_code(first_result_text(harness.DIALECT, calls)) not in (None, 0)
    first_request = FIRST_REQUESTS / f"{name}.json"
    if first_request.exists():
        tools = orjson.loads(first_request.read_bytes())["body"]["tools"]
        names = [tool.get("name") or tool.get("function", {}).get("name") for tool in tools]
        offered = len([name for name in names if name not in harness.PLACEHOLDER_TOOLS])
        assert behaviour.tools_offered == offered, context
    assert (behaviour.calls, behaviour.turns, behaviour.failed_calls, behaviour.unreadable) == \
        (len(calls), len(calls) - side_calls, 0, 0), context
    assert orjson.loads(behaviour.tool_counts) == counts and behaviour.tool_calls == sum(counts.values()), context
    assert behaviour.shell_calls == 3 and behaviour.shell_share == 3 / behaviour.tool_calls, context
    assert (behaviour.tools_used, behaviour.tool_coverage) == (len(counts), len(counts) / behaviour.tools_offered), \
        context
    assert (behaviour.changes, behaviour.self_verified) == (1, True), context
    assert (behaviour.tool_failures, behaviour.changed_after_failure, behaviour.repeated_after_failure) == \
        ((1, 1, 0) if failure_seen else (0, 0, 0)), context
    assert behaviour.plan_completion == (pytest.approx(2 / 3) if name in PLANS else None), context
    assert orjson.loads(behaviour.finish_reasons)["tool_calls"] == behaviour.tool_calls, context
    assert behaviour.response_tokens == sum(len(call["response_token_ids"]) for call in calls), context


def first_result_text(dialect: str, calls: list[dict]) -> str:
    """The text of the first tool result any recorded request holds (the failed `cat answer.txt`)."""
    for call in sorted(calls, key=lambda c: c["call_index"]):
        results = READERS[dialect].tool_results(call["request"])
        if results:
            return results[0].text
    raise AssertionError(f"no tool result in {len(calls)} recorded requests")


def run_recorded(name: str, harness_proxy: ProxyProcess, tmp_path: Path) -> list[dict]:
    """Runs the harness once on the instruction through the proxy; the calls it recorded."""
    harness = HARNESSES[name]
    exe = installed_exe(name)
    rollout_id = f"{name}-{uuid.uuid4().hex[:8]}"
    rollout = harness_proxy.register(rollout_id, {"harness": name})
    endpoint = Endpoint(openai_base_url=rollout["openai_base_url"], anthropic_base_url=rollout["anthropic_base_url"],
                        api_key=rollout["api_key"], model="tiny")
    home, workdir = tmp_path / "home", tmp_path / "work"
    workdir.mkdir()
    done = run_harness(harness.command(INSTRUCTION, workdir, exe), harness.prepare(home, workdir, endpoint), workdir)
    assert done.returncode == 0, done.stderr[-2000:]
    calls = harness_proxy.calls(rollout_id)
    harness_proxy.client.close(rollout_id)
    return calls


def test_direct_repeating_a_failed_call_counts_as_repeated(scripted: ScriptedModel, harness_proxy: ProxyProcess,
                                                           tmp_path: Path) -> None:
    """Control for error recovery: the same failing command twice, then another one, through the real proxy."""
    scripted.set_commands(["cat missing.txt", "cat missing.txt", COMMAND])
    calls = run_recorded("direct", harness_proxy, tmp_path)
    behaviour = rollout_behaviour(calls, "direct")
    assert (behaviour.tool_failures, behaviour.repeated_after_failure, behaviour.changed_after_failure) == (2, 1, 1)
    assert (behaviour.changes, behaviour.self_verified) == (1, False), behaviour


ENV_COMMAND = "env > tool-env.txt"


def tool_environment(name: str, scripted: ScriptedModel, harness_proxy: ProxyProcess, tmp_path: Path,
                     edit_home: Callable[[Path], None] = lambda home: None) -> tuple[str, str]:
    """(the rollout's key, what the harness's shell tool found in its environment), after the scripted
    model had it run `env` into a file; `edit_home` may change the harness's config first."""
    harness = HARNESSES[name]
    exe = installed_exe(name)
    scripted.set_commands([ENV_COMMAND])
    rollout_id = f"env-{name}-{uuid.uuid4().hex[:8]}"
    rollout = harness_proxy.register(rollout_id, {"harness": name})
    endpoint = Endpoint(openai_base_url=rollout["openai_base_url"], anthropic_base_url=rollout["anthropic_base_url"],
                        api_key=rollout["api_key"], model="tiny")
    home, workdir = tmp_path / "home", tmp_path / "work"
    workdir.mkdir()
    env = harness.prepare(home, workdir, endpoint)
    edit_home(home)
    done = run_harness(harness.command(INSTRUCTION, workdir, exe), env, workdir)
    calls = harness_proxy.calls(rollout_id)
    harness_proxy.client.close(rollout_id)
    seen = workdir / "tool-env.txt"
    context = f"{name} exited {done.returncode}\nstdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-2000:]}"
    assert seen.exists() and "PATH=" in seen.read_text(), context  # the tool ran and wrote its environment
    assert {call["status"] for call in calls} == {"ok"} and len(calls) >= 2, context  # the key did reach the proxy
    # Control for self-verification: it wrote a file and never read it back.
    assert rollout_behaviour(calls, name).self_verified is False, context
    return endpoint.api_key, seen.read_text()


@pytest.mark.parametrize("name", list(HARNESSES))
def test_tool_processes_see_the_rollout_key_only_where_the_harness_cannot_hide_it(
        name: str, scripted: ScriptedModel, harness_proxy: ProxyProcess, tmp_path: Path) -> None:
    """The rollout's key is in the shell tool's environment exactly when the harness cannot be told to
    keep it out (`KEY_IN_TOOL_ENV`); every pinned harness here can, and is told to."""
    key, seen = tool_environment(name, scripted, harness_proxy, tmp_path)
    assert (key in seen) is HARNESSES[name].KEY_IN_TOOL_ENV, seen


def test_codex_tool_processes_see_the_key_without_its_environment_policy(
        scripted: ScriptedModel, harness_proxy: ProxyProcess, tmp_path: Path) -> None:
    """Control: the same run with Codex's `[shell_environment_policy]` removed puts the key in the tool's env,
    so the check above would catch a harness that passes it on."""
    def drop_policy(home: Path) -> None:
        config = home / ".codex" / "config.toml"
        text = config.read_text()
        assert "[shell_environment_policy]" in text
        config.write_text(re.sub(r"\[shell_environment_policy\][^\[]*", "", text))

    key, seen = tool_environment("codex", scripted, harness_proxy, tmp_path, edit_home=drop_policy)
    assert f"{codex.API_KEY_VAR}={key}" in seen
