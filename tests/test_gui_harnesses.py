"""The GUI harnesses complete built-in GUI tasks as a rollout runs them, through the real recording proxy, and
the task's own verifier grades the app's state; a control doing one thing wrong scores 0.

    python -m steps.harnesses install browser-use     # once: its own virtualenv (the tests install it otherwise)
    pytest -m harness tests/test_gui_harnesses.py

Real parts throughout: `steps.rollout.run_rollout` on a task of `steps/tasks/gui` (the task's app in its
sibling sandbox sharing the rollout's loopback, the harness in the rollout sandbox, its only way out the
tunnel to the proxy), the real pinned browser-use on headless Chromium, the computer-use loop on the desktop
task's X display, the recording proxy (`python -m steps.proxy`) and the task's verifier.

The model behind the proxy is a double of vLLM's server, because no model that runs here can read a screen and
act on it, let alone solve a task: it replays the task's oracle in the harness's own protocol, from the actions
written down once per task in `tests/data/gui_oracle_actions.json` (each naming the solve.sh line it replays).
For browser-use that is `tests/scripted_gui_model.py` (Chat Completions under its strict json_schema, elements
picked by index from the page's element list); for the computer-use loop `tests/scripted_model.py` calling
the `computer` tool (the proxy turns that into Messages `tool_use` blocks of `computer_20250124`, and the
screenshots the loop returns inside `tool_result` blocks into the tool messages the double receives).
"""

from __future__ import annotations

import doctest
import hashlib
import importlib
import json
import os
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from scripted_gui_model import ScriptedGuiModel
from scripted_model import ScriptedModel

from proxy_process import ProxyProcess
from steps.harnesses import GUI_HARNESSES, default_prefix
from steps.proxy.images import REFERENCE_PREFIX
from steps.contracts.rollout import RolloutResult
from steps.rollout import RolloutSpec, run_rollout

REPO = Path(__file__).resolve().parents[1]
GUI = REPO / "steps" / "tasks" / "gui"
SCRIPTS = json.loads((Path(__file__).parent / "data" / "gui_oracle_actions.json").read_text())
SCRIPTED = [(task, harness) for task, scripts in SCRIPTS.items() if task != "about" for harness in scripts]
TASKS = {name: [task for task, harness in SCRIPTED if harness == name] for name in GUI_HARNESSES}
DATA_URL = "data:image/"


@dataclass
class Run:
    """One rollout of a task against a scripted model: its result, what the proxy recorded and stored, and what
    the model was sent."""

    result: RolloutResult
    calls: list[dict]
    exchanges: list[dict]
    store: Path
    log: str

    @property
    def context(self) -> str:
        """What to read when an assertion on this run fails."""
        harness_log = Path(self.result.paths.get("harness_log", "/nonexistent"))
        tail = harness_log.read_text(errors="replace")[-3000:] if harness_log.is_file() else "(no harness log)"
        return f"{self.result}\n{len(self.calls)} calls\n{tail}\nproxy:\n{self.log}"


def installed(name: str) -> None:
    """Installs the harness if it is not (`make test` installs it first); skipped only when harness installs are
    off for this run (OPENFORGE_TEST_HARNESS_CLIS=off, `make test-fast`), never silently in the whole suite."""
    harness = GUI_HARNESSES[name]
    prefix = default_prefix(name, harness.VERSION)
    if not harness.installed(prefix) and os.environ.get("OPENFORGE_TEST_HARNESS_CLIS") == "off":
        pytest.skip(f"harness installs are off for this run (OPENFORGE_TEST_HARNESS_CLIS=off): {name}")
    harness.install(prefix)


def scripted(harness: str, steps: list[list[dict]]):
    """The double that plays `steps` (each one reply's actions) in the harness's protocol."""
    if harness == "browser-use":
        return ScriptedGuiModel(steps)
    return ScriptedModel(commands=[{"tool": "computer", "arguments": action} for (action,) in steps])


def rollouts(proxy: Callable[..., ProxyProcess], task: str, harness: str, out: Path) -> dict[str, Run]:
    """Two rollouts of `task` with `harness`, side by side, as the rollout step runs them (each against its own
    double and proxy): one playing the oracle's actions, one the control's; {"oracle": run, "wrong": run}."""
    installed(harness)
    script = SCRIPTS[task][harness]
    scripts = {"oracle": [step["actions"] for step in script["oracle"]], "wrong": script["wrong"]["steps"]}
    with ExitStack() as stack:
        models = {name: stack.enter_context(scripted(harness, actions)) for name, actions in scripts.items()}
        gateways = {name: proxy(model.url) for name, model in models.items()}

        def run(name: str) -> Run:
            gateway = gateways[name]
            spec = RolloutSpec(task=GUI / task, harness=harness, proxy_url=gateway.url, out=out / name,
                               rollout_id=f"{task}-{name}-{uuid.uuid4().hex[:8]}", admin_key=gateway.admin_key)
            result = run_rollout(spec)
            return Run(result, gateway.calls(result.rollout_id), list(models[name].exchanges), Path(gateway.store),
                       gateway.log_tail())

        with ThreadPoolExecutor(len(scripts)) as pool:
            return dict(zip(scripts, pool.map(run, scripts)))


def assert_stored_by_reference(run: Run) -> None:
    """The rollout's stored calls name each screenshot by reference, never inline, and each is stored whole."""
    log = (run.store / "rollouts" / run.result.rollout_id / "calls.jsonl").read_text()
    assert REFERENCE_PREFIX in log and DATA_URL not in log, run.context
    for call in run.calls:
        for image in call["images"]:
            stored = run.store / "images" / image["sha256"]
            assert hashlib.sha256(stored.read_bytes()).hexdigest() == image["sha256"], run.context


def assert_token_exact(run: Run) -> None:
    """Each recorded call holds the ids the model returned."""
    recorded = sorted((tuple(call["prompt_token_ids"]), tuple(call["response_token_ids"])) for call in run.calls)
    upstream = sorted((tuple(e["response"]["prompt_token_ids"]), tuple(e["response"]["choices"][0]["token_ids"]))
                      for e in run.exchanges)
    assert recorded == upstream, run.context


def image_urls(body: dict, role: str) -> list[str]:
    """The image_url strings of the chat body's messages of `role`, in prompt order."""
    return [part["image_url"]["url"] if isinstance(part["image_url"], dict) else part["image_url"]
            for message in body.get("messages", []) if message.get("role") == role
            and isinstance(message.get("content"), list)
            for part in message["content"] if isinstance(part, dict) and part.get("type") == "image_url"]


@pytest.mark.parametrize("task, harness", SCRIPTED)
def test_every_scripted_step_replays_a_line_of_its_tasks_oracle(task, harness):
    solve = (GUI / task / "solution" / "solve.sh").read_text()
    script = SCRIPTS[task][harness]
    assert harness in GUI_HARNESSES and script["oracle"] and script["wrong"]["why"]
    lines = [solve.index(line) for step in script["oracle"] for line in step["replays"]]  # each line is in solve.sh ...
    assert lines == sorted(lines)  # ... in the oracle's order
    assert script["wrong"]["steps"] != [step["actions"] for step in script["oracle"]]
    if harness == "computer-use":  # the loop answers one tool call a turn, and the double plays one
        assert all(len(step) == 1 for step in [*(s["actions"] for s in script["oracle"]), *script["wrong"]["steps"]])


@pytest.mark.parametrize("module", ["scripted_gui_model", "steps.harnesses.computer_use"])
def test_doctests(module):
    failures, tried = doctest.testmod(importlib.import_module(module))
    assert tried and not failures


@pytest.mark.harness
@pytest.mark.parametrize("task", TASKS["browser-use"])
def test_browser_use_completes_a_gui_task_through_the_proxy(proxy, task, tmp_path):
    runs = rollouts(proxy, task, "browser-use", tmp_path)
    oracle, wrong, script = runs["oracle"], runs["wrong"], SCRIPTS[task]["browser-use"]
    assert (oracle.result.status, oracle.result.reward) == ("ok", 1.0), oracle.context
    # Control: the same harness doing one thing wrong (the script's "why"), every action played, gets 0.
    assert (wrong.result.status, wrong.result.reward) == ("ok", 0.0), wrong.context
    assert len(wrong.calls) == len(script["wrong"]["steps"]) + 1, wrong.context

    calls = oracle.calls
    assert len(calls) == len(script["oracle"]) + 1, oracle.context  # each step, then done
    assert {call["status"] for call in calls} == {"ok"}, oracle.context
    assert {call["dialect"] for call in calls} == {"chat_completions"}, oracle.context
    assert all(call["request"]["response_format"]["type"] == "json_schema" for call in calls), oracle.context
    # Every call carried the current screenshot, sent to the model as a data URL and recorded by its bytes.
    assert all(len(call["images"]) == 1 for call in calls), oracle.context
    assert all([url.startswith(DATA_URL) for url in image_urls(e["request"], "user")] == [True]
               for e in oracle.exchanges), oracle.context
    assert len({call["images"][0]["sha256"] for call in calls}) > 1, oracle.context  # the page changed
    assert_stored_by_reference(oracle)
    assert_token_exact(oracle)


@pytest.mark.harness
@pytest.mark.parametrize("task", TASKS["computer-use"])
def test_computer_use_completes_a_gui_task_through_the_proxy(proxy, task, tmp_path):
    """The Messages path: the loop offers `computer_20250124` and returns each screenshot as a tool_result
    image, which reaches the model inside a tool message."""
    runs = rollouts(proxy, task, "computer-use", tmp_path)
    oracle, wrong, script = runs["oracle"], runs["wrong"], SCRIPTS[task]["computer-use"]
    assert (oracle.result.status, oracle.result.reward) == ("ok", 1.0), oracle.context
    # Control: the same loop clicking the wrong place (the script's "why"), every action played, gets 0.
    assert (wrong.result.status, wrong.result.reward) == ("ok", 0.0), wrong.context
    assert len(wrong.calls) == len(script["wrong"]["steps"]) + 1, wrong.context

    calls, actions = oracle.calls, script["oracle"]
    assert len(calls) == len(actions) + 1 and {call["status"] for call in calls} == {"ok"}, oracle.context
    assert {call["dialect"] for call in calls} == {"messages"}, oracle.context
    assert all(call["request"]["tools"][0]["type"] == "computer_20250124" for call in calls), oracle.context
    # Call k holds the k screenshots returned so far, as tool_result images; the model got them in tool messages.
    assert [len(call["images"]) for call in calls] == list(range(len(calls))), oracle.context
    assert [len(image_urls(e["request"], "tool")) for e in oracle.exchanges] == list(range(len(calls))), oracle.context
    assert all(url.startswith("data:image/png;base64,") for e in oracle.exchanges
               for url in image_urls(e["request"], "tool")), oracle.context
    last = calls[-1]["request"]["messages"]
    results = [block for message in last if isinstance(message.get("content"), list) for block in message["content"]
               if isinstance(block, dict) and block.get("type") == "tool_result"]
    assert [part["type"] for block in results for part in block["content"]] == ["image"] * len(actions), oracle.context
    tool = calls[0]["request"]["tools"][0]  # offered for the screen's size: the X display's, or the browser's
    screen = (tool["display_width_px"], tool["display_height_px"])
    assert {(image["width"], image["height"]) for call in calls for image in call["images"]} == {screen}, oracle.context
    first, *_, after_click = calls[-1]["images"]
    assert first["sha256"] != after_click["sha256"], oracle.context  # the click changed the screen
    assert_stored_by_reference(oracle)
    assert_token_exact(oracle)
