"""Behaviour analytics (`steps.analytics`): the metrics' doctests, each dialect's reader on streamed and
plain responses, the controls, and records an agent or a broken store could produce.

The records here are small, in the shapes the real harnesses send and the proxy stores (the real ones,
from every harness CLI, are checked in tests/test_harnesses.py).
"""

from __future__ import annotations

import copy
import doctest
import json
import random
from dataclasses import fields

import pytest

import steps.analytics.behaviour
import steps.analytics.dialects
import steps.analytics.metrics
import steps.analytics.shell
import steps.analytics.tools
import steps.harnesses.base
from steps.analytics import METRICS, RolloutBehaviour, rollout_behaviour, summarize_behaviour
from steps.analytics.__main__ import main as analytics_main
from steps.analytics.dialects import READERS
from steps.analytics.metrics import use
from steps.analytics.tools import changes_and_checks
from steps.harnesses import HARNESSES
from steps.trajectories.schema import BEHAVIOUR

ANALYTICS_NAMES = ("SHELL_TOOLS", "EDIT_TOOLS", "READ_TOOLS", "PLAN_TOOLS", "shell_command", "exit_code",
                   "plan_items")


@pytest.mark.parametrize("module", [steps.analytics.behaviour, steps.analytics.dialects, steps.analytics.metrics,
                                    steps.analytics.shell, steps.analytics.tools, steps.harnesses.base])
def test_doctests(module):
    failures, tried = doctest.testmod(module)
    assert tried > 0 and failures == 0


@pytest.mark.parametrize("name", list(HARNESSES))
def test_every_harness_names_its_tools_for_analytics(name):
    harness = HARNESSES[name]
    missing = [attr for attr in ANALYTICS_NAMES if not hasattr(harness, attr)]
    assert not missing, f"{name} lacks {missing}"
    assert len(harness.SHELL_TOOLS) >= 1
    assert harness.exit_code("garbage") in (None, 0) and harness.plan_items("not an object") is None


def test_the_table_columns_are_the_dataclass_fields():
    assert BEHAVIOUR.names[9:] == [f.name for f in fields(RolloutBehaviour)] == METRICS


# --- records in each dialect's shape ---------------------------------------------------------------------

def chat(index, calls=(), results=(), stream=False, tools=("shell",)):
    """A chat_completions record: `calls` [(id, name, arguments)], `results` [(id, text)] in its request."""
    messages = [{"role": "user", "content": "task"}]
    for call_id, text in results:
        messages += [{"role": "assistant", "tool_calls": [{"id": call_id, "type": "function", "function": {}}]},
                     {"role": "tool", "tool_call_id": call_id, "content": text}]
    request = {"messages": messages, "tools": [{"type": "function", "function": {"name": t}} for t in tools]}
    pieces = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls]
    if stream:  # as qwen-code, opencode and OpenClaw get it: one delta per tool call, the arguments in two
        response = [{"event": None, "data": {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}}]
        for n, (i, name, arguments) in enumerate(calls):
            half = len(arguments) // 2
            response += [
                {"event": None, "data": {"choices": [{"delta": {"tool_calls": [
                    {"index": n, "id": i, "function": {"name": name, "arguments": arguments[:half]}}]}}]}},
                {"event": None, "data": {"choices": [{"delta": {"tool_calls": [
                    {"index": n, "function": {"arguments": arguments[half:]}}]}}]}}]
        response.append({"event": None, "data": "[DONE]"})
    else:
        response = {"choices": [{"message": {"role": "assistant", "tool_calls": pieces}}]}
    return {"call_index": index, "dialect": "chat_completions", "status": "ok", "request": request,
            "response": response, "finish_reason": "tool_calls" if calls else "stop",
            "response_token_ids": [1] * 10, "weight_version": "0"}


def shell_script(harness, commands_and_outputs, stream=False):
    """A direct-harness rollout: one shell call per (command, output), then a final answer."""
    records, results = [], []
    for n, (command, output) in enumerate(commands_and_outputs):
        call_id = f"call-{n}"
        records.append(chat(n, [(call_id, "shell", json.dumps({"command": command}))], results, stream))
        results = results + [(call_id, output)]
    records.append(chat(len(records), [], results, stream))
    return records


def responses_record(index, calls=(), results=(), stream=True):
    """A responses record as Codex sends it: `function_call_output` input items; the stream's
    `response.completed` holds the output."""
    request = {"input": [{"type": "function_call_output", "call_id": i, "output": text} for i, text in results],
               "tools": [{"type": "function", "name": "exec_command"}, {"type": "custom", "name": "apply_patch"}]}
    output = [{"type": "function_call", "call_id": i, "name": n, "arguments": a} for i, n, a in calls]
    response = ([{"event": "response.created", "data": {"type": "response.created", "response": {"output": []}}},
                 {"event": "response.completed", "data": {"type": "response.completed", "response": {"output": output}}}]
                if stream else {"output": output})
    return {"call_index": index, "dialect": "responses", "status": "ok", "request": request, "response": response}


def messages_record(index, calls=(), results=(), stream=True):
    """A messages record as Claude Code sends it: `tool_result` blocks with `is_error`; the stream's tool
    input comes in `input_json_delta` pieces."""
    blocks = [{"type": "tool_result", "tool_use_id": i, "content": text, "is_error": error} for i, text, error in results]
    request = {"messages": [{"role": "user", "content": blocks}], "tools": [{"name": "Bash"}, {"name": "Read"}]}
    if stream:
        response = [{"event": "message_start", "data": {"type": "message_start"}}]
        for n, (i, name, arguments) in enumerate(calls):
            response += [{"event": "content_block_start", "data": {"type": "content_block_start", "index": n,
                          "content_block": {"type": "tool_use", "id": i, "name": name, "input": {}}}},
                         {"event": "content_block_delta", "data": {"type": "content_block_delta", "index": n,
                          "delta": {"type": "input_json_delta", "partial_json": json.dumps(arguments)}}}]
    else:
        response = {"content": [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in calls]}
    return {"call_index": index, "dialect": "messages", "status": "ok", "request": request, "response": response}


@pytest.mark.parametrize("stream", [False, True])
def test_each_dialect_reads_the_same_calls_streamed_or_not(stream):
    chat_calls = READERS["chat_completions"].tool_calls(
        chat(0, [("a", "shell", '{"command": "ls"}'), ("b", "shell", '{"command": "pwd"}')], stream=stream)["response"])
    assert [(c.id, c.name, json.loads(c.arguments)) for c in chat_calls] == \
        [("a", "shell", {"command": "ls"}), ("b", "shell", {"command": "pwd"})]
    responses_calls = READERS["responses"].tool_calls(
        responses_record(0, [("c", "exec_command", '{"cmd": "ls"}')], stream=stream)["response"])
    assert [(c.id, c.name, c.arguments) for c in responses_calls] == [("c", "exec_command", '{"cmd": "ls"}')]
    messages_calls = READERS["messages"].tool_calls(
        messages_record(0, [("d", "Bash", {"command": "ls"})], stream=stream)["response"])
    assert [(c.id, c.name, json.loads(c.arguments) if stream else c.arguments) for c in messages_calls] == \
        [("d", "Bash", {"command": "ls"})]


def test_error_recovery_and_self_verification_in_each_dialect():
    codex = [responses_record(0, [("c0", "exec_command", '{"cmd": "cat answer.txt"}')]),
             responses_record(1, [("c1", "exec_command", '{"cmd": "echo hello > answer.txt"}')],
                              [("c0", "Process exited with code 1\nOutput:\nNo such file")]),
             responses_record(2, [], [("c0", "Process exited with code 1"), ("c1", "Process exited with code 0")])]
    b = rollout_behaviour(codex, "codex")
    assert (b.tool_failures, b.changed_after_failure, b.repeated_after_failure) == (1, 1, 0)
    assert (b.changes, b.self_verified, b.tools_offered, b.tool_coverage) == (1, False, 2, 0.5)
    claude = [messages_record(0, [("m0", "Bash", {"command": "echo hi > a.txt"})]),
              messages_record(1, [("m1", "Read", {"file_path": "a.txt"})], [("m0", "", False)]),
              messages_record(2, [], [("m0", "", False), ("m1", "hi", False)])]
    b = rollout_behaviour(claude, "claude-code")
    assert (b.self_verified, b.shell_share, b.tool_counts, b.tool_failures) == (True, 0.5, '{"Bash": 1, "Read": 1}', 0)


@pytest.mark.parametrize("command, expected", [
    ("echo hello > answer.txt", ["change"]),
    ("cat answer.txt", ["check"]),
    ("ls -la && echo done", ["", ""]),
    ("pytest -q 2>&1 | tail -5", ["check", "check"]),
    ("python3 solve.py > out.txt; diff out.txt expected.txt", ["change", "check"]),
    ("echo 'a; b > c' && cd src", ["", ""]),  # quoted operators are text
    ("cat > f.py <<'EOF'\nif a > b:\n    print(1)\nEOF\npython3 f.py", ["change", "check"]),  # heredoc body is data
    ("bash <<'EOF'\nset -e\necho hi > /app/answer.txt\nEOF", ["check", "", "change"]),  # ... unless a shell runs it
    ("sed -i 's/a/b/' main.py && git diff", ["change", "check"]),
    ("FOO=1 timeout 30 ./run_tests.sh", ["check"]),
    ("ls > /dev/null", [""]),
    ("echo 'unbalanced > x", ["change"]),  # unbalanced quotes: a plain split
])
def test_what_each_shell_step_does(command, expected):
    assert changes_and_checks(use("shell", "shell", command)) == expected


# --- controls ---------------------------------------------------------------------------------------------

def test_a_rollout_that_never_checks_its_work_is_not_self_verified():
    never = rollout_behaviour(shell_script("direct", [("echo hello > answer.txt", "exit code: 0\n")]), "direct")
    checked = rollout_behaviour(shell_script("direct", [("echo hello > answer.txt", "exit code: 0\n"),
                                                        ("cat answer.txt", "exit code: 0\nhello\n")]), "direct")
    assert (never.changes, never.self_verified) == (1, False)
    assert (checked.changes, checked.self_verified) == (1, True)
    # A check before the change does not count; nothing changed at all is no answer either way.
    before = rollout_behaviour(shell_script("direct", [("cat answer.txt", "exit code: 1\n"),
                                                       ("echo hello > answer.txt", "exit code: 0\n")]), "direct")
    nothing = rollout_behaviour(shell_script("direct", [("ls", "exit code: 0\n")]), "direct")
    assert before.self_verified is False and nothing.self_verified is None


def test_a_repeated_failing_call_counts_as_repeated():
    failing = ("cat missing.txt", "exit code: 1\ncat: missing.txt: No such file or directory\n")
    repeated = rollout_behaviour(shell_script("direct", [failing, failing, ("ls", "exit code: 0\n")]), "direct")
    changed = rollout_behaviour(shell_script("direct", [failing, ("ls", "exit code: 0\n")]), "direct")
    assert (repeated.tool_failures, repeated.repeated_after_failure, repeated.changed_after_failure) == (2, 1, 1)
    assert (changed.tool_failures, changed.repeated_after_failure, changed.changed_after_failure) == (1, 0, 1)


def test_plan_completion_reads_the_last_plan_of_the_harness_plan_tool():
    todos = lambda *statuses: json.dumps({"todos": [{"content": f"step {n}", "status": s, "priority": "high"}
                                                    for n, s in enumerate(statuses)]})
    records = [chat(0, [("t0", "todowrite", todos("in_progress", "pending"))], tools=("bash", "todowrite")),
               chat(1, [("t1", "todowrite", todos("completed", "completed", "pending", "cancelled"))], [("t0", "ok")],
                    tools=("bash", "todowrite")),
               chat(2, [], [("t0", "ok"), ("t1", "ok")], tools=("bash", "todowrite"))]
    assert rollout_behaviour(records, "opencode").plan_completion == pytest.approx(2 / 3)
    # OpenClaw has no plan tool: the same calls give no plan completion; nor does a rollout that never plans.
    assert rollout_behaviour(records, "openclaw").plan_completion is None
    assert rollout_behaviour(shell_script("direct", [("ls", "exit code: 0")]), "opencode").plan_completion is None


# --- what an agent or a broken store can put in the records ---------------------------------------------

JUNK = [None, 0, -1, 2**70, 1.5, True, "", "x" * 100_000, "{", [], [None], {}, {"a": {"b": []}}, "[DONE]"]


def mutate(value, rng: random.Random, depth: int = 0):
    """`value` with a few of its items, at any depth, replaced by junk of another type."""
    if isinstance(value, dict):
        return {k: (rng.choice(JUNK) if rng.random() < 0.15 else mutate(v, rng, depth + 1)) for k, v in value.items()}
    if isinstance(value, list):
        return [rng.choice(JUNK) if rng.random() < 0.15 else mutate(v, rng, depth + 1) for v in value]
    return value


def test_no_record_an_agent_or_store_controls_makes_it_raise():
    rng = random.Random(17)
    bases = [shell_script("direct", [("cat a", "exit code: 1"), ("echo a > a", "exit code: 0")], stream=s)
             for s in (False, True)]
    bases.append([responses_record(0, [("c", "exec_command", '{"cmd": "ls"}')]),
                  responses_record(1, [], [("c", "Process exited with code 0")])])
    bases.append([messages_record(0, [("m", "Bash", {"command": "ls"})]), messages_record(1, [], [("m", "x", True)])])
    harnesses = list(HARNESSES) + ["unknown", None, 3]
    for n in range(400):
        records = mutate(copy.deepcopy(rng.choice(bases)), rng)
        behaviour = rollout_behaviour(records, harnesses[n % len(harnesses)])
        assert isinstance(behaviour, RolloutBehaviour)
    for records in (None, "not a list", [None, 3, "x"], [{"call_index": "0"}], [{}]):
        assert rollout_behaviour(records, "direct").calls == 0


def test_unreadable_records_are_counted_not_fatal():
    records = shell_script("direct", [("cat a", "exit code: 1")])
    records[0].update(response=None, store_error="response: not JSON")  # a truncated record
    records[1]["dialect"] = "smoke_signals"
    behaviour = rollout_behaviour(records + ["garbage"], "direct")
    assert (behaviour.calls, behaviour.unreadable, behaviour.tool_calls) == (2, 3, 0)


def test_malformed_and_huge_tool_arguments():
    huge = "echo hi > out.txt; echo " + "a" * 1_000_000  # read by its head only (shell.COMMAND_LIMIT)
    records = [chat(0, [("a", "shell", "not json at all"), ("b", "shell", json.dumps({"command": 7})),
                        ("c", "shell", json.dumps([1, 2])), ("d", "shell", json.dumps({"command": huge}))]),
               chat(1, [], [("a", "error: arguments must be a JSON object"), ("d", "exit code: 0")])]
    behaviour = rollout_behaviour(records, "direct")
    assert (behaviour.tool_calls, behaviour.shell_calls, behaviour.changes, behaviour.self_verified) == (4, 4, 1, False)


# --- aggregates and the command line ----------------------------------------------------------------------

def test_summaries_are_means_over_the_rollouts_that_have_a_value():
    rows = [{"harness": "a", "iteration": 0, "status": "ok", "reward": 1.0, "self_verified": True, "tool_failures": 2,
             "tool_counts": '{"bash": 2}', "plan_completion": None},
            {"harness": "a", "iteration": 0, "status": "ok", "reward": 0.0, "self_verified": False, "tool_failures": 1,
             "tool_counts": '{"bash": 1, "read": 1}', "plan_completion": 0.5},
            {"harness": "a", "iteration": 0, "status": "infra_error", "reward": None, "self_verified": None},
            {"harness": "b", "iteration": 0, "status": "ok", "reward": 1.0, "self_verified": None, "tool_failures": 0,
             "tool_counts": "not json"}]
    a, b = summarize_behaviour(rows, ["harness", "iteration"])
    assert (a["harness"], a["rollouts"], a["pass_rate"], a["self_verified"], a["plan_completion"]) == ("a", 2, 0.5, 0.5, 0.5)
    assert (a["recovery_rate"], a["tool_counts"]) == (0.5, {"bash": 1.5, "read": 0.5})
    assert (b["rollouts"], b["self_verified"], b["recovery_rate"], b["tool_counts"]) == (1, None, None, {})


def test_the_command_line_prints_a_table_per_group(tmp_path, capsys):
    from steps.trajectories import partition_url, write_tables
    from steps.trajectories.collect import collect

    results = [{"rollout_id": f"r{n}", "task": "t", "harness": "direct", "status": "ok", "reward": float(n % 2)}
               for n in range(4)]
    calls = {f"r{n}": shell_script("direct", [("echo a > a", "exit code: 0")] + [("cat a", "exit code: 0")] * (n % 2))
             for n in range(4)}
    for iteration in (0, 1):
        write_tables(collect(results, calls, "demo", iteration)[0].tables(), partition_url(str(tmp_path), "demo", iteration))
    assert analytics_main(["--trajectories", str(tmp_path), "--by", "harness,iteration", "--json"]) == 0
    summaries = json.loads(capsys.readouterr().out)
    assert [(s["iteration"], s["rollouts"], s["self_verified"], s["pass_rate"]) for s in summaries] == \
        [(0, 4, 0.5, 0.5), (1, 4, 0.5, 0.5)]
    assert analytics_main(["--trajectories", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[:3] == ["harness", "rollouts", "pass_rate"]
    assert analytics_main(["--trajectories", str(tmp_path / "nothing")]) == 2
    assert "no behaviour table" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        analytics_main(["--trajectories", str(tmp_path), "--by", "prompt"])
    assert "'prompt' is not a column to group by" in capsys.readouterr().err
