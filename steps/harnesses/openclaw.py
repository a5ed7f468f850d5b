"""OpenClaw (`openclaw`), speaking OpenAI Chat Completions; needs Node >= 24.16.

    python -m steps.harnesses install openclaw
    # what a rollout runs, with the environment from prepare():
    openclaw agent exec --cwd WORKDIR --json -- "INSTRUCTION" </dev/null

`agent exec` is OpenClaw's headless one-shot mode: no Gateway, a temporary state directory removed
afterwards, exit 0 ok / 1 error / 2 timeout. Its config is the ambient one, which prepare() writes to
`HOME/.openclaw/openclaw.json` and names in `OPENCLAW_CONFIG_PATH`. Its event log is the `--json`
envelope on stdout (final text, tool summary, usage); the session itself lives in the temporary state.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from steps.harnesses.base import Endpoint, npm_programs, argument_text, clean_env, npm_binds, npm_install

NPM_PACKAGE = "openclaw"
VERSION = "2026.9.6"
DIALECT = "chat_completions"
BINARY = "openclaw"
# Whether the agent's tool processes find the rollout's key in their environment (docs/rollouts.md).
KEY_IN_TOOL_ENV = False
# The harness's own budget beside the task's cpus and memory_mb, which bound what the agent runs: its processes'
# memory in MiB (about twice their peak on a built-in task: docs/rollouts.md, "The harness's own budget") and CPUs.
MEMORY_MB = 2048
CPUS = 1.0

# Behaviour analytics (steps/analytics, docs/analytics.md): the tools that run commands, change files, read
# files back, and keep a plan.
SHELL_TOOLS = ("exec",)
EDIT_TOOLS = ("write", "edit", "apply_patch")
READ_TOOLS = ("read",)
PLAN_TOOLS = ()
SHELL_WRITERS = ()  # programs of its own, run in its shell tool, that change files: none
# Tools that call another tool by name (`tool_call {"name": ..., "arguments": ...}`): name key, arguments key.
META_TOOLS: dict[str, tuple[str, str]] = {"tool_call": ("id", "args")}
# Tools offered only to keep a mechanism on, never to be called: not counted as offered.
PLACEHOLDER_TOOLS = ()
# The pinned CLI appends "\n\n(Command exited with code N)" at the end of a result when N is not 0
# (bash-tools.exec-runtime: buildExecExitOutcome); only the end counts, the output before it is the agent's.
EXIT_CODE = re.compile(r"\(Command exited with code (-?\d+)\)\s*\Z")
# What it appends instead for a command that failed without an exit code of its own (formatExecFailureReason),
# with the code each stands for (-1: none was captured).
FAILED_ENDINGS = (
    (re.compile(r"Command not found\s*\Z"), 127),
    (re.compile(r"Command not executable \(permission denied\)\s*\Z"), 126),
    (re.compile(r"Command aborted by signal \S+\s*\Z"), -1),
    (re.compile(r"Command aborted before exit code was captured\s*\Z"), -1),
    (re.compile(r"Command timed out[^\n]*(\n\n(The command was terminated|If it should keep running)[^\n]*)*\s*\Z"),
     -1),
)
# A command left running in the background: no exit code yet.
STILL_RUNNING = re.compile(r"Command still running \(session [^\n]*\Z")

PROVIDER = "openforge"
# What OpenClaw is told about the served model; it plans compaction and output caps from these.
CONTEXT_WINDOW = 32768
MAX_TOKENS = 4096


def install(prefix: Path) -> Path:
    """Install the pinned OpenClaw into `prefix` (on Node 24; skipped when already there)."""
    return npm_install(prefix, NPM_PACKAGE, VERSION, BINARY)


def config(endpoint: Endpoint) -> dict:
    """OpenClaw's config: one provider, the proxy, and nothing discovered or updated from outside."""
    model = {
        "id": endpoint.model, "name": endpoint.model, "reasoning": False, "input": ["text"],
        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
        "contextWindow": CONTEXT_WINDOW, "maxTokens": MAX_TOKENS,
    }
    provider = {
        "baseUrl": endpoint.openai_base_url, "apiKey": endpoint.api_key,
        "api": "openai-completions", "models": [model],
    }
    return {
        # "replace" uses only this catalog: no provider discovery over the network.
        "models": {"mode": "replace", "providers": {PROVIDER: provider}},
        "agents": {"defaults": {"model": {"primary": f"{PROVIDER}/{endpoint.model}"}}},
        "update": {"checkOnStart": False},
        # The rollout sandbox is the boundary, not the workspace. `agent exec` fences the file tools (read, write,
        # edit, ls, apply_patch) into --cwd unless the config says otherwise (the pinned dist's agent-exec-input
        # module, buildExecConfigDefaults: `tools.fs.workspaceOnly: true`), and apply_patch is fenced on its own
        # (src/agents/apply-patch-policy.ts: `tools.exec.applyPatch.workspaceOnly`, default true). Commands run
        # with no approval ("full": security full, ask off, that module's default too) and no extra approval for
        # inline scripts such as `python -c` (`strictInlineEval`, docs/tools/exec.md): with no one to ask, an
        # approval falls back to deny.
        "tools": {"fs": {"workspaceOnly": False},
                  "exec": {"mode": "full", "strictInlineEval": False, "applyPatch": {"workspaceOnly": False}}},
    }


def prepare(home: Path, workdir: Path, endpoint: Endpoint) -> dict[str, str]:
    """Write `HOME/.openclaw/openclaw.json` and return the clean environment for `openclaw agent exec`."""
    path = home / ".openclaw" / "openclaw.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config(endpoint), indent=2))
    return clean_env(home, OPENCLAW_CONFIG_PATH=str(path), OPENCLAW_NO_AUTO_UPDATE="1")


def command(instruction: str, workdir: Path, exe: Path) -> list[str]:
    """The headless command line; `--cwd` is both the agent workspace and the tools' directory."""
    # "--": an instruction may start with "-" (a Markdown list).
    return [str(exe), "agent", "exec", "--cwd", str(workdir), "--json", "--", instruction]


def log_paths(home: Path) -> list[Path]:
    """None on disk: `agent exec` removes its temporary state; the stdout envelope is the log."""
    return []


def binds() -> list[tuple[Path, str, bool]]:
    """Host paths the harness needs inside a rollout sandbox (read-only, at the same place)."""
    return npm_binds()


def shell_command(arguments: dict | None) -> str | None:
    """The command a call of one of SHELL_TOOLS runs, from its decoded arguments."""
    return argument_text(arguments, "command")


def exit_code(output: str) -> int | None:
    """The exit code an `exec` result states at its end: "(Command exited with code N)" is appended only
    when N is not 0, and a failure text (`FAILED_ENDINGS`) when the command did not exit by itself, so a
    result ending in neither exited 0; None for a command still running in the background.

    >>> exit_code("boom\\n\\n(Command exited with code 2)"), exit_code("x\\n\\nCommand not found"), exit_code("hi")
    (2, 127, 0)
    >>> exit_code("(Command exited with code 0)\\nstill printing")
    0
    """
    if not isinstance(output, str) or STILL_RUNNING.search(output):
        return None
    found = EXIT_CODE.search(output)
    if found:
        return int(found.group(1))
    return next((code for ending, code in FAILED_ENDINGS if ending.search(output)), 0)


def plan_items(arguments: dict | None) -> list[bool] | None:
    """None: OpenClaw has no plan or todo tool."""
    return None


def programs(exe: Path) -> tuple[str, ...]:
    """The programs whose processes are the harness's own (path prefixes as the sandbox sees them): Node and every
    harness install; anything else it starts is the agent's (`steps.sandbox.limits`)."""
    return npm_programs()
