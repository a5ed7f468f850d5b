"""Swapping the served weights without failing a call, on every replica at once.

New calls wait at the gate, in-flight calls finish on the old weights, every live replica reloads the new
checkpoint in place (`collective_rpc reload_weights`, needs VLLM_SERVER_DEV_MODE=1), its prefix cache is
dropped (cached KV of the old weights would be wrong) and its version set; only then do calls resume,
stamped with the new version. No call is served by mixed versions: a replica whose reload failed while
another's succeeded is left out (its rollouts move); if none succeeded, every replica keeps the old weights.
"""

import asyncio

from steps.proxy.errors import ProxyError
from steps.proxy.replicas import Replica, Replicas, healthy
from steps.proxy.sessions import WeightGate
from steps.proxy.upstream import Upstream


async def swap_weights(gate: WeightGate, replicas: Replicas, weights_path: str, version: str) -> None:
    """Reloads every live replica's weights from `weights_path` (a Hugging Face folder) and serves them as `version`."""
    await gate.pause()
    serving = replicas.live() or replicas.all
    failures = await asyncio.gather(*(_reload(replica.upstream, weights_path, version) for replica in serving))
    if all(failures):
        await gate.resume()
        raise ProxyError(502, f"weight swap to {weights_path!r} failed, still serving version {gate.version!r}: "
                              f"{next(failure for failure in failures)}")
    for replica, failure in zip(serving, failures):
        if failure is None:
            replica.weight_version = version
        else:
            await _leave_out(replica, failure)
    await gate.resume(version)


async def _reload(upstream: Upstream, weights_path: str, version: str) -> str | None:
    """One replica's reload; None when it succeeded, else why not."""
    try:
        await upstream.request("POST", "/collective_rpc",
                               {"method": "reload_weights", "kwargs": {"weights_path": weights_path}})
        await upstream.request("POST", "/reset_prefix_cache")
        await upstream.request("POST", "/update_weight_version", {"new_version": version})
    except ProxyError as err:
        return err.message
    return None


async def _leave_out(replica: Replica, failure: str) -> None:
    """A replica that could not reload while others did: out of service, so that no call meets its old weights."""
    replica.state = "failed" if await healthy(replica.upstream) else "dead"
    replica.reason = f"the weight reload failed: {failure}"


async def initial_version(upstream: Upstream, configured: str | None) -> str:
    """The version to stamp on calls until the first swap: the configured one, else vLLM's own, else "0"."""
    if configured is not None:
        return configured
    try:
        version = (await upstream.request("GET", "/weight_info", timeout_s=5, retries=0)).get("weight_version")
    except ProxyError:
        version = None
    return str(version) if version is not None else "0"
