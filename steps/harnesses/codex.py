"""Codex CLI (`@openai/codex`), speaking the OpenAI Responses API.

    python -m steps.harnesses install codex
    # what a rollout runs, with the environment from prepare():
    codex exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox --cd WORKDIR \
        --disable plugins --disable remote_plugin --disable apps --disable api_key_model_discovery \
        --json -- "INSTRUCTION" </dev/null

Config lives in `$CODEX_HOME/config.toml` (here `HOME/.codex`). Its event log: `--json` prints one
event per line on stdout, and the session is kept in `$CODEX_HOME/sessions/YYYY/MM/DD/rollout-*.jsonl`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from steps.harnesses.base import Endpoint, npm_programs, argument_text, clean_env, exit_code_in, npm_binds, npm_install, todo_items

NPM_PACKAGE = "@openai/codex"
VERSION = "0.171.0"
DIALECT = "responses"
BINARY = "codex"
API_KEY_VAR = "OPENFORGE_API_KEY"
# Whether the agent's tool processes find the rollout's key in their environment (docs/rollouts.md).
KEY_IN_TOOL_ENV = False
# The harness's own budget beside the task's cpus and memory_mb, which bound what the agent runs: its processes'
# memory in MiB (about twice their peak on a built-in task: docs/rollouts.md, "The harness's own budget") and CPUs.
MEMORY_MB = 512
CPUS = 1.0

# Behaviour analytics (steps/analytics, docs/analytics.md): the tools that run commands, change files, read
# files back, and keep a plan.
SHELL_TOOLS = ("exec_command",)
EDIT_TOOLS = ("apply_patch",)
READ_TOOLS = ("view_image",)
PLAN_TOOLS = ("update_plan",)
# Programs its shell tool runs that change files: Codex edits with `apply_patch <<'PATCH' ... PATCH` in a
# shell command as often as through the apply_patch tool.
SHELL_WRITERS = ("apply_patch", "applypatch")
# Tools that call another tool by name (`tool_call {"name": ..., "arguments": ...}`): name key, arguments key.
META_TOOLS: dict[str, tuple[str, str]] = {}
# Tools offered only to keep a mechanism on, never to be called: not counted as offered.
PLACEHOLDER_TOOLS = ()
# An `exec_command` result: a header ("Chunk ID", "Wall time", "Process exited with code N" or "Process running
# with session ID N", "Original token count"), then "Output:" and the command's output, which is the agent's.
EXIT_CODE = re.compile(r"^Process exited with code (-?\d+)$", re.MULTILINE)
OUTPUT_START = "\nOutput:\n"


def install(prefix: Path) -> Path:
    """Install the pinned Codex CLI into `prefix` (skipped when already there); return `codex`."""
    return npm_install(prefix, NPM_PACKAGE, VERSION, BINARY)


def config_toml(endpoint: Endpoint) -> str:
    """Codex's config.toml pointing one provider at the proxy's OpenAI routes."""
    quoted = json.dumps  # A JSON string is a valid TOML basic string.
    return f"""\
model = {quoted(endpoint.model)}
model_provider = "openforge"
approval_policy = "never"
sandbox_mode = "danger-full-access"
# Otherwise a hosted `web_search` tool is offered, which only OpenAI's servers can run.
web_search = "disabled"

[model_providers.openforge]
name = "OpenForge proxy"
base_url = {quoted(endpoint.openai_base_url)}
env_key = "{API_KEY_VAR}"
# This version rejects the "chat" wire API.
wire_api = "responses"
# A retried call would be recorded twice; the rollout fails instead and is retried as a whole.
request_max_retries = 0
stream_max_retries = 0

# The shell tool's processes (the agent's commands) get everything but the rollout's key: codex itself
# reads it from its own environment, and the default excludes (*KEY*, *SECRET*, *TOKEN*) are off by default.
[shell_environment_policy]
inherit = "all"
exclude = ["{API_KEY_VAR}"]

[analytics]
enabled = false
"""


def prepare(home: Path, workdir: Path, endpoint: Endpoint) -> dict[str, str]:
    """Write `HOME/.codex/config.toml` and return the clean environment for `codex exec`."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(config_toml(endpoint))
    return clean_env(home, CODEX_HOME=str(codex_home), **{API_KEY_VAR: endpoint.api_key})


def command(instruction: str, workdir: Path, exe: Path) -> list[str]:
    """The headless command line; run it with stdin from /dev/null, or it waits for more prompt."""
    return [
        str(exe), "exec",
        "--skip-git-repo-check",  # Task workspaces are not git repositories.
        # No approvals and no sandbox of its own, so a command may touch any path the rollout sandbox allows
        # (the pinned binary's help: "Skip all confirmation prompts and execute commands without sandboxing ...
        # intended solely for running in environments that are externally sandboxed"); the config says the same.
        "--dangerously-bypass-approvals-and-sandbox",
        "--cd", str(workdir),
        # Without these it looks up plugins, apps and models on outside hosts.
        "--disable", "plugins", "--disable", "remote_plugin",
        "--disable", "apps", "--disable", "api_key_model_discovery",
        "--json",
        "--", instruction,  # An instruction may start with "-" (a Markdown list).
    ]


def log_paths(home: Path) -> list[Path]:
    """Codex's own session logs (one JSONL per session), besides the `--json` events on stdout."""
    return sorted((home / ".codex" / "sessions").rglob("*.jsonl"))


def binds() -> list[tuple[Path, str, bool]]:
    """Host paths the harness needs inside a rollout sandbox (read-only, at the same place)."""
    return npm_binds()


def shell_command(arguments: dict | None) -> str | None:
    """The command a call of one of SHELL_TOOLS runs, from its decoded arguments."""
    return argument_text(arguments, "cmd", "command")


def exit_code(output: str) -> int | None:
    """The exit code a shell result states: "Process exited with code 1" in the header of its `exec_command`
    result, before its output; None for a process still running.

    >>> exit_code("Wall time: 0.1 seconds\\nProcess exited with code 1\\nOutput:\\nboom")
    1
    >>> exit_code("Process running with session ID 3\\nOutput:\\nProcess exited with code 0") is None
    True
    """
    header = output.split(OUTPUT_START, 1)[0] if isinstance(output, str) else None
    return exit_code_in(EXIT_CODE, header)


def plan_items(arguments: dict | None) -> list[bool] | None:
    """Whether each item of the plan a call of PLAN_TOOLS sets is done: Codex's `update_plan` takes `{"plan":
    [{"step", "status"}]}` (builds that offer it; 0.171 does not)."""
    return todo_items(arguments, "plan")


def programs(exe: Path) -> tuple[str, ...]:
    """The programs whose processes are the harness's own (path prefixes as the sandbox sees them): Node and every
    harness install; anything else it starts is the agent's (`steps.sandbox.limits`)."""
    return npm_programs()
