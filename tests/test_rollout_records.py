"""A rollout's records have one owner, `steps/contracts/rollout.py`: the planned rollout and the rollout result are read
back with the type they were written with, and no module of `steps/` or `workflows/` spells one of their fields as a
key of a raw dict."""

import ast
import json
import re
from dataclasses import fields
from pathlib import Path

import pytest

from steps import plan
from steps.contracts.layout import RESULT_FILE
from steps.contracts.rollout import (INFRA_ERROR, PlannedRollout, RecordError, RolloutResult, harness_killed, read_plan,
                                     read_result)
from steps.rollout import write_result
from steps.tasks import BUILTIN_DATASET, load_dataset

REPO = Path(__file__).resolve().parents[1]
FIELDS = {f.name for f in fields(RolloutResult)} | {f.name for f in fields(PlannedRollout)}
# What a result or a planned rollout is called where it is read: `result`, `results[i]`, `planned`, `item`, or a file
# read straight into a dict (`json.loads(...)`). Calls, table rows and the proxy's answers have keys of the same
# names and are other records.
RECEIVERS = re.compile(r"result|planned|^item$")
# Modules that never hold a result or a plan, and whose own records share those keys: the proxy's answers and
# stored calls, a harness's session logs.
OTHER_RECORDS = ("steps/proxy/", "steps/harnesses/")


def receiver(node: ast.expr) -> str | None:
    """The name a subscripted value goes by (`result`, `self.result`, `results[0]`), "json.loads" for a parsed
    file, None for anything else."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("load", "loads"):
        return "json.loads"
    return None


def field_reads(path: Path, root: Path = REPO) -> list[str]:
    """`file:line: code` for each `X["field"]` or `X.get("field")` where X is a result or a planned rollout as a
    raw dict and "field" one of their fields."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Subscript):
            value, key = node.value, node.slice
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args):
            value, key = node.func.value, node.args[0]
        else:
            continue
        name = receiver(value)
        if (isinstance(key, ast.Constant) and key.value in FIELDS and name is not None
                and (name == "json.loads" or RECEIVERS.search(name))):
            found.append((node.lineno, node.col_offset, f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}"))
    return [read for *_, read in sorted(found)]


def sources() -> list[Path]:
    """Every module of `steps/` and `workflows/` but the records' owner's package and `OTHER_RECORDS`."""
    return [path for folder in ("steps", "workflows") for path in sorted((REPO / folder).rglob("*.py"))
            if not path.is_relative_to(REPO / "steps" / "contracts")
            and not str(path.relative_to(REPO)).startswith(OTHER_RECORDS)]


def test_no_module_reads_a_result_or_a_planned_rollout_as_a_raw_dict():
    assert [path for path in sources() if path.name == "local.py"], "the scan sees workflows/local.py"
    offenders = [read for path in sources() for read in field_reads(path)]
    assert not offenders, "read it with steps.contracts.rollout (read_result, read_plan):\n" + "\n".join(offenders)


def test_the_scan_catches_a_planted_raw_read(tmp_path):
    """The control: the reads the runner and the evaluation made before their records were typed are caught; a
    call record's `status` is not."""
    module = tmp_path / "steps" / "planted.py"
    module.parent.mkdir()
    module.write_text('import json\n\n\n'
                      'def one(item, result, results, call, text):\n'
                      '    deadline = item["deadline_s"] + 1\n'
                      '    failed = result["status"] == "infra_error"\n'
                      '    reward = results[0].get("reward")\n'
                      '    kept = json.loads(text)["rollout_id"]\n'
                      '    answered = call["status"] == "ok"\n'
                      '    return deadline, failed, reward, kept, answered\n')
    assert [read.split(": ", 1)[1] for read in field_reads(module, tmp_path)] == [
        "item['deadline_s']", "result['status']", "results[0].get('reward')", "json.loads(text)['rollout_id']"]


# ---- the JSON forms ----

def full_result() -> RolloutResult:
    """A result with every field set, as a finished rollout leaves it."""
    return RolloutResult(rollout_id="it0-hello-file-s1-a2", task="hello-file", harness="direct", status="ok",
                         reward=0.5, rewards={"reward": 0.5, "style": 1}, num_calls=3, error=None, harness_exit_code=137,
                         durations={"setup_s": 0.1, "agent_s": 2.0, "total_s": 2.5}, weight_versions=["0", "1"],
                         response_tokens=42, paths={"harness_log": "/o/harness.log", "harness_logs": ["/o/a.jsonl"]},
                         notes=["harness.log: cut"], sample=1, metadata={"from": "test"},
                         killed=[{"process": "harness", "by": "memory", "count": 1}],
                         peak_memory_mb={"harness": 900, "agent": 12})


def test_a_result_the_rollout_step_writes_reads_back_equal(tmp_path):
    written = full_result()
    assert write_result(tmp_path, written) is None
    assert read_result(tmp_path / RESULT_FILE) == written and harness_killed(written) == "memory"
    bare = RolloutResult("r", "t", "direct", INFRA_ERROR, None)  # the runner's result before anything ran
    assert write_result(tmp_path, bare) is None and read_result(tmp_path / RESULT_FILE) == bare


def test_a_result_an_older_writer_left_fields_out_of_reads_with_their_defaults(tmp_path):
    path = tmp_path / RESULT_FILE
    path.write_text(json.dumps({"rollout_id": "it0-t-s0", "task": "t", "harness": "direct", "status": "ok",
                                "reward": 1.0, "num_calls": 2, "error": None, "durations": {"total_s": 1.0},
                                "unknown_later_field": 7}))
    result = read_result(path)
    assert (result.sample, result.killed, result.peak_memory_mb, result.response_tokens) == (None, [], {}, 0)
    assert harness_killed(result) is None and result.reward == 1.0 and result.durations == {"total_s": 1.0}


@pytest.mark.parametrize("text, why", [
    ("{not json", "not JSON"),
    ("[1, 2]", "a JSON list, not an object"),
    ('{"status": "ok", "reward": 1.0}', "it has no rollout_id"),
    ('{"rollout_id": "r", "reward": "1.0"}', "its reward is '1.0', not a number or null"),
    ('{"rollout_id": "r", "sample": true}', "its sample is True, not a number or null"),
])
def test_a_malformed_result_is_one_sentence_naming_the_file(tmp_path, text, why):
    path = tmp_path / "r" / RESULT_FILE
    path.parent.mkdir()
    path.write_text(text)
    with pytest.raises(RecordError) as caught:
        read_result(path)
    assert str(caught.value).startswith(f"{path} is not a rollout result") and why in str(caught.value)
    with pytest.raises(RecordError, match="could not be read"):
        read_result(tmp_path / "missing" / RESULT_FILE)


def test_a_plan_the_plan_step_prints_reads_back_equal(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    args = ["--dataset", str(BUILTIN_DATASET), "--iteration", "1", "--tasks-per-iteration", "3",
            "--samples-per-task", "2", "--seed", "4", "--app-rollouts", str(tmp_path / "app.json")]
    assert plan.main(args) == 0
    printed = read_plan(capsys.readouterr().out)
    tasks, _ = load_dataset(BUILTIN_DATASET)
    planned = plan.plan(tasks, 1, 3, 2, seed=4)
    with_app = read_plan((tmp_path / "app.json").read_text())
    assert printed + with_app and sorted(printed + with_app, key=lambda r: r.rollout_id) == \
        sorted(planned, key=lambda r: r.rollout_id)
    assert all(isinstance(item, PlannedRollout) for item in printed)


def test_a_malformed_plan_is_one_sentence():
    item = PlannedRollout("t", 0, "it0-t-s0", "img", 480, 1, 2048, 10240, 0).to_json()
    assert read_plan(json.dumps([item])) == [PlannedRollout.from_json(item)]
    for text, why in (("{", "is not JSON"), ("{}", "a JSON dict, not a list"),
                      (json.dumps([{**item, "deadline": 480}]), "has unknown deadline"),
                      (json.dumps([{k: v for k, v in item.items() if k != "deadline_s"}]), "lacks deadline_s")):
        with pytest.raises(RecordError, match=why):
            read_plan(text, "the plan step's output")
