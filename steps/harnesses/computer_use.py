"""`computer-use`: Anthropic's computer-use loop over the Messages API, screenshots returned as tool results.

    python -m steps.harnesses.computer_use [--max-turns 20] -- "INSTRUCTION"
    # with ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY, ANTHROPIC_MODEL set (prepare() does that)

The loop of Anthropic's computer-use reference, on the `anthropic` SDK OpenForge's environment has: the
model is offered the `computer_20250124` tool (beta `computer-use-2025-01-24`) for the screen's size;
each of its actions (click, type, key, scroll, mouse move, screenshot) is done on that screen and
answered with a `tool_result` holding the new screenshot as a base64 PNG `image` block. Like the
reference it keeps only the most recent screenshots, dropping old ones in chunks (`drop_old_images`),
so a prompt's history breaks prefix continuity at those points. The loop ends when the model answers
without a tool call or the turn budget is spent.

The screen: when the instruction names an X display (`DISPLAY=127.0.0.1:1`, a desktop task's), that
display, as the reference drives its own: xdotool for the mouse and keyboard, ImageMagick's `import` for
the screenshot, at the display's own size (`DesktopScreen`). Otherwise a local headless Chromium of
`BROWSER_SIZE` pixels driven by Playwright, opened on the first URL of the instruction (the task's app
on loopback), as browser-use does (`BrowserScreen`).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol

from steps.harnesses.base import Endpoint, SYSTEM_PATH

NPM_PACKAGE = None
VERSION = "builtin"
DIALECT = "messages"
BINARY = "python"
KEY_IN_TOOL_ENV = False  # it runs no commands: its actions are mouse and keyboard events
# The harness's own budget beside the task's cpus and memory_mb, which bound what the agent runs: its processes'
# memory in MiB (about twice their peak on a built-in task: docs/rollouts.md, "The harness's own budget") and CPUs.
MEMORY_MB = 512
CPUS = 1.0
CHROMIUM = "/usr/bin/chromium"
BROWSER_SIZE = (1280, 720)
KEEP_IMAGES = 3  # the most recent screenshots kept in the prompt
DROP_CHUNK = 10  # older ones are dropped this many at a time (the reference's min_removal_threshold)
BETA = "computer-use-2025-01-24"
URL = re.compile(r"https?://[^\s'\"<>]+")
X_DISPLAY = re.compile(r"\bDISPLAY=([\w.-]*:\d+(?:\.\d+)?)")
KEYS = {"Return": "Enter", "return": "Enter", "BackSpace": "Backspace", "Escape": "Escape", "Tab": "Tab"}
SETTLE_S = 0.3  # let the screen react to an action before its screenshot
X_TIMEOUT_S = 30

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


def tool(size: tuple[int, int]) -> dict:
    """The computer tool offered to the model, for a screen of `size` pixels."""
    return {"type": "computer_20250124", "name": "computer", "display_width_px": size[0],
            "display_height_px": size[1]}


def image_block(png: bytes) -> dict:
    """A PNG as an Anthropic image block."""
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                        "data": base64.b64encode(png).decode()}}


class Screen(Protocol):
    """What the loop works: a screen of `size` pixels (width, height) taking mouse and keyboard input."""

    size: tuple[int, int]

    def click(self, x: int, y: int, button: str, count: int) -> None:
        """Click `button` ("left", "middle", "right") `count` times at (x, y)."""

    def move(self, x: int, y: int) -> None:
        """Move the mouse to (x, y)."""

    def type(self, text: str) -> None:
        """Type `text` at the focus."""

    def key(self, keys: str) -> None:
        """Press a key or chord in xdotool's names ("Return", "ctrl+a")."""

    def scroll(self, dx: int, dy: int) -> None:
        """Scroll by that many wheel clicks at the mouse (positive: right, down)."""

    def wait(self, seconds: float) -> None:
        """Let `seconds` pass."""

    def screenshot(self) -> bytes:
        """The whole screen as a PNG."""


class BrowserScreen:
    """A headless Chromium page of BROWSER_SIZE pixels, driven by Playwright."""

    def __init__(self, page):
        self.page = page
        self.size = BROWSER_SIZE

    def click(self, x: int, y: int, button: str, count: int) -> None:
        self.page.mouse.click(x, y, button=button, click_count=count)

    def move(self, x: int, y: int) -> None:
        self.page.mouse.move(x, y)

    def type(self, text: str) -> None:
        self.page.keyboard.type(text)

    def key(self, keys: str) -> None:
        self.page.keyboard.press("+".join(KEYS.get(key, key) for key in keys.split("+")))

    def scroll(self, dx: int, dy: int) -> None:
        self.page.mouse.wheel(dx * 100, dy * 100)

    def wait(self, seconds: float) -> None:
        self.page.wait_for_timeout(1000 * seconds)

    def screenshot(self) -> bytes:
        return self.page.screenshot(type="png")


class DesktopScreen:
    """An X display, driven with xdotool and shot with ImageMagick's `import`, as the reference does."""

    def __init__(self, display: str):
        self.env = {**os.environ, "DISPLAY": display}
        width, height = self.x("xdotool", "getdisplaygeometry").split()
        self.size = (int(width), int(height))

    def x(self, *argv: str) -> str:
        """Runs an X client on the display; its stdout."""
        return subprocess.run(argv, env=self.env, capture_output=True, check=True, timeout=X_TIMEOUT_S).stdout.decode()

    def click(self, x: int, y: int, button: str, count: int) -> None:
        number = {"left": "1", "middle": "2", "right": "3"}[button]
        self.x("xdotool", "mousemove", str(x), str(y), "click", "--repeat", str(count), number)

    def move(self, x: int, y: int) -> None:
        self.x("xdotool", "mousemove", str(x), str(y))

    def type(self, text: str) -> None:
        self.x("xdotool", "type", "--delay", "12", "--", text)

    def key(self, keys: str) -> None:  # the model's key names are xdotool's (X keysyms), as in the reference
        self.x("xdotool", "key", "--", keys)

    def scroll(self, dx: int, dy: int) -> None:
        for amount, (back, forth) in ((dx, ("6", "7")), (dy, ("4", "5"))):
            if amount:
                self.x("xdotool", "click", "--repeat", str(abs(amount)), forth if amount > 0 else back)

    def wait(self, seconds: float) -> None:
        time.sleep(seconds)

    def screenshot(self) -> bytes:
        return subprocess.run(["import", "-window", "root", "-depth", "8", "png:-"], env=self.env,
                              capture_output=True, check=True, timeout=X_TIMEOUT_S).stdout


def act(screen: Screen, action: dict) -> str | None:
    """Does one computer action on the screen; returns an error text for one it cannot do."""
    kind, point = action.get("action"), action.get("coordinate")
    if point is not None and not (isinstance(point, list) and len(point) == 2 and all(isinstance(v, int) for v in point)):
        return f"coordinate must be [x, y] integers, got {point!r}"
    if point is not None and not all(0 <= value < limit for value, limit in zip(point, screen.size)):
        return f"coordinate {point} is off the {screen.size[0]}x{screen.size[1]} screen"
    if kind in ("left_click", "right_click", "middle_click", "double_click", "triple_click"):
        if point is None:
            return f"{kind} needs a coordinate"
        screen.click(*point, {"right_click": "right", "middle_click": "middle"}.get(kind, "left"),
                     {"double_click": 2, "triple_click": 3}.get(kind, 1))
    elif kind == "mouse_move" and point is not None:
        screen.move(*point)
    elif kind == "type":
        screen.type(str(action.get("text", "")))
    elif kind == "key":
        screen.key(str(action.get("text", "")))
    elif kind == "scroll":
        if point is not None:
            screen.move(*point)
        amount = int(action.get("scroll_amount") or 3)
        screen.scroll(*{"up": (0, -amount), "down": (0, amount), "left": (-amount, 0), "right": (amount, 0)}.get(
            action.get("scroll_direction"), (0, amount)))
    elif kind == "wait":
        screen.wait(min(float(action.get("duration") or 1), 10))
    elif kind != "screenshot":
        return f"action {kind!r} is not supported here"
    screen.wait(SETTLE_S)
    return None


def tool_result(screen: Screen, call) -> dict:
    """The tool_result answering one tool_use: the screenshot after the action, or why it was not done."""
    try:
        problem = "the only tool is `computer`" if call.name != "computer" else act(screen, call.input or {})
        shot = None if problem else screen.screenshot()
    except (subprocess.SubprocessError, OSError) as exc:  # an X client that failed: the model is told so
        problem = f"the action failed: {exc}"
    if problem:
        return {"type": "tool_result", "tool_use_id": call.id, "is_error": True, "content": problem}
    return {"type": "tool_result", "tool_use_id": call.id, "content": [image_block(shot)]}


def run_turns(client, screen: Screen, messages: list[dict], max_turns: int, log) -> int:
    """The model's turns on `screen`; returns the number of model calls made."""
    for turn in range(max_turns):
        drop_old_images(messages)
        reply = client.beta.messages.create(model=os.environ["ANTHROPIC_MODEL"], max_tokens=1024,
                                            messages=messages, tools=[tool(screen.size)], betas=[BETA])
        calls = [block for block in reply.content if block.type == "tool_use"]
        log({"turn": turn, "stop_reason": reply.stop_reason, "tool_uses": [c.input for c in calls]})
        messages.append({"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in reply.content]})
        if not calls:
            return turn + 1
        messages.append({"role": "user", "content": [tool_result(screen, call) for call in calls]})
    return max_turns


def agent_loop(instruction: str, max_turns: int, log) -> int:
    """Runs the loop on the instruction's X display, or else on a fresh headless Chromium; returns the number
    of model calls made."""
    from anthropic import Anthropic  # imported here so that install/prepare/command need no SDK

    client = Anthropic(max_retries=0, timeout=3600)
    messages = [{"role": "user", "content": instruction}]
    display = X_DISPLAY.search(instruction)
    if display:
        return run_turns(client, DesktopScreen(display.group(1)), messages, max_turns, log)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": BROWSER_SIZE[0], "height": BROWSER_SIZE[1]})
        start = URL.search(instruction)
        if start:
            page.goto(start.group(0).rstrip(".,;)"))
        try:
            return run_turns(client, BrowserScreen(page), messages, max_turns, log)
        finally:
            browser.close()


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


def programs(exe: Path) -> tuple[str, ...]:
    """The programs whose processes are the harness's own: its Python (as the kernel names it, links resolved);
    anything else it starts is the agent's (`steps.sandbox.limits`), Chromium included: the browser is the agent's tool."""
    return (os.path.realpath(exe),)
