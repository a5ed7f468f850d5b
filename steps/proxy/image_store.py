"""A run's images, each stored once under the SHA-256 of its bytes, and the calls that name them.

    {store root}/images/{sha256}    the image's decoded bytes as sent (steps.contracts.layout.images_url)

A call's record keeps `images` (each image's reference, in prompt order) and its stored `request` has every
JSON string that carried an image's bytes (its data URL, or the bare base64) replaced by `REFERENCE_PREFIX + sha256`, so a screenshot that a
harness sends again with every later call is stored once, and the request's sharing with the call before it
(steps.proxy.store, `request_shared`) works as on text. An image is written before the record that names it
and never replaced: a local file is linked into place from a finished temporary one (two proxies writing the
same screenshot at once: one link wins, both are whole), an object is put only if its name is free. A local
file found under an image's name whose bytes do not hash to it (a crash before its data reached the disk) is
the one thing replaced. Readers check that every image a call names is stored and hashes to its name; a call
whose images are not is kept with `images` null and `store_error` saying which. A reader downloads and hashes
an image once: the bytes it verified stay in memory within a byte budget (`cache_bytes`, least recently used
out first), so the screenshot that every rollout of a task starts from, or that every later call of a rollout
names again, is read once per process; readers checking the same image at once wait for one download. An image
is never replaced, so one found whole stays whole; a reader that starts after an image was removed or altered
finds that.
"""

import hashlib
import os
import re
import threading
import uuid
from collections import OrderedDict

import orjson

from steps.proxy.images import REFERENCE_PREFIX, Image

IMAGES = "images"
_FETCHED_AT_ONCE = 16  # images a reader holds at once while checking them, beside the verified ones kept
CACHE_BYTES = 256 * 2**20  # verified images a reader keeps: ~2,500 screenshots of 100 KB
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# One JSON string token (outside strings a JSON text has no quote but a string's delimiters), unrolled so that
# a long run of plain characters (an image's base64) is matched in C without backtracking.
_JSON_STRING = re.compile(rb'"([^"\\]*(?:\\.[^"\\]*)*)"', re.S)
_OTHER_ESCAPE = re.compile(rb"\\[^/u]")  # an escape no image payload (base64, a data URL) can hold


class ImageWriteFailed(Exception):
    """An image the store could not write; the call that sent it is not stored."""


def referenced_request(line: bytes, images: list[Image]) -> bytes:
    r"""The request as stored: each JSON string that is exactly an image's payload as sent (or, for a data
    URL, its base64) becomes the image's reference, however the harness's JSON encoder escaped it (`\/`, as
    some encoders write every slash, or `\u` escapes). One pass over the request, however many images it has.

    >>> image = Image("5e1f", "image/png", b"", 1, 1, "data:image/png;base64,iVBO")  # a short name, to read
    >>> referenced_request(b'{"url": "data:image/png;base64,iVBO", "text": "data:image/png;base64,iVBOx"}', [image])
    b'{"url": "openforge-image:sha256:5e1f", "text": "data:image/png;base64,iVBOx"}'
    >>> referenced_request(b'{"url": "data:image\\/png;base64,iVBO", "data": "\\u0069VBO"}', [image])
    b'{"url": "openforge-image:sha256:5e1f", "data": "openforge-image:sha256:5e1f"}'
    """
    if not images:
        return line
    references = {}
    for image in images:
        reference = f'"{REFERENCE_PREFIX}{image.sha256}"'.encode()
        references[image.sent.encode()] = reference
        if image.sent.startswith("data:"):  # a dialect that sends the bare base64 (Messages) and a data URL built from it
            references[image.sent.partition(",")[2].encode()] = reference
    lengths, shortest = {len(sent) for sent in references}, min(len(sent) for sent in references)

    def swap(match: re.Match) -> bytes:
        inner = match.group(1)
        if len(inner) in lengths and inner in references:
            return references[inner]
        # An escaped payload is longer than the payload, and the only escapes one can hold are `\/` and `\u`
        # (a text's `\n` rules it out at once): only such a string is decoded, to be looked up as sent.
        if len(inner) > shortest and b"\\" in inner and _OTHER_ESCAPE.search(inner) is None:
            try:
                return references.get(orjson.loads(match.group(0)).encode(), match.group(0))
            except orjson.JSONDecodeError:  # a lone surrogate (`\\ud800`): text, never an image
                pass
        return match.group(0)

    return _JSON_STRING.sub(swap, line)


def valid_references(images) -> bool:
    """Whether a record's `images` is a list of references a reader may follow (a name that is a SHA-256,
    never a path).

    >>> valid_references([{"sha256": "0" * 64, "media_type": "image/png", "width": 2, "height": 1}])
    True
    >>> valid_references([{"sha256": "../calls.jsonl", "media_type": "image/png", "width": 2, "height": 1}])
    False
    """
    return isinstance(images, list) and all(
        isinstance(ref, dict) and isinstance(ref.get("sha256"), str) and _SHA256.fullmatch(ref["sha256"]) is not None
        and isinstance(ref.get("media_type"), str)
        and all(type(ref.get(key)) is int and ref[key] > 0 for key in ("width", "height")) for ref in images)


class ImageUnreadable(Exception):
    """An image that is not stored whole under its name; the message says which and why."""


class VerifiedImages:
    """Images whose bytes a reader found to hash to their names, kept within `budget` bytes (the least recently
    used go first; one larger than the budget is not kept), and the names being fetched now, so that readers
    checking one image at once download it once.

    >>> kept = VerifiedImages(budget=5)
    >>> kept.add("a", b"123"); kept.add("b", b"45"); kept.get("a"); kept.add("c", b"6")  # "b" is the oldest now
    b'123'
    >>> [name for name in "abc" if kept.get(name) is not None], kept.size
    (['a', 'c'], 4)
    """

    def __init__(self, budget: int):
        self.budget, self.size = budget, 0
        self._bytes: OrderedDict[str, bytes] = OrderedDict()
        self._fetching: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> bytes | None:
        with self._lock:
            data = self._bytes.get(name)
            if data is not None:
                self._bytes.move_to_end(name)
            return data

    def add(self, name: str, data: bytes) -> None:
        if len(data) > self.budget:
            return
        with self._lock:
            if name in self._bytes:
                return
            self._bytes[name], self.size = data, self.size + len(data)
            while self.size > self.budget:
                self.size -= len(self._bytes.popitem(last=False)[1])

    def claim(self, names: list[str]) -> tuple[list[str], list[tuple[str, threading.Event]]]:
        """Of `names` not verified yet: those this reader is to fetch (it must `release` them) and, with the event
        set when they are released, those another reader is fetching now."""
        mine, theirs = [], []
        with self._lock:
            for name in names:
                if name in self._bytes:
                    self._bytes.move_to_end(name)
                elif name in self._fetching:
                    theirs.append((name, self._fetching[name]))
                else:
                    self._fetching[name] = threading.Event()
                    mine.append(name)
        return mine, theirs

    def release(self, names: list[str]) -> None:
        with self._lock:
            for name in names:
                self._fetching.pop(name).set()


class ImageStore:
    """Writes images once, create-only, under `{root}/images`, and checks them for readers, each image read once
    (`VerifiedImages`, within `cache_bytes`)."""

    def __init__(self, fs, root: str, local: bool, create_only: bool, fsync: bool = False,
                 cache_bytes: int = CACHE_BYTES):
        self.fs, self.folder, self.local, self.create_only, self.fsync = fs, f"{root}/{IMAGES}", local, create_only, fsync
        self._stored: set[str] = set()  # names this process wrote or found whole: never written again
        self._lock = threading.Lock()
        self.verified = VerifiedImages(cache_bytes)

    @classmethod
    def reader(cls, images_url: str, cache_bytes: int = CACHE_BYTES) -> "ImageStore":
        """A reader of the images in `images_url` (a run's image folder, `steps.contracts.layout.images_url`: a local
        path or `s3://`), for `read` and `check`."""
        import fsspec

        fs, folder = fsspec.core.url_to_fs(images_url)
        root = folder.rstrip("/").removesuffix(f"/{IMAGES}")
        if f"{root}/{IMAGES}" != folder.rstrip("/"):
            raise ValueError(f"{images_url} is not an image folder (its last part must be {IMAGES!r})")
        return cls(fs, root, "file" in ((fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol),
                   create_only=False, cache_bytes=cache_bytes)

    def path(self, sha256: str) -> str:
        """Where the image named `sha256` is stored."""
        return f"{self.folder}/{sha256}"

    def new(self, images: list[Image]) -> list[Image]:
        """The call's images this process has not stored yet, each once."""
        with self._lock:
            return list({image.sha256: image for image in images if image.sha256 not in self._stored}.values())

    def put(self, images: list[Image]) -> int:
        """Stores each image unless it is stored already and returns the bytes written; raises ImageWriteFailed
        naming the first that could not be (the images written before it stay: whole, and named by their bytes)."""
        written = 0
        for image in images:
            try:
                wrote = self._put_local(image) if self.local else self._put_object(image)
            except OSError as exc:
                raise ImageWriteFailed(f"image {image.sha256} could not be written to {self.path(image.sha256)}: "
                                       f"{exc.strerror or exc}") from None
            written += len(image.data) if wrote else 0
            with self._lock:
                self._stored.add(image.sha256)
        return written

    def _put_local(self, image: Image) -> bool:
        """Writes the image unless a file holding it is there; whether this call wrote it."""
        path = self.path(image.sha256)
        if _hashes_to(path, image.sha256):
            return False
        os.makedirs(self.folder, exist_ok=True)
        tmp = f"{self.folder}/.{image.sha256}.{uuid.uuid4().hex}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(image.data)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            try:
                os.link(tmp, path)  # never replaces: a concurrent writer's link of the same bytes wins
            except FileExistsError:
                if _hashes_to(path, image.sha256):
                    return False
                os.replace(tmp, path)  # a torn leftover (or a directory: then this fails)
            return True
        finally:
            if os.path.lexists(tmp):
                os.remove(tmp)

    def _put_object(self, image: Image) -> bool:
        """Puts the image unless its name is taken; whether this call put it."""
        try:
            self.fs.pipe_file(self.path(image.sha256), image.data, **({"mode": "create"} if self.create_only else {}))
        except FileExistsError:
            return False  # stored by another call or proxy: an object is put whole, so it holds these bytes
        except OSError as exc:
            if "PreconditionFailed" not in str(exc) and "412" not in str(exc):
                raise
            return False
        return True

    def check(self, records: list[dict]) -> list[dict]:
        """Gives each record `images` (in place; [] for records older than images) and, for one whose
        images are not all stored whole under their names, `images` null and `store_error` saying why."""
        names = {ref["sha256"] for record in records if valid_references(record.get("images"))
                 for ref in record["images"]}
        problems = self._problems(sorted(names))
        for record in records:
            images = record.setdefault("images", [])
            if not valid_references(images):
                _unreadable(record, "not a list of image references ({sha256, media_type, width, height})")
                continue
            bad = [f"{ref['sha256']} {problems[ref['sha256']]}" for ref in images if ref["sha256"] in problems]
            if bad:
                _unreadable(record, "image " + "; image ".join(dict.fromkeys(bad)))
        return records

    def read(self, name: str) -> bytes:
        """The bytes of the image `name` (a SHA-256), checked against it (once per process); ImageUnreadable if
        they are not stored whole under that name."""
        data = self.verified.get(name)
        if data is not None:
            return data
        if not _SHA256.fullmatch(name):
            raise ImageUnreadable(f"image name {name!r} is not a SHA-256 (64 lowercase hex digits)")
        ((_, data, problem),) = self._fetch([name])
        if problem is not None:
            raise ImageUnreadable(f"image {name} {problem} ({self.path(name)})")
        self.verified.add(name, data)
        return data

    def _problems(self, names: list[str]) -> dict[str, str]:
        """What is wrong with each named image that is not stored whole under its name: each is read and hashed
        unless this reader verified it before (or another reader is verifying it now: then its answer is used)."""
        mine, theirs = self.verified.claim(names)
        problems = {}
        try:
            for name, data, problem in self._fetch(mine):
                if problem is None:
                    self.verified.add(name, data)
                else:
                    problems[name] = problem
        finally:
            self.verified.release(mine)
        for name, fetched in theirs:
            fetched.wait()
            if self.verified.get(name) is None:  # found not whole (or too large to keep): this reader looks itself
                problems.update((name, problem) for name, _, problem in self._fetch([name]) if problem is not None)
        return problems

    def _fetch(self, names: list[str]):
        """(name, bytes, None) for each named image stored whole under its name, else (name, None, what is wrong);
        a few at a time (a rollout's images are never all in memory)."""
        for start in range(0, len(names), _FETCHED_AT_ONCE):
            chunk = names[start:start + _FETCHED_AT_ONCE]
            contents = self.fs.cat([self.path(name) for name in chunk], on_error="return")
            for name in chunk:
                data = contents.get(self.path(name))
                if isinstance(data, FileNotFoundError) or data is None:
                    yield name, None, "is not in the store"
                elif not isinstance(data, bytes):
                    yield name, None, f"cannot be read from the store ({getattr(data, 'strerror', None) or data})"
                elif hashlib.sha256(data).hexdigest() != name:
                    yield name, None, "is stored with bytes that do not hash to its name"
                else:
                    yield name, data, None


def _hashes_to(path: str, sha256: str) -> bool:
    """Whether a local file holds bytes that hash to `sha256` (False if there is none; OSError if the
    name is taken by something that is not a readable file)."""
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest() == sha256
    except FileNotFoundError:
        return False


def _unreadable(record: dict, why: str) -> None:
    record["images"] = None
    note = f"images: {why}"
    record["store_error"] = note if record.get("store_error") is None else f"{record['store_error']}; {note}"
