"""The vLLM replicas behind one proxy, and which one serves each call.

Affinity (the default): a rollout is given, when it registers, the live replica with the fewest open rollouts
(ties: the fewest calls in flight, then the lowest index), and keeps it. Its next call's prompt starts with its
history, which that replica's prefix cache holds. Only the proxy chooses: the rollout that the key opens
decides, and nothing in a request (a header, a body field, the path) names or probes a replica.
Round robin (`--replica-policy round-robin`): each call goes to the next live replica, whatever its rollout.
It exists to measure what affinity is worth (`benchmarks/replica_affinity.py`), not for a run.

A call is served only by a live replica holding the gate's weight version, and is stamped with the version
of the replica that served it; with none, it gets the dialect's 503 naming the version (never a replica left
out). A rollout counts on its replica until it closes or goes `IDLE_S` without a call (a rollout whose
runner died never closes).

A replica is left out as dead when its `/health` refuses the connection, or fails `DEAD_AFTER` times in a
row over at least `DEAD_SPAN_S` (checked after a call to it failed, and every `WATCH_S` while there are
several): one slow answer from a busy API server is not a death. `TIMEOUTS_DEAD` calls in a row that ran to
the upstream timeout also leave it out (an engine hung while its API server answers `/health`). Its rollouts
move to the least loaded live replica at their next call, a call in flight on it gets the dialect's 502 (the
harness retries), and a call that never reached it (the connection was refused) goes to the new replica at
once. A dead replica stays out: a restarted vLLM would serve its checkpoint's weights, not those swapped in
since. One left out by a failed weight reload ("failed") is reloaded again at the next swap
(steps.proxy.weights). The last live replica is never left out as dead: its calls get its own errors, as with
one server.
"""

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Literal

from steps.proxy.errors import ProxyError
from steps.proxy.sessions import Rollout
from steps.proxy.upstream import Completion, Unreachable, Upstream

log = logging.getLogger("openforge.proxy.replicas")
AFFINITY, ROUND_ROBIN = "affinity", "round-robin"
POLICIES = (AFFINITY, ROUND_ROBIN)
WATCH_S = 5.0  # how often each live replica's /health is asked while there are several
HEALTH_TIMEOUT_S = 10.0  # a busy vLLM still answers /health at once: its API server is not the engine
DEAD_AFTER = 3  # failed /health checks in a row (not refused) before a replica is left out as dead...
DEAD_SPAN_S = 30.0  # ...spanning at least this long
TIMEOUTS_DEAD = 3  # calls in a row that ran to the upstream timeout: a hung engine (its /health still answers)
IDLE_S = 900.0  # a rollout with no call this long stops counting on its replica (its next call counts it again)
State = Literal["live", "dead", "failed"]  # dead: its /health is gone; failed: a weight reload on it failed


@dataclass
class Replica:
    """One vLLM server: its client, the weights it holds (None: unknown, after a failed reload), and its load."""

    index: int
    upstream: Upstream
    weight_version: str | None
    adapter: str | None = None  # the LoRA adapter its calls name as their model (steps.proxy.weights); None: the base
    open: dict[str, float] = field(default_factory=dict)  # its rollouts' ids: when each last called
    in_flight: int = 0  # calls it is answering
    state: State = "live"
    reason: str | None = None  # why it was left out
    health_failures: list[float] = field(default_factory=list)  # when each /health of the current run failed
    timeouts: int = 0  # its calls in a row that ran to the upstream timeout

    @property
    def rollouts(self) -> int:
        """Its open rollouts that called within IDLE_S."""
        return len(self.open)

    def info(self) -> dict:
        """What the admin route `GET /replicas` shows of it (never its address)."""
        return {"replica": self.index, "state": self.state, "weight_version": self.weight_version,
                "adapter": self.adapter,
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
        """The replicas in service."""
        return [replica for replica in self.all if replica.state == "live"]

    def serving(self, version: str) -> list[Replica]:
        """The live replicas holding weight version `version`: the only ones that may serve its calls."""
        return [replica for replica in self.all if replica.state == "live" and replica.weight_version == version]

    def _least_loaded(self, version: str) -> Replica:
        serving = self.serving(version)
        if not serving:
            raise ProxyError(503, f"no replica serves weight version {version!r} now (every one is dead or failed "
                                  "its weight reload; see the proxy log); retry later")
        self._expire()
        return min(serving, key=Replica.load)

    def _expire(self) -> None:
        """Stops counting the rollouts that went IDLE_S without a call."""
        oldest = time.monotonic() - IDLE_S
        for replica in self.all:
            for rollout_id in [rid for rid, seen in replica.open.items() if seen < oldest]:
                del replica.open[rollout_id]

    def assign(self, rollout: Rollout, version: str) -> Replica | None:
        """Gives `rollout` the least loaded replica serving `version` and counts it there; None when none serves it
        (its first call then gets the 503, or a replica if one serves by then)."""
        try:
            replica = self._least_loaded(version)
        except ProxyError:
            return None
        rollout.replica = replica.index
        replica.open[rollout.rollout_id] = time.monotonic()
        return replica

    def release(self, rollout: Rollout) -> None:
        """A rollout that closes stops counting on its replica; releasing it again changes nothing."""
        if rollout.replica is not None:
            self.all[rollout.replica].open.pop(rollout.rollout_id, None)
            rollout.replica = None

    def pick(self, rollout: Rollout, version: str) -> Replica:
        """The replica for `rollout`'s next call at `version`: its own while it serves that version, else (moved) the
        least loaded one that does; a 503 when none does."""
        if self.policy == ROUND_ROBIN:
            serving = self.serving(version) or [self._least_loaded(version)]  # none: the 503
            return serving[next(self._turn) % len(serving)]
        own = None if rollout.replica is None else self.all[rollout.replica]
        if own is not None and own.state == "live" and own.weight_version == version:
            if rollout.closed_at is None:
                own.open[rollout.rollout_id] = time.monotonic()  # counted again if it had gone idle
            return own
        if own is not None:
            log.warning("rollout moved off a replica left out", extra={"rollout_id": rollout.rollout_id,
                                                                      "replica": rollout.replica})
        self.release(rollout)
        if rollout.closed_at is not None:  # a call admitted just before its rollout closed: counted nowhere
            return self._least_loaded(version)
        return self.assign(rollout, version) or self._least_loaded(version)

    async def complete(self, rollout: Rollout, body: dict, served: dict, version: str) -> Completion:
        """One call of `rollout` at the gate's `version` on its replica, whose index and weight version go into
        `served` (`replica`, `weight_version`, `adapter`: the call record's fields) as it is picked; one that never
        reached a replica left out goes to the next. A replica holding an adapter is sent it as the call's model."""
        while True:
            replica = self.pick(rollout, version)
            served.update(replica=replica.index, weight_version=replica.weight_version, adapter=replica.adapter)
            replica.in_flight += 1
            try:
                answer = await replica.upstream.complete(body, model=replica.adapter)
                replica.timeouts = 0
                return answer
            except ProxyError as err:
                if err.status == 504:
                    self._timed_out(replica)
                if err.status < 500 or not await self.leave_out_if_dead(replica) or not isinstance(err, Unreachable):
                    raise unnamed(err, replica) from None
            finally:
                replica.in_flight -= 1

    async def leave_out_if_dead(self, replica: Replica) -> bool:
        """Leaves `replica` out as dead if its /health refuses the connection, or has failed DEAD_AFTER times in a
        row over DEAD_SPAN_S, and another replica is live; True if it is out."""
        if replica.state != "live":
            return True
        # One replica (or the last live one) is never left out: no /health asked, its error goes back at once.
        if not self._others_live(replica):
            return False
        problem = await health_problem(replica.upstream)
        if problem is None:
            replica.health_failures.clear()
            return False
        replica.health_failures.append(time.monotonic())
        failures = replica.health_failures
        refused = problem.startswith("refused")
        if not refused and (len(failures) < DEAD_AFTER or failures[-1] - failures[0] < DEAD_SPAN_S):
            return False
        if not self._others_live(replica):  # asked again after the wait: another check may have left the others out
            return False
        self.leave_out(replica, "dead", f"its /health {problem}" if refused else
                       f"its /health failed {len(failures)} times in a row over {failures[-1] - failures[0]:.1f} s")
        return True

    def _timed_out(self, replica: Replica) -> None:
        """Counts a call that ran to the upstream timeout; TIMEOUTS_DEAD in a row (and another replica live) leave
        the replica out as dead: an engine hung while its API server still answers /health."""
        replica.timeouts += 1
        if replica.timeouts >= TIMEOUTS_DEAD and replica.state == "live" and self._others_live(replica):
            self.leave_out(replica, "dead", f"{replica.timeouts} calls in a row ran to the upstream timeout")

    def leave_out(self, replica: Replica, state: State, reason: str, weight_version: str | None = None) -> None:
        """Takes `replica` out of service (`weight_version`: what it may hold now, None when unknown)."""
        replica.state, replica.reason = state, reason
        if weight_version is not None or state == "failed":
            replica.weight_version = weight_version
        log.warning("replica left out", extra={"replica": replica.index, "state": state, "reason": reason})

    def serve(self, replica: Replica, version: str, adapter: str | None = None) -> None:
        """Puts `replica` (back) in service, holding `version` (with `adapter` loaded: a LoRA run's)."""
        replica.state, replica.reason, replica.weight_version, replica.adapter = "live", None, version, adapter
        replica.health_failures.clear()

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


async def health_problem(upstream: Upstream) -> str | None:
    """None if the server answers its /health, else what went wrong ("refused ...": nothing listens)."""
    try:
        await upstream.send("GET", "/health", timeout_s=HEALTH_TIMEOUT_S, retries=0)
        return None
    except Unreachable as err:
        return f"refused the connection ({err.message})"
    except ProxyError as err:
        return f"did not answer ({err.message})"


async def healthy(upstream: Upstream) -> bool:
    """Whether the server answers its /health."""
    return await health_problem(upstream) is None
