"""browser-use (PyPI `browser-use`), a browser agent speaking OpenAI Chat Completions, one screenshot per call.

    python -m steps.harnesses install browser-use
    # what a rollout runs, with the environment from prepare():
    PREFIX/bin/python -m steps.harnesses.browser_use [--max-steps 20] -- "INSTRUCTION"

It is a Python package, not an npm one: `install` creates its own virtualenv at the harness prefix
(`${OPENFORGE_CACHE:-~/.cache/openforge}/harnesses/browser-use-<version>`) and pip-installs the pinned
version there, never into OpenForge's own environment. The run drives the local Chromium
(`/usr/bin/chromium`, headless, without Chromium's own sandbox: the rollout sandbox is the isolation) and
points `ChatOpenAI` at the rollout's proxy URL with the rollout's key; telemetry and cloud sync are off by
environment, so it reaches nothing but the proxy and the task's app on loopback. Each call is a Chat
Completion with a strict `response_format` json_schema ("agent_output"), no tools, and only the current
screenshot as an `image_url` data URL: every call starts a new sample (docs/gui.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path

from steps.harnesses.base import Endpoint, InstallError, SYSTEM_PATH

NPM_PACKAGE = None  # a PyPI package in its own virtualenv (install below)
PIP_PACKAGE = "browser-use"
VERSION = "0.13.14"
DIALECT = "chat_completions"
BINARY = "bin/python"
KEY_IN_TOOL_ENV = False  # it runs no commands: its actions are browser actions
# The harness's own budget beside the task's cpus and memory_mb, which bound what the agent runs: its processes'
# memory in MiB (about twice their peak on a built-in task: docs/rollouts.md, "The harness's own budget") and CPUs.
MEMORY_MB = 512
CPUS = 1.0
CHROMIUM = "/usr/bin/chromium"
MAX_STEPS = 20

# Behaviour analytics (steps/analytics): browser-use calls no tools; its actions are JSON in the reply.
SHELL_TOOLS: tuple[str, ...] = ()
EDIT_TOOLS: tuple[str, ...] = ()
READ_TOOLS: tuple[str, ...] = ()
PLAN_TOOLS: tuple[str, ...] = ()
SHELL_WRITERS: tuple[str, ...] = ()
META_TOOLS: dict[str, tuple[str, str]] = {}
PLACEHOLDER_TOOLS: tuple[str, ...] = ()

# Off: anonymised telemetry (PostHog), cloud sync, and the version check at start-up.
QUIET_ENV = {"ANONYMIZED_TELEMETRY": "false", "BROWSER_USE_CLOUD_SYNC": "false",
             "BROWSER_USE_VERSION_CHECK": "false", "BROWSER_USE_SETUP_LOGGING": "true",
             "BROWSER_USE_LOGGING_LEVEL": "info"}


def install(prefix: Path) -> Path:
    """Create the virtualenv at `prefix` and pip-install the pinned browser-use (skipped when it is there);
    return its Python."""
    python = prefix / BINARY
    if installed(prefix):
        return python
    steps = [[sys.base_prefix + "/bin/python3", "-m", "venv", str(prefix)],
             [str(python), "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
              f"{PIP_PACKAGE}=={VERSION}"]]
    for argv in steps:
        done = subprocess.run(argv, capture_output=True, text=True, cwd="/")
        if done.returncode != 0:
            raise InstallError(f"{' '.join(argv[:4])} ... failed:\n{done.stderr[-2000:]}")
    if not installed(prefix):
        raise InstallError(f"pip did not install {PIP_PACKAGE}=={VERSION} into {prefix}")
    return python


BROWSER_START_TIMEOUT_S = 120


def installed(prefix: Path) -> bool:
    """Whether the pinned version is installed in the virtualenv at `prefix`."""
    found = list((prefix / "lib").glob(f"python3*/site-packages/browser_use-{VERSION}.dist-info"))
    return bool(found) and (prefix / BINARY).exists()


def prepare(home: Path, workdir: Path, endpoint: Endpoint) -> dict[str, str]:
    """The clean environment for the agent: the proxy endpoint and key, telemetry and cloud off."""
    home.mkdir(parents=True, exist_ok=True)
    return {
        "HOME": str(home), "PATH": SYSTEM_PATH, "LANG": "C.UTF-8", "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "BROWSER_USE_CONFIG_DIR": str(home / ".config" / "browseruse"),
        "OPENAI_BASE_URL": endpoint.openai_base_url, "OPENAI_API_KEY": endpoint.api_key,
        "OPENAI_MODEL": endpoint.model, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
        # browser-use gives Chromium 30 s to start; on a loaded node it takes longer, and the rollout is lost
        **{f"TIMEOUT_{event}": str(BROWSER_START_TIMEOUT_S) for event in ("BrowserStartEvent", "BrowserLaunchEvent")},
        **QUIET_ENV,
    }


def command(instruction: str, workdir: Path, exe: Path) -> list[str]:
    """The headless command line: this module run by the virtualenv's Python."""
    return [str(exe), "-m", "steps.harnesses.browser_use", "--", instruction]


def log_paths(home: Path) -> list[Path]:
    """Its event log is its stdout; nothing under HOME."""
    return []


def binds() -> list[tuple[Path, str, bool]]:
    """Host paths it needs inside a rollout sandbox: the virtualenv, its base Python, and only the harness
    package of OpenForge (Chromium is under the host's /usr, which every sandbox has)."""
    from steps.harnesses.base import default_prefix

    steps_dir = Path(__file__).resolve().parents[1]
    paths = [default_prefix("browser-use", VERSION), Path(sys.base_prefix), steps_dir / "__init__.py",
             steps_dir / "harnesses"]
    return [(path, str(path), True) for path in dict.fromkeys(paths)]


async def run_agent(instruction: str, max_steps: int) -> bool:
    """Runs browser-use on the instruction; returns whether the agent said it is done."""
    from browser_use import Agent, BrowserProfile, ChatOpenAI  # only in the harness's own virtualenv

    llm = ChatOpenAI(model=os.environ["OPENAI_MODEL"], base_url=os.environ["OPENAI_BASE_URL"],
                     api_key=os.environ["OPENAI_API_KEY"], max_retries=0)
    profile = BrowserProfile(executable_path=CHROMIUM, headless=True, chromium_sandbox=False,
                             enable_default_extensions=False,  # they would be downloaded from the internet
                             user_data_dir=None, keep_alive=False)
    agent = Agent(task=instruction, llm=llm, browser_profile=profile, use_vision=True, max_failures=2,
                  use_judge=False)  # its judge is one more model call grading the run: the verifier grades it
    history = await agent.run(max_steps=max_steps)
    return history.is_done()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m steps.harnesses.browser_use", description=__doc__.split("\n\n")[0])
    p.add_argument("instruction")
    p.add_argument("--max-steps", type=int, default=MAX_STEPS)
    args = p.parse_args(argv)
    done = asyncio.run(run_agent(args.instruction, args.max_steps))
    print(f"browser-use: done={done}", flush=True)
    return 0


def shell_command(arguments: dict | None) -> str | None:
    """None: browser-use has no shell tool."""
    return None


def exit_code(output: str) -> int | None:
    """None: browser-use runs no commands."""
    return None


def plan_items(arguments: dict | None) -> list[bool] | None:
    """None: browser-use's plan is free text in its reply."""
    return None


if __name__ == "__main__":
    sys.exit(main())


def programs(exe: Path) -> tuple[str, ...]:
    """The programs whose processes are the harness's own: its Python (as the kernel names it, links resolved);
    anything else it starts is the agent's (`steps.sandbox.limits`), Chromium included: the browser is the agent's tool."""
    return (os.path.realpath(exe),)
