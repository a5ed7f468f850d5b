"""One model call through the proxy, the same for every dialect.

authorize -> read and check the request -> wait at the weight gate -> one upstream call (abandoned
if the harness goes away) -> durably store the call -> answer as JSON or as the dialect's SSE stream.
The call is stored before the first byte of the answer leaves, so nothing answered is ever lost.

A call index is taken only once the request is found valid (a refused request takes none), and a call
that took one is stored, whatever happens after: answered, failed upstream, aborted, or failed in the
proxy itself. If the store cannot write it (a full disk), the harness gets a 503 in its dialect's shape
and the index is handed back when no later call took one. A call's images are stored (once each, by the
SHA-256 of their bytes: steps.proxy.image_store) before its upstream call, so every record that names an
image finds it stored; one that cannot be stored is a 503 the same way. A rollout at its store quota
(steps.proxy.sessions.StoreQuota) has its further calls refused before they take an index: a 400 in the
dialect's shape, nothing stored, nothing sent upstream.
"""

import asyncio
import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from types import ModuleType

import orjson
from fastapi import Request

from steps.contracts.calls import CallRecord
from steps.logs import now
from steps.proxy import images as call_images
from steps.proxy.errors import ProxyError
from steps.proxy.image_store import referenced_request
from steps.proxy.protocol import Raw, decode, one_line
from steps.proxy.sessions import MIB, Rollout
from steps.sampling import RESHAPING
from steps.proxy.store import CallIndexTaken, StoreWriteFailed, share_prompt, share_request

log = logging.getLogger("openforge.proxy")
# Response ids: a random per-process prefix and a counter (uuid4 read os.urandom on every call).
_ID_PREFIX = secrets.token_hex(8)
_ID_COUNTER = itertools.count()

# What a record keeps of an upstream body's settings, as the harness asked (`sampling_requested`) and as vLLM
# was sent (`sampling`): the run's keys, the fields that reshape the distribution, and the harmless ones.
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "stop", "seed", "presence_penalty",
                 "frequency_penalty", "repetition_penalty", "min_p", "tool_choice", "parallel_tool_calls",
                 *RESHAPING)
INDEX_RETRIES = 3  # an object store's index held by another writer: take the next free one, this often


class ClientGone(Exception):
    """The harness closed its connection before the answer was ready."""


def read_headers(headers: list[tuple[bytes, bytes]]) -> tuple[str | None, bytes | None]:
    """The key a harness sent (`Authorization: Bearer`, else `x-api-key`) and the declared body length,
    in one pass over the request's headers (lower-case names, as ASGI has them)."""
    bearer = x_api_key = length = None
    for name, value in headers:
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            bearer = value[7:].strip().decode("latin-1")
        elif name == b"x-api-key":
            x_api_key = value.decode("latin-1")
        elif name == b"content-length":
            length = value
    return bearer or x_api_key, length


def api_key(request: Request) -> str | None:
    """The key a harness sent, as `Authorization: Bearer` or `x-api-key`."""
    return read_headers(request.scope["headers"])[0]


def too_large(declared: bytes | None, limit: int) -> ProxyError:
    """The 413 for a body over the proxy's limit, with its size when the client declared it."""
    if declared is not None and declared.isdigit():
        return ProxyError(413, f"request body of {int(declared)} bytes is over the proxy's limit of {limit} bytes")
    return ProxyError(413, f"request body is over the proxy's limit of {limit} bytes")


async def receive_body(receive, declared: bytes | None, limit: int) -> bytes:
    """An ASGI request's body; 413 past `limit` bytes, ClientGone if the client hangs up first."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(declared, limit)
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk, more = message.get("body", b""), message.get("more_body", False)
        size += len(chunk)
        if size > limit:
            raise too_large(None, limit)
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body; 413 past `limit` bytes."""
    return await receive_body(request.receive, read_headers(request.scope["headers"])[1], limit)


def parse_object(data: bytes) -> dict:
    """A request body as a JSON object; 400 if it is not one."""
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ProxyError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ProxyError(400, "request body must be a JSON object")
    return body


async def read_json(request: Request, limit: int) -> dict:
    """The request body as a JSON object; 413 past `limit` bytes, 400 if it is not a JSON object."""
    return parse_object(await read_body(request, limit))


async def until_disconnect(receive, work):
    """Awaits `work` in this task; if the ASGI client disconnects first, cancels it and raises ClientGone."""
    this, gone = asyncio.current_task(), False

    async def watch():
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        this.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise
        this.uncancel()
        raise ClientGone() from None
    finally:
        watcher.cancel()


def event_stream(events: list[tuple[str | None, object]]) -> tuple[bytes, list[dict]]:
    """A dialect's events as the SSE body sent to the harness and as the stored `response`; each payload
    is encoded once, for both. `event: NAME` lines only for dialects that name their events."""
    wire, stored = [], []
    for name, data in events:
        if isinstance(data, str):  # a bare sentinel such as Chat's [DONE]
            payload, kept = data.encode(), data
        else:
            payload = orjson.dumps(data)
            kept = orjson.Fragment(payload)
        if name is not None:
            wire += (b"event: ", name.encode(), b"\n")
        wire += (b"data: ", payload, b"\n\n")  # pieces joined once: a 20 KB payload is copied once
        stored.append({"event": name, "data": kept})
    return b"".join(wire), stored


GONE = (499, [(b"content-length", b"0")], b"")  # the harness hung up: nobody reads this answer
# No content-length: uvicorn's protocol sends the stream chunked; the proxy's own server adds one.
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


def json_answer(status: int, body: bytes) -> tuple[int, list, bytes]:
    """(status, headers, body) of a JSON answer."""
    return status, [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))], body


async def serve_call(state, rollout_id: str, dialect: ModuleType, key: str | None,
                     read: Callable[[], Awaitable[bytes]], guard) -> tuple[int, list, bytes]:
    """Answers one model call of a rollout in `dialect`, recording it token-exactly: (status, headers,
    body) of the answer, a JSON object or the dialect's whole SSE stream.

    `read()` gives the request body, after the key was accepted; `guard(work)` awaits the upstream call
    and raises ClientGone if the harness hangs up meanwhile (the server that carries the call knows how
    it learns of that). A call of a rollout at its store quota is refused (400) once the request is found
    valid, before it takes an index. Raises ProxyError, or ClientGone if the harness hung up before its
    request was read."""
    rollout = await state.sessions.authorize(rollout_id, key)
    data = await read()
    req, raw = decode(data, dialect.Request, fields=dialect.RAW_FIELDS)
    upstream_body = dialect.to_upstream(req, raw)
    config = state.config
    images = call_images.collect(upstream_body.get("messages"), config.image_pixel_limit,  # what vLLM is sent,
                                 config.request_image_mb * MIB)  # in prompt order
    requested = _settings(upstream_body)  # the harness's own, before the run's are forced
    config.sampling(upstream_body)
    line = referenced_request(one_line(data), images)  # the request as stored: images by name
    state.sessions.quota.admit(rollout, len(line))
    try:
        record = CallRecord(rollout_id=rollout.rollout_id, call_index=rollout.take_index(), dialect=dialect.NAME,
                            stream=req.stream, sampling=_settings(upstream_body),  # what vLLM was sent
                            sampling_requested=requested, timings={"received_at": now()},
                            request=orjson.Fragment(line), images=[image.reference() for image in images])
        return await _record_call(state, rollout, dialect, req, line, record, upstream_body, images, guard)
    finally:
        state.sessions.quota.release(rollout, len(line))


async def _record_call(state, rollout: Rollout, dialect: ModuleType, req, line: bytes, record: CallRecord,
                       upstream_body: dict, images: list, guard) -> tuple[int, list, bytes]:
    """Stores the call's new images, makes the upstream call and stores the call with its outcome (see
    `serve_call`)."""
    if images:
        try:
            rollout.stored_bytes += await state.store.put_images(images)
        except StoreWriteFailed as exc:
            raise _unstored(rollout, record, exc) from None
    try:
        completion = await guard(_complete(state, rollout, upstream_body, record))
    except ClientGone:
        await _finish(state, rollout, record, "aborted", error={"status": 499, "message": "client disconnected"})
        return GONE
    except ProxyError as err:
        await _finish(state, rollout, record, "error", error={"status": err.status, "message": err.message})
        raise
    except Exception as exc:  # the proxy's own failure: the call is kept all the same
        await _finish(state, rollout, record, "error", error={"status": 500, "message": f"{type(exc).__name__}: {exc}"})
        raise
    try:
        return await _answer(state, rollout, dialect, req, line, record, completion)
    except (ProxyError, StoreWriteFailed):
        raise
    except Exception as exc:  # building the answer failed after the upstream call: kept as failed
        _forget_shared(record, line)
        await _finish(state, rollout, record, "error", error={"status": 500, "message": f"{type(exc).__name__}: {exc}"})
        raise


async def _answer(state, rollout: Rollout, dialect: ModuleType, req, line: bytes, record: CallRecord,
                  completion) -> tuple[int, list, bytes]:
    """Stores the answered call (only what its request and prompt add to the rollout's last stored
    call's) and gives the answer to send."""
    response_id, created = f"{_ID_PREFIX}{next(_ID_COUNTER):08x}", int(time.time())
    between, record.request_shared, request_base = share_request(rollout.request_base, line, record.call_index)
    if record.request_shared is not None:
        record.request = between
    ids, prompt_base = completion.prompt_ids_json, None
    if ids is None:  # a completion not read from vLLM's bytes: stored whole
        record.prompt_token_ids = completion.prompt_token_ids
    else:
        kept, record.prompt_shared, prompt_base = share_prompt(rollout.prompt_base, ids, record.call_index,
                                                               completion.prompt_tokens)
        record.prompt_token_ids = orjson.Fragment(kept) if kept is not ids else completion.prompt_token_ids
    record.response_token_ids, record.response_logprobs = completion.response_token_ids, completion.response_logprobs
    record.finish_reason = completion.finish_reason
    if completion.untrainable is not None:  # an external upstream's answer without token ids
        record.untrainable = completion.untrainable
        record.usage = {"prompt_tokens": completion.prompt_tokens, "completion_tokens": completion.completion_tokens}
    if not req.stream:
        body = orjson.dumps(dialect.to_body(completion, req, response_id, created))
        await _finish(state, rollout, record, "ok", response=orjson.Fragment(body))
        answer = json_answer(200, body)
    else:
        body, stored = event_stream(dialect.to_events(completion, req, response_id, created))
        await _finish(state, rollout, record, "ok", response=stored)
        answer = 200, SSE_HEADERS, body
    # Stored: the rollout's next call may extend them (its index may have moved: see _finish).
    rollout.request_base = replace(request_base, call_index=record.call_index)
    if prompt_base is not None:
        rollout.prompt_base = replace(prompt_base, call_index=record.call_index)
    return answer


def _unstored(rollout: Rollout, record: CallRecord, exc: StoreWriteFailed) -> ProxyError:
    """The 503 for a call the store could not write; its index is handed back when no later call took one."""
    if rollout.next_index == record.call_index + 1:
        rollout.next_index -= 1
    return ProxyError(503, f"the proxy could not store this call, so it was not answered ({exc}); retry later")


def _forget_shared(record: CallRecord, line: bytes) -> None:
    """Undoes what `_answer` shared of a record that is stored as failed instead: its request whole."""
    record.request, record.request_shared, record.prompt_shared = orjson.Fragment(line), None, None
    record.prompt_token_ids = record.response_token_ids = record.response_logprobs = None


def _settings(upstream_body: dict) -> dict:
    """The sampling settings of an upstream body, in vLLM's chat terms."""
    return {key: _stored(upstream_body[key]) for key in SAMPLING_KEYS if key in upstream_body}


async def _complete(state, rollout: Rollout, upstream_body: dict, record: CallRecord):
    served: dict = {}  # the replica that took the call and its weight version (`Replicas.complete` says)
    async with state.gate.call() as version:  # the stamp is the serving replica's version (steps.proxy.replicas)
        record.timings["upstream_started_at"] = now()
        try:
            return await state.replicas.complete(rollout, upstream_body, served, version)
        finally:
            record.timings["upstream_ended_at"] = now()
            record.replica, record.weight_version = served.get("replica"), served.get("weight_version")
            record.adapter = served.get("adapter")


def _stored(value):
    """A sampling setting as stored: raw JSON is copied as sent (on one line), never decoded."""
    return orjson.Fragment(one_line(value)) if isinstance(value, Raw) else value


async def _finish(state, rollout: Rollout, record: CallRecord, status: str, response=None,
                  error: dict | None = None) -> None:
    """Stores the call with its outcome and counts it against the rollout's quota. A 503 if the store cannot
    write it (nothing of it is stored, the harness is not answered); an object store's index that another
    writer holds is replaced by the next free one."""
    timings = record.timings
    timings["responded_at"] = now()
    timings["total_s"] = round(timings["responded_at"] - timings["received_at"], 6)
    if "upstream_ended_at" in timings:
        timings["upstream_s"] = round(timings["upstream_ended_at"] - timings["upstream_started_at"], 6)
    record.status, record.response, record.error = status, response, error
    for _ in range(INDEX_RETRIES):
        try:
            rollout.stored_bytes += await state.store.put_call(record.to_json())
            rollout.stored_calls += 1
            return
        except CallIndexTaken:
            log.warning("call index taken by another writer", extra={"rollout_id": rollout.rollout_id,
                                                                     "call_index": record.call_index})
            stored = await state.store.resume_calls(rollout.rollout_id)
            rollout.next_index = max(rollout.next_index, stored.next_index)
            record.call_index = rollout.take_index()
        except StoreWriteFailed as exc:
            raise _unstored(rollout, record, exc) from None
    raise ProxyError(503, f"the proxy found call indices of rollout {rollout.rollout_id!r} taken by another writer "
                          f"{INDEX_RETRIES} times; is a second proxy serving it?")
