"""The four trajectory tables as pyarrow schemas, defined once and checked on every read.

`calls`: one row per recorded model call. `rollouts`: one row per rollout result. `samples`: the
training samples built from a rollout's calls (see `steps.trajectories.samples`), one `SampleRow` each: the
trajectories step writes them and the update reads them with that type. `behaviour`: one row per
rollout, what the agent did (see `steps.analytics`; its metric columns are `RolloutBehaviour`'s fields). Column meanings are
in `docs/trajectories.md`.

Only pyarrow and the standard library: the update's environment (veRL) imports this module too.
"""

from dataclasses import KW_ONLY, Field, dataclass, field, fields

import pyarrow as pa

SCHEMA_VERSION = "1"
TOKENS = pa.list_(pa.int32())
LOGPROBS = pa.list_(pa.float32())


def column(data_type: pa.DataType, nullable: bool = True, **default) -> Field:
    """A row field that is a table column of `data_type` (`default`: the field's default, or kw_only=False)."""
    return field(metadata={"arrow": pa.field("column", data_type, nullable=nullable)}, **default)


def arrow_fields(row: type) -> list[pa.Field]:
    """A row type's columns, in order, each of its type."""
    return [row_field.metadata["arrow"].with_name(row_field.name) for row_field in fields(row)]


def columns(row: type) -> list[str]:
    """The column names of a row type, in order.

    >>> columns(SampleRow)[:3]
    ['run', 'iteration', 'rollout_id']
    """
    return [row_field.name for row_field in fields(row)]


@dataclass
class RowKeys:
    """Who a row belongs to; leads every table so the four join on (run, iteration, rollout_id)."""

    _: KW_ONLY
    run: str | None = column(pa.string(), nullable=False, default=None)
    iteration: int | None = column(pa.int32(), nullable=False, default=None)
    rollout_id: str = column(pa.string(), nullable=False, kw_only=False)
    task: str | None = column(pa.string(), kw_only=False)
    sample: int | None = column(pa.int32(), default=None)  # the rollout's index within its task group (GRPO group member)
    harness: str | None = column(pa.string(), default=None)


_KEYS = arrow_fields(RowKeys)

CALL_TIMINGS = ["received_at", "upstream_started_at", "upstream_ended_at", "responded_at", "upstream_s", "total_s"]
ROLLOUT_DURATIONS = ["setup_s", "agent_s", "verifier_s", "total_s"]


def _with_meta(name: str, fields: list[pa.Field]) -> pa.Schema:
    return pa.schema(fields, metadata={"openforge.table": name, "openforge.schema_version": SCHEMA_VERSION})


CALLS = _with_meta("calls", _KEYS + [
    pa.field("call_index", pa.int32(), nullable=False),
    pa.field("dialect", pa.string()),
    pa.field("stream", pa.bool_()),
    pa.field("status", pa.string()),
    pa.field("prompt_token_ids", TOKENS),
    pa.field("response_token_ids", TOKENS),
    pa.field("response_logprobs", LOGPROBS),
    pa.field("finish_reason", pa.string()),
    pa.field("weight_version", pa.string()),
    pa.field("replica", pa.int32()),  # the vLLM replica that served it; null in records of older stores
    pa.field("adapter", pa.string()),  # a LoRA run's adapter that served it (policy-vN); null: the full weights
    # The settings vLLM sampled the call with (the record's `sampling`: the run's, forced by the proxy).
    pa.field("temperature", pa.float64()),
    pa.field("top_p", pa.float64()),
    pa.field("top_k", pa.int32()),
    *[pa.field(name, pa.float64()) for name in CALL_TIMINGS],
    pa.field("error", pa.string()),
    pa.field("sample_index", pa.int32()),  # the training sample this call went into; null if skipped
    pa.field("continued", pa.bool_()),  # it extended an existing sample token-exactly
    pa.field("images", pa.list_(pa.string())),  # its images' SHA-256 names, in prompt order (layout.images_url)
    pa.field("untrainable", pa.string()),  # why an answered call is in no sample (no token ids, image tokens ...)
])

ROLLOUTS = _with_meta("rollouts", _KEYS + [
    pa.field("status", pa.string()),
    pa.field("reward", pa.float64()),
    pa.field("rewards", pa.string()),  # the verifier's named rewards as a JSON object
    pa.field("error", pa.string()),
    *[pa.field(name, pa.float64()) for name in ROLLOUT_DURATIONS],
    pa.field("harness_exit_code", pa.int32()),
    pa.field("harness_killed", pa.string()),  # the limit that killed its harness (memory, pids, time); null if none
    pa.field("num_calls", pa.int32()),
    pa.field("response_tokens", pa.int64()),
    pa.field("weight_versions", pa.list_(pa.string())),
    pa.field("num_samples", pa.int32()),
])


@dataclass
class SampleRow(RowKeys):
    """One training sample, a row of the `samples` table: the first call's prompt, then every token after it,
    `response_mask` 1 on the sampled ones. Its fields are the table's columns, in order (`SAMPLES`); those the
    update trains on come first in its constructor, the rest are keywords (`SampleRow("r", "task", prompt,
    response, mask, logprobs, reward)`). Read from a file without a column, a field keeps its default."""

    _: KW_ONLY
    # Its position among its rollout's training samples; a reader of a file without it names the row ("row N").
    sample_index: int | str | None = column(pa.int32(), nullable=False, default=None)
    prompt_token_ids: list[int] = column(TOKENS, kw_only=False)
    response_token_ids: list[int] = column(TOKENS, kw_only=False)
    response_mask: list[int] = column(pa.list_(pa.int8()), kw_only=False)
    # The sampler's, aligned with response_token_ids, 0 where the mask is 0; None if a merged call had none.
    response_logprobs: list[float] | None = column(LOGPROBS, kw_only=False)
    reward: float | None = column(pa.float64(), kw_only=False)
    loss_weight: float = column(pa.float64(), default=1.0, kw_only=False)
    num_calls: int | None = column(pa.int32(), default=None)
    call_indices: list[int] | None = column(pa.list_(pa.int32()), default=None)
    weight_versions: list[str] | None = column(pa.list_(pa.string()), default=None)
    images: list[str] | None = column(pa.list_(pa.string()), default=None)  # SHA-256 names in prompt order


SAMPLES = _with_meta("samples", arrow_fields(SampleRow))

BEHAVIOUR = _with_meta("behaviour", _KEYS + [
    # The rollout's outcome and weights, so that pass/fail and checkpoint splits need no join.
    pa.field("status", pa.string()),
    pa.field("reward", pa.float64()),
    pa.field("weight_version", pa.string()),  # comma-separated when it changed mid-rollout
    pa.field("calls", pa.int32()),
    pa.field("turns", pa.int32()),
    pa.field("failed_calls", pa.int32()),
    pa.field("tool_calls", pa.int32()),
    pa.field("tool_counts", pa.string()),  # JSON object: tool name -> calls
    pa.field("tools_offered", pa.int32()),
    pa.field("tools_used", pa.int32()),
    pa.field("tool_coverage", pa.float64()),
    pa.field("shell_calls", pa.int32()),
    pa.field("shell_share", pa.float64()),
    pa.field("changes", pa.int32()),
    pa.field("self_verified", pa.bool_()),
    pa.field("plan_completion", pa.float64()),
    pa.field("tool_failures", pa.int32()),
    pa.field("repeated_after_failure", pa.int32()),
    pa.field("changed_after_failure", pa.int32()),
    pa.field("response_tokens", pa.int64()),
    pa.field("tokens_per_call", pa.float64()),
    pa.field("finish_reasons", pa.string()),  # JSON object: finish reason -> calls
    pa.field("unreadable", pa.int32()),
])

# Columns a table gained after schema version 1 was first written: an older file reads with nulls there.
ADDED_LATER = {"calls": ("temperature", "top_p", "top_k", "replica", "adapter", "images", "untrainable"), "samples": ("images",),
               "rollouts": ("harness_killed",)}

TABLES: dict[str, pa.Schema] = {"calls": CALLS, "rollouts": ROLLOUTS, "samples": SAMPLES, "behaviour": BEHAVIOUR}


class SchemaError(ValueError):
    """A trajectory file whose columns are not the documented ones."""


def describe(data_type: pa.DataType) -> str:
    """A type as the docs write it, whatever the list's item field is called.

    >>> describe(pa.list_(pa.int32()))
    'list<int32>'
    """
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return f"list<{describe(data_type.value_type)}>"
    return str(data_type)


def check_schema(table: pa.Table, expected: pa.Schema, where: str) -> pa.Table:
    """`table` restricted to `expected`'s columns, in order; raises SchemaError naming the first bad column.

    Extra columns are dropped (a newer writer may add some); a column added since a table was written
    (`ADDED_LATER`) reads as nulls; any other missing column or another type is refused.
    """
    for field in expected:
        index = table.schema.get_field_index(field.name)
        if index < 0 and field.name in ADDED_LATER.get(expected.metadata[b"openforge.table"].decode(), ()):
            table = table.append_column(field, pa.nulls(len(table), field.type))
            continue
        if index < 0:
            raise SchemaError(f"{where} has no column {field.name!r} (expected {describe(field.type)}).")
        found = table.schema.field(index).type
        if found != field.type:
            raise SchemaError(f"column {field.name!r} in {where} is {describe(found)}, expected {describe(field.type)}.")
    # Parquet names a list's item `element`; the cast (no copy) gives readers exactly the documented schema.
    return table.select(expected.names).cast(expected)


def empty(name: str) -> pa.Table:
    """An empty table of the named kind (a partition with no rollouts still gets its files)."""
    return TABLES[name].empty_table()
