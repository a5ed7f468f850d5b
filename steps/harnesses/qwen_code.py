"""Qwen Code (`@qwen-code/qwen-code`), speaking OpenAI Chat Completions.

    python -m steps.harnesses install qwen-code
    # what a rollout runs, with the environment from prepare():
    qwen --auth-type openai --yolo --output-format stream-json "--prompt=INSTRUCTION" </dev/null

It reads `OPENAI_MODEL` and `HOME/.qwen/settings.json` (endpoint and key under `security.auth`). Its event
log: `--output-format stream-json` prints one event per line on stdout, and chats are recorded under
`HOME/.qwen/`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from steps.harnesses.base import Endpoint, npm_programs, argument_text, clean_env, npm_binds, npm_install, todo_items

NPM_PACKAGE = "@qwen-code/qwen-code"
VERSION = "0.24.4"
DIALECT = "chat_completions"
BINARY = "qwen"
# Whether the agent's tool processes find the rollout's key in their environment (docs/rollouts.md).
KEY_IN_TOOL_ENV = False
# The harness's own budget beside the task's cpus and memory_mb, which bound what the agent runs: its processes'
# memory in MiB (about twice their peak on a built-in task: docs/rollouts.md, "The harness's own budget") and CPUs.
MEMORY_MB = 1024
CPUS = 1.0

# Behaviour analytics (steps/analytics, docs/analytics.md): the tools that run commands, change files, read
# files back, and keep a plan.
SHELL_TOOLS = ("run_shell_command",)
EDIT_TOOLS = ("edit", "write_file", "notebook_edit")
READ_TOOLS = ("read_file", "read_many_files", "grep_search")
PLAN_TOOLS = ("todo_write",)
SHELL_WRITERS = ()  # programs of its own, run in its shell tool, that change files: none
# Tools that call another tool by name (`tool_call {"name": ..., "arguments": ...}`): name key, arguments key.
META_TOOLS: dict[str, tuple[str, str]] = {"tool_call": ("name", "arguments")}
# Tools offered only to keep a mechanism on, never to be called: not counted as offered.
PLACEHOLDER_TOOLS = ()
# A `run_shell_command` result: "Command: ...\nDirectory: ...\nOutput: <output>\nError: ...\nExit Code: N\nSignal:
# ...\nProcess Group PGID: ..." (hints may follow). The output is the agent's and may print such lines too: the
# last whole trailing block is the CLI's.
EXIT_CODE = re.compile(r"^Exit Code: (-?\d+)\nSignal: [^\n]*\nProcess Group PGID: [^\n]*$", re.MULTILINE)

SETTINGS = {
    "general": {"enableAutoUpdate": False},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
}


def install(prefix: Path) -> Path:
    """Install the pinned Qwen Code into `prefix` (skipped when already there); return `qwen`."""
    exe = npm_install(prefix, NPM_PACKAGE, VERSION, BINARY)
    # The package ships its ripgrep without the executable bit: spawning it fails (EACCES) and
    # qwen's search tools fall back to a slower built-in grep.
    for rg in (prefix / "node_modules" / NPM_PACKAGE / "vendor" / "ripgrep").glob("*-linux/rg"):
        rg.chmod(0o755)
    return exe


def prepare(home: Path, workdir: Path, endpoint: Endpoint) -> dict[str, str]:
    """Write `HOME/.qwen/settings.json` and return the clean environment for `qwen`.

    The endpoint and key go in the settings, not `OPENAI_BASE_URL`/`OPENAI_API_KEY`: qwen hands its own
    environment to its shell tool's processes (only its internal tokens are removed)."""
    settings = home / ".qwen" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    auth = {"selectedType": "openai", "apiKey": endpoint.api_key, "baseUrl": endpoint.openai_base_url}
    settings.write_text(json.dumps({**SETTINGS, "security": {"auth": auth}}, indent=2))
    return clean_env(
        home,
        OPENAI_MODEL=endpoint.model,
        # The variables win over settings.json; set both so neither default turns them back on.
        QWEN_USAGE_STATISTICS_ENABLED="0",
        QWEN_TELEMETRY_ENABLED="0",
    )


def command(instruction: str, workdir: Path, exe: Path) -> list[str]:
    """The headless command line; run it in `workdir` with stdin from /dev/null."""
    return [
        str(exe), "--auth-type", "openai",
        # Approve every tool call: the rollout sandbox is the isolation. Its file tools ask for a path outside the
        # workspace and for every write (packages/core/src/tools/file-read-permission.ts, write-file.ts), which
        # YOLO never puts to anyone (core/permissionFlow.ts, needsConfirmation). One fence stays: run_shell_command
        # refuses a `directory` argument outside the workspace (tools/shell.ts, validateToolParamValues; the
        # command itself may `cd` anywhere). Lifting it takes `--include-directories /`, which would put a listing
        # of / in the first prompt and have every search without a path walk the whole root.
        "--yolo",
        "--output-format", "stream-json",
        # Not positional: qwen ignores a prompt after "--", and one starting with "-" (a Markdown
        # list) would be read as flags. `--prompt=` is deprecated but unambiguous.
        f"--prompt={instruction}",
    ]


def log_paths(home: Path) -> list[Path]:
    """Qwen Code's own chat recordings, besides the stream-json events on stdout."""
    return sorted((home / ".qwen" / "projects").glob("*/chats/*.jsonl"))


def binds() -> list[tuple[Path, str, bool]]:
    """Host paths the harness needs inside a rollout sandbox (read-only, at the same place)."""
    return npm_binds()


def shell_command(arguments: dict | None) -> str | None:
    """The command a call of one of SHELL_TOOLS runs, from its decoded arguments."""
    return argument_text(arguments, "command")


def exit_code(output: str) -> int | None:
    """The exit code a shell result states: "Exit Code: 1" in the last Exit Code/Signal/PGID block of its
    `run_shell_command` result.

    >>> exit_code("Output: x\\nExit Code: 0\\nSignal: (none)\\nProcess Group PGID: 1\\nError: (none)\\n"
    ...           "Exit Code: 1\\nSignal: (none)\\nProcess Group PGID: 7")
    1
    """
    found = list(EXIT_CODE.finditer(output)) if isinstance(output, str) else []
    return int(found[-1].group(1)) if found else None


def plan_items(arguments: dict | None) -> list[bool] | None:
    """Whether each item of the plan a call of PLAN_TOOLS sets is done: `todo_write` takes `{"todos": [{"id",
    "content", "status"}]}` (0.24 offers none)."""
    return todo_items(arguments, "todos")


def programs(exe: Path) -> tuple[str, ...]:
    """The programs whose processes are the harness's own (path prefixes as the sandbox sees them): Node and every
    harness install; anything else it starts is the agent's (`steps.sandbox.limits`)."""
    return npm_programs()
