"""`direct`: OpenForge's own minimal agent loop, one shell tool over OpenAI Chat Completions.

    python -m steps.harnesses.direct [--max-turns 20] [--log LOG.jsonl] -- "INSTRUCTION"
    # with OPENAI_BASE_URL, OPENAI_API_KEY, OPENAI_MODEL set (prepare() does that)

It stands in for the paper's ZeroClaw (a minimal direct-tool harness, not installable here) and is
the fastest harness for CPU runs: no Node, no start-up cost, one non-streamed call per turn. The
model gets the instruction and a `shell` tool; each tool call runs `bash -c` in the working folder.
The loop ends when the model answers without a tool call or the turn budget is spent; the final
answer is also written to `/logs/agent/answer.txt` (Harbor's agent log folder) for verifiers that
grade the reply. Its event log is one JSON line per model call and per command.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from steps.harnesses.base import Endpoint, SYSTEM_PATH, argument_text, exit_code_in

NPM_PACKAGE = None
VERSION = "builtin"
DIALECT = "chat_completions"
BINARY = "python"
# Whether the agent's tool processes find the rollout's key in their environment (docs/rollouts.md).
KEY_IN_TOOL_ENV = False
# The harness's own budget beside the task's cpus and memory_mb, which bound what the agent runs: its processes'
# memory in MiB (about twice their peak on a built-in task: docs/rollouts.md, "The harness's own budget") and CPUs.
MEMORY_MB = 256
CPUS = 1.0

# Behaviour analytics (steps/analytics, docs/analytics.md): the tools that run commands, change files, read
# files back, and keep a plan.
SHELL_TOOLS = ("shell",)
EDIT_TOOLS = ()
READ_TOOLS = ()
PLAN_TOOLS = ()
SHELL_WRITERS = ()  # programs of its own, run in its shell tool, that change files: none
# Tools that call another tool by name (`tool_call {"name": ..., "arguments": ...}`): name key, arguments key.
META_TOOLS: dict[str, tuple[str, str]] = {}
# Tools offered only to keep a mechanism on, never to be called: not counted as offered.
PLACEHOLDER_TOOLS = ()
EXIT_CODE = re.compile(r"\Aexit code: (-?\d+)")

SYSTEM_PROMPT = ("You are an autonomous agent working in a Linux shell. Use the `shell` tool to run commands "
                 "until the task is done, then reply with a short final answer and no tool call.")
SHELL_TOOL = {"type": "function", "function": {
    "name": "shell", "description": "Run a bash command in the working folder; returns its output and exit code.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
OUTPUT_LIMIT = 8000
# What the loop's own Python needs (prepare()); the task's programs run without it, and without the key.
HARNESS_ONLY_ENV = ("PYTHONPATH", "LD_LIBRARY_PATH", "OPENAI_API_KEY")
# Harbor's folder for agent logs; a verifier may grade the final reply found here.
ANSWER_FILE = Path("/logs/agent/answer.txt")


def install(prefix: Path) -> Path:
    """Nothing to install: the loop runs on the Python that runs OpenForge."""
    return Path(sys.executable)


def prepare(home: Path, workdir: Path, endpoint: Endpoint) -> dict[str, str]:
    """The clean environment for the loop: the proxy endpoint and key, nothing inherited."""
    home.mkdir(parents=True, exist_ok=True)
    return {
        "HOME": str(home), "PATH": SYSTEM_PATH, "LANG": "C.UTF-8", "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        # The loop runs on the runner's Python, which in a rollout pod finds its libpython only through this.
        **({"LD_LIBRARY_PATH": os.environ["LD_LIBRARY_PATH"]} if os.environ.get("LD_LIBRARY_PATH") else {}),
        "OPENAI_BASE_URL": endpoint.openai_base_url, "OPENAI_API_KEY": endpoint.api_key,
        "OPENAI_MODEL": endpoint.model, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
    }


def command(instruction: str, workdir: Path, exe: Path) -> list[str]:
    """The headless command line: this module as a script."""
    return [str(exe), "-m", "steps.harnesses.direct", "--", instruction]


def log_paths(home: Path) -> list[Path]:
    """The loop's event log is its stdout (and `--log` if given); nothing under HOME."""
    return []


def binds() -> list[tuple[Path, str, bool]]:
    """Host paths the loop needs inside a rollout sandbox: this Python, its venv, and only the harness
    package of OpenForge (not the whole checkout, whose built-in tasks hold verifiers and oracles)."""
    steps_dir = Path(__file__).resolve().parents[1]
    paths = [Path(sys.base_prefix), Path(sys.prefix), steps_dir / "__init__.py", steps_dir / "harnesses"]
    return [(path, str(path), True) for path in dict.fromkeys(paths)]


def run_shell(command_text: str, timeout_s: float) -> str:
    """Runs one command and returns what the model sees: exit code and (truncated) output."""
    try:
        done = subprocess.run(["bash", "-c", command_text], capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL, errors="replace",
                              env={k: v for k, v in os.environ.items() if k not in HARNESS_ONLY_ENV})
    except subprocess.TimeoutExpired:
        return f"exit code: timeout after {timeout_s:.0f} s"
    output = (done.stdout + done.stderr)[-OUTPUT_LIMIT:]
    return f"exit code: {done.returncode}\n{output}"


def tool_output(call, timeout_s: float) -> str:
    """The tool message for one call: the command's output, or why it did not run."""
    if call.function.name != "shell":
        return f"error: unknown tool {call.function.name!r}; the only tool is `shell`"
    try:
        command_text = json.loads(call.function.arguments or "{}")["command"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return 'error: arguments must be a JSON object like {"command": "ls"}'
    return run_shell(str(command_text), timeout_s)


def agent_loop(instruction: str, max_turns: int, max_tokens: int | None, command_timeout_s: float,
               log) -> tuple[int, str | None]:
    """Runs the loop; returns the number of model calls made and the final answer."""
    from openai import OpenAI  # imported here so that install/prepare/command need no SDK

    client = OpenAI(max_retries=0, timeout=3600)
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": instruction}]
    for turn in range(max_turns):
        extra = {"max_tokens": max_tokens} if max_tokens else {}
        message = client.chat.completions.create(model=os.environ["OPENAI_MODEL"], messages=messages,
                                                 tools=[SHELL_TOOL], **extra).choices[0].message
        log({"turn": turn, "content": message.content, "tool_calls": len(message.tool_calls or [])})
        messages.append(message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))
        if not message.tool_calls:
            return turn + 1, message.content
        for call in message.tool_calls:
            output = tool_output(call, command_timeout_s)
            log({"turn": turn, "tool_call_id": call.id, "output": output[:500]})
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    return max_turns, None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m steps.harnesses.direct", description=__doc__.split("\n\n")[0])
    p.add_argument("instruction")
    p.add_argument("--max-turns", type=int, default=20)
    p.add_argument("--max-tokens", type=int, help="response tokens per call (the proxy may cap them too)")
    p.add_argument("--command-timeout", type=float, default=120.0)
    p.add_argument("--log", type=Path)
    p.add_argument("--answer-file", type=Path, default=ANSWER_FILE,
                   help="where the final answer goes, for verifiers that grade the reply (if its folder exists)")
    args = p.parse_args(argv)
    log_file = open(args.log, "a") if args.log else None

    def log(event: dict) -> None:
        line = json.dumps({"ts": round(time.time(), 3), **event})
        print(line, flush=True)
        if log_file:
            log_file.write(line + "\n")
            log_file.flush()

    calls, answer = agent_loop(args.instruction, args.max_turns, args.max_tokens, args.command_timeout, log)
    log({"done": True, "model_calls": calls})
    if args.answer_file and args.answer_file.parent.is_dir():
        args.answer_file.write_text(answer or "")
    return 0


def shell_command(arguments: dict | None) -> str | None:
    """The command a call of one of SHELL_TOOLS runs, from its decoded arguments."""
    return argument_text(arguments, "command")


def exit_code(output: str) -> int | None:
    """The exit code a shell result states: "exit code: 1" on the first line of its `shell` result (a timeout
    states none)."""
    return exit_code_in(EXIT_CODE, output)


def plan_items(arguments: dict | None) -> list[bool] | None:
    """None: `direct` has only its shell tool."""
    return None


if __name__ == "__main__":
    sys.exit(main())


def programs(exe: Path) -> tuple[str, ...]:
    """The programs whose processes are the harness's own: its Python (as the kernel names it, links resolved);
    anything else it starts is the agent's (`steps.sandbox.limits`)."""
    return (os.path.realpath(exe),)
