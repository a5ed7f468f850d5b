"""Rollout sessions (who may call, and as which rollout) and the weight gate.

A rollout's API key is random and known only to whoever registered it; the store keeps its SHA-256,
so a restarted proxy still accepts the harness that holds it. Every call takes the next index of its
rollout. Open rollouts stay in memory; a closed one leaves it (the store keeps it), except the last
`closed_kept` closed ones, so that a harness still calling after its close gets its 403 without a store
read. What the store keeps of a rollout is bounded by its quota (`StoreQuota`): a rollout at it makes no
further call. The weight gate holds new calls while weights are swapped and lets in-flight ones finish.
"""

import asyncio
import hashlib
import hmac
import re
import secrets
from collections import OrderedDict
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

from steps.logs import now
from steps.proxy.errors import ProxyError
from steps.proxy.store import CallStore, PromptBase, RequestBase

ROLLOUT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
CLOSED_KEPT = 1024
MIB = 1 << 20


def key_digest(api_key: str) -> str:
    """The stored form of an API key."""
    return hashlib.sha256(api_key.encode()).hexdigest()


@dataclass
class Rollout:
    """One registered rollout: its key digest, metadata, the next call index, the prompt and request
    of its last stored call, which the next call's stored ones may extend (store.share_prompt and
    share_request), and its replica."""

    rollout_id: str
    key_sha256: str
    metadata: dict
    created_at: float
    closed_at: float | None = None
    next_index: int = 0
    prompt_base: PromptBase | None = None
    request_base: RequestBase | None = None
    replica: int | None = None  # the replica serving its calls (steps.proxy.replicas); not stored: given again after a restart
    # Held against its quota (`StoreQuota`): what the store keeps of it (read back from the store after a restart)
    # and its calls admitted but not stored yet, each with its request's size as it would be stored unshared.
    stored_calls: int = 0
    stored_bytes: int = 0  # its records as written, and the images its calls stored first
    calls_in_flight: int = 0
    bytes_in_flight: int = 0

    def take_index(self) -> int:
        """Reserves the next call index (calls are numbered in arrival order)."""
        index, self.next_index = self.next_index, self.next_index + 1
        return index

    def info(self) -> dict:
        """The registration as stored (never the key itself)."""
        return {
            "rollout_id": self.rollout_id,
            "key_sha256": self.key_sha256,
            "metadata": self.metadata,
            "created_at": self.created_at,
            "closed_at": self.closed_at,
        }


@dataclass(frozen=True)
class StoreQuota:
    """What the store keeps of one rollout at most (the run's `store_quota_mb` and `store_quota_calls`; 0 turns
    one off): bytes (its call records as written, after the sharing of prompts and requests, and the images
    its calls stored first) and calls (every call stored: answered, failed or aborted)."""

    mb: int = 0
    calls: int = 0

    def admit(self, rollout: Rollout, request_bytes: int) -> None:
        """Counts a call of `rollout` in before it takes an index, holding `request_bytes` (its request as it
        would be stored unshared) against the quota until `release`. A 400 if the rollout is at a quota already,
        its calls in flight counted, so that calls sent at once cannot pass it together: the call takes no index
        and nothing of it is stored. A 400 because no harness retries one (Claude Code retries a 403 as an
        expired key, and 429s and 5xx with backoff: docs/proxy.md, "Limits"), so the harness ends its turn and
        the rollout is graded on what its answered calls did."""
        if self.calls and rollout.stored_calls + rollout.calls_in_flight >= self.calls:
            raise ProxyError(400, f"rollout {rollout.rollout_id!r} has made {self.calls} calls, the most the proxy "
                                  "stores for one rollout (store_quota_calls), so it answers no further call of it",
                             code="store_quota_exceeded")
        if self.mb and rollout.stored_bytes + rollout.bytes_in_flight >= self.mb * MIB:
            raise ProxyError(400, f"rollout {rollout.rollout_id!r} has reached the {self.mb} MiB the proxy stores for "
                                  "one rollout (store_quota_mb), so it answers no further call of it",
                             code="store_quota_exceeded")
        rollout.calls_in_flight += 1
        rollout.bytes_in_flight += request_bytes

    @staticmethod
    def release(rollout: Rollout, request_bytes: int) -> None:
        """Counts an admitted call out, stored or not (what was stored is in `stored_calls` and `stored_bytes`)."""
        rollout.calls_in_flight -= 1
        rollout.bytes_in_flight -= request_bytes


@dataclass
class Sessions:
    """Registered rollouts, backed by the store so that a restart loses none, and their store quota."""

    store: CallStore
    quota: StoreQuota = field(default_factory=StoreQuota)
    rollouts: dict[str, Rollout] = field(default_factory=dict)  # open ones
    closed: OrderedDict[str, Rollout] = field(default_factory=OrderedDict)  # the last closed_kept closed ones
    closed_kept: int = CLOSED_KEPT
    registering: set[str] = field(default_factory=set)  # ids whose registration is under way

    async def register(self, rollout_id: str, metadata: dict) -> tuple[Rollout, str]:
        """Registers a new rollout and returns it with its freshly made API key; 409 if the id is taken,
        also by a registration still under way (only one of concurrent ones gets a key)."""
        if not ROLLOUT_ID.match(rollout_id):
            raise ProxyError(400, "rollout_id must be 1-128 characters of letters, digits, '.', '_' or '-', "
                             f"starting with a letter or digit; got {rollout_id!r}", param="rollout_id")
        taken = ProxyError(409, f"rollout {rollout_id!r} is already registered", param="rollout_id")
        if rollout_id in self.registering:  # checked and claimed with no await between: the claim is atomic
            raise taken
        self.registering.add(rollout_id)
        try:
            if await self.find(rollout_id) is not None:
                raise taken
            api_key = "of-" + secrets.token_urlsafe(32)
            rollout = Rollout(rollout_id, key_digest(api_key), metadata, created_at=now())
            await self.store.put_rollout(rollout.info())
            self.rollouts[rollout_id] = rollout
        finally:
            self.registering.discard(rollout_id)
        return rollout, api_key

    async def find(self, rollout_id: str) -> Rollout | None:
        """The rollout with this id, reloaded from the store after a restart or a while after its close;
        None if unknown."""
        rollout = self.rollouts.get(rollout_id)
        if rollout is not None or not ROLLOUT_ID.match(rollout_id):
            return rollout
        rollout = self.closed.get(rollout_id)
        if rollout is not None:
            self.closed.move_to_end(rollout_id)
            return rollout
        info = await self.store.get_rollout(rollout_id)
        if info is None:
            return None
        stored = await self.store.resume_calls(rollout_id)
        rollout = Rollout(**info, next_index=stored.next_index, stored_calls=stored.calls, stored_bytes=stored.bytes)
        if rollout.closed_at is not None:
            return self._keep_closed(rollout)
        return self.rollouts.setdefault(rollout_id, rollout)

    def _keep_closed(self, rollout: Rollout) -> Rollout:
        """Moves a closed rollout out of the open ones, into the few closed ones kept (a copy without the
        last prompt and request: a call still in flight may set them on the original)."""
        if self.rollouts.get(rollout.rollout_id) is rollout:
            del self.rollouts[rollout.rollout_id]
        kept = self.closed.setdefault(rollout.rollout_id, replace(rollout, prompt_base=None, request_base=None))
        self.closed.move_to_end(rollout.rollout_id)
        while len(self.closed) > self.closed_kept:
            self.closed.popitem(last=False)
        return kept

    async def get(self, rollout_id: str) -> Rollout:
        """The rollout with this id, or a 404."""
        rollout = await self.find(rollout_id)
        if rollout is None:
            raise ProxyError(404, f"unknown rollout {rollout_id!r}: register it with POST /rollouts first")
        return rollout

    async def authorize(self, rollout_id: str, api_key: str | None) -> Rollout:
        """The open rollout that this key belongs to; 404 if unknown, 401 on a wrong key, 403 if closed."""
        rollout = await self.get(rollout_id)
        if not api_key or not hmac.compare_digest(key_digest(api_key), rollout.key_sha256):
            raise ProxyError(401, f"missing or wrong API key for rollout {rollout_id!r}")
        if rollout.closed_at is not None:
            raise ProxyError(403, f"rollout {rollout_id!r} is closed")
        return rollout

    async def close(self, rollout_id: str) -> Rollout:
        """Ends a rollout's session: later calls with its key are refused."""
        rollout = await self.get(rollout_id)
        if rollout.closed_at is None:
            rollout.closed_at, rollout.prompt_base, rollout.request_base = now(), None, None
            await self.store.put_rollout(rollout.info())
        return self._keep_closed(rollout)


class WeightGate:
    """Holds new calls while the served weights change; in-flight calls finish first."""

    def __init__(self, version: str):
        self.version = version
        self.in_flight = 0
        self.held = 0  # calls waiting for the gate to open
        self.paused = False
        self._changed = asyncio.Condition()

    @asynccontextmanager
    async def call(self):
        """Enters a call once the gate is open; yields the weight version that will serve it."""
        if self.paused:
            self.held += 1
            try:
                async with self._changed:
                    await self._changed.wait_for(lambda: not self.paused)
            finally:
                self.held -= 1
        self.in_flight += 1
        try:
            yield self.version
        finally:
            self.in_flight -= 1
            if self.paused and self.in_flight == 0:
                async with self._changed:
                    self._changed.notify_all()

    async def pause(self) -> None:
        """Stops admitting calls and returns once none is in flight."""
        self.paused = True
        async with self._changed:
            await self._changed.wait_for(lambda: self.in_flight == 0)

    async def resume(self, version: str | None = None) -> None:
        """Admits calls again, served by `version` from now on."""
        if version is not None:
            self.version = version
        self.paused = False
        async with self._changed:
            self._changed.notify_all()
