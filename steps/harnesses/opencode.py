"""opencode (`opencode-ai`), speaking OpenAI Chat Completions through `@ai-sdk/openai-compatible`.

    python -m steps.harnesses install opencode
    # what a rollout runs, with the environment from prepare():
    opencode run --pure --format json --dir WORKDIR -- "INSTRUCTION" </dev/null

Its config is `HOME/.config/opencode/opencode.json`, named in `OPENCODE_CONFIG`. Its event log:
`--format json` prints one event per line on stdout, and logs are kept in
`HOME/.local/share/opencode/log/`.
"""

from __future__ import annotations

import json
from pathlib import Path

from steps.harnesses.base import Endpoint, npm_programs, argument_text, clean_env, npm_binds, npm_install, todo_items

NPM_PACKAGE = "opencode-ai"
VERSION = "1.18.33"
DIALECT = "chat_completions"
BINARY = "opencode"
# Whether the agent's tool processes find the rollout's key in their environment (docs/rollouts.md).
KEY_IN_TOOL_ENV = False
# The harness's own budget beside the task's cpus and memory_mb, which bound what the agent runs: its processes'
# memory in MiB (about twice their peak on a built-in task: docs/rollouts.md, "The harness's own budget") and CPUs.
MEMORY_MB = 1024
CPUS = 1.0

# Behaviour analytics (steps/analytics, docs/analytics.md): the tools that run commands, change files, read
# files back, and keep a plan.
SHELL_TOOLS = ("bash",)
EDIT_TOOLS = ("edit", "write", "patch", "multiedit")
READ_TOOLS = ("read", "grep")
PLAN_TOOLS = ("todowrite",)
SHELL_WRITERS = ()  # programs of its own, run in its shell tool, that change files: none
# Tools that call another tool by name (`tool_call {"name": ..., "arguments": ...}`): name key, arguments key.
META_TOOLS: dict[str, tuple[str, str]] = {}
# Tools offered only to keep a mechanism on, never to be called: not counted as offered.
PLACEHOLDER_TOOLS = ()

PROVIDER = "openforge"
CONTEXT_WINDOW = 32768
MAX_TOKENS = 4096


def install(prefix: Path) -> Path:
    """Install the pinned opencode into `prefix` (skipped when already there); return `opencode`."""
    return npm_install(prefix, NPM_PACKAGE, VERSION, BINARY)


def config(endpoint: Endpoint) -> dict:
    """opencode's config: one OpenAI-compatible provider (the proxy), tools allowed, nothing shared."""
    model = {
        "name": endpoint.model, "tool_call": True,
        "limit": {"context": CONTEXT_WINDOW, "output": MAX_TOKENS},
    }
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "OpenForge proxy",
        "options": {"baseURL": endpoint.openai_base_url, "apiKey": endpoint.api_key},
        "models": {endpoint.model: model},
    }
    return {
        "provider": {PROVIDER: provider},
        "model": f"{PROVIDER}/{endpoint.model}",
        "small_model": f"{PROVIDER}/{endpoint.model}",  # Titles, otherwise a hosted default.
        "autoupdate": False,
        "share": "disabled",
        # Headless, `opencode run` rejects whatever asks ("permission requested: ...; auto-rejecting"), and the
        # session ends. The pinned version's default agent asks (its agent.ts defaults, as built into the binary)
        # for `external_directory` (any path outside --dir but its own temp folder, in every file tool and in a
        # command's path arguments or workdir), `doom_loop` (a call repeated 3 times) and `read` of `*.env` files:
        # all allowed, since the rollout sandbox is the boundary. The web stays off: a rollout is offline.
        "permission": {"bash": "allow", "edit": "allow", "read": "allow", "external_directory": "allow",
                       "doom_loop": "allow", "webfetch": "deny"},
    }


def prepare(home: Path, workdir: Path, endpoint: Endpoint) -> dict[str, str]:
    """Write `HOME/.config/opencode/opencode.json` and return the clean environment for `opencode`."""
    path = home / ".config" / "opencode" / "opencode.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config(endpoint), indent=2))
    return clean_env(
        home,
        OPENCODE_CONFIG=str(path),
        # Without these it fetches the models.dev catalog, updates, LSP servers and plugins.
        OPENCODE_DISABLE_MODELS_FETCH="1",
        OPENCODE_DISABLE_AUTOUPDATE="1",
        OPENCODE_DISABLE_LSP_DOWNLOAD="1",
        OPENCODE_DISABLE_SHARE="1",
        OPENCODE_DISABLE_DEFAULT_PLUGINS="1",
        # It npm-installs `@opencode-ai/plugin` into its config folder in the background, flags or
        # not; offline, that fails at once (a logged warning) instead of reaching the registry.
        npm_config_offline="true",
    )


def command(instruction: str, workdir: Path, exe: Path) -> list[str]:
    """The headless command line; the model is named in the config as `openforge/<model>`."""
    return [
        str(exe), "run",
        "--pure",  # No external plugins.
        "--format", "json",
        "--dir", str(workdir),
        "--", instruction,  # An instruction may start with "-" (a Markdown list).
    ]


def log_paths(home: Path) -> list[Path]:
    """opencode's own log files, besides the JSON events on stdout."""
    return sorted((home / ".local" / "share" / "opencode" / "log").glob("*.log"))


def binds() -> list[tuple[Path, str, bool]]:
    """Host paths the harness needs inside a rollout sandbox (read-only, at the same place)."""
    return npm_binds()


def shell_command(arguments: dict | None) -> str | None:
    """The command a call of one of SHELL_TOOLS runs, from its decoded arguments."""
    return argument_text(arguments, "command")


def exit_code(output: str) -> int | None:
    """Always None: opencode's `bash` result is the command's output alone, with no exit code in it."""
    return None


def plan_items(arguments: dict | None) -> list[bool] | None:
    """Whether each item of the plan a call of PLAN_TOOLS sets is done: `todowrite` takes `{"todos": [{"content",
    "status", "priority"}]}`."""
    return todo_items(arguments, "todos")


def programs(exe: Path) -> tuple[str, ...]:
    """The programs whose processes are the harness's own (path prefixes as the sandbox sees them): Node and every
    harness install; anything else it starts is the agent's (`steps.sandbox.limits`)."""
    return npm_programs()
