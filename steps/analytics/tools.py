"""A rollout's tool uses, in order, read from its recorded calls: what each call asked for and what came back.

The calls a model made are read from each recorded call's response (what the harness received), so every
call counts once even when a harness rewrites or compacts its history. A call's result is looked up in the
requests of the calls after it, by id: OpenClaw re-sends ids without their dashes (`chatcmpl-tool-3e84...`
becomes `chatcmpltool3e84...`), so ids are compared by their letters and digits only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from types import ModuleType

from steps.analytics import shell
from steps.analytics.dialects import READERS, ToolResult, decoded_arguments


@dataclass(frozen=True)
class ToolUse:
    """One tool call and what came of it.

    `kind`: the harness's role for the tool (`shell`, `edit`, `read`, `plan`, `other`). `arguments`: the
    decoded arguments (None when they are not a JSON object). `key`: the tool and its arguments in canonical
    form, to tell a repeated call. `command`: a shell call's command text. `output`: the result's text (None
    when no later request holds it). `failed`: True for a result with a non-zero exit code or an error flag,
    False for one stating success, None when it says neither.
    """

    call_index: int
    name: str
    kind: str
    arguments: dict | None
    key: str
    command: str | None = None
    output: str | None = None
    failed: bool | None = None


@dataclass
class ReadCalls:
    """What the readers made of a rollout's records: tool uses, tools offered, and what could not be read."""

    uses: list[ToolUse]
    offered: set[str]
    agent_calls: int  # calls whose request offered tools (not titles or summaries)
    unreadable: int  # records, requests or responses that could not be read


def plain_id(call_id: str) -> str:
    """A tool call id by its letters and digits alone, as it survives a harness re-sending it.

    >>> plain_id("chatcmpl-tool-3e84d312") == plain_id("chatcmpltool3e84d312")
    True
    """
    return re.sub(r"[^A-Za-z0-9]", "", call_id)


def tool_kind(name: str, harness: ModuleType | None) -> str:
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
    if decoded is not None:
        return json.dumps(decoded, sort_keys=True, ensure_ascii=False, default=str)
    return arguments if isinstance(arguments, str) else repr(arguments)


def failed(result: ToolResult, kind: str, harness: ModuleType | None) -> bool | None:
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


def read_calls(records: list, harness: ModuleType | None) -> ReadCalls:
    """The tool uses of a rollout's recorded calls, with their results and failures."""
    calls, unreadable = ordered_records(records)
    offered, emitted, results = set(), [], {}
    agent_calls = 0
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
        offered.update(names)
        agent_calls += bool(names)
        for result in reader.tool_results(request):
            results.setdefault(plain_id(result.id), result)
        emitted += [(record["call_index"], call) for call in reader.tool_calls(response)]
    uses = []
    for call_index, call in emitted:
        kind = tool_kind(call.name, harness)
        arguments = decoded_arguments(call.arguments)
        result = results.get(plain_id(call.id)) if call.id else None
        uses.append(ToolUse(
            call_index=call_index, name=call.name, kind=kind, arguments=arguments,
            key=f"{call.name}:{canonical(call.arguments)}",
            command=harness.shell_command(arguments) if kind == "shell" else None,
            output=None if result is None else result.text,
            failed=None if result is None else failed(result, kind, harness)))
    return ReadCalls(uses, offered, agent_calls, unreadable)


def changes_and_checks(use: ToolUse) -> list[str]:
    """What a tool use did to the workspace, step by step: "change", "check" or "" per step (a shell
    command's segments; one step for any other tool). An edit that failed changed nothing; a shell command
    that failed may have written before the step that failed, so its changes stand.

    >>> use = ToolUse(0, "shell", "shell", {}, "", command="echo hi > a.txt && cat a.txt", failed=False)
    >>> changes_and_checks(use)
    ['change', 'check']
    """
    if use.kind == "shell" and use.command is not None:
        return ["change" if shell.is_change(s) else "check" if shell.is_check(s) else ""
                for s in shell.segments(use.command)]
    if use.kind == "edit" and use.failed:
        return [""]
    return [{"edit": "change", "read": "check"}.get(use.kind, "")]
