"""The call store's shared prompts: a call whose prompt starts with the prompt of the rollout's last
stored call keeps only what it adds, and every reader gets the whole prompt back, in a local folder
and in S3 (moto on loopback)."""

import asyncio
import uuid

import orjson
import pytest

from steps.proxy.store import (
    CallStore,
    PromptBase,
    StoreCorrupt,
    expand_prompts,
    share_prompt,
)


def base(index: int, ids: list[int]) -> PromptBase:
    return PromptBase(index, orjson.dumps(ids), len(ids))


@pytest.mark.parametrize(("before", "now", "kept", "shared"), [
    ([1, 2, 3], [1, 2, 3, 4, 5], [4, 5], 3),         # the context grew: only the new ids are kept
    ([1, 2, 3], [1, 2, 3], [], 3),                   # the same prompt again
    ([1, 2, 3], [1, 2, 34, 5], [1, 2, 34, 5], None),  # "3" only starts "34": not the same ids
    ([1, 2, 3], [1, 2], [1, 2], None),               # shorter
    ([1, 2, 3], [9, 2, 3, 4], [9, 2, 3, 4], None),   # a different start (an agent that rewrote its context)
    ([], [7, 8], [7, 8], None),                      # nothing to share
])
def test_a_prompt_is_stored_as_what_it_adds_to_the_last_one(before, now, kept, shared):
    stored, ref, following = share_prompt(base(4, before), orjson.dumps(now), 5)
    assert orjson.loads(stored) == kept
    assert ref == (None if shared is None else {"call_index": 4, "tokens": shared})
    if ref is not None:
        assert before[:ref["tokens"]] + orjson.loads(stored) == now
    assert following == PromptBase(5, orjson.dumps(now), len(now))  # what the next call may extend


def test_the_first_call_of_a_rollout_is_stored_whole():
    assert share_prompt(None, b"[1,2]", 0) == (b"[1,2]", None, PromptBase(0, b"[1,2]", 2))
    assert share_prompt(None, b"[]", 0) == (b"[]", None, PromptBase(0, b"[]", 0))


def record(index: int, ids: list[int], shared: dict | None = None, status: str = "ok") -> dict:
    return {"rollout_id": "r", "call_index": index, "status": status, "prompt_token_ids": ids, "prompt_shared": shared}


def test_readers_get_whole_prompts_back_across_chains_and_out_of_order_calls():
    # Call 2 finished before call 1 (a harness running two at once), so call 1 extends call 2.
    records = [record(0, [1, 2]), record(1, [6], {"call_index": 2, "tokens": 3}),
               record(2, [3], {"call_index": 0, "tokens": 2}), record(3, None, status="aborted"),
               record(4, [], {"call_index": 1, "tokens": 4})]
    expanded = expand_prompts(records)
    assert [r["prompt_token_ids"] for r in expanded] == [[1, 2], [1, 2, 3, 6], [1, 2, 3], None, [1, 2, 3, 6]]
    assert all("prompt_shared" not in r for r in expanded)


def test_a_record_that_extends_a_missing_call_is_refused_by_name():
    with pytest.raises(StoreCorrupt, match="rollout r call 1 extends the prompt of call 0"):
        expand_prompts([record(1, [3], {"call_index": 0, "tokens": 2})])
    with pytest.raises(StoreCorrupt, match="call 0"):  # a loop, which no proxy writes
        expand_prompts([record(0, [1], {"call_index": 1, "tokens": 1}), record(1, [2], {"call_index": 0, "tokens": 1})])


@pytest.fixture(params=["local", "s3"])
def store_url(request, tmp_path, monkeypatch) -> str:
    if request.param == "local":
        return str(tmp_path / "store")
    s3 = request.getfixturevalue("s3_server")
    for key, value in s3["env"].items():
        monkeypatch.setenv(key, value)
    return f"s3://{s3['bucket']}/shared-prompts-{uuid.uuid4().hex[:8]}"


def test_shared_prompts_round_trip_through_the_store(store_url):
    store = CallStore(store_url)
    first = orjson.dumps(list(range(100, 140)))
    grown = orjson.dumps(list(range(100, 150)))
    last = None
    for index, ids in enumerate([first, grown, grown]):
        kept, shared, last = share_prompt(last, ids, index)
        asyncio.run(store.put_call({**record(index, orjson.Fragment(kept)), "prompt_shared": shared}))
    stored = [orjson.loads(line) for path in sorted(store.fs.find(f"{store.root}/rollouts/r"))
              for line in store.fs.cat_file(path).splitlines()]
    assert [(r["prompt_shared"], len(r["prompt_token_ids"])) for r in stored] == [
        (None, 40), ({"call_index": 0, "tokens": 40}, 10), ({"call_index": 1, "tokens": 50}, 0)]
    calls = asyncio.run(store.list_calls("r"))
    assert [c["prompt_token_ids"] for c in calls] == [list(range(100, 140)), list(range(100, 150)), list(range(100, 150))]
    assert all("prompt_shared" not in c for c in calls)
