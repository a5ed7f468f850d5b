"""A rollout's tool uses, in order, read from its recorded calls: what each call asked for and what came back.

The calls a model made are read from each answered (`ok`) recorded call's response (what the harness
received), so every call counts once even when a harness rewrites or compacts its history. A call's
result is looked up in the first request after it that holds one with its id (an upstream may number
calls per response, `call_0` every turn, so an id names a call only from the call that made it on).
OpenClaw re-sends ids without their dashes (`chatcmpl-tool-3e84...` becomes `chatcmpltool3e84...`): a
request without the exact id is searched by the id's letters and digits.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass, replace

from steps.analytics import shell
from steps.analytics.dialects import READERS, ToolCall, ToolResult, decoded_arguments
from steps.harnesses.base import AnalyticsRole


@dataclass(frozen=True)
class ToolUse:
    """One tool call and what came of it.

    `kind`: the harness's role for the tool (`shell`, `edit`, `read`, `plan`, `other`). `arguments`: the
    decoded arguments (None when they are not a JSON object). `key`: the tool and its arguments in canonical
    form, to tell a repeated call (a shell call by its command alone: `description`, `yield_time_ms` and
    such do not make a retry a new call). `command`: a shell call's command text. `output`: the result's
    text (None when no later request holds it). `failed`: True for a result with a non-zero exit code or an
    error flag, False for one stating success, None when it says neither. `answered_at`: the call index of
    the first request holding the result (None without one). `steps`: what it did to the workspace
    (`tool_steps`).
    """

    call_index: int
    name: str
    kind: str
    arguments: dict | None
    key: str
    command: str | None = None
    output: str | None = None
    failed: bool | None = None
    answered_at: int | None = None
    steps: tuple[shell.Step, ...] = ()


@dataclass
class ReadCalls:
    """What the readers made of a rollout's records: tool uses, tools offered, and what could not be read."""

    uses: list[ToolUse]
    offered: set[str]
    turns: int  # calls whose request offered tools (not titles or summaries)
    unreadable: int  # records, requests or responses that could not be read


def plain_id(call_id: str) -> str:
    """A tool call id by its letters and digits alone, as it survives a harness re-sending it.

    >>> plain_id("chatcmpl-tool-3e84d312") == plain_id("chatcmpltool3e84d312")
    True
    """
    return re.sub(r"[^A-Za-z0-9]", "", call_id)


def tool_kind(name: str, harness: AnalyticsRole | None) -> str:
    """The role of a tool in a harness: `shell`, `edit`, `read`, `plan` or `other` (every tool of an
    unknown harness).

    >>> from steps.harnesses import codex
    >>> tool_kind("exec_command", codex), tool_kind("apply_patch", codex), tool_kind("get_goal", codex)
    ('shell', 'edit', 'other')
    """
    if harness is None:
        return "other"
    for kind, names in (("shell", harness.SHELL_TOOLS), ("edit", harness.EDIT_TOOLS),
                        ("read", harness.READ_TOOLS), ("plan", harness.PLAN_TOOLS)):
        if name in names:
            return kind
    return "other"


def canonical(arguments: object) -> str:
    """Arguments as comparable text: canonical JSON when they decode, else as sent.

    >>> canonical('{"b": 1, "a": 2}') == canonical({"a": 2, "b": 1})
    True
    """
    decoded = decoded_arguments(arguments)
    try:
        if decoded is not None:
            return json.dumps(decoded, sort_keys=True, ensure_ascii=False, default=str)
        return arguments if isinstance(arguments, str) else repr(arguments)
    except RecursionError:  # an object nested deeper than Python recurses: compared by identity alone
        return f"<unreadable {id(arguments)}>"


def failed(result: ToolResult, kind: str, harness: AnalyticsRole | None) -> bool | None:
    """Whether a tool result failed: the dialect's error flag, else a shell result's stated exit code."""
    if result.is_error is not None:
        return result.is_error
    if kind != "shell" or harness is None:
        return None
    code = harness.exit_code(result.text)
    return None if code is None else code != 0


def ordered_records(records: list) -> tuple[list[dict], int]:
    """The records that are call records, in call order, and how many are not."""
    calls = [r for r in records if isinstance(r, dict) and isinstance(r.get("call_index"), int)]
    return sorted(calls, key=lambda r: r["call_index"]), len(records) - len(calls)


def results_by_id(results: list[ToolResult]) -> tuple[dict[str, list], dict[str, list]]:
    """One request's tool results by exact id and by plain id, each id's results in order."""
    exact, plain = defaultdict(list), defaultdict(list)
    for result in results:
        exact[result.id].append(result)
        plain[plain_id(result.id)].append(result)
    return exact, plain


def answer(call_id: str, position: int, requests: list, made_at: dict[str, list[int]]) -> tuple | None:
    """(call index, result) for the call made by the request at `position`: the first later request with a
    result of its id. A request holding several results of one id (an upstream reusing ids) gives the last
    to the latest call of that id, the one before it to the call before, and so on.

    `requests`: (call index, results by exact id, by plain id) per request; `made_at`: the positions of the
    requests whose responses made calls, per exact id and per plain id (prefixed `~`).
    """
    if not call_id:
        return None
    for later in range(position + 1, len(requests)):
        call_index, exact, plain = requests[later]
        found, made = ((exact[call_id], made_at[call_id]) if call_id in exact else
                       (plain.get(plain_id(call_id), []), made_at["~" + plain_id(call_id)]))
        # calls of the same id made after this one, before this request
        newer = bisect_left(made, later) - bisect_right(made, position)
        if len(found) > newer:
            return call_index, found[-1 - newer]
    return None


def read_calls(records: list, harness: AnalyticsRole | None) -> ReadCalls:
    """The tool uses of a rollout's recorded calls, with their results and failures."""
    calls, unreadable = ordered_records(records)
    offered, emitted, requests = set(), [], []
    turns = 0
    for record in calls:
        dialect, request, response = record.get("dialect"), record.get("request"), record.get("response")
        reader = READERS.get(dialect) if isinstance(dialect, str) else None
        # One count per record: an unknown dialect, a field the store could not read back, an answered
        # call without its response.
        unreadable += reader is None or bool(record.get("store_error")) or (
            record.get("status") == "ok" and response is None)
        if reader is None:
            continue
        names = reader.offered_tools(request)
        offered.update(name for name in names if harness is None or name not in harness.PLACEHOLDER_TOOLS)
        turns += bool(names)
        requests.append((record["call_index"], *results_by_id(reader.tool_results(request))))
        if record.get("status") == "ok":  # a failed or aborted call's partial stream was not acted on
            emitted += [(len(requests) - 1, record["call_index"], call) for call in reader.tool_calls(response)]
    made_at = defaultdict(list)
    for position, _, call in emitted:
        made_at[call.id].append(position)
        made_at["~" + plain_id(call.id)].append(position)
    uses = [tool_use(call_index, call, answer(call.id, position, requests, made_at), harness)
            for position, call_index, call in emitted]
    return ReadCalls(uses, offered, turns, unreadable)


def unwrapped(call: ToolCall, harness: AnalyticsRole | None) -> ToolCall:
    """The call a harness's meta-tool makes (`tool_call {"name": "read_file", "arguments": {...}}`), as if
    made directly; any other call as it is, and a meta-tool call that names no tool too.

    >>> from steps.harnesses import qwen_code
    >>> unwrapped(ToolCall("a", "tool_call", '{"name": "read_file", "arguments": {"path": "a"}}'), qwen_code)
    ToolCall(id='a', name='read_file', arguments={'path': 'a'})
    """
    keys = harness.META_TOOLS.get(call.name) if harness is not None else None
    arguments = decoded_arguments(call.arguments) if keys else None
    name = arguments.get(keys[0]) if arguments else None
    if not isinstance(name, str) or not name:
        return call
    return ToolCall(call.id, name, arguments.get(keys[1], {}))


def tool_use(call_index: int, call: ToolCall, answered: tuple[int, ToolResult] | None,
             harness: AnalyticsRole | None) -> ToolUse:
    """One tool use from the call, its result (the request's call index and the result) and the harness."""
    call = unwrapped(call, harness)
    kind = tool_kind(call.name, harness)
    arguments = decoded_arguments(call.arguments)
    command = harness.shell_command(arguments) if kind == "shell" else None
    answered_at, result = answered if answered else (None, None)
    use = ToolUse(call_index=call_index, name=call.name, kind=kind, arguments=arguments,
                  key=f"{call.name}:{command if command is not None else canonical(call.arguments)}",
                  command=command, output=None if result is None else result.text,
                  failed=None if result is None else failed(result, kind, harness), answered_at=answered_at)
    return replace(use, steps=tuple(tool_steps(use, harness.SHELL_WRITERS if harness else ())))


def tool_steps(use: ToolUse, writers: tuple[str, ...] = ()) -> list[shell.Step]:
    """What a tool use did to the workspace, step by step (a shell command's segments, `writers` the
    harness's own programs that write; one step for any other tool, naming the files in its arguments). A
    call no result was ever seen for (the rollout ended first) did nothing known. An edit that failed
    changed nothing; a shell command that failed may have written before the step that failed, so its
    changes stand.

    >>> use = ToolUse(0, "Read", "read", {"file_path": "/app/a.txt"}, "", output="hi", failed=False)
    >>> tool_steps(use)
    [Step(effect='check', files=('/app/a.txt',), runs=False)]
    """
    if use.output is None:
        return [shell.Step("")]
    if use.kind == "shell" and use.command is not None:
        return shell.steps(use.command, writers)
    if use.kind == "edit" and use.failed:
        return [shell.Step("")]
    return [shell.Step({"edit": "change", "read": "check"}.get(use.kind, ""), argument_files(use.arguments))]


def argument_files(arguments: dict | None) -> tuple[str, ...]:
    """The file paths a dedicated tool's arguments name: text under a key that says path or file.

    >>> argument_files({"file_path": "a.py", "old_string": "x", "paths": ["b", "c"]})
    ('a.py', 'b', 'c')
    """
    found = []
    for key, value in (arguments or {}).items():
        if "path" in key.lower() or "file" in key.lower():
            found += [value] if isinstance(value, str) else [v for v in value if isinstance(v, str)] \
                if isinstance(value, list) else []
    return tuple(found)


def changes_and_checks(use: ToolUse, writers: tuple[str, ...] = ()) -> list[str]:
    """What each step of a tool use did: "change", "check" or "" (see `tool_steps`).

    >>> use = ToolUse(0, "shell", "shell", {}, "", command="echo hi > a.txt && cat a.txt", output="", failed=False)
    >>> changes_and_checks(use)
    ['change', 'check']
    >>> changes_and_checks(replace(use, output=None))
    ['']
    """
    return [step.effect for step in tool_steps(use, writers)]
