"""The records that cross a step boundary, read with the type they were written with (`steps/contracts/`).

- The samples table's row, `SampleRow`: its fields are the Parquet schema's columns, the update's required
  columns are among them, and a table the trajectories step writes reads back in the update as the rows
  written; a file without a column the update trains on is refused, naming it (the control).
"""

import dataclasses

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from steps.contracts.table_files import partition_url, read_table, write_tables
from steps.contracts.tables import SAMPLES, SampleRow, arrow_fields, columns
from steps.trajectories.collect import collect

update_batch = pytest.importorskip("steps.update.batch", reason="the update's batch needs torch")


def call(index: int, prompt: list[int], response: list[int]) -> dict:
    return {"call_index": index, "status": "ok", "prompt_token_ids": prompt, "response_token_ids": response,
            "response_logprobs": [-0.5] * len(response), "weight_version": "0"}


def test_the_sample_rows_columns_are_the_parquet_schemas_and_the_update_reads_them():
    assert columns(SampleRow) == SAMPLES.names
    assert pa.schema(arrow_fields(SampleRow)).equals(SAMPLES)
    assert set(update_batch.SAMPLE_COLUMNS) < set(SAMPLES.names)
    assert update_batch.Sample is SampleRow


def test_a_samples_table_the_trajectories_step_writes_reads_back_in_the_update_as_the_rows_written(tmp_path):
    results = [{"rollout_id": rid, "task": "t", "sample": n, "status": "ok", "reward": float(n), "harness": "direct"}
               for n, rid in enumerate(["r0", "r1"])]
    calls = {"r0": [call(0, [1, 2], [3]), call(1, [1, 2, 3, 4], [5])], "r1": [call(0, [7], [8]), call(1, [9], [10])]}
    partition = partition_url(str(tmp_path), "run", 0)
    write_tables(collect(results, calls, "run", 0)[0].tables(), partition)
    written = read_table(partition, "samples").to_pylist()
    read = update_batch.read_samples(partition)
    assert len(written) == 3 and [dataclasses.asdict(sample) for sample in read] == written
    assert read[0].response_mask == [1, 0, 1] and read[2].sample_index == 1 and read[2].call_indices == [1]


def test_a_samples_file_without_a_column_the_update_trains_on_is_refused_naming_it(tmp_path):
    row = SampleRow("r", "t", [1, 2], [3], [1], [-0.5], 1.0, run="run", iteration=0, sample_index=0, images=[])
    full = {name: getattr(row, name) for name in columns(SampleRow)}
    pq.write_table(pa.Table.from_pylist([full], schema=SAMPLES), tmp_path / "samples.parquet")
    assert update_batch.read_samples(str(tmp_path)) == [row]  # the control: the whole row reads
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in full.items() if k != "reward"}]),
                   tmp_path / "samples.parquet")
    with pytest.raises(update_batch.SampleError, match="missing column.s. reward"):
        update_batch.read_samples(str(tmp_path))
