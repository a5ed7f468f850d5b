"""Durable storage of rollouts and their recorded calls: a local folder or any fsspec URL (s3://...).

Layout:

    {root}/rollouts/{rollout_id}/rollout.json            registration: metadata, key digest, times
    {root}/rollouts/{rollout_id}/calls.jsonl             local folder: one call record per line, appended
    {root}/rollouts/{rollout_id}/calls/{index:06d}.json  object store: one object per call

A call's prompt usually starts with the prompt of the rollout's call before it (an agent's context grows
by appending), so a stored record keeps only what is new: `prompt_shared` = {"call_index": k, "tokens":
n} says its prompt is call k's whole prompt (n ids) followed by its own `prompt_token_ids`. Its request
likewise starts (and usually ends: tools, settings) as the request of the call before: `request_shared`
= {"call_index": k, "head": h, "tail": t} says its request's bytes are the first h bytes of call k's,
then its own `request` (a string: the bytes between), then the last t bytes of call k's. Without them a
rollout's store grows with the square of its length. Readers (`list_calls`) give every call its whole
prompt and request back.

A local call is one `write` to a file opened with O_APPEND; a record that a crash cut short has no
final newline, was never answered (the answer leaves after the write), and is dropped by readers and
cut off when a restarted proxy takes the rollout up again. Appending costs ~50 us per 90 KB record
where creating and renaming a file per call cost 0.2-1 ms (benchmarks/proxy_overhead.py). Object
stores put whole objects.
"""

import asyncio
import os
import uuid
from dataclasses import dataclass

import fsspec
import msgspec
import orjson

CALL_LOG = "calls.jsonl"


class StoreCorrupt(Exception):
    """A stored record refers to a call the store does not hold."""


@dataclass(frozen=True)
class PromptBase:
    """The prompt of a rollout's last stored call: its index, its ids as vLLM's JSON, how many (vLLM's
    count: told to readers, never used to cut)."""

    call_index: int
    ids: bytes
    tokens: int


def share_prompt(base: PromptBase | None, ids: bytes, call_index: int, tokens: int) -> tuple[bytes, dict | None, PromptBase]:
    """What to store of call `call_index`'s prompt ids (vLLM's JSON array of `tokens` ids): the ids after
    base's whole prompt and the `prompt_shared` reference, or all of them and None when the prompt does
    not start with all of base's; and this prompt, as the base of the rollout's next call. One comparison
    of bytes, without a copy."""
    following = PromptBase(call_index, ids, tokens)
    n = len(base.ids) - 1 if base is not None else 0  # base's ids without the closing bracket
    if base is None or len(ids) <= n or not ids.startswith(memoryview(base.ids)[:n]) or ids[n] not in b",]":
        return ids, None, following  # ids[n]: else base's last id "3" may only start this one's "34"
    kept = b"[]" if ids[n] == 0x5D else b"[" + ids[n + 1:]  # "]": the same prompt again
    return kept, {"call_index": base.call_index, "tokens": base.tokens}, following


def expand_prompts(records: list[dict]) -> list[dict]:
    """Gives every record its whole `prompt_token_ids` back (in place) and drops `prompt_shared`; raises
    StoreCorrupt if a record extends a call that is not among them."""
    by_index = {record["call_index"]: record for record in records}
    for record in records:
        chain, at = [], record
        while at.get("prompt_shared") is not None:  # walk back to a call whose prompt is whole
            chain.append(at)
            ref = at["prompt_shared"]
            at = by_index.get(ref["call_index"])
            if at is None or at.get("prompt_token_ids") is None or len(chain) > len(by_index):
                raise StoreCorrupt(f"rollout {record['rollout_id']} call {chain[-1]['call_index']} extends the "
                                   f"prompt of call {ref['call_index']}, which the store does not hold")
        for extended in reversed(chain):  # the earliest first: each extends a prompt made whole already
            ref = extended.pop("prompt_shared")
            extended["prompt_token_ids"] = by_index[ref["call_index"]]["prompt_token_ids"] + extended["prompt_token_ids"]
    for record in records:
        record.pop("prompt_shared", None)
    return records


@dataclass(frozen=True)
class RequestBase:
    """The request of a rollout's last stored call: its index and its bytes as stored (one line)."""

    call_index: int
    data: bytes


def _common_prefix(a: bytes, b: bytes) -> int:
    """How many leading bytes `a` and `b` share: a binary search, each step comparing only the bytes it
    adds (~n bytes compared in all, in C, without a copy)."""
    low, high, view = 0, min(len(a), len(b)), memoryview(a)
    while low < high:
        mid = (low + high + 1) // 2
        if b.startswith(view[low:mid], low):
            low = mid
        else:
            high = mid - 1
    return low


def _common_suffix(a: bytes, b: bytes, limit: int) -> int:
    """How many trailing bytes `a` and `b` share, at most `limit`."""
    low, high, view, end_a, end_b = 0, limit, memoryview(a), len(a), len(b)
    while low < high:
        mid = (low + high + 1) // 2
        if b.endswith(view[end_a - mid:end_a - low], 0, end_b - low):
            low = mid
        else:
            high = mid - 1
    return low


def share_request(base: RequestBase | None, data: bytes, call_index: int) -> tuple[bytes | str, dict | None, RequestBase]:
    """What to store of call `call_index`'s request (its bytes on one line): the bytes between those it
    shares with the start and the end of `base`'s, as a string, and the `request_shared` reference; or
    all of it and None when that would not save half of it (or the bytes between are not whole UTF-8).
    And this request, as the base of the rollout's next call."""
    following = RequestBase(call_index, data)
    if base is None:
        return data, None, following
    if data == base.data:
        return "", {"call_index": base.call_index, "head": len(data), "tail": 0}, following
    head = _common_prefix(base.data, data)
    limit, need = min(len(base.data), len(data)) - head, len(data) // 2 - head  # the tail that saves half
    if need > 0 and (need > limit or not data.endswith(memoryview(base.data)[len(base.data) - need:])):
        return data, None, following
    tail = _common_suffix(base.data, data, limit)
    while head < len(data) and 0x80 <= data[head] < 0xC0:  # never split a character
        head -= 1
    while tail and 0x80 <= data[len(data) - tail] < 0xC0:
        tail -= 1
    if head + tail < len(data) // 2:
        return data, None, following
    try:
        between = data[head:len(data) - tail].decode()
    except UnicodeDecodeError:
        return data, None, following
    return between, {"call_index": base.call_index, "head": head, "tail": tail}, following


class _StoredRequest(msgspec.Struct):
    request: msgspec.Raw


_STORED_REQUEST = msgspec.json.Decoder(_StoredRequest)


def expand_requests(records: list[dict], lines: dict[int, bytes]) -> list[dict]:
    """Gives every record whose request is stored as shared its whole request back (in place), from the
    stored bytes of the calls it extends (`lines`: each call's stored record); drops `request_shared`.
    Raises StoreCorrupt if a record extends a call that is not among them."""
    by_index = {record["call_index"]: record for record in records}
    whole: dict[int, bytes] = {}  # each call's request bytes, once known

    def request_bytes(index: int) -> bytes:
        chain, at = [], index
        while at not in whole:
            record = by_index.get(at)
            if record is None or len(chain) > len(by_index):
                raise StoreCorrupt(f"rollout {by_index[index]['rollout_id']} call {chain[-1]} extends the request "
                                   f"of call {at}, which the store does not hold")
            ref = record.get("request_shared")
            if ref is None:
                whole[at] = bytes(_STORED_REQUEST.decode(lines[at]).request)
                break
            chain.append(at)
            at = ref["call_index"]
        for at in reversed(chain):  # the earliest first: each extends a request known already
            record = by_index[at]
            ref, middle = record["request_shared"], record["request"].encode()
            base = whole[ref["call_index"]]
            whole[at] = base[:ref["head"]] + middle + base[len(base) - ref["tail"]:]
        return whole[index]

    for record in records:
        if record.get("request_shared") is not None:
            request = request_bytes(record["call_index"])
            record["request"] = orjson.loads(request)
    for record in records:
        record.pop("request_shared", None)
    return records


class CallStore:
    """Reads and writes rollout registrations and call records under one root URL."""

    def __init__(self, url: str, fsync: bool = False):
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.root = self.root.rstrip("/")
        self.local = "file" in _protocols(self.fs)
        self.fsync = fsync
        if self.local:
            os.makedirs(self.root, exist_ok=True)

    def _rollout_dir(self, rollout_id: str) -> str:
        return f"{self.root}/rollouts/{rollout_id}"

    async def put_rollout(self, info: dict) -> None:
        """Writes (or rewrites) a rollout's registration."""
        path = f"{self._rollout_dir(info['rollout_id'])}/rollout.json"
        await asyncio.to_thread(self._write_whole, path, orjson.dumps(info))

    async def get_rollout(self, rollout_id: str) -> dict | None:
        """The rollout's registration, or None if it was never registered."""
        path = f"{self._rollout_dir(rollout_id)}/rollout.json"
        data = await asyncio.to_thread(self._read, path)
        return None if data is None else orjson.loads(data)

    async def put_call(self, record: dict) -> None:
        """Durably writes one call record; returns once it is readable by a restarted proxy.

        A local append without fsync is a page-cache copy, cheaper than a hop to a worker thread, so it
        runs on the event loop; object stores and fsync go to a thread.
        """
        data = orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE)
        if self.local and not self.fsync:
            self._append(record["rollout_id"], data)
        elif self.local:
            await asyncio.to_thread(self._append, record["rollout_id"], data)
        else:
            path = f"{self._rollout_dir(record['rollout_id'])}/calls/{record['call_index']:06d}.json"
            await asyncio.to_thread(self.fs.pipe_file, path, data)

    async def list_calls(self, rollout_id: str) -> list[dict]:
        """Every stored call of a rollout, in call order."""
        return await asyncio.to_thread(self._list_calls, rollout_id)

    async def resume_calls(self, rollout_id: str) -> int:
        """How many calls of a rollout are stored: the next call index when a restarted proxy takes the
        rollout up again. A local log loses its torn last record here, before anything is appended."""
        if self.local:
            return await asyncio.to_thread(self._resume_log, rollout_id)
        return len(await asyncio.to_thread(self._object_paths, rollout_id))

    def list_rollouts(self) -> list[str]:
        """Ids of every rollout in the store."""
        try:
            entries = self.fs.ls(f"{self.root}/rollouts", detail=False)
        except FileNotFoundError:
            return []
        return sorted(entry.rstrip("/").rsplit("/", 1)[-1] for entry in entries)

    # --- local: one append-only log per rollout ---------------------------------------------------
    def _log_path(self, rollout_id: str) -> str:
        return f"{self._rollout_dir(rollout_id)}/{CALL_LOG}"

    def _append(self, rollout_id: str, data: bytes) -> None:
        path = self._log_path(rollout_id)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def _resume_log(self, rollout_id: str) -> int:
        _cut_torn_tail(self._log_path(rollout_id))
        return len(self._log_lines(rollout_id))

    def _log_lines(self, rollout_id: str) -> list[bytes]:
        """The log's complete records (a torn last line, never answered, is left out)."""
        try:
            with open(self._log_path(rollout_id), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        return data[:data.rfind(b"\n") + 1].splitlines()

    # --- object stores: one object per call --------------------------------------------------------
    def _object_paths(self, rollout_id: str) -> list[str]:
        try:
            names = self.fs.ls(f"{self._rollout_dir(rollout_id)}/calls", detail=False)
        except FileNotFoundError:
            return []
        return sorted(name for name in names if name.endswith(".json"))

    def _list_calls(self, rollout_id: str) -> list[dict]:
        if self.local:
            stored = self._log_lines(rollout_id)
        else:
            paths = self._object_paths(rollout_id)
            contents = self.fs.cat(paths) if paths else {}
            stored = [contents[path] for path in paths]
        records = [orjson.loads(data) for data in stored]
        lines = {record["call_index"]: data for record, data in zip(records, stored)}
        # Calls of one rollout finish out of order when a harness runs several at once.
        records.sort(key=lambda record: record["call_index"])
        return expand_requests(expand_prompts(records), lines)

    def _write_whole(self, path: str, data: bytes) -> None:
        """Writes a small file atomically: a temporary name renamed into place (a put on object stores)."""
        if not self.local:
            self.fs.pipe_file(path, data)
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            if self.fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)

    def _read(self, path: str) -> bytes | None:
        try:
            return self.fs.cat_file(path)
        except FileNotFoundError:
            return None


def _cut_torn_tail(path: str) -> None:
    """Cuts a record that a crash left without its final newline, so the next append starts a line."""
    try:
        with open(path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return
            f.seek(0)
            f.truncate(f.read().rfind(b"\n") + 1)
    except FileNotFoundError:
        pass


def _protocols(fs) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)
