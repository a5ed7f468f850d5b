"""The behaviour metrics, each a pure function of a rollout's tool uses or recorded calls.

Definitions, with examples from real harness traffic, are in docs/analytics.md. In the examples below,
`use(...)` builds one tool use the way `steps.analytics.tools.read_calls` reads it from the records.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from steps.analytics.tools import ToolUse, canonical, tool_steps


def use(name: str, kind: str = "other", command: str | None = None, failed: bool | None = None,
        arguments: dict | None = None, call_index: int = 0, answered_at: int | None = None) -> ToolUse:
    """One answered tool use, for examples and tests: its key is the tool and its command (or arguments); by
    default each call is its own response, answered in the next request.

    >>> use("shell", "shell", "ls").key
    'shell:ls'
    """
    arguments = arguments if arguments is not None else {"command": command} if command is not None else {}
    key = f"{name}:{command if command is not None else canonical(arguments)}"
    made = ToolUse(call_index, name, kind, arguments, key, command, "", failed,
                   call_index + 1 if answered_at is None else answered_at)
    return replace(made, steps=tuple(tool_steps(made)))


def numbered(uses: list[ToolUse]) -> list[ToolUse]:
    """Examples' uses as one call per response, in order, each answered in the next request."""
    return [replace(u, call_index=n, answered_at=n + 1) for n, u in enumerate(uses)]


def tool_counts(uses: list[ToolUse]) -> dict[str, int]:
    """Tool calls by tool name, most used first, ties by name.

    >>> tool_counts([use("Read"), use("Bash"), use("Glob"), use("Bash")])
    {'Bash': 2, 'Glob': 1, 'Read': 1}
    """
    return dict(sorted(Counter(u.name for u in uses).items(), key=lambda kv: (-kv[1], kv[0])))


def tool_coverage(uses: list[ToolUse], offered: set[str]) -> float | None:
    """Distinct offered tools the rollout used, over the tools offered; None when none was offered.
    A call of a tool that was not offered does not count.

    >>> tool_coverage([use("bash"), use("bash"), use("read"), use("made_up")], {"bash", "read", "edit", "write"})
    0.5
    """
    if not offered:
        return None
    return len({u.name for u in uses} & offered) / len(offered)


def shell_share(uses: list[ToolUse]) -> float | None:
    """The share of tool calls that went to the harness's shell tool (the rest are dedicated tools);
    None for a rollout without tool calls.

    >>> shell_share([use("exec", "shell", "ls"), use("read", "read"), use("write", "edit"), use("exec", "shell", "ls")])
    0.5
    """
    return sum(u.kind == "shell" for u in uses) / len(uses) if uses else None


def self_verified(uses: list[ToolUse]) -> bool | None:
    """After its last change to the workspace, did the rollout check its work? None when it changed nothing.

    A change: a shell step that writes (a redirection into a file, `cp`, `sed -i`, ...) or a dedicated edit
    tool that did not fail. A check of the work: a later step that runs tests, a build or a program
    (`pytest`, `make`, `python prog.py`, `./prog`), or reads (`cat`, `diff`, a dedicated read tool) a file
    the rollout changed. When the files a change wrote are not known (an `apply_patch`), any later check
    counts. The steps of one command count in their order.

    >>> self_verified([use("shell", "shell", "echo hello > answer.txt"), use("shell", "shell", "cat answer.txt")])
    True
    >>> self_verified([use("shell", "shell", "echo hello > answer.txt"), use("shell", "shell", "cat /dev/null")])
    False
    >>> self_verified([use("shell", "shell", "cat answer.txt"), use("shell", "shell", "echo hello > answer.txt")])
    False
    >>> self_verified([use("shell", "shell", "ls")]) is None
    True
    """
    steps = [step for u in uses for step in u.steps]
    changed = [n for n, step in enumerate(steps) if step.effect == "change"]
    if not changed:
        return None
    files = {name for n in changed for name in file_names(steps[n].files)}
    unknown = not all(steps[n].files for n in changed)
    return any(step.effect == "check" and (step.runs or unknown or names_one_of(step.files, files))
               for step in steps[changed[-1] + 1:])


def file_names(words: tuple[str, ...]) -> set[str]:
    """The file names (last path parts) of words that may be paths.

    >>> sorted(file_names(("/app/answer.txt", "./out/", "x")))
    ['answer.txt', 'out', 'x']
    """
    return {name for word in words if (name := word.rstrip("/").rsplit("/", 1)[-1]) not in ("", ".", "..")}


def names_one_of(words: tuple[str, ...], files: set[str]) -> bool:
    """Whether a step's words name one of the changed files: a path ending in its name, or (for names of 3
    characters or more) a word holding it, as in `python3 -c 'print(open("answer.txt").read())'`.

    >>> names_one_of(("-5", "/app/answer.txt"), {"answer.txt"}), names_one_of(("/etc/passwd",), {"answer.txt"})
    (True, False)
    """
    return bool(file_names(words) & files) or any(len(f) >= 3 and f in word for f in files for word in words)


def changes(uses: list[ToolUse]) -> int:
    """Tool calls that changed the workspace (at least one step of a command, or an edit that did not fail).

    >>> changes([use("shell", "shell", "mkdir d && cd d"), use("write", "edit", failed=True), use("edit", "edit")])
    2
    """
    return sum(any(step.effect == "change" for step in u.steps) for u in uses)


def plan_completion(uses: list[ToolUse], plan_items: Callable[[dict | None], list[bool] | None]) -> float | None:
    """The share of items done in the last plan the rollout set with its harness's plan tool (`plan_items`
    reads one call's items): the last plan call whose result did not fail and whose plan is readable; None
    when there is none, or that plan is empty (every item dropped).

    >>> todos = lambda args: [item == "done" for item in args["items"]]
    >>> plan_completion([use("todo", "plan", arguments={"items": ["done", "todo"]}),
    ...                  use("todo", "plan", arguments={"items": ["done", "done", "todo", "todo"]}),
    ...                  use("todo", "plan", arguments={"items": ["done"]}, failed=True)], todos)
    0.5
    >>> plan_completion([use("todo", "plan", arguments={"items": ["done"]}),
    ...                  use("todo", "plan", arguments={"items": []})], todos) is None
    True
    """
    for u in reversed(uses):
        if u.kind == "plan" and not u.failed and (items := plan_items(u.arguments)) is not None:
            return sum(items) / len(items) if items else None
    return None


def error_recovery(uses: list[ToolUse]) -> tuple[int, int, int]:
    """(failed tool results, of them followed by the same call again, followed by a different call).

    A failure is a result with a non-zero exit code or an error flag. What came next is the first response
    made after the model saw the failure (whose request holds the result; a call made beside the failed one,
    in the same response, was not). It repeats the failure when one of its calls is the same tool with the
    same command (or arguments, compared as canonical JSON); a failure with no call after it counts in neither.

    >>> error_recovery(numbered([use("sh", "shell", "cat a", failed=True), use("sh", "shell", "cat a", failed=True),
    ...                          use("sh", "shell", "ls", failed=False), use("sh", "shell", "make", failed=True)]))
    (3, 1, 1)
    >>> error_recovery([use("sh", "shell", "cat a", failed=True), use("sh", "shell", "cat b", failed=False),
    ...                 use("sh", "shell", "cat a", call_index=1)])
    (1, 1, 0)
    """
    failures = [u for u in uses if u.failed]
    repeated = changed = 0
    for failure in failures:
        after = [u for u in uses if failure.answered_at is not None and u.call_index >= failure.answered_at]
        response = [u for u in after if u.call_index == after[0].call_index] if after else []
        repeated += any(u.key == failure.key for u in response)
        changed += bool(response) and not any(u.key == failure.key for u in response)
    return len(failures), repeated, changed


def finish_reasons(records: list[dict]) -> dict[str, int]:
    """Recorded calls by finish reason (`none` for a call that has none: failed, or cut off).

    >>> finish_reasons([{"finish_reason": "tool_calls"}, {"finish_reason": "stop"}, {"finish_reason": None}])
    {'none': 1, 'stop': 1, 'tool_calls': 1}
    """
    return dict(sorted(Counter(str(r.get("finish_reason") or "none") for r in records).items()))


def response_tokens(records: list[dict]) -> tuple[int, float | None]:
    """(response tokens, mean per call), over the calls that recorded their response token ids, or the
    upstream's `usage.completion_tokens` for a call an external upstream answered without token ids.

    >>> response_tokens([{"response_token_ids": [1, 2, 3]}, {"response_token_ids": [4]}, {"response_token_ids": None},
    ...                  {"response_token_ids": None, "usage": {"prompt_tokens": 9, "completion_tokens": 5}}])
    (9, 3.0)
    """
    counts = [len(ids) if isinstance(ids := r.get("response_token_ids"), list) else completion_tokens(r)
              for r in records]
    counts = [n for n in counts if n is not None]
    return sum(counts), (sum(counts) / len(counts) if counts else None)


def completion_tokens(record: dict) -> int | None:
    """The response tokens an upstream's `usage` states for a call recorded without token ids, else None."""
    usage = record.get("usage")
    count = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None
