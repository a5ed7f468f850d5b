"""A LoRA run's base model, fetched once into a cache that every iteration's serve pod mounts (`model_cache_volume`,
docs/serving.md "LoRA"): the first serve pod downloads the base, each later one finds it there and downloads only
its iteration's adapter.

A base is kept in a folder named by its identity: a hash of its URL and of each file's path, size and version (S3's
ETag, which changes with the content), so that a base rewritten at the same URL is fetched again, never served stale.
A fetch downloads into a temporary folder of the cache, lists the base again (unchanged, or the download is thrown
away), writes the folder's manifest (that identity) and renames the folder into place: rename(2) is atomic within
one filesystem, so a folder under its final name is always whole, and of two pods fetching the same base at once
the first rename wins and the other uses its folder and removes its own. A folder whose files do not match its
manifest (truncated, or left half by hand) is never used: it is moved aside and fetched again.
"""

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from steps.checkpoint import download, fetch, is_remote, remote_files

MANIFEST = ".openforge-base.json"  # in a cached folder: the identity it was fetched as, written last
PARTIAL = ".partial-"  # a download under way (or a pod killed during one): never used
KEY_CHARS = 24


def identity(url: str, listed: dict[str, dict], root: str) -> dict:
    """What names a base: its URL and each file's path below it, size and version (ETag where the store has one).

    >>> identity("s3://b/base", {"b/base/config.json": {"size": 9, "ETag": '"a1"'}}, "b/base")
    {'url': 's3://b/base', 'files': {'config.json': [9, '"a1"']}}
    """
    return {"url": url, "files": {path[len(root) + 1:]: [info.get("size") or 0, str(version(info))]
                                  for path, info in sorted(listed.items())}}


def version(info: dict) -> object:
    """A listed file's version: S3's ETag, else what other stores give (GCS's md5Hash), else its modification time."""
    for key in ("ETag", "etag", "md5Hash", "LastModified", "mtime", "updated"):
        if info.get(key):
            return info[key]
    return ""


def cache_key(ident: dict) -> str:
    """The cache folder's name for a base of this identity."""
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:KEY_CHARS]


def is_whole(folder: Path, ident: dict) -> bool:
    """Whether `folder` holds the base `ident` names: its manifest says that identity and every file is there at its
    size (a truncated file, a missing one, or no manifest at all: not whole)."""
    try:
        if json.loads((folder / MANIFEST).read_text()) != ident:
            return False
        return all((folder / path).stat().st_size == size for path, (size, _) in ident["files"].items())
    except (OSError, ValueError, TypeError, KeyError):
        return False


def fetch_base(url: str, cache: Path, skip: tuple[str, ...] = (),
               progress: Callable[[str], None] | None = None) -> Path:
    """A local folder holding the base model at `url` (without the top-level entries named in `skip`): a local `url`
    where it is; else its folder in `cache`, downloaded there first unless a whole one is there already."""
    if not is_remote(url):
        return fetch(url, cache, skip)
    _, root, listed = remote_files(url, skip, fresh=True)
    if not listed:
        raise FileNotFoundError(f"no checkpoint files at {url}")
    ident = identity(url, listed, root)
    folder = cache / cache_key(ident)
    if is_whole(folder, ident):
        _say(progress, f"the base model {url} is in the cache ({folder}); not fetched")
        return folder
    if folder.exists():
        _set_aside(folder)
    cache.mkdir(parents=True, exist_ok=True)
    partial = cache / f"{PARTIAL}{folder.name}-{uuid.uuid4().hex[:8]}"
    try:
        download(url, partial, skip, progress)
        _, _, again = remote_files(url, skip, fresh=True)
        if identity(url, again, root) != ident:
            raise OSError(f"the base model at {url} changed while it was fetched; serve again to fetch it anew")
        (partial / MANIFEST).write_text(json.dumps(ident, sort_keys=True))
        try:
            os.rename(partial, folder)
        except OSError:  # another pod renamed its copy into place first: use that one
            if not is_whole(folder, ident):
                raise
        _say(progress, f"the base model {url} fetched into the cache ({folder})")
        return folder
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _set_aside(folder: Path) -> None:
    """Moves a folder that is not whole out of the way (and removes it), so that a whole one can be renamed in; another
    pod may have moved it first."""
    aside = folder.with_name(f"{PARTIAL}{folder.name}-old-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(folder, aside)
    except FileNotFoundError:
        return
    shutil.rmtree(aside, ignore_errors=True)


def _say(progress: Callable[[str], None] | None, line: str) -> None:
    if progress is not None:
        progress(line)
