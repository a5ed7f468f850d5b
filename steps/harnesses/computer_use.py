"""`computer-use`: Anthropic's computer-use loop over the Messages API, screenshots returned as tool results.

    python -m steps.harnesses.computer_use [--max-turns 20] -- "INSTRUCTION"
    # with ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY, ANTHROPIC_MODEL set (prepare() does that)

The loop of Anthropic's computer-use reference, on the `anthropic` SDK OpenForge's environment has: the
model is offered the `computer_20250124` tool (beta `computer-use-2025-01-24`) for a display of
`DISPLAY` pixels; each of its actions (click, type, key, scroll, mouse move, screenshot) is done with
Playwright on the local headless Chromium, and answered with a `tool_result` holding the new screenshot
as a base64 PNG `image` block. Like the reference it keeps only the most recent screenshots, dropping
old ones in chunks (`drop_old_images`), so a prompt's history breaks prefix continuity at those points.
The browser opens the first URL of the instruction (the task's app on loopback), as browser-use does.
The loop ends when the model answers without a tool call or the turn budget is spent.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import sys
from pathlib import Path

from steps.harnesses.base import Endpoint, SYSTEM_PATH

NPM_PACKAGE = None
VERSION = "builtin"
DIALECT = "messages"
BINARY = "python"
KEY_IN_TOOL_ENV = False  # it runs no commands: its actions are mouse and keyboard events
CHROMIUM = "/usr/bin/chromium"
DISPLAY = (1280, 720)
KEEP_IMAGES = 3  # the most recent screenshots kept in the prompt
DROP_CHUNK = 10  # older ones are dropped this many at a time (the reference's min_removal_threshold)
BETA = "computer-use-2025-01-24"
TOOL = {"type": "computer_20250124", "name": "computer",
        "display_width_px": DISPLAY[0], "display_height_px": DISPLAY[1]}
URL = re.compile(r"https?://[^\s'\"<>]+")
KEYS = {"Return": "Enter", "return": "Enter", "BackSpace": "Backspace", "Escape": "Escape", "Tab": "Tab"}

# Behaviour analytics (steps/analytics): its one tool works the screen, none runs commands.
SHELL_TOOLS: tuple[str, ...] = ()
EDIT_TOOLS: tuple[str, ...] = ()
READ_TOOLS: tuple[str, ...] = ()
PLAN_TOOLS: tuple[str, ...] = ()
SHELL_WRITERS: tuple[str, ...] = ()
META_TOOLS: dict[str, tuple[str, str]] = {}
PLACEHOLDER_TOOLS: tuple[str, ...] = ()


def install(prefix: Path) -> Path:
    """Nothing to install: the loop runs on the Python that runs OpenForge (anthropic, Playwright)."""
    return Path(sys.executable)


def installed(prefix: Path) -> bool:
    """Always: it is built in."""
    return True


def prepare(home: Path, workdir: Path, endpoint: Endpoint) -> dict[str, str]:
    """The clean environment for the loop: the proxy's Messages endpoint and key, nothing inherited."""
    home.mkdir(parents=True, exist_ok=True)
    return {
        "HOME": str(home), "PATH": SYSTEM_PATH, "LANG": "C.UTF-8", "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        **({"LD_LIBRARY_PATH": os.environ["LD_LIBRARY_PATH"]} if os.environ.get("LD_LIBRARY_PATH") else {}),
        "ANTHROPIC_BASE_URL": endpoint.anthropic_base_url, "ANTHROPIC_API_KEY": endpoint.api_key,
        "ANTHROPIC_MODEL": endpoint.model, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
    }


def command(instruction: str, workdir: Path, exe: Path) -> list[str]:
    """The headless command line: this module as a script."""
    return [str(exe), "-m", "steps.harnesses.computer_use", "--", instruction]


def log_paths(home: Path) -> list[Path]:
    """Its event log is its stdout."""
    return []


def binds() -> list[tuple[Path, str, bool]]:
    """Host paths the loop needs inside a rollout sandbox: this Python, its venv, the harness package."""
    steps_dir = Path(__file__).resolve().parents[1]
    paths = [Path(sys.base_prefix), Path(sys.prefix), steps_dir / "__init__.py", steps_dir / "harnesses"]
    return [(path, str(path), True) for path in dict.fromkeys(paths)]


def drop_old_images(messages: list[dict], keep: int = KEEP_IMAGES, chunk: int = DROP_CHUNK) -> int:
    """Removes the oldest tool-result screenshots beyond the `keep` most recent, a multiple of `chunk` at a
    time (so the prompt changes only every `chunk` screenshots); returns how many it removed.

    >>> shot = {"type": "image", "source": {}}
    >>> turns = [{"role": "user", "content": [{"type": "tool_result", "content": [shot]}]} for _ in range(14)]
    >>> drop_old_images(turns, keep=3, chunk=10), drop_old_images(turns, keep=3, chunk=10)
    (10, 0)
    """
    results = [block for message in messages if isinstance(message.get("content"), list)
               for block in message["content"] if isinstance(block, dict) and block.get("type") == "tool_result"]
    total = sum(1 for block in results for part in block.get("content") or [] if part.get("type") == "image")
    remove = max(0, total - keep)
    remove -= remove % chunk
    removed = 0
    for block in results:
        kept = []
        for part in block.get("content") or []:
            if part.get("type") == "image" and removed < remove:
                removed += 1
                continue
            kept.append(part)
        block["content"] = kept
    return removed


def screenshot(page) -> dict:
    """The page's screenshot as an Anthropic image block."""
    data = base64.b64encode(page.screenshot(type="png")).decode()
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


def act(page, action: dict) -> str | None:
    """Does one computer action on the page; returns an error text for one it cannot do."""
    kind, point = action.get("action"), action.get("coordinate")
    if point is not None and not (isinstance(point, list) and len(point) == 2 and all(isinstance(v, int) for v in point)):
        return f"coordinate must be [x, y] integers, got {point!r}"
    if kind in ("left_click", "right_click", "middle_click", "double_click", "triple_click"):
        if point is None:
            return f"{kind} needs a coordinate"
        button = {"right_click": "right", "middle_click": "middle"}.get(kind, "left")
        page.mouse.click(*point, button=button, click_count={"double_click": 2, "triple_click": 3}.get(kind, 1))
    elif kind == "mouse_move" and point is not None:
        page.mouse.move(*point)
    elif kind == "type":
        page.keyboard.type(str(action.get("text", "")))
    elif kind == "key":
        page.keyboard.press("+".join(KEYS.get(key, key) for key in str(action.get("text", "")).split("+")))
    elif kind == "scroll":
        amount = int(action.get("scroll_amount") or 3) * 100
        dx, dy = {"up": (0, -amount), "down": (0, amount), "left": (-amount, 0), "right": (amount, 0)}.get(
            action.get("scroll_direction"), (0, amount))
        page.mouse.wheel(dx, dy)
    elif kind == "wait":
        page.wait_for_timeout(1000 * min(float(action.get("duration") or 1), 10))
    elif kind != "screenshot":
        return f"action {kind!r} is not supported here"
    page.wait_for_timeout(300)  # let the page react before the screenshot
    return None


def tool_result(page, call) -> dict:
    """The tool_result answering one tool_use: the screenshot after the action, or why it was not done."""
    problem = "the only tool is `computer`" if call.name != "computer" else act(page, call.input or {})
    if problem:
        return {"type": "tool_result", "tool_use_id": call.id, "is_error": True, "content": problem}
    return {"type": "tool_result", "tool_use_id": call.id, "content": [screenshot(page)]}


def agent_loop(instruction: str, max_turns: int, log) -> int:
    """Runs the loop on a fresh headless Chromium; returns the number of model calls made."""
    from anthropic import Anthropic  # imported here so that install/prepare/command need no SDK
    from playwright.sync_api import sync_playwright

    client = Anthropic(max_retries=0, timeout=3600)
    messages = [{"role": "user", "content": instruction}]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": DISPLAY[0], "height": DISPLAY[1]})
        start = URL.search(instruction)
        if start:
            page.goto(start.group(0).rstrip(".,;)"))
        for turn in range(max_turns):
            drop_old_images(messages)
            reply = client.beta.messages.create(model=os.environ["ANTHROPIC_MODEL"], max_tokens=1024,
                                                messages=messages, tools=[TOOL], betas=[BETA])
            calls = [block for block in reply.content if block.type == "tool_use"]
            log({"turn": turn, "stop_reason": reply.stop_reason, "tool_uses": [c.input for c in calls]})
            messages.append({"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in reply.content]})
            if not calls:
                return turn + 1
            messages.append({"role": "user", "content": [tool_result(page, call) for call in calls]})
        browser.close()
    return max_turns


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m steps.harnesses.computer_use", description=__doc__.split("\n\n")[0])
    p.add_argument("instruction")
    p.add_argument("--max-turns", type=int, default=20)
    args = p.parse_args(argv)
    calls = agent_loop(args.instruction, args.max_turns, lambda event: print(json.dumps(event), flush=True))
    print(json.dumps({"done": True, "model_calls": calls}), flush=True)
    return 0


def shell_command(arguments: dict | None) -> str | None:
    """None: no shell tool."""
    return None


def exit_code(output: str) -> int | None:
    """None: it runs no commands."""
    return None


def plan_items(arguments: dict | None) -> list[bool] | None:
    """None: no plan tool."""
    return None


if __name__ == "__main__":
    sys.exit(main())
