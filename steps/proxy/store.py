"""Durable storage of rollouts and their recorded calls: a local folder or any fsspec URL (s3://...).

Layout (one JSON object per file, so a crash never leaves a half-written call that readers take):

    {root}/rollouts/{rollout_id}/rollout.json          registration: metadata, key digest, times
    {root}/rollouts/{rollout_id}/calls/{index:06d}.json one recorded call

Local writes go to a temporary name and are renamed into place; object stores put whole objects.
"""

import asyncio
import os
import uuid

import fsspec
import orjson


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

    def _call_path(self, rollout_id: str, call_index: int) -> str:
        return f"{self._rollout_dir(rollout_id)}/calls/{call_index:06d}.json"

    async def put_rollout(self, info: dict) -> None:
        """Writes (or rewrites) a rollout's registration."""
        path = f"{self._rollout_dir(info['rollout_id'])}/rollout.json"
        await asyncio.to_thread(self._write, path, orjson.dumps(info))

    async def get_rollout(self, rollout_id: str) -> dict | None:
        """The rollout's registration, or None if it was never registered."""
        path = f"{self._rollout_dir(rollout_id)}/rollout.json"
        data = await asyncio.to_thread(self._read, path)
        return None if data is None else orjson.loads(data)

    async def put_call(self, record: dict) -> None:
        """Durably writes one call record; returns once it is readable by a restarted proxy."""
        path = self._call_path(record["rollout_id"], record["call_index"])
        await asyncio.to_thread(self._write, path, orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY))

    async def list_calls(self, rollout_id: str) -> list[dict]:
        """Every stored call of a rollout, in call order."""
        return await asyncio.to_thread(self._list_calls, rollout_id)

    async def count_calls(self, rollout_id: str) -> int:
        """How many calls of a rollout are stored (the next call index after a restart)."""
        return len(await asyncio.to_thread(self._call_paths, rollout_id))

    def list_rollouts(self) -> list[str]:
        """Ids of every rollout in the store."""
        try:
            entries = self.fs.ls(f"{self.root}/rollouts", detail=False)
        except FileNotFoundError:
            return []
        return sorted(entry.rstrip("/").rsplit("/", 1)[-1] for entry in entries)

    def _call_paths(self, rollout_id: str) -> list[str]:
        try:
            names = self.fs.ls(f"{self._rollout_dir(rollout_id)}/calls", detail=False)
        except FileNotFoundError:
            return []
        return sorted(name for name in names if name.endswith(".json"))

    def _list_calls(self, rollout_id: str) -> list[dict]:
        paths = self._call_paths(rollout_id)
        if not paths:
            return []
        contents = self.fs.cat(paths)
        return [orjson.loads(contents[path]) for path in paths]

    def _write(self, path: str, data: bytes) -> None:
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


def _protocols(fs) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)
