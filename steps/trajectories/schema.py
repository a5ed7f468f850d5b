"""The four trajectory tables as pyarrow schemas, defined once and checked on every read.

`calls`: one row per recorded model call. `rollouts`: one row per rollout result. `samples`: the
training samples built from a rollout's calls (see `steps.trajectories.samples`). `behaviour`: one row per
rollout, what the agent did (see `steps.analytics`; its metric columns are `RolloutBehaviour`'s fields). Column meanings are
in `docs/trajectories.md`.
"""

import pyarrow as pa

SCHEMA_VERSION = "1"
TOKENS = pa.list_(pa.int32())
LOGPROBS = pa.list_(pa.float32())

# Who a row belongs to; leads every table so the four join on (run, iteration, rollout_id).
_KEYS = [
    pa.field("run", pa.string(), nullable=False),
    pa.field("iteration", pa.int32(), nullable=False),
    pa.field("rollout_id", pa.string(), nullable=False),
    pa.field("task", pa.string()),
    pa.field("sample", pa.int32()),  # the rollout's index within its task group (GRPO group member)
    pa.field("harness", pa.string()),
]

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

SAMPLES = _with_meta("samples", _KEYS + [
    pa.field("sample_index", pa.int32(), nullable=False),  # position among its rollout's training samples
    pa.field("prompt_token_ids", TOKENS),
    pa.field("response_token_ids", TOKENS),
    pa.field("response_mask", pa.list_(pa.int8())),
    pa.field("response_logprobs", LOGPROBS),  # 0 where the mask is 0; null if a merged call had none
    pa.field("reward", pa.float64()),
    pa.field("loss_weight", pa.float64()),
    pa.field("num_calls", pa.int32()),
    pa.field("call_indices", pa.list_(pa.int32())),
    pa.field("weight_versions", pa.list_(pa.string())),
    pa.field("images", pa.list_(pa.string())),  # SHA-256 names in prompt order: the first call's, then each one's new
])

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
ADDED_LATER = {"calls": ("temperature", "top_p", "top_k", "replica", "images", "untrainable"), "samples": ("images",),
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
