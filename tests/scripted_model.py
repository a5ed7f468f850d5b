"""A scripted stand-in for vLLM's OpenAI-compatible server, for tests that run real harnesses.

    python tests/scripted_model.py --port 8001 [--model tiny] [--command 'echo hello > answer.txt' ...]
        [--oracle steps/tasks/builtin | --wrong] [--no-token-ids | --strict]

Why a double: the harness and evaluation tests need a model that calls the shell tool a harness offers,
with the arguments its schema asks for, runs a known solution (or a known wrong one), and then stops. A
small random model cannot call tools, let alone solve a task, so this server plays the model from a
script, while answering exactly in the shape the proxy reads from vLLM: a non-streaming
`/v1/chat/completions` with `prompt_token_ids`, `choices[0].token_ids` and per-token `logprobs` when the
request asks for `return_token_ids` and `logprobs`. It also stands in for an endpoint that is not vLLM
(`--no-token-ids`, `--strict`), which cannot run here.

The script: while the conversation holds fewer tool results than there are commands, answer with one
call of the offered shell tool running the next command; after that, answer "done" (`--final-answer`). A request
without tools (titles, summaries) gets a short plain answer. Commands come from `--command`
(repeatable) or `POST /script {"commands": [...]}`; the default writes `hello` into `answer.txt`. A
command may also be `{"tool": NAME, "arguments": {...}}`: one call of that tool (a plan tool, say).
`--oracle DATASET` (a task folder or a folder of them) plays, for the task whose instruction is in the
conversation's user messages, that task's oracle: its `solution/solve.sh` as one shell command, a bash
here-document (the longest instruction found wins; a conversation with none gets a plain answer saying so).
`--wrong` plays a wrong script: one command that leaves the workspace as it was, so no task passes.
`ScriptedModel(replies={TEXT: ANSWER})` answers a request without tools whose user messages hold TEXT (the
longest found) with ANSWER: a double for a judge model, which reads a rubric and an answer and gives its verdict
(a judge that can be trusted to grade cannot run here; this one grades by the script, as told).

`--no-token-ids` answers as an OpenAI-compatible server that is not vLLM: `return_token_ids` is ignored
(no `prompt_token_ids`, no `token_ids`), logprobs still come when asked. `--strict` is such a server that
also refuses what OpenAI's API does not have (`return_token_ids`, `top_k`, `min_p`, `repetition_penalty`,
...) with a 400 naming the field, as OpenAI's own endpoint does.

Tokens are simple and recomputable: the text is UTF-8 encoded and every 3 bytes form one token id
(`int.from_bytes(chunk, "big")`, so ids stay below 2**24). Three bytes per token keeps token counts
near a real tokenizer's, so harnesses see realistic usage and do not start compacting. The prompt is
the canonical JSON of the request's messages and tools; the response is its text (a tool call is
rendered the way Hermes-style templates write one). The logprob of response token i is
`-(1 + i % 8) / 8`, exact in binary. `GET /requests` returns every exchange as
`{"request": ..., "response": ..., "authorization": ...}` (the header it came with) for tests to compare with what
the proxy recorded.

In a test, `ScriptedModel(commands=[...])` runs the same app on a free loopback port in a thread
(`oracle=DATASET`, `commands=WRONG_COMMANDS`, `with_token_ids=False`, `strict=True` as above; `tls=(cert,
key)` serves it over HTTPS, for an external endpoint's TLS).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from steps.net import HOST, free_port

DEFAULT_COMMANDS = ["echo hello > answer.txt"]
WRONG_COMMANDS = ["echo 'a wrong guess: nothing is changed'"]
NO_TASK_ANSWER = "No task of the oracle's dataset has its instruction in this conversation"
# Request fields of vLLM's chat API that OpenAI's does not have: `--strict` refuses them by name.
VLLM_ONLY_FIELDS = ("return_token_ids", "top_k", "min_p", "repetition_penalty", "skip_special_tokens",
                    "chat_template_kwargs", "include_stop_str_in_output")
FINAL_ANSWER = "done"
PLAIN_ANSWER = "Scripted answer"
# The shell tool of each harness, in order of preference when a request offers several.
SHELL_TOOLS = ["exec_command", "shell", "Bash", "exec", "run_shell_command", "bash"]
BYTES_PER_TOKEN = 3


def token_ids(text: str | bytes) -> list[int]:
    """The scripted tokenizer: every 3 UTF-8 bytes of `text` make one id.

    >>> token_ids("hello")
    [6841708, 27759]
    """
    data = text.encode() if isinstance(text, str) else text
    return [int.from_bytes(data[i:i + BYTES_PER_TOKEN], "big") for i in range(0, len(data), BYTES_PER_TOKEN)]


def logprob(position: int) -> float:
    """The scripted logprob of the response token at `position`: varied, negative, exact in binary."""
    return -(1 + position % 8) / 8


def prompt_text(body: dict) -> str:
    """What the scripted model 'reads': the canonical JSON of the messages and tools."""
    prompt = {"messages": body.get("messages", []), "tools": body.get("tools") or []}
    return json.dumps(prompt, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def tool_schema(tool: dict) -> tuple[str, dict]:
    """A tool's name and JSON schema, from the chat shape (or a flat one, to be lenient)."""
    function = tool.get("function") or tool
    return function.get("name", ""), function.get("parameters") or function.get("input_schema") or {}


def shell_call(tools: list[dict], command: str) -> tuple[str, dict] | None:
    """The offered shell tool and arguments that run `command`, built from that tool's schema."""
    offered = dict(tool_schema(tool) for tool in tools)
    name = next((candidate for candidate in SHELL_TOOLS if candidate in offered), None)
    if name is None:
        return None
    properties = offered[name].get("properties", {})
    key = "cmd" if "cmd" in properties else "command"
    # Old Codex's `shell` takes an argv list; everything else a command string.
    value = ["bash", "-lc", command] if properties.get(key, {}).get("type") == "array" else command
    arguments = {key: value}
    if "description" in properties:
        arguments["description"] = "Run the scripted command"
    return name, arguments


@dataclass
class Reply:
    """What the script says next: text, or one tool call."""

    content: str | None = None
    tool_name: str | None = None
    arguments: dict = field(default_factory=dict)

    def text(self) -> str:
        """The generated text, as a Hermes-style chat template would have the model write it."""
        if self.tool_name is None:
            return self.content or ""
        call = json.dumps({"name": self.tool_name, "arguments": self.arguments}, ensure_ascii=False)
        return f"<tool_call>\n{call}\n</tool_call>"


def scripted_call(tools: list[dict], command: dict) -> Reply:
    """A scripted call of a named tool (a plan tool, say), if the request offers it."""
    offered = [tool_schema(tool)[0] for tool in tools]
    if command.get("tool") not in offered:
        return Reply(content=f"No tool {command.get('tool')!r} among {offered}")
    return Reply(tool_name=command["tool"], arguments=dict(command.get("arguments") or {}))


def next_reply(body: dict, commands: list, replies: dict[str, str] | None = None,
               final_answer: str = FINAL_ANSWER) -> Reply:
    """The script: one call per command not yet answered by a tool result, then `final_answer` ("done"). A command
    is a shell command (run with the offered shell tool) or `{"tool": name, "arguments": {...}}`. A request without
    tools gets the reply of the longest key of `replies` its user messages hold, else a plain answer."""
    tools = body.get("tools") or []
    if not tools:
        found = [text for text in replies or {} if text and text in user_text(body)]
        return Reply(content=replies[max(found, key=len)] if found else PLAIN_ANSWER)
    answered = sum(1 for message in body.get("messages", []) if message.get("role") == "tool")
    if answered >= len(commands):
        return Reply(content=final_answer)
    command = commands[answered]
    if isinstance(command, dict):  # a call of another tool: {"tool": name, "arguments": {...}}
        return scripted_call(tools, command)
    call = shell_call(tools, command)
    if call is None:
        offered = [tool_schema(tool)[0] for tool in tools]
        return Reply(content=f"No shell tool among {offered}; expected one of {SHELL_TOOLS}")
    return Reply(tool_name=call[0], arguments=call[1])


def oracle_command(task: Path) -> str:
    """A task's `solution/solve.sh` as one shell command, run by bash (some harnesses' shell tools run `sh`)."""
    script = (task / "solution" / "solve.sh").read_text()
    return f"bash <<'OPENFORGE_ORACLE'\n{script}\nOPENFORGE_ORACLE"


def oracle_scripts(dataset: Path) -> dict[str, str]:
    """Each task's instruction (stripped) -> its oracle command, for a task folder or a folder of task
    folders (Harbor's layout, as `steps/tasks` reads it)."""
    folders = [dataset] if (dataset / "task.toml").is_file() else sorted(p for p in dataset.iterdir() if (p / "task.toml").is_file())
    return {(folder / "instruction.md").read_text().strip(): oracle_command(folder)
            for folder in folders if (folder / "solution" / "solve.sh").is_file()}


def user_text(body: dict) -> str:
    """The text of the conversation's user messages (content strings and text parts), one after another."""
    texts = []
    for message in body.get("messages", []):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        parts = [content] if isinstance(content, str) else [part.get("text") for part in content or []
                                                             if isinstance(part, dict)]
        texts += [part for part in parts if isinstance(part, str)]
    return "\n".join(texts)


def oracle_commands(body: dict, scripts: dict[str, str]) -> list[str] | None:
    """The oracle of the task whose instruction the user messages hold (the longest found), or None."""
    text = user_text(body)
    found = [instruction for instruction in scripts if instruction and instruction in text]
    return [scripts[max(found, key=len)]] if found else None


def completion(body: dict, reply: Reply, model: str, with_token_ids: bool = True) -> dict:
    """The chat completion in vLLM's non-streaming shape, token fields included when asked for."""
    raw = reply.text().encode()
    finish = "tool_calls" if reply.tool_name else "stop"
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_tokens is not None and len(raw) > max_tokens * BYTES_PER_TOKEN:
        raw, finish = raw[:max_tokens * BYTES_PER_TOKEN], "length"
        reply = Reply(content=raw.decode(errors="ignore"))
    ids = token_ids(raw)
    message: dict = {"role": "assistant", "content": reply.content, "reasoning_content": None,
                     "tool_calls": []}
    if reply.tool_name:
        message["tool_calls"] = [{
            "id": f"chatcmpl-tool-{uuid.uuid4().hex[:16]}", "type": "function",
            "function": {"name": reply.tool_name,
                         "arguments": json.dumps(reply.arguments, ensure_ascii=False)},
        }]
    choice: dict = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
                    "stop_reason": None}
    if body.get("logprobs"):
        pieces = [raw[i:i + BYTES_PER_TOKEN] for i in range(0, len(raw), BYTES_PER_TOKEN)]
        choice["logprobs"] = {"content": [
            {"token": piece.decode(errors="replace"), "logprob": logprob(i), "bytes": list(piece),
             "top_logprobs": []}
            for i, piece in enumerate(pieces)
        ]}
    prompt_ids = token_ids(prompt_text(body))
    response: dict = {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
        "model": model, "choices": [choice],
        "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                  "total_tokens": len(prompt_ids) + len(ids)},
        "prompt_logprobs": None,
    }
    if body.get("return_token_ids") and with_token_ids:
        response["prompt_token_ids"] = prompt_ids
        choice["token_ids"] = ids
    return response


def script_reply(body: dict, state) -> Reply:
    """The next reply of the server's script: the oracle of the conversation's task, or the commands."""
    if state.oracle is None:
        return next_reply(body, state.commands, state.replies, state.final_answer)
    commands = oracle_commands(body, state.oracle)
    if commands is None:
        return Reply(content=NO_TASK_ANSWER) if body.get("tools") else Reply(content=PLAIN_ANSWER)
    return next_reply(body, commands, final_answer=state.final_answer)


def error(status: int, message: str) -> JSONResponse:
    """vLLM's error shape."""
    return JSONResponse({"error": {"message": message, "type": "BadRequestError", "param": None,
                                   "code": status}}, status_code=status)


def create_app(model: str = "tiny", commands: list[str] | None = None, max_model_len: int = 262144,
               oracle: Path | None = None, with_token_ids: bool = True, strict: bool = False,
               replies: dict[str, str] | None = None, final_answer: str = FINAL_ANSWER) -> FastAPI:
    """The scripted server; its script and request log live on `app.state` (`oracle`: a dataset whose
    tasks' oracles are played instead of `commands`; `with_token_ids` False or `strict`: not vLLM, see above;
    `final_answer`: the reply once the commands are done, which the `direct` harness keeps as its answer)."""
    app = FastAPI(title="scripted model")
    app.state.commands = list(commands or DEFAULT_COMMANDS)
    app.state.final_answer = final_answer
    app.state.oracle = None if oracle is None else oracle_scripts(Path(oracle))
    app.state.replies = dict(replies or {})  # a plain request's answer by the text it holds (a judge's verdicts)
    app.state.exchanges = []  # {"request": body, "response": body}, in arrival order

    @app.get("/health")
    async def health() -> dict:
        return {}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model, "object": "model", "created": 0,
                                            "owned_by": "openforge", "max_model_len": max_model_len}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        refused = next((name for name in VLLM_ONLY_FIELDS if name in body), None) if strict else None
        if refused is not None:  # OpenAI's own words
            return error(400, f"Unrecognized request argument supplied: {refused}")
        if body.get("stream"):
            return error(400, "the scripted model answers non-streaming requests only")
        if body.get("model") != model:
            return error(404, f"The model `{body.get('model')}` does not exist.")
        prompt_tokens = len(token_ids(prompt_text(body)))
        wanted = body.get("max_completion_tokens") or body.get("max_tokens") or 0
        if prompt_tokens + wanted > max_model_len:
            return error(400, f"This model's maximum context length is {max_model_len} tokens. However, "
                              f"you requested {prompt_tokens + wanted} tokens ({prompt_tokens} in the "
                              f"messages, {wanted} in the completion).")
        response = completion(body, script_reply(body, app.state), model, with_token_ids=with_token_ids and not strict)
        app.state.exchanges.append({"request": body, "response": response,
                                    "authorization": request.headers.get("authorization")})
        return JSONResponse(response)

    @app.post("/script")
    async def script(request: Request) -> dict:
        """Replace the commands; the request log is cleared too."""
        app.state.commands = list((await request.json())["commands"])
        app.state.exchanges.clear()
        return {"commands": app.state.commands}

    @app.get("/requests")
    async def requests() -> list[dict]:
        return app.state.exchanges

    return app


class ScriptedModel:
    """The scripted server on a free loopback port, in a background thread (for pytest fixtures).

        with ScriptedModel(commands=["echo hello > answer.txt"]) as server:
            ...  # point the proxy at server.url; read server.exchanges afterwards
    """

    def __init__(self, model: str = "tiny", commands: list[str] | None = None, oracle: Path | None = None,
                 with_token_ids: bool = True, strict: bool = False, tls: tuple[Path, Path] | None = None,
                 replies: dict[str, str] | None = None, final_answer: str = FINAL_ANSWER):
        self.app = create_app(model, commands, oracle=oracle, with_token_ids=with_token_ids, strict=strict,
                              replies=replies, final_answer=final_answer)
        self.port = free_port()
        self.url = f"{'https' if tls else 'http'}://{HOST}:{self.port}"
        certfile, keyfile = tls or (None, None)
        config = uvicorn.Config(self.app, host=HOST, port=self.port, log_level="warning", ssl_certfile=certfile,
                                ssl_keyfile=keyfile)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def exchanges(self) -> list[dict]:
        """Every chat completion served so far: `{"request": ..., "response": ...}`."""
        return self.app.state.exchanges

    def set_commands(self, commands: list) -> None:
        """Replace the script's commands and clear the request log."""
        self.app.state.commands = list(commands)
        self.app.state.exchanges.clear()

    def set_scripts(self, by_instruction: dict[str, str] | None) -> None:
        """Play one shell command per task instruction (as `--oracle` plays each task's oracle): rollouts of different
        tasks running at once each get their own; None goes back to the commands. Clears the request log."""
        self.app.state.oracle = None if by_instruction is None else {k.strip(): v for k, v in by_instruction.items()}
        self.app.state.exchanges.clear()

    def __enter__(self) -> ScriptedModel:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the scripted model did not start on {self.url}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


def main() -> None:
    """Serve the scripted model until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default=HOST)
    parser.add_argument("--model", default="tiny", help="the model id it serves")
    parser.add_argument("--command", action="append", dest="commands", metavar="SHELL",
                        help=f"a shell command to call, in order (repeatable; default {DEFAULT_COMMANDS[0]!r})")
    parser.add_argument("--max-model-len", type=int, default=262144)
    parser.add_argument("--final-answer", default=FINAL_ANSWER, help="the reply once the commands are done")
    script = parser.add_mutually_exclusive_group()
    script.add_argument("--oracle", type=Path, metavar="DATASET", help="play the oracle of the conversation's task")
    script.add_argument("--wrong", action="store_true", help="play a wrong script: no task passes")
    answers = parser.add_mutually_exclusive_group()
    answers.add_argument("--no-token-ids", action="store_true", help="answer without token ids, like a server not vLLM")
    answers.add_argument("--strict", action="store_true", help="also refuse vLLM-only fields by name, like OpenAI")
    args = parser.parse_args()
    if args.oracle is not None and not args.oracle.is_dir():
        parser.error(f"--oracle takes a task folder or a folder of task folders, got {str(args.oracle)!r}")
    commands = WRONG_COMMANDS if args.wrong else args.commands
    uvicorn.run(create_app(args.model, commands, args.max_model_len, oracle=args.oracle,
                           with_token_ids=not args.no_token_ids, strict=args.strict, final_answer=args.final_answer),
                host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
