"""Durable storage of rollouts and their recorded calls: a local folder or any fsspec URL (s3://...). A call
record's fields and its JSON form are `steps.contracts.calls.CallRecord`'s; its layout and reading rule are here.

Layout:

    {root}/rollouts/{rollout_id}/rollout.json            registration: metadata, key digest, times
    {root}/rollouts/{rollout_id}/calls.jsonl             local folder: one call record per line, appended
    {root}/rollouts/{rollout_id}/calls/{index:06d}.json  object store: one object per call
    {root}/images/{sha256}                               every image a call sent, once (steps.proxy.image_store)
    {root}/judge/rollouts/{rollout_id}/...               a judge's calls (the verifier's: steps.proxy.judge), laid
                                                         out as above, apart: no reader of rollouts/ meets them

A call's prompt usually starts with the prompt of the rollout's call before it (an agent's context grows
by appending), so a stored record keeps only what is new: `prompt_shared` = {"call_index": k, "tokens":
n} says its prompt is call k's whole prompt (n ids) followed by its own `prompt_token_ids`. Its request
likewise starts (and usually ends: tools, settings) as the request of the call before: `request_shared`
= {"call_index": k, "head": h, "tail": t} says its request's bytes are the first h bytes of call k's,
then its own `request` (a string: the bytes between), then the last t bytes of call k's. Without them a
rollout's store grows with the square of its length. Readers (`read_calls`, `list_calls`) give every
call its whole prompt and request back.

A local call is one `write` to a file opened with O_APPEND; appending costs ~50 us per 90 KB record
where creating and renaming a file per call cost 0.2-1 ms (benchmarks/proxy_overhead.py). A write that
fails (a full disk) is cut off again at once; a log found not to end with a line break (a crash, or a
cut that failed) has the next record start on a line of its own, and a restarted proxy cuts the torn
tail before appending. Object stores put whole objects, each created only if its name is free, so two
writers never replace each other's call. Call indices never repeat: a restarted proxy goes on after
the highest index the store holds.

Readers never fail a rollout for one bad record. Their rule (docs/proxy.md, "Reading a store back"):
a local log's last line without its line break (being written, or cut short: never answered) is left
out; a record glued after a torn one is read from where it starts; a line or object that is no call
record of the rollout, or that repeats an index already read, is skipped and named in `skipped`; a
record whose request, response or sampling (sent or requested) alone cannot be read keeps its place with
that field null and `store_error` saying why, as does one whose prompt or request extends a call that
cannot be read, or names an image that is not stored whole under its name (then `images` is null).
"""

import asyncio
import os
import threading
import uuid
from dataclasses import dataclass, field

import fsspec
import msgspec
import orjson

from steps.contracts.calls import NAMES
from steps.proxy.image_store import ImageStore, ImageWriteFailed
from steps.proxy.images import Image

CALL_LOG = "calls.jsonl"
JUDGE_FOLDER = "judge"  # under the root: the judge's calls, a store of their own (`judge_store_url`)
RECORD_START = b'{"%s":' % NAMES[0].encode()  # how every record the proxy writes begins (its first key)


def judge_store_url(root: str) -> str:
    """The store of the judge's calls, beside the policy's rollouts under `root` (never inside `rollouts/`).

    >>> judge_store_url("s3://b/runs/demo/calls/")
    's3://b/runs/demo/calls/judge'
    """
    return f"{root.rstrip('/')}/{JUDGE_FOLDER}"


class StoreWriteFailed(Exception):
    """A call record the store could not write (a full disk, an unreachable object store); nothing of
    it is left readable."""


class CallIndexTaken(Exception):
    """Another writer already stored a call of the rollout under this index (object stores)."""


@dataclass
class StoredCalls:
    """A rollout's calls as read back (each a `CallRecord`'s JSON form: `CallRecord.from_json` reads it), in call
    order, and the stored records that were skipped, each {"record": where it is stored, "error": why}."""

    calls: list[dict]
    skipped: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class Resumed:
    """What a proxy takes a rollout up with after a restart: its next call index, and how many call records
    and bytes of them the store holds (its store quota's counts; the images its calls stored before are not
    counted again)."""

    next_index: int
    calls: int
    bytes: int


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


def _unreadable(record: dict, name: str, why: str) -> None:
    """Marks one field of a read record as not readable back: null, and why in `store_error`."""
    record[name] = None
    note = f"{name}: {why}"
    record["store_error"] = note if record.get("store_error") is None else f"{record['store_error']}; {note}"


def expand_prompts(records: list[dict], ambiguous: frozenset[int] = frozenset()) -> list[dict]:
    """Gives every record its whole `prompt_token_ids` back (in place) and drops `prompt_shared`. A record
    that extends a call the records lack (or one in `ambiguous`: an index that repeats), or a call whose
    prompt is not whole, gets a null prompt and `store_error` naming that call."""
    by_index = {record["call_index"]: record for record in records}
    whole: dict[int, list | None] = {}  # each call's whole prompt, once known (None: cannot be known)
    for record in records:
        chain, at = [], record
        while at["call_index"] not in whole and at.get("prompt_shared") is not None:
            chain.append(at)  # walk back to a call whose prompt is whole
            ref = at["prompt_shared"]["call_index"]
            at = by_index.get(ref) if ref not in ambiguous else None
            if at is None or len(chain) > len(by_index):  # missing, or a loop (which no proxy writes)
                at = None
                break
        base = None if at is None else whole.get(at["call_index"], at.get("prompt_token_ids"))
        base = base if isinstance(base, list) else None
        if at is not None:
            whole[at["call_index"]] = base
        for extended in reversed(chain):  # the earliest first: each extends a prompt made whole already
            ref = extended["prompt_shared"]["call_index"]
            if base is None:
                _unreadable(extended, "prompt_token_ids", f"extends the prompt of call {ref}, which the store does "
                                                          "not hold readable and whole")
            else:
                base = base + extended["prompt_token_ids"]
                extended["prompt_token_ids"] = base
            whole[extended["call_index"]] = base
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


def expand_requests(records: list[dict], lines: dict[int, bytes], ambiguous: frozenset[int] = frozenset()) -> list[dict]:
    """Gives every record whose request is stored as shared its whole request back (in place), from the
    stored bytes of the calls it extends (`lines`: each call's stored record); drops `request_shared`.
    A record that extends a call the records lack (or one in `ambiguous`), or whose whole request is
    not JSON, gets a null request and `store_error` saying why."""
    by_index = {record["call_index"]: record for record in records}
    whole: dict[int, bytes | None] = {}  # each call's request bytes, once known (None: cannot be known)

    def request_bytes(index: int) -> bytes | None:
        chain, at = [], index
        while at not in whole:
            record = by_index.get(at) if at not in ambiguous else None
            if record is None or len(chain) > len(by_index):  # missing, or a loop (which no proxy writes)
                break
            ref = record.get("request_shared")
            if ref is None:
                try:
                    whole[at] = bytes(_STORED_REQUEST.decode(lines[at]).request)
                except (msgspec.DecodeError, RecursionError):  # a record that holds no request
                    whole[at] = None
                break
            chain.append(at)
            at = ref["call_index"]
        base = whole.get(at)
        for at in reversed(chain):  # the earliest first: each extends a request known already
            record = by_index[at]
            ref, middle = record["request_shared"], record["request"]
            if base is not None:
                base = base[:ref["head"]] + middle.encode() + base[len(base) - ref["tail"]:]
            else:
                base = None
            whole[at] = base
        return whole.get(index)

    for record in records:
        ref = record.get("request_shared")
        if ref is None:
            continue
        request = request_bytes(record["call_index"])
        if request is None:
            _unreadable(record, "request", f"extends the request of call {ref['call_index']}, which the store "
                                           "does not hold readable and whole")
            continue
        try:
            record["request"] = orjson.loads(request)
        except orjson.JSONDecodeError as exc:
            _unreadable(record, "request", f"not readable back as JSON ({exc})")
    for record in records:
        record.pop("request_shared", None)
    return records


class _Head(msgspec.Struct):
    rollout_id: str
    call_index: int


_HEAD = msgspec.json.Decoder(_Head)
_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])
# Holding what the harness sent: the rest is the proxy's own.
_WHOLE_FIELDS = ("request", "response", "sampling", "sampling_requested")


def _index(value) -> bool:
    return type(value) is int and 0 <= value < 2**31


def _call_record(rollout_id: str, record) -> bool:
    """Whether a decoded line is a call record of this rollout, with references readers can follow."""
    if not (isinstance(record, dict) and record.get("rollout_id") == rollout_id and _index(record.get("call_index"))):
        return False
    prompt, request = record.get("prompt_shared"), record.get("request_shared")
    return ((prompt is None or isinstance(prompt, dict) and _index(prompt.get("call_index"))
             and isinstance(record.get("prompt_token_ids"), list))
            and (request is None or isinstance(request, dict) and isinstance(record.get("request"), str)
                 and all(_index(request.get(key)) for key in ("call_index", "head", "tail"))))


def _by_fields(rollout_id: str, data: bytes) -> dict | None:
    """A record read field by field (msgspec skips what it cannot decode): the request or response that
    orjson cannot read back becomes null with `store_error`; None if the rest is not a call record."""
    try:
        fields = _FIELDS.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None
    record = {}
    for name, raw in fields.items():
        try:
            record[name] = orjson.loads(memoryview(raw))
        except orjson.JSONDecodeError as exc:
            if name not in _WHOLE_FIELDS:
                return None
            _unreadable(record, name, f"not readable back as JSON ({exc})")
    return record if _call_record(rollout_id, record) else None


def parse_record(rollout_id: str, data: bytes) -> tuple[dict | None, bytes, str | None]:
    """One stored record read back by the rule in the module docstring: (the record or None, the bytes
    it was read from, what is wrong with the stored bytes or None)."""
    try:
        record = orjson.loads(data)
        if _call_record(rollout_id, record):
            return record, data, None
        return None, data, f"not a call record of rollout {rollout_id}"
    except orjson.JSONDecodeError as exc:
        error = f"not JSON ({exc})"
    record = _by_fields(rollout_id, data)
    if record is not None:
        return record, data, None
    at = data.find(RECORD_START, 1)
    while at > 0:  # a record written after a torn one, on its line: the one start whose rest reads whole
        record = _by_fields(rollout_id, data[at:])
        if record is not None:
            return record, data[at:], f"its first {at} bytes are a torn record ({error})"
        at = data.find(RECORD_START, at + 1)
    return None, data, error


def read_records(rollout_id: str, stored: list[tuple[str, bytes]]) -> StoredCalls:
    """A rollout's calls from its stored records ((where, bytes), in the order stored), with their whole
    prompts and requests, in call order; the records skipped are named."""
    records, lines, skipped, repeated = [], {}, [], set()
    for where, data in stored:
        record, used, error = parse_record(rollout_id, data)
        if record is not None and record["call_index"] in lines:
            repeated.add(record["call_index"])
            record, error = None, f"repeats call index {record['call_index']}, read from an earlier record"
        if error is not None:
            skipped.append({"record": where, "error": error})
        if record is not None:
            records.append(record)
            lines[record["call_index"]] = used
    # Calls of one rollout finish out of order when a harness runs several at once.
    records.sort(key=lambda record: record["call_index"])
    ambiguous = frozenset(repeated)
    return StoredCalls(expand_requests(expand_prompts(records, ambiguous), lines, ambiguous), skipped)


class CallStore:
    """Reads and writes rollout registrations and call records under one root URL."""

    def __init__(self, url: str, fsync: bool = False):
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.root = self.root.rstrip("/")
        self.local = "file" in _protocols(self.fs)
        self.create_only = "s3" in _protocols(self.fs)  # a PUT that never replaces (If-None-Match: *)
        self.fsync = fsync
        self._appending: dict[str, threading.Lock] = {}  # per log: with fsync, appends run in threads
        self.images = ImageStore(self.fs, self.root, self.local, self.create_only, fsync)
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

    async def put_call(self, record: dict) -> int:
        """Durably writes one call record, its JSON form (`CallRecord.to_json()`); returns the bytes written once it is readable by a restarted proxy.
        Raises StoreWriteFailed if it could not be written (nothing of it is left readable) and, on an object
        store, CallIndexTaken if another writer holds its index.

        A local append without fsync is a page-cache copy, cheaper than a hop to a worker thread, so it
        runs on the event loop; object stores and fsync go to a thread.
        """
        data = orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE)
        if self.local and not self.fsync:
            return self._append(record["rollout_id"], data)
        if self.local:
            return await asyncio.to_thread(self._append, record["rollout_id"], data)
        await asyncio.to_thread(self._put_object, self._object_path(record["rollout_id"], record["call_index"]), data)
        return len(data)

    async def put_images(self, images: list[Image]) -> int:
        """Durably stores each of a call's images not stored yet, before the record that names them, and returns
        the bytes written (an image found stored already costs none); raises StoreWriteFailed if one could not
        be (the call must not be stored then)."""
        new = self.images.new(images)
        if not new:
            return 0
        try:
            return await asyncio.to_thread(self.images.put, new)
        except ImageWriteFailed as exc:
            raise StoreWriteFailed(str(exc)) from None

    async def read_calls(self, rollout_id: str) -> StoredCalls:
        """Every readable call of a rollout, in call order, and the stored records skipped (see the
        module docstring for the rule)."""
        return await asyncio.to_thread(self._read_calls, rollout_id)

    async def list_calls(self, rollout_id: str) -> list[dict]:
        """Every readable call of a rollout, in call order."""
        return (await self.read_calls(rollout_id)).calls

    async def resume_calls(self, rollout_id: str) -> Resumed:
        """What a restarted proxy takes the rollout up again with: the next call index, one past the highest
        index the store holds (so an index taken by a call that was never stored leaves a gap, never a
        repeat), and the records and bytes held (a local log's size; an object listing's sizes: nothing more
        is read). A local log loses its torn last record here, before anything is appended."""
        if self.local:
            return await asyncio.to_thread(self._resume_log, rollout_id)
        objects = await asyncio.to_thread(self._objects, rollout_id)
        return Resumed(max((_object_index(path) for path, _ in objects), default=-1) + 1, len(objects),
                       sum(size for _, size in objects))

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

    def _lock(self, path: str) -> threading.Lock:
        return self._appending.get(path) or self._appending.setdefault(path, threading.Lock())

    def _append(self, rollout_id: str, data: bytes) -> int:
        path = self._log_path(rollout_id)
        with self._lock(path):
            try:
                fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            except FileNotFoundError:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                start = os.fstat(fd).st_size
                if start and os.pread(fd, 1, start - 1) != b"\n":  # a torn record: ours starts a line
                    data = b"\n" + data
                view = memoryview(data)
                try:
                    while view:
                        view = view[os.write(fd, view):]
                    if self.fsync:
                        os.fsync(fd)
                except OSError as exc:
                    _undo_append(fd, start, len(data) - len(view))
                    raise StoreWriteFailed(f"the call could not be written to {path}: {exc.strerror}") from None
            finally:
                os.close(fd)
        return len(data)

    def _resume_log(self, rollout_id: str) -> Resumed:
        with self._lock(self._log_path(rollout_id)):  # never while one of this proxy's appends is half done
            size = _cut_torn_tail(self._log_path(rollout_id))
        highest, calls = -1, 0
        for _, data in self._log_lines(rollout_id):
            try:
                head = _HEAD.decode(data)
                index = head.call_index if head.rollout_id == rollout_id and _index(head.call_index) else -1
            except (msgspec.DecodeError, RecursionError):
                record = parse_record(rollout_id, data)[0]
                index = -1 if record is None else record["call_index"]
            highest, calls = max(highest, index), calls + (index >= 0)
        return Resumed(highest + 1, calls, size)

    def _log_lines(self, rollout_id: str) -> list[tuple[str, bytes]]:
        """The log's complete lines, named by number (a torn last line, never answered, is left out)."""
        try:
            with open(self._log_path(rollout_id), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        lines = data[:data.rfind(b"\n") + 1].split(b"\n")
        return [(f"{CALL_LOG} line {n}", line) for n, line in enumerate(lines, 1) if line.strip()]

    # --- object stores: one object per call --------------------------------------------------------
    def _object_path(self, rollout_id: str, call_index: int) -> str:
        return f"{self._rollout_dir(rollout_id)}/calls/{call_index:06d}.json"

    def _objects(self, rollout_id: str) -> list[tuple[str, int]]:
        """(path, size) of each of the rollout's call objects, in index order: one listing."""
        try:
            entries = self.fs.ls(f"{self._rollout_dir(rollout_id)}/calls", detail=True, refresh=True)
        except FileNotFoundError:
            return []
        return sorted((entry["name"], entry.get("size") or 0) for entry in entries if _object_index(entry["name"]) >= 0)

    def _put_object(self, path: str, data: bytes) -> None:
        """Creates the call's object, never replacing one on S3, which keeps a PUT whole or not at all."""
        try:
            self.fs.pipe_file(path, data, **({"mode": "create"} if self.create_only else {}))
        except FileExistsError:
            raise CallIndexTaken(path) from None
        except OSError as exc:
            if "PreconditionFailed" in str(exc) or "412" in str(exc):
                raise CallIndexTaken(path) from None
            raise StoreWriteFailed(f"the call could not be written to {path}: {exc}") from None

    def _read_calls(self, rollout_id: str) -> StoredCalls:
        if self.local:
            stored = self._log_lines(rollout_id)
        else:
            paths = [path for path, _ in self._objects(rollout_id)]
            contents = self.fs.cat(paths, on_error="omit") if paths else {}
            stored = [(path.rsplit("/", 2)[-2] + "/" + path.rsplit("/", 1)[-1], contents[path])
                      for path in paths if path in contents]
        read = read_records(rollout_id, stored)
        self.images.check(read.calls)
        return read

    def _write_whole(self, path: str, data: bytes) -> None:
        """Writes a small file atomically: a temporary name renamed into place (a put on object stores)."""
        if not self.local:
            self.fs.pipe_file(path, data)
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):  # a failed write (a full disk) leaves no half file behind
                os.remove(tmp)

    def _read(self, path: str) -> bytes | None:
        try:
            return self.fs.cat_file(path)
        except FileNotFoundError:
            return None


def _object_index(path: str) -> int:
    """The call index in an object's name (`calls/000012.json`), or -1 if it is no call's."""
    name = path.rsplit("/", 1)[-1]
    stem = name[:-5] if name.endswith(".json") else ""
    return int(stem) if stem.isdigit() and stem.isascii() else -1


def _undo_append(fd: int, start: int, written: int) -> None:
    """Cuts off what a failed append wrote, unless another writer appended since (then the next append
    starts a line of its own, and readers skip the torn bytes)."""
    try:
        if written and os.fstat(fd).st_size == start + written:
            os.ftruncate(fd, start)
    except OSError:
        pass


def _cut_torn_tail(path: str) -> int:
    """Cuts a record that a crash left without its final newline, so the next append starts a line; returns
    the log's size then (0 without a log)."""
    try:
        with open(path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return 0
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return size
            f.seek(0)
            return f.truncate(f.read().rfind(b"\n") + 1)
    except FileNotFoundError:
        return 0


def _protocols(fs) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)
