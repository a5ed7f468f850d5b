"""Claude Code (`@anthropic-ai/claude-code`), speaking the Anthropic Messages API.

    python -m steps.harnesses install claude-code
    # what a rollout runs, with the environment from prepare():
    claude -p --dangerously-skip-permissions --output-format stream-json --verbose -- "INSTRUCTION" </dev/null

It is configured through the environment (`ANTHROPIC_BASE_URL` without `/v1`) and `HOME/.claude/settings.json`,
whose `apiKeyHelper` prints the rollout's key from a file beside it. Its event log:
`--output-format stream-json` prints one event per line on stdout, and the session is kept in
`HOME/.claude/projects/<workdir slug>/<session id>.jsonl`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from steps.harnesses.base import Endpoint, npm_programs, argument_text, clean_env, exit_code_in, npm_binds, npm_install, todo_items

NPM_PACKAGE = "@anthropic-ai/claude-code"
VERSION = "2.1.332"
DIALECT = "messages"
BINARY = "claude"
# Whether the agent's tool processes find the rollout's key in their environment (docs/rollouts.md).
KEY_IN_TOOL_ENV = False
# The harness's own budget beside the task's cpus and memory_mb, which bound what the agent runs: its processes'
# memory in MiB (about twice their peak on a built-in task: docs/rollouts.md, "The harness's own budget") and CPUs.
MEMORY_MB = 1024
CPUS = 1.0

# Behaviour analytics (steps/analytics, docs/analytics.md): the tools that run commands, change files, read
# files back, and keep a plan.
SHELL_TOOLS = ("Bash",)
EDIT_TOOLS = ("Edit", "Write", "MultiEdit", "NotebookEdit")
READ_TOOLS = ("Read", "Grep")
PLAN_TOOLS = ("TodoWrite",)
SHELL_WRITERS = ()  # programs of its own, run in its shell tool, that change files: none
# Tools that call another tool by name (`tool_call {"name": ..., "arguments": ...}`): name key, arguments key.
META_TOOLS: dict[str, tuple[str, str]] = {}
# Tools offered only to keep a mechanism on, never to be called: not counted as offered.
PLACEHOLDER_TOOLS = ("DeferredToolPlaceholder",)
EXIT_CODE = re.compile(r"\AExit code (-?\d+)")

KEY_FILE = "openforge-key"


def install(prefix: Path) -> Path:
    """Install the pinned Claude Code into `prefix` (skipped when already there); return `claude`."""
    return npm_install(prefix, NPM_PACKAGE, VERSION, BINARY)


def prepare(home: Path, workdir: Path, endpoint: Endpoint) -> dict[str, str]:
    """Write the key and `HOME/.claude/settings.json`; return the clean environment pointing Claude Code at the proxy.

    The key reaches Claude Code through `apiKeyHelper`, not `ANTHROPIC_API_KEY`: its Bash tool's processes
    inherit its environment (CLAUDE_CODE_SUBPROCESS_ENV_SCRUB would strip the key, but then every command
    must run in Claude Code's own sandbox, which needs bubblewrap and socat in the task's image)."""
    settings = home / ".claude" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    (settings.parent / KEY_FILE).write_text(endpoint.api_key)
    # $HOME, not the path: in a local sandbox the harness sees HOME under another name than the runner.
    settings.write_text(json.dumps({"apiKeyHelper": f'cat "$HOME/.claude/{KEY_FILE}"'}, indent=2))
    env = clean_env(
        home,
        ANTHROPIC_BASE_URL=endpoint.anthropic_base_url,
        ANTHROPIC_MODEL=endpoint.model,
        # Side requests (titles, summaries) otherwise name a Haiku model the server does not serve.
        ANTHROPIC_SMALL_FAST_MODEL=endpoint.model,
        ANTHROPIC_DEFAULT_HAIKU_MODEL=endpoint.model,
        ANTHROPIC_DEFAULT_SONNET_MODEL=endpoint.model,
        ANTHROPIC_DEFAULT_OPUS_MODEL=endpoint.model,
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_TELEMETRY="1",
        DISABLE_ERROR_REPORTING="1",
        DISABLE_AUTOUPDATER="1",
    )
    if os.geteuid() == 0:
        # As root, --dangerously-skip-permissions is refused unless the process says it is sandboxed;
        # without the flag its Bash tool is silently denied.
        env["IS_SANDBOX"] = "1"
    return env


def command(instruction: str, workdir: Path, exe: Path) -> list[str]:
    """The headless command line; run it in `workdir` with stdin from /dev/null."""
    return [
        str(exe), "-p",
        # bypassPermissions: every tool call is allowed, on any path, outside the working folder too (no --add-dir
        # needed); the pinned version's fences outside the working directories are settings left off here
        # (`permissions.blockReadsOutsideWorkingDirectories`, `blockWritesOutsideWorkingDirectories`). The rollout
        # sandbox is the isolation.
        "--dangerously-skip-permissions",
        # A rollout is offline: its web tools could only fail (the proxy refuses their server tools with a 400).
        "--disallowedTools", "WebSearch,WebFetch",
        "--output-format", "stream-json", "--verbose",  # stream-json requires --verbose with -p.
        "--", instruction,  # An instruction may start with "-" (a Markdown list).
    ]


def log_paths(home: Path) -> list[Path]:
    """Claude Code's own session transcripts, besides the stream-json events on stdout."""
    return sorted((home / ".claude" / "projects").rglob("*.jsonl"))


def binds() -> list[tuple[Path, str, bool]]:
    """Host paths the harness needs inside a rollout sandbox (read-only, at the same place)."""
    return npm_binds()


def shell_command(arguments: dict | None) -> str | None:
    """The command a call of one of SHELL_TOOLS runs, from its decoded arguments."""
    return argument_text(arguments, "command")


def exit_code(output: str) -> int | None:
    """The exit code a shell result states: "Exit code 1" opening a failed `Bash` result (a success states none;
    the Messages `is_error` flag says it)."""
    return exit_code_in(EXIT_CODE, output)


def plan_items(arguments: dict | None) -> list[bool] | None:
    """Whether each item of the plan a call of PLAN_TOOLS sets is done: `TodoWrite` takes `{"todos": [{"content",
    "status", "activeForm"}]}` (2.1.332 offers none)."""
    return todo_items(arguments, "todos")


def programs(exe: Path) -> tuple[str, ...]:
    """The programs whose processes are the harness's own (path prefixes as the sandbox sees them): Node and every
    harness install; anything else it starts is the agent's (`steps.sandbox.limits`)."""
    return npm_programs()
