"""The records that cross a step boundary, read with the type they were written with (`steps/contracts/`).

- The samples table's row, `SampleRow`: its fields are the Parquet schema's columns, the update's required
  columns are among them, and a table the trajectories step writes reads back in the update as the rows
  written; a file without a column the update trains on is refused, naming it (the control).
- The proxy's call record, `CallRecord`: what the real proxy stores is exactly its JSON form, key for key, and
  reads back as the record stored (its prompt and request made whole); a record of an older store, without
  the keys added since, still reads, with their defaults (the control: the same record with them).
- The manifest's records (`IterationRecord`, `EvalRecord`): written by `steps.manifest`, read back equal; one
  written before a field existed, or by a newer writer with one more, still reads.
"""

import asyncio
import dataclasses
import json

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from proxy_process import start_proxy, stop_proxy
from screenshots import CapturingUpstream
from test_store_images import chat, local_log, post, user
from steps import manifest
from steps.contracts import layout
from steps.contracts.rollout import RolloutResult
from steps.contracts.calls import CallRecord
from steps.contracts.manifest import EvalRecord, IterationRecord
from steps.contracts.table_files import partition_url, read_table, write_tables
from steps.contracts.tables import SAMPLES, SampleRow, arrow_fields, columns
from steps.proxy.store import CallStore
from steps.trajectories.collect import collect

ADMIN = "test-admin-key"


@pytest.fixture
def update_batch():
    return pytest.importorskip("steps.update.batch", reason="the update's batch needs torch")


def call(index: int, prompt: list[int], response: list[int]) -> dict:
    return {"call_index": index, "status": "ok", "prompt_token_ids": prompt, "response_token_ids": response,
            "response_logprobs": [-0.5] * len(response), "weight_version": "0"}


def test_the_sample_rows_columns_are_the_parquet_schemas_and_the_update_reads_them(update_batch):
    assert columns(SampleRow) == SAMPLES.names
    assert pa.schema(arrow_fields(SampleRow)).equals(SAMPLES)
    assert set(update_batch.SAMPLE_COLUMNS) < set(SAMPLES.names)
    assert update_batch.Sample is SampleRow


def test_a_samples_table_the_trajectories_step_writes_reads_back_in_the_update_as_the_rows_written(tmp_path, update_batch):
    results = [RolloutResult(rollout_id=rid, task="t", sample=n, status="ok", reward=float(n), harness="direct")
               for n, rid in enumerate(["r0", "r1"])]
    calls = {"r0": [call(0, [1, 2], [3]), call(1, [1, 2, 3, 4], [5])], "r1": [call(0, [7], [8]), call(1, [9], [10])]}
    partition = partition_url(str(tmp_path), "run", 0)
    write_tables(collect(results, calls, "run", 0)[0].tables(), partition)
    written = read_table(partition, "samples").to_pylist()
    read = update_batch.read_samples(partition)
    assert len(written) == 3 and [dataclasses.asdict(sample) for sample in read] == written
    assert read[0].response_mask == [1, 0, 1] and read[2].sample_index == 1 and read[2].call_indices == [1]


def test_a_samples_file_without_a_column_the_update_trains_on_is_refused_naming_it(tmp_path, update_batch):
    row = SampleRow("r", "t", [1, 2], [3], [1], [-0.5], 1.0, run="run", iteration=0, sample_index=0, images=[])
    full = {name: getattr(row, name) for name in columns(SampleRow)}
    pq.write_table(pa.Table.from_pylist([full], schema=SAMPLES), tmp_path / "samples.parquet")
    assert update_batch.read_samples(str(tmp_path)) == [row]  # the control: the whole row reads
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in full.items() if k != "reward"}]),
                   tmp_path / "samples.parquet")
    with pytest.raises(update_batch.SampleError, match="missing column.s. reward"):
        update_batch.read_samples(str(tmp_path))


def test_a_call_record_round_trips_through_its_json_form():
    record = CallRecord(rollout_id="r", call_index=3, dialect="messages", stream=True, status="ok", weight_version="2",
                        replica=1, prompt_token_ids=[1, 2], response_token_ids=[3], response_logprobs=[-0.25],
                        finish_reason="stop", sampling={"temperature": 1.0}, sampling_requested={"temperature": 0.2},
                        timings={"received_at": 1.5, "total_s": 0.25}, request={"messages": []}, images=[],
                        response=[{"event": "message_stop", "data": {}}], error=None)
    stored = record.to_json()
    assert next(iter(stored)) == "rollout_id" and not {"untrainable", "usage", "store_error"} & set(stored)
    assert CallRecord.from_json(orjson.loads(orjson.dumps(stored))) == record
    external = dataclasses.replace(record, untrainable="no token ids", usage={"completion_tokens": 4})
    assert CallRecord.from_json(orjson.loads(orjson.dumps(external.to_json()))) == external


def test_what_the_proxy_stores_is_the_call_records_json_form_and_reads_back_as_stored(tmp_path):
    root = tmp_path / "store"
    with CapturingUpstream() as upstream:
        proxy = start_proxy(upstream.url, str(root), ADMIN, log_path=tmp_path / "proxy.log")
        try:
            rollout = proxy.register("r")
            url, key = f"{rollout['openai_base_url']}/chat/completions", rollout["api_key"]
            first = [user("hello")]
            assert post(url, key, chat(first))[0] == 200
            assert post(url, key, chat([*first, {"role": "assistant", "content": "hi"}, user("more")], stream=True))[0] == 200
            served = proxy.calls("r")
        finally:
            stop_proxy(proxy)
    stored = [orjson.loads(line) for line in local_log(root, "r")]
    assert [list(line) for line in stored] == [list(CallRecord.from_json(line).to_json()) for line in stored]
    assert stored[1]["prompt_shared"] is not None  # the second call's prompt extends the first's as stored
    read = [CallRecord.from_json(call) for call in asyncio.run(CallStore(str(root)).read_calls("r")).calls]
    assert read == [CallRecord.from_json(call) for call in served]  # the admin route gives the store's reading
    assert read[0] == CallRecord.from_json(stored[0])
    whole = dataclasses.replace(CallRecord.from_json(stored[1]), prompt_token_ids=read[1].prompt_token_ids,
                                prompt_shared=None, request=read[1].request, request_shared=None)
    assert read[1] == whole and read[1].prompt_token_ids[:len(read[0].prompt_token_ids)] == read[0].prompt_token_ids
    assert read[1].status == "ok" and read[1].stream and read[1].replica == 0 and read[1].response_token_ids


def test_a_record_of_an_older_store_without_the_keys_added_since_still_reads(tmp_path):
    newer = CallRecord(rollout_id="old", call_index=0, dialect="chat_completions", stream=False, status="ok",
                       weight_version=0, replica=0, prompt_token_ids=[1, 2], response_token_ids=[3],
                       response_logprobs=[-0.5], finish_reason="stop", sampling={"temperature": 1.0},
                       sampling_requested={}, timings={"received_at": 1.0}, request={"messages": []},
                       images=[], response={"choices": []})
    older = {key: value for key, value in newer.to_json().items()
             if key not in ("replica", "images", "sampling_requested", "prompt_shared", "request_shared")}
    log = tmp_path / "store" / "rollouts" / "old" / "calls.jsonl"
    log.parent.mkdir(parents=True)
    for record in (older, newer.to_json()):  # the control: the newer record, whole
        log.write_bytes(orjson.dumps(record) + b"\n")
        (call,) = asyncio.run(CallStore(str(tmp_path / "store")).read_calls("old")).calls
        rows, _ = collect([RolloutResult(rollout_id="old", task="t", harness="direct", status="ok", reward=1.0)],
                          {"old": [call]}, "run", 0)
        assert rows.calls["call_index"] == [0] and rows.samples["prompt_token_ids"] == [[1, 2]]
        assert rows.calls["replica"] == [0 if record is not older else None]
        read = CallRecord.from_json(call)
        assert read == (newer if record is not older else dataclasses.replace(newer, replica=None))


def test_the_manifests_records_read_back_as_written_and_older_or_newer_ones_still_read(tmp_path):
    run_url = str(tmp_path / "run")
    entry = IterationRecord(0, "local", "ckpt-0", "ckpt-1", status="Succeeded", metrics={"loss": 0.5},
                            timings_s={"update": 2.0}, reason=None)
    manifest.record(run_url, entry)
    manifest.record_eval(run_url, EvalRecord(0, "local", "ckpt-0", status="Failed"))
    assert manifest.read_iterations(run_url) == {0: entry} and manifest.read_evals(run_url)[0].done
    stored = json.loads((tmp_path / "run" / "manifest" / "iteration-0.json").read_text())
    assert IterationRecord.from_json(stored) == entry and entry.to_json() == stored
    older = {key: value for key, value in stored.items() if key not in ("phase_times", "reason", "staleness")}
    url = layout.iteration_record_url(run_url, 1)
    manifest.write_json(url, {**older, "iteration": 1, "added_later": True})
    assert manifest.read_iterations(run_url)[1] == dataclasses.replace(entry, iteration=1)
