"""One recorded model call: the record the proxy stores for each call of a rollout, and its JSON form.

    record = CallRecord(rollout_id="it0-hello-s0", call_index=0, dialect="chat_completions", stream=False)
    line = orjson.dumps(record.to_json())            # what the store keeps (steps.proxy.store)
    CallRecord.from_json(orjson.loads(line)) == record

The proxy (`steps.proxy.serving`) fills one in as the call goes and the store writes its JSON form; the store's
reader gives the JSON form back with every prompt and request whole (`prompt_shared` and `request_shared`
followed and dropped), and a field it could not read back null, with why in `store_error` (docs/proxy.md,
"Reading a store back"); the trajectories step reads each with `from_json`. Field meanings: docs/proxy.md,
"A call record".

Standard library only: the rollout pod's Python and the update's environment import the floor too.
"""

from dataclasses import dataclass, field, fields
from typing import Any

# Written only when set: an external upstream's answer without token ids (`untrainable`, `usage`); the reader's
# note on a field it could not read back (`store_error`), which the proxy never writes.
ONLY_WHEN_SET = ("adapter", "untrainable", "usage", "store_error")


@dataclass(kw_only=True)
class CallRecord:
    """One call of a rollout, as stored: its fields in the stored key order (every record starts with
    `rollout_id`, which the store's reader looks for after a torn record)."""

    rollout_id: str = ""  # "" only in a partial record handed over without it (a rollout's calls in a test)
    call_index: int
    dialect: str | None = None  # chat_completions, responses or messages
    stream: bool | None = None
    status: str = "pending"  # pending, then ok, error or aborted when stored
    weight_version: str | int | None = None  # the serving replica's weights when the call went upstream
    replica: int | None = None  # the proxy's choice (steps.proxy.replicas), never the request's; null in older stores
    adapter: str | None = None  # a LoRA run's: the adapter that served it with the base (steps.proxy.weights)
    # vLLM's prompt ids; as stored, only those after `prompt_shared`'s call's prompt when that is set.
    prompt_token_ids: Any = None
    prompt_shared: dict | None = None  # {"call_index", "tokens"}: the prompt extends that call's (stored only)
    response_token_ids: list[int] | None = None
    response_logprobs: list[float] | None = None
    finish_reason: str | None = None
    sampling: dict | None = field(default_factory=dict)  # the settings vLLM was sent (the run's, forced)
    sampling_requested: dict | None = field(default_factory=dict)  # what the harness asked for
    timings: dict = field(default_factory=dict)  # received_at, upstream_started_at, ..., total_s
    # The harness's request as sent (images by name); as stored, the bytes between what `request_shared` shares.
    request: Any = None
    request_shared: dict | None = None  # {"call_index", "head", "tail"} (stored only)
    # Each image's reference (steps.proxy.images), in prompt order; null when the store cannot give them back.
    images: list[dict] | None = field(default_factory=list)
    response: Any = None  # the answer's JSON body, or the SSE stream's events
    error: dict | None = None  # {"status", "message"} of a call that failed
    untrainable: str | None = None  # why an answered call has no token ids (an external upstream's)
    usage: dict | None = None  # that upstream's token counts
    store_error: str | None = None  # the reader's: which fields could not be read back, and why

    def to_json(self) -> dict:
        """The record as stored: a JSON object in field order, without the fields written only when set.
        Values stay as given (the proxy passes bytes it already holds as `orjson.Fragment`)."""
        data = {name: getattr(self, name) for name in NAMES}
        for name in ONLY_WHEN_SET:
            if data[name] is None:
                del data[name]
        return data

    @classmethod
    def from_json(cls, data: dict) -> "CallRecord":
        """A stored record (decoded JSON) as a `CallRecord`. A key it lacks keeps the field's default (a store
        written before the key existed: no `replica`, `images` or `sampling_requested`); a key no field
        names is left out.

        >>> CallRecord.from_json({"rollout_id": "r", "call_index": 2, "status": "ok", "later": 1}).images
        []
        """
        return cls(**{name: data[name] for name in NAMES if name in data})


NAMES = tuple(record_field.name for record_field in fields(CallRecord))
