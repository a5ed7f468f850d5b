"""The call store's shared prompts and requests: a call whose prompt (request) starts (and ends) like
the one of the rollout's last stored call keeps only what it adds, and every reader gets the whole
prompt and request back, in a local folder and in S3 (moto on loopback)."""

import asyncio
import uuid

import orjson
import pytest

from steps.proxy.store import (
    CallStore,
    PromptBase,
    RequestBase,
    expand_prompts,
    expand_requests,
    share_prompt,
    share_request,
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
    stored, ref, following = share_prompt(base(4, before), orjson.dumps(now), 5, len(now))
    assert orjson.loads(stored) == kept
    assert ref == (None if shared is None else {"call_index": 4, "tokens": shared})
    if ref is not None:
        assert before[:ref["tokens"]] + orjson.loads(stored) == now
    assert following == PromptBase(5, orjson.dumps(now), len(now))  # what the next call may extend


def test_the_first_call_of_a_rollout_is_stored_whole():
    assert share_prompt(None, b"[1,2]", 0, 2) == (b"[1,2]", None, PromptBase(0, b"[1,2]", 2))


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


def test_a_record_that_extends_a_missing_call_keeps_its_place_with_a_null_prompt_and_the_reason():
    (kept,) = expand_prompts([record(1, [3], {"call_index": 0, "tokens": 2})])
    assert kept["prompt_token_ids"] is None and "extends the prompt of call 0" in kept["store_error"]
    looped = expand_prompts([record(0, [1], {"call_index": 1, "tokens": 1}), record(1, [2], {"call_index": 0, "tokens": 1})])
    assert [r["prompt_token_ids"] for r in looped] == [None, None]  # a loop, which no proxy writes
    # Control: the same record with its base present is made whole, without a store_error.
    whole = expand_prompts([record(0, [1, 2]), record(1, [3], {"call_index": 0, "tokens": 2})])
    assert whole[1]["prompt_token_ids"] == [1, 2, 3] and "store_error" not in whole[1]


@pytest.fixture(params=["local", "s3"])
def store_url(request, tmp_path, monkeypatch) -> str:
    if request.param == "local":
        return str(tmp_path / "store")
    s3 = request.getfixturevalue("s3_server")
    for key, value in s3["env"].items():
        monkeypatch.setenv(key, value)
    return f"s3://{s3['bucket']}/shared-prompts-{uuid.uuid4().hex[:8]}"


def test_shared_prompts_and_requests_round_trip_through_the_store(store_url):
    store = CallStore(store_url)
    prompts = [orjson.dumps(list(range(100, 140))), orjson.dumps(list(range(100, 150))), orjson.dumps(list(range(100, 150)))]
    requests = [request(["hi"]), request(["hi", "more"]), request(["hi", "more"])]
    last_prompt = last_request = None
    for index in range(3):
        kept, prompt_shared, last_prompt = share_prompt(last_prompt, prompts[index], index, len(orjson.loads(prompts[index])))
        between, request_shared, last_request = share_request(last_request, requests[index], index)
        asyncio.run(store.put_call({**record(index, orjson.Fragment(kept)), "prompt_shared": prompt_shared,
                                    "request": between if request_shared else orjson.Fragment(requests[index]),
                                    "request_shared": request_shared}))
    stored = [orjson.loads(line) for path in sorted(store.fs.find(f"{store.root}/rollouts/r"))
              for line in store.fs.cat_file(path).splitlines()]
    assert [(r["prompt_shared"], len(r["prompt_token_ids"])) for r in stored] == [
        (None, 40), ({"call_index": 0, "tokens": 40}, 10), ({"call_index": 1, "tokens": 50}, 0)]
    assert [r["request_shared"] is None for r in stored] == [True, False, False] and stored[2]["request"] == ""
    calls = asyncio.run(store.list_calls("r"))
    assert [c["prompt_token_ids"] for c in calls] == [list(range(100, 140)), list(range(100, 150)), list(range(100, 150))]
    assert [c["request"] for c in calls] == [orjson.loads(body) for body in requests]
    assert all("prompt_shared" not in c and "request_shared" not in c for c in calls)


def request(messages: list[str], tools: str = "t" * 300) -> bytes:
    return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": m} for m in messages],
                         "tools": tools, "stream": True})


@pytest.mark.parametrize(("before", "now"), [
    (request(["hi"]), request(["hi", "more"])),               # a turn appended before the tools
    (request(["hi"]), request(["hi"])),                       # the same request again
    (request(["hé", "x"]), request(["hè", "x"])),             # é and è share their first UTF-8 byte
    (request(["a" * 400, "€"]), request(["a" * 400, "₤"])),   # 3-byte characters that differ in the last
    (request(["ĩ" + "b" * 400]), request(["é" + "b" * 400])),  # ... and in the first byte only
])
def test_a_request_is_stored_as_the_bytes_between_what_it_shares(before, now):
    stored, ref, following = share_request(RequestBase(2, before), now, 3)
    assert ref is not None and following == RequestBase(3, now)
    assert before[:ref["head"]] + stored.encode() + before[len(before) - ref["tail"]:] == now
    assert len(stored.encode()) < len(now) // 2


def test_a_request_that_shares_little_is_stored_whole():
    other = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 500}]})
    assert share_request(RequestBase(0, request(["hi"])), other, 1) == (other, None, RequestBase(1, other))
    assert share_request(None, other, 0) == (other, None, RequestBase(0, other))


def test_readers_get_whole_requests_back_across_chains():
    bodies = [request(["hi"]), request(["hi", "more"]), request(["hi", "more"]), request(["hi", "more", "é!"])]
    records, lines, base = [], {}, None
    for index in (0, 2, 1, 3):  # stored in this order: call 2 finished before call 1
        between, shared, base = share_request(base, bodies[index], index)
        stored = {"rollout_id": "r", "call_index": index, "request_shared": shared,
                  "request": between if shared else orjson.Fragment(bodies[index])}
        lines[index] = orjson.dumps(stored)
        records.append(orjson.loads(lines[index]))
    assert [r["request_shared"] is not None for r in records] == [False, True, True, True]
    expanded = expand_requests(sorted(records, key=lambda r: r["call_index"]), lines)
    assert [r["request"] for r in expanded] == [orjson.loads(body) for body in bodies]
    assert all("request_shared" not in r for r in expanded)
    (orphan,) = expand_requests([{"rollout_id": "r", "call_index": 1, "request": "x",
                                  "request_shared": {"call_index": 0, "head": 1, "tail": 1}}], {})
    assert orphan["request"] is None and "extends the request of call 0" in orphan["store_error"]
