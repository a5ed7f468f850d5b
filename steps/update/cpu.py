"""The CPU-only adjustments that let veRL's real `TrainingWorker` run without an accelerator.

Used by `steps.update` only when `torch.cuda.is_available()` is false (tests, the CPU benchmark);
on a GPU nothing here runs. veRL 0.9.1 knows only cuda/npu/rocm, so on CPU it needs:

1. a CPU platform, registered and selected before veRL caches the device name;
2. its FSDP language-model engine registered for device "cpu";
3. FSDP2, as everywhere in `steps.update` (FSDP1 hard-codes `sync_module_states=True`, which fails on CPU);
4. a gloo process group (torchrun's ranks, or a single process alone) and no torch.compile
   (`ENGINE_OVERRIDES`); sdpa attention instead of flash-attention-2, unpacked, is
   `steps.update.train.attention`'s choice wherever `flash_attn` is missing, on CPU always.

Unpacked ("remove padding" off) for speed: without flash-attention's varlen kernels, sdpa on one packed
sequence builds a full tokens x tokens mask: 8 samples x 512 tokens took 7.8 s a step packed, 1.2 s padded.

Everything veRL-specific is imported lazily so that importing this module costs nothing.
"""

import functools
import os
from contextlib import contextmanager, nullcontext
from types import SimpleNamespace
from typing import Any

import torch

# Applied to the engine config on CPU only (adjustment 4).
ENGINE_OVERRIDES: dict[str, Any] = {"use_torch_compile": False}


def needed() -> bool:
    """True when there is no GPU, so the CPU adjustments must be applied."""
    return not torch.cuda.is_available()


def _cpu_device_module() -> SimpleNamespace:
    """`torch.cpu` plus the memory-statistics calls veRL makes on its device module (all zero / no-op)."""
    zero = lambda *args, **kwargs: 0  # noqa: E731
    noop = lambda *args, **kwargs: None  # noqa: E731
    return SimpleNamespace(
        current_device=lambda: "cpu", device_count=lambda: 1, set_device=noop, synchronize=noop,
        is_available=lambda: True, get_device_name=lambda *a, **k: "CPU", manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed,
        empty_cache=noop, max_memory_allocated=zero, max_memory_reserved=zero, memory_allocated=zero,
        memory_reserved=zero, reset_peak_memory_stats=noop, mem_get_info=lambda *a, **k: (0, 0),
        get_rng_state=torch.get_rng_state, set_rng_state=torch.set_rng_state,
        Stream=None, Event=None, stream=lambda *a, **k: nullcontext(), current_stream=lambda *a, **k: None,
    )


def _register_cpu_platform() -> None:
    """Adjustment 1: a veRL platform whose device is "cpu" and whose collectives use gloo."""
    from verl.plugin.platform import PlatformBase, PlatformRegistry, set_platform

    cpu_module = _cpu_device_module()

    @PlatformRegistry.register(platform="cpu")
    class PlatformCPU(PlatformBase):
        """veRL platform for a machine without accelerators (tests only)."""

        device_name = "cpu"
        vendor_name = "cpu"
        device_module = cpu_module

        def is_available(self) -> bool:
            return True

        def current_device(self) -> str:
            # veRL passes this to `.to(device=...)`; an int would mean an accelerator index.
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CPU_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> None:
            return None

    os.environ["VERL_PLATFORM"] = "cpu"
    set_platform(PlatformCPU())


def _register_cpu_engine() -> None:
    """Adjustment 2: veRL's FSDP language-model engine, also for device "cpu"."""
    from verl.workers.engine import EngineRegistry, FSDPEngineWithLMHead

    backends = EngineRegistry._engines["language_model"]
    for backend in ("fsdp", "fsdp2"):
        backends[backend].setdefault("cpu", FSDPEngineWithLMHead)


def _process_group() -> None:
    """Adjustment 4: a gloo group of the launcher's ranks (RANK, WORLD_SIZE, MASTER_* from torchrun), or alone
    a one-process group whose store is in memory (`steps.update.ranks.process_group`; veRL would ask for
    "cpu:gloo,cpu:gloo")."""
    from steps.update.ranks import process_group

    process_group("gloo")


@functools.cache
def apply() -> None:
    """Apply adjustments 1, 2 and the process-group env, once per process, before veRL's engine is imported."""
    _register_cpu_platform()
    _register_cpu_engine()
    _process_group()
