"""Swapping the served weights without failing a call, on every replica at once.

New calls wait at the gate, in-flight calls finish on the old weights, every replica in service (and every
one a failed reload left out that answers `/health`) reloads the new checkpoint in place (`collective_rpc
reload_weights`, needs VLLM_SERVER_DEV_MODE=1), its prefix cache is dropped (cached KV of the old weights
would be wrong), then its encoder cache (a vision model's image embeddings of the old weights: `reload_weights`
clears only the worker's copy, and the same image sent again would then kill the engine with "Encoder cache
miss"; a text model has none to drop) and its version set; only then do calls resume at the new version.

A LoRA run's checkpoint is an adapter (a folder with peft's `adapter_config.json`): vLLM serves the base model and
each replica loads the adapter beside it (`POST /v1/load_lora_adapter`, vllm/entrypoints/serve/lora/api_router.py)
under a name new with each version (`adapter_name`), from the path the caller gives (a new one per version: each
iteration's checkpoint folder). Calls then name that adapter as their `model` (steps.proxy.replicas). vLLM keys
its prefix cache on the adapter's (name, path) (vllm/v1/core/kv_cache_utils.py `_gen_lora_extra_hash_keys`), so
an adapter loaded again under a name and path it had before would be served with the old adapter's cached KV:
the new name per version avoids that, and the prefix cache is reset after the load all the same. The previous
adapter is unloaded once the replica serves the new one: the gate holds new calls and lets in-flight ones
finish first, so by then no call uses it.

A reload is four requests, and any of them can fail. A replica that was never reached keeps its old weights.
Any other failure (vLLM's error, a timeout, a connection lost mid-request, a cache reset or version update
failing after the load) leaves it holding weights nobody knows: it is left out ("failed", version unknown)
until a later swap reloads it. Calls are served only by replicas holding the gate's version
(steps.proxy.replicas), so no call is served by mixed or unknown weights; with none left, calls get a 503
naming the version. The swap's answer names each replica that failed, and at which stage.

Where vLLM cannot reload a model in place (a mixture-of-experts model on CPU: `steps.vllm_server.reloads_in_place`),
the serve step that started the replicas hands the proxy a `Restart`: each replica is then stopped and started
again on the new checkpoint (stage "restart", minutes rather than a fraction of a second), behind the same gate, and
its version set. A fresh process has no caches of the old weights to drop.
"""

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from steps.contracts import layout
from steps.contracts.layout import adapter_name
from steps.proxy.errors import ProxyError
from steps.proxy.replicas import Replica, Replicas, healthy
from steps.proxy.sessions import WeightGate
from steps.proxy.upstream import Unreachable, Upstream

log = logging.getLogger("openforge.proxy.weights")

STAGES = ("reload_weights", "reset_prefix_cache", "reset_encoder_cache", "update_weight_version")
ADAPTER_STAGES = ("load_lora_adapter", "reset_prefix_cache", "update_weight_version")


def is_adapter(weights_path: str) -> bool:
    """Whether the checkpoint folder `weights_path` is a LoRA adapter (peft's format) rather than full weights."""
    return (Path(weights_path) / layout.ADAPTER_CONFIG).is_file()


RESTART_STAGES = ("restart", "update_weight_version")
# Stops replica `index` and starts it again serving the checkpoint folder `weights_path`, on the same address; blocks
# until it answers /health and raises RuntimeError (one sentence) when it cannot. Runs on a worker thread.
Restart = Callable[[int, str], None]


@dataclass(frozen=True)
class Failure:
    """Why one replica's reload failed: the stage, vLLM's or the connection's message, and whether anything was sent."""

    replica: int
    stage: str
    message: str
    reached: bool  # False: the first request never reached it, so it keeps its old weights

    def info(self) -> dict:
        """As the swap's answer lists it."""
        return {"replica": self.replica, "stage": self.stage, "error": self.message}


async def swap_weights(gate: WeightGate, replicas: Replicas, weights_path: str, version: str,
                       restart: Restart | None = None) -> list[Failure]:
    """Reloads the replicas' weights from `weights_path` (a Hugging Face folder) and serves them as `version`
    (with `restart`: restarts each replica on it instead); the failures of a swap that reached at least one
    replica, a 502 naming every failure when none reloaded."""
    await gate.pause()
    try:
        # A replica a failed restart left out is restarted again, answering /health or not.
        targets = [replica for replica in replicas.all if replica.state == "live"
                   or (replica.state == "failed" and (restart is not None or await healthy(replica.upstream)))]
        adapter = adapter_name(version) if is_adapter(weights_path) else None
        restart = None if adapter is not None else restart  # an adapter leaves the base's weights as they are
        outcomes = await asyncio.gather(*(_reload(replica, weights_path, version, adapter, restart)
                                          for replica in targets))
    except BaseException:
        await gate.resume()
        raise
    failures = [failure for failure in outcomes if failure is not None]
    for replica, failure in zip(targets, outcomes):
        if failure is None:
            await _unload(replica, replica.adapter, adapter)
        # Left out during the swap (the watch) stays out; a restarted one was refusing /health while it started.
        if failure is None and replica.state == "dead" and restart is None:
            replica.weight_version, replica.adapter = version, adapter
        elif failure is None:
            replicas.serve(replica, version, adapter)
        elif failure.reached:
            replicas.leave_out(replica, "failed", f"the weight reload failed at {failure.stage}: {failure.message}")
        elif any(outcome is None for outcome in outcomes):  # never reached: old weights, now not the gate's
            replicas.leave_out(replica, "failed", f"the weight reload could not reach it: {failure.message}",
                               weight_version=replica.weight_version)
    if not replicas.serving(version):
        await gate.resume()
        said = "; ".join(f"replica {f.replica} at {f.stage}: {f.message}" for f in failures) or "each was left out"
        raise ProxyError(502, f"weight swap to {weights_path!r} left no replica serving version {version!r}; calls "
                              f"stay at version {gate.version!r} on the replicas that still hold it, if any ({said})")
    await gate.resume(version)
    return failures


async def _reload(replica: Replica, weights_path: str, version: str, adapter: str | None,
                  restart: Restart | None = None) -> Failure | None:
    """One replica's reload (of the full weights, with `adapter` its load, with `restart` a restart on them); None
    when it succeeded, else the stage that failed."""
    requests = {"reload_weights": ("/collective_rpc", {"method": "reload_weights",
                                                       "kwargs": {"weights_path": weights_path}}),
                "load_lora_adapter": ("/v1/load_lora_adapter", {"lora_name": adapter, "lora_path": weights_path}),
                "reset_prefix_cache": ("/reset_prefix_cache", None),
                "reset_encoder_cache": ("/reset_encoder_cache", None),
                "update_weight_version": ("/update_weight_version", {"new_version": version})}
    stages = RESTART_STAGES if restart is not None else STAGES if adapter is None else ADAPTER_STAGES
    # The same version swapped in again, or a replica whose last swap failed (it may hold this name already, and
    # vLLM refuses a name loaded twice): the name is unloaded first, and loaded afresh.
    if adapter is not None and (adapter == replica.adapter or replica.state == "failed"):
        await _unload(replica, adapter, None)
    for stage in stages:
        try:
            if stage == "restart":
                await asyncio.to_thread(restart, replica.index, weights_path)
                continue
            path, body = requests[stage]
            await replica.upstream.send("POST", path, body)  # vLLM answers some of them in plain text
        except RuntimeError as err:  # the restart's own sentence; the replica was stopped, so it holds nothing
            return Failure(replica.index, stage, str(err), reached=True)
        except ProxyError as err:
            reached = stage != stages[0] or not isinstance(err, Unreachable)
            return Failure(replica.index, stage, err.message.replace(replica.upstream.url, f"replica {replica.index}"),
                           reached)
    return None


async def _unload(replica: Replica, old: str | None, new: str | None) -> None:
    """Unloads adapter `old` from `replica` unless it is `new` or none; a failure is only logged: it costs one of
    vLLM's adapter slots (its LRU cache evicts one when full), never a wrong answer, as no call names it again."""
    if old is None or old == new:
        return
    try:
        await replica.upstream.send("POST", "/v1/unload_lora_adapter", {"lora_name": old})
    except ProxyError as err:
        log.warning("adapter unload failed", extra={"replica": replica.index, "adapter": old, "error": err.message})


async def initial_version(upstreams: list[Upstream], configured: str | None) -> str:
    """The version to stamp on calls until the first swap: the configured one, else vLLM's own (every replica's
    must agree), else "0"."""
    if configured is not None:
        return configured
    versions = {await _served_version(upstream) for upstream in upstreams}
    if len(versions) > 1:
        raise ValueError(f"the replicas serve different weight versions ({', '.join(sorted(versions))}); "
                         "start them on one checkpoint or set --weight-version")
    return versions.pop()


async def _served_version(upstream: Upstream) -> str:
    try:
        version = (await upstream.request("GET", "/weight_info", timeout_s=5, retries=0)).get("weight_version")
    except ProxyError:
        version = None
    return str(version) if version is not None else "0"
