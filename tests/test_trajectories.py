"""Trajectories: calls and results become Parquet tables (local folder and a real S3 endpoint on
loopback), and a rollout's calls become token-exact training samples.

Sample building is checked on crafted calls (continuation, rewritten history, compaction, a side call
in between, failed calls) and on the calls that real harnesses (`direct`, `codex`) recorded through the
real proxy against the scripted model; the CLI runs end to end on those.
"""

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scripted_model import ScriptedModel
from test_harnesses import installed_exe

from steps.rollout import RolloutSpec, run_rollout
from steps.sampling import NEUTRAL, as_flags
from steps.tasks import BUILTIN_DATASET
from steps.contracts.table_files import TrajectoryFileError, partition_url, read_table, write_table, write_tables
from steps.contracts.tables import CALLS, SAMPLES, SchemaError
from steps.trajectories import build_samples
from steps.trajectories.collect import collect
from steps.contracts.rollout import RolloutResult

ADMIN_KEY = "test-admin-key"


def call(index: int, prompt: list[int], response: list[int], status: str = "ok", version: str = "0") -> dict:
    """A crafted call record in the proxy's shape; logprob of response token i is -(index + i / 10)."""
    return {"rollout_id": "r", "call_index": index, "status": status, "dialect": "chat_completions", "stream": False,
            "prompt_token_ids": prompt, "response_token_ids": response,
            "response_logprobs": [-(index + i / 10) for i in range(len(response))], "finish_reason": "stop",
            "weight_version": version, "timings": {"received_at": 1.0, "total_s": 0.5}}


def assert_aligned(sample, calls: list[dict]) -> None:
    """Mask 1 exactly on the merged calls' response tokens, in order, with their logprobs; 0 elsewhere."""
    merged = [c for c in calls if c["call_index"] in sample.call_indices]
    sampled = [t for t, m in zip(sample.response_token_ids, sample.response_mask) if m == 1]
    assert sampled == [t for c in merged for t in c["response_token_ids"]]
    assert len(sample.response_mask) == len(sample.response_token_ids) == len(sample.response_logprobs)
    assert [lp for lp, m in zip(sample.response_logprobs, sample.response_mask) if m == 1] == \
        pytest.approx([lp for c in merged for lp in c["response_logprobs"]])
    assert all(lp == 0.0 for lp, m in zip(sample.response_logprobs, sample.response_mask) if m == 0)
    tokens = sample.prompt_token_ids + sample.response_token_ids
    for c in merged:  # every merged call saw exactly a prefix of the sample, and sampled what follows it
        n = len(c["prompt_token_ids"])
        assert tokens[:n] == c["prompt_token_ids"]
        assert tokens[n:n + len(c["response_token_ids"])] == c["response_token_ids"]


# --- sample building on crafted calls ---------------------------------------------------------------

def test_a_continued_conversation_is_one_sample_with_tool_output_masked():
    calls = [call(0, [1, 2, 3], [10, 11]), call(1, [1, 2, 3, 10, 11, 50, 51], [12]),
             call(2, [1, 2, 3, 10, 11, 50, 51, 12, 60], [13, 14])]
    built = build_samples(calls)
    (sample,) = built.samples
    assert sample.prompt_token_ids == [1, 2, 3]
    assert sample.response_token_ids == [10, 11, 50, 51, 12, 60, 13, 14]
    assert sample.response_mask == [1, 1, 0, 0, 1, 0, 1, 1]
    assert sample.response_logprobs == pytest.approx([0, -0.1, 0, 0, -1, 0, -2, -2.1])
    assert built.continued_calls == {1, 2} and built.continuable_calls == 2
    assert_aligned(sample, calls)


def test_a_rewritten_history_starts_a_new_sample():
    # call 1's prompt re-renders call 0's answer differently (token 10 -> 99): not the sampled tokens
    calls = [call(0, [1, 2], [10, 11]), call(1, [1, 2, 99, 11, 50], [12])]
    built = build_samples(calls)
    assert [s.call_indices for s in built.samples] == [[0], [1]] and built.continued_calls == set()
    assert built.samples[1].prompt_token_ids == [1, 2, 99, 11, 50] and built.samples[1].response_mask == [1]
    for sample in built.samples:
        assert_aligned(sample, calls)


def test_compaction_starts_a_new_sample_and_later_calls_continue_it():
    calls = [call(0, [1, 2, 3, 4], [10]), call(1, [1, 2, 3, 4, 10, 5], [11]),
             call(2, [1, 77], [12]),  # compacted: a summary replaces the history
             call(3, [1, 77, 12, 6], [13])]
    built = build_samples(calls)
    assert [s.call_indices for s in built.samples] == [[0, 1], [2, 3]]
    assert built.continued_calls == {1, 3} and built.continuable_calls == 3
    for sample in built.samples:
        assert_aligned(sample, calls)


def test_a_side_call_in_between_does_not_split_the_main_conversation():
    calls = [call(0, [1, 2], [10]), call(1, [8, 9], [20]),  # e.g. a title request
             call(2, [1, 2, 10, 5], [11])]
    built = build_samples(calls)
    assert [s.call_indices for s in built.samples] == [[0, 2], [1]]
    assert built.sample_of_call == {0: 0, 1: 1, 2: 0}


def test_failed_calls_are_skipped_and_missing_logprobs_are_not_invented():
    calls = [call(0, [1], [10]), call(1, [1, 10, 5], [11], status="aborted"),
             call(2, [1, 10, 5], [12], status="error"), call(3, [1, 10, 5], [13], version="1")]
    built = build_samples(calls)
    (sample,) = built.samples
    assert sample.call_indices == [0, 3] and sample.weight_versions == ["0", "1"] and built.used_calls == 2
    calls[3]["response_logprobs"] = None
    assert build_samples(calls).samples[0].response_logprobs is None


def test_each_rollout_weighs_one_in_the_loss_and_infra_errors_give_no_samples():
    results = [{"rollout_id": "a", "task": "t", "sample": 0, "harness": "direct", "status": "ok", "reward": 1.0},
               {"rollout_id": "b", "task": "t", "sample": 1, "harness": "direct", "status": "ok", "reward": 0.0},
               {"rollout_id": "c", "task": "t", "sample": 2, "harness": "direct", "status": "infra_error", "reward": None}]
    calls = {"a": [call(0, [1], [2]), call(1, [7], [8]), call(2, [9], [9])], "b": [call(0, [1], [3])],
             "c": [call(0, [1], [4])]}
    rows, stats = collect([RolloutResult.from_json(r) for r in results], calls, "run", 0)
    tables = rows.tables()
    samples = tables["samples"].to_pylist()
    assert [(s["rollout_id"], s["loss_weight"], s["reward"]) for s in samples] == \
        [("a", pytest.approx(1 / 3), 1.0)] * 3 + [("b", 1.0, 0.0)]
    assert tables["rollouts"].column("sample").to_pylist() == [0, 1, 2]
    assert tables["calls"].num_rows == 5  # the infra error's calls stay on record, untrained
    assert stats["direct"] == {"rollouts": 2, "calls": 4, "samples": 4, "continuity_rate": 0.0,
                               "samples_per_rollout": 2.0}


def test_the_calls_table_has_the_settings_vllm_sampled_with_and_nulls_for_an_older_record():
    results = [{"rollout_id": "a", "task": "t", "harness": "direct", "status": "ok", "reward": 1.0}]
    sent = {"temperature": 0.7, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "max_tokens": 16}
    asked = {"temperature": 0.2, "top_p": 0.5}
    calls = {"a": [{**call(0, [1], [2]), "sampling": sent, "sampling_requested": asked}, call(1, [1, 2], [3])]}
    rows, _ = collect([RolloutResult.from_json(r) for r in results], calls, "run", 0)
    table = rows.tables()["calls"]
    assert [(r["temperature"], r["top_p"], r["top_k"]) for r in table.to_pylist()] == \
        [(0.7, 1.0, 0), (None, None, None)]
    assert [table.schema.field(name).type for name in ("temperature", "top_p", "top_k")] == \
        [pa.float64(), pa.float64(), pa.int32()]


def test_the_tiny_models_real_template_continues_unless_arguments_are_reserialised(tiny_model):
    """Qwen2.5's template (the tiny model's) is append-only when the harness sends the sampled tool-call
    arguments back verbatim; a harness that parses them and sends an object back gets them re-rendered
    with `tojson`'s spacing, which is not what was sampled, so a new sample starts (no drift trained on)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}}}}]
    history = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Write hello"}]

    def prompt(messages: list[dict]) -> list[int]:
        text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        return tok.encode(text, add_special_tokens=False)

    sampled = '{"command":"echo hello > answer.txt"}'
    response = tok.encode(f'<tool_call>\n{{"name": "bash", "arguments": {sampled}}}\n</tool_call>',
                          add_special_tokens=False) + [tok.eos_token_id]
    for sent_back, continued in ((sampled, True), (json.loads(sampled), False)):
        turn = [{"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": sent_back}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
        calls = [call(0, prompt(history), response), call(1, prompt(history + turn), tok.encode("done"))]
        built = build_samples(calls)
        assert (built.continued_calls == {1}) is continued and len(built.samples) == (1 if continued else 2)
        for sample in built.samples:
            assert_aligned(sample, calls)


def test_sample_numbers_come_from_the_results_when_a_failed_attempt_is_left_beside_its_retry(tmp_path):
    """`r-0` failed (infra_error) and its retry ran as `r-0-a2`: both results sit in the iteration's folder.
    Every table takes each rollout's sample number from its result; the failed attempt gives no samples,
    so each (task, sample) is trained on once. A result that names no sample gets a null, not a position."""
    from steps.trajectories.collect import load_results

    results = {"r-0": ("infra_error", 0), "r-0-a2": ("ok", 0), "r-1": ("ok", 1), "old": ("ok", None)}
    for rollout_id, (status, sample) in results.items():
        (tmp_path / rollout_id).mkdir()
        (tmp_path / rollout_id / "result.json").write_text(json.dumps({
            "rollout_id": rollout_id, "task": "t" if rollout_id != "old" else "u", "harness": "direct",
            "status": status, "reward": None if status == "infra_error" else 1.0,
            **({} if sample is None else {"sample": sample})}))
    calls = {rid: [call(0, [1], [2 + n]), call(1, [7], [8])] for n, rid in enumerate(results)}
    tables = collect(load_results(str(tmp_path)), calls, "run", 0)[0].tables()
    expected = {rid: sample for rid, (_, sample) in results.items()}
    for name in ("rollouts", "calls", "samples"):
        rows = tables[name].to_pylist()
        assert rows and all(row["sample"] == expected[row["rollout_id"]] for row in rows), name
    samples = tables["samples"].to_pylist()
    assert {s["rollout_id"] for s in samples} == {"r-0-a2", "r-1", "old"}
    trained = {(s["task"], s["sample"]): s["rollout_id"] for s in samples}
    assert len(trained) == len({s["rollout_id"] for s in samples}) == 3  # one rollout per group member
    # Control: numbering the task's rollouts by their position among its ids, as before, miscounts here.
    by_position = {rid: n for n, rid in enumerate(sorted(rid for rid in results if rid != "old"))}
    assert [by_position[r] for r in ("r-0-a2", "r-1")] != [expected[r] for r in ("r-0-a2", "r-1")]


def test_results_that_are_not_rollout_results_are_named(tmp_path):
    from steps.trajectories.collect import CollectError, load_results

    with pytest.raises(CollectError, match="no rollout results under"):
        load_results(str(tmp_path))
    for folder, body in (("a", {"rollout_id": "r1"}), ("b", {"rollout_id": "r1"})):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "result.json").write_text(json.dumps(body))
    with pytest.raises(CollectError, match=r"b/result.json and .*a/result.json are both results of rollout 'r1'"):
        load_results(str(tmp_path))
    (tmp_path / "b" / "result.json").write_text("{not json")
    with pytest.raises(CollectError, match=r"b/result.json is not a rollout result"):
        load_results(str(tmp_path))


# --- Parquet files: round trips, schema, truncation ---------------------------------------------------

def crafted_tables() -> dict[str, pa.Table]:
    results = [{"rollout_id": f"r{i}", "task": "hello-file", "harness": "direct", "status": "ok", "reward": 1.0,
                "rewards": {"reward": 1.0}, "durations": {"total_s": 2.5}, "num_calls": 2} for i in range(3)]
    calls = {f"r{i}": [call(0, [1, 2, i], [10, 11]), call(1, [1, 2, i, 10, 11, 5], [12])] for i in range(3)}
    return collect([RolloutResult.from_json(r) for r in results], calls, "demo", 4)[0].tables()


def assert_round_trip(out: str, storage_options: dict | None = None) -> None:
    tables = crafted_tables()
    partition = partition_url(out, "demo", 4)
    files = write_tables(tables, partition, storage_options)
    assert files["calls"] == f"{out}/run=demo/iteration=4/calls.parquet"
    for name, table in tables.items():
        assert read_table(partition, name, storage_options).equals(table), name


def test_round_trip_through_a_local_folder(tmp_path):
    assert_round_trip(str(tmp_path / "traj"))
    folder = tmp_path / "traj" / "run=demo" / "iteration=4"
    assert sorted(p.name for p in folder.iterdir()) == ["behaviour.parquet", "calls.parquet", "rollouts.parquet",
                                                        "samples.parquet"]
    assert pq.read_metadata(folder / "calls.parquet").row_group(0).column(0).compression == "ZSTD"


def test_round_trip_through_s3_on_loopback(s3_server):
    options = {"key": "testing", "secret": "testing", "endpoint_url": s3_server["endpoint_url"]}
    assert_round_trip(f"s3://{s3_server['bucket']}/traj-{uuid.uuid4().hex[:6]}", options)


def test_a_column_of_the_wrong_type_is_refused_on_read(tmp_path):
    table = crafted_tables()["calls"]
    wrong = table.set_column(table.schema.get_field_index("prompt_token_ids"), "prompt_token_ids",
                             table.column("prompt_token_ids").cast(pa.list_(pa.int64())))
    (tmp_path / "p").mkdir()
    pq.write_table(wrong, tmp_path / "p" / "calls.parquet")
    with pytest.raises(SchemaError, match=r"column 'prompt_token_ids' in .*calls.parquet is list<int64>, "
                                          r"expected list<int32>\."):
        read_table(str(tmp_path / "p"), "calls")
    with pytest.raises(SchemaError, match="prompt_token_ids"):  # and never written in the first place
        write_table(wrong, str(tmp_path / "q"), "calls")
    assert not (tmp_path / "q").exists()


def test_a_missing_column_is_refused_on_read(tmp_path):
    table = crafted_tables()["samples"].drop_columns(["response_mask"])
    (tmp_path / "p").mkdir()
    pq.write_table(table, tmp_path / "p" / "samples.parquet")
    with pytest.raises(SchemaError, match="samples.parquet has no column 'response_mask'"):
        read_table(str(tmp_path / "p"), "samples")


def test_a_truncated_file_is_refused_with_its_name(tmp_path, s3_server):
    partition = str(tmp_path / "p")
    path = Path(write_table(crafted_tables()["samples"], partition, "samples"))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TrajectoryFileError, match=rf"{path} is not a complete Parquet file"):
        read_table(partition, "samples")
    import s3fs
    options = {"key": "testing", "secret": "testing", "endpoint_url": s3_server["endpoint_url"]}
    url = f"s3://{s3_server['bucket']}/trunc-{uuid.uuid4().hex[:6]}"
    s3fs.S3FileSystem(**options).pipe_file(f"{url[5:]}/samples.parquet", data[:-100])
    with pytest.raises(TrajectoryFileError, match=rf"{url}/samples.parquet is not a complete Parquet file"):
        read_table(url, "samples", options)
    with pytest.raises(TrajectoryFileError, match="does not exist"):
        read_table(url, "calls", options)


def test_a_failed_write_leaves_no_file_behind(tmp_path, monkeypatch):
    def crash(table, where, **kwargs):
        Path(where).write_bytes(b"PAR1 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", crash)
    with pytest.raises(OSError, match="disk full"):
        write_table(crafted_tables()["calls"], str(tmp_path), "calls")
    assert list(tmp_path.iterdir()) == []


# --- real harness runs through the real proxy, and the CLI ------------------------------------------

@pytest.fixture(scope="module")
def recorded(proxy, tmp_path_factory):
    """One `hello-file` rollout per harness (direct, and codex when installed) through the real proxy
    against the scripted model, plus one infra-error result; yields (proxy, store, results folder, calls)."""
    results = tmp_path_factory.mktemp("results")
    store = str(tmp_path_factory.mktemp("store"))
    with ScriptedModel(model="tiny") as scripted:
        served = proxy(scripted.url, store=store, extra=as_flags({**NEUTRAL, "temperature": 0.7}))  # as `serve` runs it
        script = (BUILTIN_DATASET / "hello-file" / "solution" / "solve.sh").read_text()
        calls = {}
        for harness in ("direct", "codex"):
            if harness == "codex" and not _installed(harness):
                continue
            scripted.set_commands([f"bash <<'OPENFORGE_ORACLE'\n{script}\nOPENFORGE_ORACLE"])
            spec = RolloutSpec(task=BUILTIN_DATASET / "hello-file", harness=harness, proxy_url=served.url,
                               rollout_id=f"{harness}-hello-file-0", out=results / f"{harness}-hello-file-0",
                               admin_key=ADMIN_KEY, sample=0)
            result = run_rollout(spec)
            assert (result.status, result.reward) == ("ok", 1.0), result
            calls[spec.rollout_id] = served.calls(spec.rollout_id)
        broken = results / "direct-hello-file-1"  # an infra error the proxy never heard of
        broken.mkdir()
        (broken / "result.json").write_text(json.dumps({"rollout_id": "direct-hello-file-1", "task": "hello-file",
                                                        "harness": "direct", "status": "infra_error", "reward": None,
                                                        "sample": 1, "error": "sandbox failed"}))
        yield served, store, results, calls


def _installed(harness: str) -> bool:
    try:
        installed_exe(harness)
        return True
    except pytest.skip.Exception:
        return False


def test_samples_from_real_harness_calls_mask_exactly_the_recorded_response_tokens(recorded):
    _, _, _, calls = recorded
    for rollout_id, rollout_calls in calls.items():
        assert len(rollout_calls) >= 2 and all(c["status"] == "ok" for c in rollout_calls)
        built = build_samples(rollout_calls)
        for sample in built.samples:
            assert_aligned(sample, rollout_calls)
        # The scripted model's prompt is the JSON of {"messages": [...], "tools": [...]}, 3 bytes a token:
        # a later call inserts its new messages before `],"tools"`, and the assistant turn comes back as a
        # JSON tool_calls object, not the `<tool_call>` text that was sampled. So no call's prompt starts
        # with the previous prompt + response: each call is its own sample, and the continuity rate is 0.
        assert built.continued_calls == set() and len(built.samples) == len(rollout_calls), rollout_id
        first, second = rollout_calls[0], rollout_calls[1]
        n = len(first["prompt_token_ids"])
        assert second["prompt_token_ids"][:n] != first["prompt_token_ids"]


def _run_cli(*args: str, env: dict | None = None) -> dict:
    done = subprocess.run([sys.executable, "-m", "steps.trajectories", *args], capture_output=True, text=True, check=False,
                          env={**os.environ, "OPENFORGE_ADMIN_KEY": ADMIN_KEY, **(env or {})}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "rollouts merged" in done.stderr
    return json.loads(done.stdout)


def test_the_cli_writes_readable_tables_from_the_proxy(recorded, tmp_path):
    served, _, results, calls = recorded
    summary = _run_cli("--proxy-url", served.url, "--results", str(results), "--out", str(tmp_path),
                       "--run", "t", "--iteration", "2")
    partition = partition_url(str(tmp_path), "t", 2)
    assert summary["partition"] == partition
    n_calls = sum(len(c) for c in calls.values())
    assert summary["rows"] == {"calls": n_calls, "rollouts": len(calls) + 1, "samples": n_calls,
                               "behaviour": len(calls) + 1}
    assert summary["harnesses"]["direct"] == {"rollouts": 1, "calls": 2, "samples": 2, "continuity_rate": 0.0,
                                              "samples_per_rollout": 2.0}
    rollouts = read_table(partition, "rollouts").to_pylist()
    # each rollout's sample number as its result.json names it (the real step wrote the first ones)
    assert [(r["rollout_id"], r["status"], r["reward"], r["sample"]) for r in rollouts] == \
        [(rid, "ok", 1.0, 0) for rid in sorted(calls)] + [("direct-hello-file-1", "infra_error", None, 1)]
    recorded_calls = read_table(partition, "calls")
    assert recorded_calls.schema.equals(CALLS, check_metadata=True)
    for row in recorded_calls.to_pylist():
        original = calls[row["rollout_id"]][row["call_index"]]
        assert row["prompt_token_ids"] == original["prompt_token_ids"]
        assert row["response_logprobs"] == original["response_logprobs"]  # scripted logprobs are exact in float32
        assert (row["temperature"], row["top_p"], row["top_k"]) == (0.7, 1.0, 0)  # the run's, forced by the proxy
    samples = read_table(partition, "samples")
    assert samples.schema.equals(SAMPLES, check_metadata=True)
    assert {r["rollout_id"] for r in samples.to_pylist()} == set(calls)
    # One behaviour row per rollout, infra errors included: the oracle's one shell call writes the answer
    # and never reads it back.
    behaviour = {r["rollout_id"]: r for r in read_table(partition, "behaviour").to_pylist()}
    assert set(behaviour) == set(calls) | {"direct-hello-file-1"}
    for rollout_id, rollout_calls in calls.items():
        row = behaviour[rollout_id]
        assert (row["status"], row["reward"], row["calls"], row["tool_calls"], row["shell_calls"]) == \
            ("ok", 1.0, len(rollout_calls), 1, 1), row
        assert (row["changes"], row["self_verified"], row["tool_failures"], row["unreadable"]) == (1, False, 0, 0), row
    assert behaviour["direct-hello-file-1"]["calls"] == 0 and behaviour["direct-hello-file-1"]["status"] == "infra_error"


def test_the_cli_reads_the_store_and_writes_to_s3(recorded, s3_server):
    _, store, results, calls = recorded
    out = f"s3://{s3_server['bucket']}/cli-{uuid.uuid4().hex[:6]}"
    summary = _run_cli("--store", store, "--results", str(results), "--out", out, env=s3_server["env"])
    options = {"key": "testing", "secret": "testing", "endpoint_url": s3_server["endpoint_url"]}
    samples = read_table(partition_url(out, "default", 0), "samples", options)
    assert samples.num_rows == summary["rows"]["samples"] == sum(len(c) for c in calls.values())


def test_the_cli_names_a_store_that_is_not_one(recorded, tmp_path):
    _, _, results, _ = recorded
    done = subprocess.run([sys.executable, "-m", "steps.trajectories", "--store", str(tmp_path / "typo"),
                           "--results", str(results), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 2 and "typo is not a proxy store" in done.stderr, done.stderr
    assert not (tmp_path / "typo").exists() and not (tmp_path / "out").exists()


def test_a_calls_table_written_before_the_sampling_columns_reads_with_nulls_there(tmp_path):
    """An older run's calls.parquet (no temperature, top_p, top_k) stays readable: those columns are null.
    Any other missing column is still refused (`test_a_missing_column_is_refused_on_read`)."""
    table = crafted_tables()["calls"]
    (tmp_path / "p").mkdir()
    pq.write_table(table.drop_columns(["temperature", "top_p", "top_k"]), tmp_path / "p" / "calls.parquet")
    read = read_table(str(tmp_path / "p"), "calls")
    assert read.schema == table.schema and read.num_rows == table.num_rows
    assert read.column("temperature").null_count == read.column("top_k").null_count == table.num_rows
    assert read.column("prompt_token_ids").to_pylist() == table.column("prompt_token_ids").to_pylist()


def test_an_attempt_that_finished_and_was_retried_anyway_is_trained_on_once(tmp_path):
    """`r-0` wrote an ok result and then its step failed, so it was retried as `r-0-a2`, which finished too:
    sample 0 of task t is one group member, trained on once, from the last attempt. Control: a different
    sample of the same task (`r-1`) is still trained on beside it."""
    from steps.trajectories.collect import load_results

    for rollout_id, sample in (("r-0", 0), ("r-0-a2", 0), ("r-1", 1)):
        (tmp_path / rollout_id).mkdir()
        (tmp_path / rollout_id / "result.json").write_text(json.dumps({
            "rollout_id": rollout_id, "task": "t", "harness": "direct", "status": "ok", "reward": 1.0,
            "sample": sample}))
    calls = {rid: [call(0, [1], [2 + n])] for n, rid in enumerate(("r-0", "r-0-a2", "r-1"))}
    tables = collect(load_results(str(tmp_path)), calls, "run", 0)[0].tables()
    assert sorted(s["rollout_id"] for s in tables["samples"].to_pylist()) == ["r-0-a2", "r-1"]
    assert len(tables["rollouts"]) == 3  # the superseded attempt is still a row of the rollouts table


# --- what a limit killed --------------------------------------------------------------------------------

def killed_results() -> list[dict]:
    """result.json files of one iteration: harnesses killed by memory (twice) and by pids, one whose agent's own
    processes were killed (its harness was not), one killed at the agent timeout, one clean, and one written
    before result.json had a `killed` list."""
    def result(rollout_id: str, killed: list | None, status: str = "ok", reward: float = 0.0) -> dict:
        return {"rollout_id": rollout_id, "task": "t", "harness": "openclaw", "status": status, "reward": reward,
                "sample": 0, "harness_exit_code": 137 if killed else 0, **({} if killed is None else {"killed": killed})}

    harness = lambda by: [{"process": "harness", "by": by, "count": 1}]  # noqa: E731
    return [result("mem-0", harness("memory")), result("mem-1", harness("memory")), result("pids-0", harness("pids")),
            result("agent-0", [{"process": "agent", "by": "memory", "count": 3}]),
            result("late-0", harness("time"), status="agent_timeout"), result("clean-0", [], reward=1.0),
            result("older-0", None, reward=1.0)]


def test_the_rollouts_table_names_what_killed_each_harness_and_the_step_counts_them(tmp_path, capsys):
    """Before: the table had `harness_exit_code` 137 and nothing else, and the step's summary said nothing."""
    from steps.trajectories.__main__ import main

    for result in killed_results():
        (tmp_path / "results" / result["rollout_id"]).mkdir(parents=True)
        (tmp_path / "results" / result["rollout_id"] / "result.json").write_text(json.dumps(result))
    (tmp_path / "store" / "rollouts").mkdir(parents=True)  # a proxy store that holds no calls
    assert main(["--store", str(tmp_path / "store"), "--results", str(tmp_path / "results"),
                 "--out", str(tmp_path / "traj"), "--run", "r", "--iteration", "3"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["harness_killed"] == {"memory": 2, "pids": 1}  # not the agent's kill, not the timeout
    assert "trajectories: warning: iteration 3: a limit killed the harness in 3 of 7 rollouts (memory 2, pids 1)" in err
    assert "raise harness_memory_mb" in err
    rows = read_table(partition_url(str(tmp_path / "traj"), "r", 3), "rollouts").to_pylist()
    assert {r["rollout_id"]: r["harness_killed"] for r in rows} == {
        "agent-0": None, "clean-0": None, "late-0": "time", "mem-0": "memory", "mem-1": "memory", "older-0": None,
        "pids-0": "pids"}


def test_an_iteration_without_a_killed_harness_counts_zero_and_warns_nothing(tmp_path, capsys):
    """Control: the same step on the clean and the older results alone."""
    from steps.trajectories.__main__ import main

    for result in killed_results()[-2:]:
        (tmp_path / "results" / result["rollout_id"]).mkdir(parents=True)
        (tmp_path / "results" / result["rollout_id"] / "result.json").write_text(json.dumps(result))
    (tmp_path / "store" / "rollouts").mkdir(parents=True)
    assert main(["--store", str(tmp_path / "store"), "--results", str(tmp_path / "results"),
                 "--out", str(tmp_path / "traj"), "--run", "r", "--iteration", "0"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["harness_killed"] == {"memory": 0, "pids": 0} and "killed" not in err


def test_a_rollouts_table_written_before_the_harness_killed_column_reads_with_nulls_there(tmp_path):
    """An older run's rollouts.parquet stays readable; its rows name no kill."""
    table = collect([RolloutResult.from_json(r) for r in killed_results()], {}, "r", 0)[0].tables()["rollouts"]
    (tmp_path / "p").mkdir()
    pq.write_table(table.drop_columns(["harness_killed"]), tmp_path / "p" / "rollouts.parquet")
    read = read_table(str(tmp_path / "p"), "rollouts")
    assert read.schema == table.schema and read.column("harness_killed").null_count == table.num_rows
