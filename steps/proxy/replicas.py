"""The vLLM replicas behind one proxy, and which one serves each call.

Affinity (the default): a rollout is given, when it registers, the live replica with the fewest open rollouts
(ties: the fewest calls in flight, then the lowest index), and keeps it. Its next call's prompt starts with its
history, which that replica's prefix cache holds. Only the proxy chooses: the rollout that the key opens
decides, and nothing in a request (a header, a body field, the path) names or probes a replica.
Round robin (`--replica-policy round-robin`): each call goes to the next live replica, whatever its rollout.
It exists to measure what affinity is worth (`benchmarks/replica_affinity.py`), not for a run.

A replica whose `/health` does not answer (checked after a call to it failed, and every `WATCH_S` while
there are several) is left out while another is live: its rollouts move to the least loaded live replica
at their next call, a call in flight on it gets the dialect's 502 (the harness retries), and a call that
never reached it (the connection was refused) goes to the new replica at once. A replica left out stays
out: a restarted vLLM would serve its checkpoint's weights, not those swapped in since. The last live
replica is never left out: its calls get its own errors, and a vLLM restarted on its port is served
again, as with one server.
"""

import asyncio
import itertools
import logging
from dataclasses import dataclass, replace

from steps.proxy.errors import ProxyError
from steps.proxy.sessions import Rollout
from steps.proxy.upstream import Completion, Unreachable, Upstream

log = logging.getLogger("openforge.proxy.replicas")
AFFINITY, ROUND_ROBIN = "affinity", "round-robin"
POLICIES = (AFFINITY, ROUND_ROBIN)
WATCH_S = 5.0  # how often each live replica's /health is asked while there are several
HEALTH_TIMEOUT_S = 10.0  # a busy vLLM still answers /health at once: its API server is not the engine


@dataclass
class Replica:
    """One vLLM server: its client, the weights it serves, and its load."""

    index: int
    upstream: Upstream
    weight_version: str
    rollouts: int = 0  # open rollouts given to it
    in_flight: int = 0  # calls it is answering
    state: str = "live"  # "live"; "dead": no /health answer; "failed": a weight reload failed
    reason: str | None = None  # why it was left out

    def info(self) -> dict:
        """What the admin route `GET /replicas` shows of it (never its address)."""
        return {"replica": self.index, "state": self.state, "weight_version": self.weight_version,
                "rollouts": self.rollouts, "in_flight": self.in_flight, "reason": self.reason}

    def load(self) -> tuple[int, int, int]:
        """How loaded it is, least first: open rollouts, then calls in flight, then its index."""
        return self.rollouts, self.in_flight, self.index


class Replicas:
    """The replicas and the rule that gives each call one (see the module docstring)."""

    def __init__(self, upstreams: list[Upstream], version: str, policy: str = AFFINITY):
        if policy not in POLICIES:
            raise ValueError(f"the replica policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.all = [Replica(index, upstream, version) for index, upstream in enumerate(upstreams)]
        self.policy = policy
        self._turn = itertools.count()

    def live(self) -> list[Replica]:
        """The replicas serving calls."""
        return [replica for replica in self.all if replica.state == "live"]

    def assign(self, rollout: Rollout) -> Replica:
        """Gives `rollout` the least loaded live replica (every replica when none is live) and counts it there."""
        replica = min(self.live() or self.all, key=Replica.load)
        rollout.replica = replica.index
        replica.rollouts += 1
        return replica

    def release(self, rollout: Rollout) -> None:
        """A rollout that closes stops counting on its replica; releasing it again changes nothing."""
        if rollout.replica is not None:
            self.all[rollout.replica].rollouts -= 1
            rollout.replica = None

    def pick(self, rollout: Rollout) -> Replica:
        """The replica for `rollout`'s next call: its own while it is live, else (moved) the least loaded live one."""
        if self.policy == ROUND_ROBIN:
            live = self.live() or self.all
            return live[next(self._turn) % len(live)]
        if rollout.replica is not None and (self.all[rollout.replica].state == "live" or not self.live()):
            return self.all[rollout.replica]
        if rollout.replica is not None:
            log.warning("rollout moved off a replica left out", extra={"rollout_id": rollout.rollout_id,
                                                                      "replica": rollout.replica})
        self.release(rollout)
        if rollout.closed_at is not None:  # a call admitted just before its rollout closed: counted nowhere
            return min(self.live() or self.all, key=Replica.load)
        return self.assign(rollout)

    async def complete(self, rollout: Rollout, body: dict, record: dict) -> Completion:
        """One call of `rollout` on its replica (named in `record["replica"]`); one that never reached a replica
        left out goes to the next."""
        while True:
            replica = self.pick(rollout)
            record["replica"] = replica.index
            replica.in_flight += 1
            try:
                return await replica.upstream.complete(body)
            except ProxyError as err:
                if err.status < 500 or not await self.leave_out_if_dead(replica) or not isinstance(err, Unreachable):
                    raise unnamed(err, replica) from None
            finally:
                replica.in_flight -= 1

    async def leave_out_if_dead(self, replica: Replica) -> bool:
        """Leaves `replica` out if its /health does not answer and another replica is live; True if it was."""
        if replica.state != "live":
            return True
        # One replica (or the last live one) is never left out: no /health asked, its error goes back at once.
        if not self._others_live(replica) or await healthy(replica.upstream) or not self._others_live(replica):
            return False  # asked again after the wait: another check may have left the others out meanwhile
        replica.state, replica.reason = "dead", "its /health did not answer"
        log.warning("replica left out", extra={"replica": replica.index, "reason": replica.reason})
        return True

    def _others_live(self, replica: Replica) -> bool:
        return any(other.state == "live" for other in self.all if other is not replica)

    async def watch(self) -> None:
        """Asks every live replica's /health every WATCH_S, so that a dead one's rollouts move before their next call
        fails; runs until cancelled."""
        while True:
            await asyncio.sleep(WATCH_S)
            for replica in self.live():
                await self.leave_out_if_dead(replica)

    def info(self) -> list[dict]:
        """Each replica's state and load."""
        return [replica.info() for replica in self.all]


def unnamed(err: ProxyError, replica: Replica) -> ProxyError:
    """`err` with the replica's address replaced by its number: the harness reads the message, and where vLLM
    listens is none of its business.

    >>> from steps.proxy.upstream import Upstream
    >>> second = Replica(1, Upstream("http://127.0.0.1:8001"), "0")
    >>> unnamed(ProxyError(502, "upstream http://127.0.0.1:8001 failed: reset"), second)
    ProxyError(status=502, message='upstream replica 1 failed: reset', param=None, code=None)
    """
    return replace(err, message=err.message.replace(replica.upstream.url, f"replica {replica.index}"))


async def healthy(upstream: Upstream) -> bool:
    """Whether the server answers its /health."""
    try:
        await upstream.send("GET", "/health", timeout_s=HEALTH_TIMEOUT_S, retries=0)
        return True
    except ProxyError:
        return False
