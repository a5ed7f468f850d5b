"""The agent harnesses a rollout can run: one small module each, with the same few names.

Each module has `NPM_PACKAGE`, `VERSION` (pinned), `DIALECT` (the API it speaks to the proxy:
`responses`, `messages` or `chat_completions`), `KEY_IN_TOOL_ENV` (whether the processes its tools start,
the agent's commands, find the rollout's key in their environment), `MEMORY_MB` and `CPUS` (the budget of its
own processes beside the task's, which bounds the agent's commands), and the functions
`install(prefix) -> exe`, `prepare(home, workdir, endpoint) -> env`,
`command(instruction, workdir, exe) -> argv`, `log_paths(home) -> [Path]` and
`binds() -> [(host path, sandbox path, read-only)]` (what it needs inside a rollout sandbox) and
`programs(exe) -> (path prefix, ...)` (the programs whose processes are its own, not the agent's). For behaviour
analytics (`steps.analytics`, docs/analytics.md) each also names its tools, `SHELL_TOOLS`, `EDIT_TOOLS`,
`READ_TOOLS`, `PLAN_TOOLS`, and reads them: `shell_command(arguments) -> str | None` (the command a shell
call runs), `exit_code(output) -> int | None` (where its exit code sits in a result's text) and
`plan_items(arguments) -> [done?] | None` (its plan tool's items).

    from steps.harnesses import HARNESSES, Endpoint, default_prefix
    harness = HARNESSES["codex"]
    exe = harness.install(default_prefix("codex", harness.VERSION))
    env = harness.prepare(home, workdir, Endpoint(openai_base_url=..., anthropic_base_url=...,
                                                  api_key=..., model="tiny"))
    subprocess.run(harness.command(instruction, workdir, exe), env=env, cwd=workdir,
                   stdin=subprocess.DEVNULL)
"""

from steps.harnesses import browser_use, claude_code, codex, computer_use, direct, openclaw, opencode, qwen_code
from steps.harnesses.base import Endpoint, InstallError, cache_root, default_prefix

HARNESSES = {
    "codex": codex,
    "claude-code": claude_code,
    "openclaw": openclaw,
    "qwen-code": qwen_code,
    "opencode": opencode,
    "direct": direct,
}
# Harnesses that work a browser instead of a shell (docs/gui.md): same functions, no shell tool; a PyPI package
# in its own virtualenv at the harness prefix.
GUI_HARNESSES = {
    "browser-use": browser_use,
    "computer-use": computer_use,
}
ALL_HARNESSES = {**HARNESSES, **GUI_HARNESSES}  # every harness a rollout can run



def allowance(name: str, memory_mb: int = 0) -> tuple[int, float]:
    """A harness's own budget beside the task's: memory in MiB (`memory_mb`, the run's `harness_memory_mb`, or else its
    module's `MEMORY_MB`) and CPUs (its module's `CPUS`).

    >>> allowance("codex", 3072)[0], allowance("codex")[0] == codex.MEMORY_MB
    (3072, True)
    """
    harness = ALL_HARNESSES[name]
    return memory_mb or harness.MEMORY_MB, harness.CPUS


__all__ = ["ALL_HARNESSES", "GUI_HARNESSES", "HARNESSES", "Endpoint", "InstallError", "allowance", "cache_root",
           "default_prefix"]
