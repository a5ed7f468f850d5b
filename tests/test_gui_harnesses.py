"""The GUI harnesses complete a browser task through the real recording proxy, their screenshots recorded.

    python -m steps.harnesses install browser-use     # once: its own virtualenv
    pytest -m harness tests/test_gui_harnesses.py

The harness is the real pinned browser-use driving the local headless Chromium; the model behind the proxy
is `tests/scripted_gui_model.py`, a double of vLLM's server that replays the task's oracle actions, because
no model that runs here can read a page and act on it. The task is a tiny form page served by the test
on loopback: the submitted form lands in a file, which is what the test grades (a GUI task's verifier
grades the app's state the same way).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from scripted_gui_model import ScriptedGuiModel
from scripted_model import ScriptedModel

from proxy_process import ProxyProcess
from steps.harnesses import GUI_HARNESSES, Endpoint, default_prefix
from steps.net import HOST, free_port
from steps.proxy.images import REFERENCE_PREFIX

pytestmark = pytest.mark.harness

FORM = b"""<!doctype html><html><body><h1>Sign up</h1>
<form method="post" action="/submit"><label>Email <input name="email" type="text"></label>
<button type="submit">Sign up now</button></form></body></html>"""
EMAIL = "ada@example.test"
HARNESS_TIMEOUT_S = 240


@pytest.fixture
def form_app(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A one-page form app on loopback; a submission is written to `submitted.json`. Yields (URL, that file)."""
    state = tmp_path / "submitted.json"

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(FORM)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            state.write_text(json.dumps(dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"<html><body>Thanks</body></html>")

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer((HOST, free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://{HOST}:{server.server_port}/", state
    server.shutdown()


def installed_python(name: str) -> Path:
    """The harness's own virtualenv Python, installed if it is not (`make test` installs it first); skipped only
    when harness installs are off for this run (OPENFORGE_TEST_HARNESS_CLIS=off, `make test-fast`), never
    silently in the whole suite."""
    harness = GUI_HARNESSES[name]
    prefix = default_prefix(name, harness.VERSION)
    if not harness.installed(prefix) and os.environ.get("OPENFORGE_TEST_HARNESS_CLIS") == "off":
        pytest.skip(f"harness installs are off for this run (OPENFORGE_TEST_HARNESS_CLIS=off): {name}")
    return harness.install(prefix)


def run_harness(argv: list[str], env: dict[str, str], workdir: Path) -> subprocess.CompletedProcess:
    """Run the harness headless; kill its process group (Chromium included) when it ends or times out."""
    process = subprocess.Popen(argv, env=env, cwd=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=HARNESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"harness ran past {HARNESS_TIMEOUT_S} s\n{output[-4000:]}")
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(argv, process.returncode, output, "")


def image_urls(request: dict) -> list[str]:
    """The image_url strings of a recorded chat request, in prompt order."""
    return [part["image_url"]["url"] if isinstance(part["image_url"], dict) else part["image_url"]
            for message in request.get("messages", []) if isinstance(message.get("content"), list)
            for part in message["content"] if isinstance(part, dict) and part.get("type") == "image_url"]


def test_browser_use_fills_a_form_through_the_proxy(proxy: Callable[..., ProxyProcess], form_app, tmp_path: Path):
    url, submitted = form_app
    python = installed_python("browser-use")
    actions = [{"navigate": {"url": url}}, {"input": {"element": "name=email", "text": EMAIL}},
               {"click": {"element": "Sign up now"}}, {"done": {"text": "Signed up", "success": True}}]
    with ScriptedGuiModel(actions) as model:
        gateway = proxy(model.url)
        rollout_id = f"browser-use-{uuid.uuid4().hex[:8]}"
        rollout = gateway.register(rollout_id, {"harness": "browser-use"})
        endpoint = Endpoint(openai_base_url=rollout["openai_base_url"],
                            anthropic_base_url=rollout["anthropic_base_url"], api_key=rollout["api_key"], model="tiny")
        harness = GUI_HARNESSES["browser-use"]
        workdir = tmp_path / "work"
        workdir.mkdir()
        instruction = f"Open {url} and sign up with the email {EMAIL}."
        done = run_harness(harness.command(instruction, workdir, python),
                           harness.prepare(tmp_path / "home", workdir, endpoint), workdir)
        calls = gateway.calls(rollout_id)
        exchanges = list(model.exchanges)
    context = f"exit {done.returncode}, {len(calls)} calls\n{done.stdout[-4000:]}\nproxy:\n{gateway.log_tail()}"

    assert submitted.exists() and json.loads(submitted.read_text()) == {"email": EMAIL}, context
    assert len(calls) >= len(actions) and {call["status"] for call in calls} == {"ok"}, context
    assert {call["dialect"] for call in calls} == {"chat_completions"}, context
    assert all(call["request"]["response_format"]["type"] == "json_schema" for call in calls), context
    # Every call carried the current screenshot, and the proxy recorded it (as sent, or by its stored name).
    for call in calls:
        urls = image_urls(call["request"])
        assert len(urls) == 1, context
        assert urls[0].startswith(("data:image/", REFERENCE_PREFIX)), context
    assert all(len(image_urls(exchange["request"])) == 1 for exchange in exchanges), context
    assert all(image_urls(exchange["request"])[0].startswith("data:image/") for exchange in exchanges), context
    # Token-exact: each recorded call holds the ids and logprobs the model returned.
    recorded = sorted((tuple(call["prompt_token_ids"]), tuple(call["response_token_ids"])) for call in calls)
    upstream = sorted((tuple(e["response"]["prompt_token_ids"]), tuple(e["response"]["choices"][0]["token_ids"]))
                      for e in exchanges)
    assert recorded == upstream, context


def test_browser_use_without_the_oracle_leaves_the_form_unsent(proxy: Callable[..., ProxyProcess], form_app,
                                                               tmp_path: Path):
    """Control: a script that never presses the button leaves no submission, so the check above can fail."""
    url, submitted = form_app
    python = installed_python("browser-use")
    with ScriptedGuiModel([{"navigate": {"url": url}}, {"done": {"text": "gave up", "success": False}}]) as model:
        gateway = proxy(model.url)
        rollout = gateway.register(f"browser-use-{uuid.uuid4().hex[:8]}", {"harness": "browser-use"})
        endpoint = Endpoint(openai_base_url=rollout["openai_base_url"],
                            anthropic_base_url=rollout["anthropic_base_url"], api_key=rollout["api_key"], model="tiny")
        harness = GUI_HARNESSES["browser-use"]
        workdir = tmp_path / "work"
        workdir.mkdir()
        done = run_harness(harness.command(f"Open {url} and sign up.", workdir, python),
                           harness.prepare(tmp_path / "home", workdir, endpoint), workdir)
    assert not submitted.exists(), done.stdout[-3000:]
    assert len(model.exchanges) >= 2, done.stdout[-3000:]


def element_centres(url: str) -> dict[str, list[int]]:
    """Where the form's field and button sit on the computer-use loop's display, measured with Playwright on
    the same page and viewport: the coordinates the oracle's clicks replay."""
    from playwright.sync_api import sync_playwright

    from steps.harnesses.computer_use import CHROMIUM, DISPLAY

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": DISPLAY[0], "height": DISPLAY[1]})
        page.goto(url)
        boxes = {name: page.locator(selector).bounding_box() for name, selector in
                 (("email", "input[name=email]"), ("button", "button"))}
        browser.close()
    return {name: [round(box["x"] + box["width"] / 2), round(box["y"] + box["height"] / 2)] for name, box in boxes.items()}


def tool_images(body: dict) -> list[str]:
    """The image_url strings inside the tool messages of a chat body (what vLLM got)."""
    return [part["image_url"]["url"] for message in body.get("messages", []) if message.get("role") == "tool"
            and isinstance(message.get("content"), list)
            for part in message["content"] if isinstance(part, dict) and part.get("type") == "image_url"]


def test_computer_use_fills_a_form_through_the_proxy(proxy: Callable[..., ProxyProcess], form_app, tmp_path: Path):
    """The Messages path: screenshots go back as tool_result images of the computer_20250124 tool."""
    url, submitted = form_app
    at = element_centres(url)
    actions = [{"action": "left_click", "coordinate": at["email"]}, {"action": "type", "text": EMAIL},
               {"action": "left_click", "coordinate": at["button"]}]
    with ScriptedModel(commands=[{"tool": "computer", "arguments": a} for a in actions]) as model:
        gateway = proxy(model.url)
        rollout_id = f"computer-use-{uuid.uuid4().hex[:8]}"
        rollout = gateway.register(rollout_id, {"harness": "computer-use"})
        endpoint = Endpoint(openai_base_url=rollout["openai_base_url"],
                            anthropic_base_url=rollout["anthropic_base_url"], api_key=rollout["api_key"], model="tiny")
        harness = GUI_HARNESSES["computer-use"]
        workdir = tmp_path / "work"
        workdir.mkdir()
        done = run_harness(harness.command(f"Open {url} and sign up with the email {EMAIL}.", workdir,
                                           harness.install(tmp_path)),
                           harness.prepare(tmp_path / "home", workdir, endpoint), workdir)
        calls = gateway.calls(rollout_id)
        exchanges = list(model.exchanges)
    context = f"exit {done.returncode}, {len(calls)} calls\n{done.stdout[-4000:]}\nproxy:\n{gateway.log_tail()}"

    assert submitted.exists() and json.loads(submitted.read_text()) == {"email": EMAIL}, context
    assert len(calls) == len(actions) + 1 and {call["status"] for call in calls} == {"ok"}, context
    assert {call["dialect"] for call in calls} == {"messages"}, context
    assert all(call["request"]["tools"][0]["type"] == "computer_20250124" for call in calls), context
    # Each screenshot the harness returned as a tool_result image reached the model inside a tool message.
    assert [len(tool_images(exchange["request"])) for exchange in exchanges] == [0, 1, 2, 3], context
    assert all(url.startswith("data:image/png;base64,") for e in exchanges for url in tool_images(e["request"])), context
    recorded = [[part for block in message["content"] if isinstance(message.get("content"), list)
                 and isinstance(block, dict) and block.get("type") == "tool_result"
                 for part in block.get("content") or [] if isinstance(part, dict) and part.get("type") == "image"]
                for message in calls[-1]["request"]["messages"]]
    assert sum(len(images) for images in recorded) == 3, context
