"""Swapping the served weights without failing a call.

New calls wait at the gate, in-flight calls finish on the old weights, vLLM reloads the new
checkpoint in place (`collective_rpc reload_weights`, needs VLLM_SERVER_DEV_MODE=1), its prefix cache
is dropped (cached KV of the old weights would be wrong), and calls resume stamped with the new version.
"""

from steps.proxy.errors import ProxyError
from steps.proxy.sessions import WeightGate
from steps.proxy.upstream import Upstream


async def swap_weights(gate: WeightGate, upstream: Upstream, weights_path: str, version: str) -> None:
    """Reloads vLLM's weights from `weights_path` (a Hugging Face folder) and serves them as `version`."""
    await gate.pause()
    try:
        await upstream.request("POST", "/collective_rpc",
                               {"method": "reload_weights", "kwargs": {"weights_path": weights_path}})
        await upstream.request("POST", "/reset_prefix_cache")
        await upstream.request("POST", "/update_weight_version", {"new_version": version})
    except ProxyError as err:
        await gate.resume()
        raise ProxyError(502, f"weight swap to {weights_path!r} failed, still serving version "
                              f"{gate.version!r}: {err.message}") from None
    await gate.resume(version)


async def initial_version(upstream: Upstream, configured: str | None) -> str:
    """The version to stamp on calls until the first swap: the configured one, else vLLM's own, else "0"."""
    if configured is not None:
        return configured
    try:
        version = (await upstream.request("GET", "/weight_info", timeout_s=5, retries=0)).get("weight_version")
    except ProxyError:
        version = None
    return str(version) if version is not None else "0"
