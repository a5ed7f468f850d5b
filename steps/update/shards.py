"""The served weights as Hugging Face sharded safetensors, written by the ranks themselves: no rank gathers the model.

    model-00001-of-0000N.safetensors ... model-0000N-of-0000N.safetensors + model.safetensors.index.json

The index is the Hugging Face one (`{"metadata": {"total_size": bytes}, "weight_map": {name: file}}`), which
transformers and vLLM read (vLLM: `model_executor/model_loader/weight_utils.py`,
`filter_duplicate_safetensors_files` loads exactly the files the index's `weight_map` names, so a stale file
beside them is never read). Each whole parameter is owned by one rank, the one with the fewest bytes so far
(the same choice on every rank: each sees the same names and shapes in the same order); the parameters are
gathered one at a time (`worker.engine.get_per_tensor_param`, veRL's own export with its Hugging Face names and
MoE experts unfused, which vLLM loads) and only the owner keeps its copy, cast to the served dtype, and writes
it into its own file once the file would pass `max_file_bytes`. So a rank holds at most one file's worth plus
the tensor in flight, whatever the model's size.

Why not torch's DCP with `HuggingFaceStorageWriter`: it writes each rank's dim-0 slices of every tensor, and a
file vLLM loads needs whole tensors, so it consolidates in a second pass that reads every slice back and writes
the files again (twice the disk and the I/O), and it names the state dict's keys, not the Hugging Face names
veRL's export gives (a fused MoE expert tensor is not what vLLM's qwen3_moe loader takes).
"""

import json
import os
from pathlib import Path
from typing import Iterable

import torch

from steps.update.ranks import barrier

INDEX_FILE = "model.safetensors.index.json"
SERVED_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def file_name(number: int, count: int) -> str:
    """Hugging Face's name of weight file `number` (from 1) of `count`.

    >>> file_name(2, 11)
    'model-00002-of-00011.safetensors'
    """
    return f"model-{number:05d}-of-{count:05d}.safetensors"


def weight_files(folder: Path) -> list[Path]:
    """The weight files of a checkpoint folder: the ones its index names, or, without an index, its
    `*.safetensors` (the single `model.safetensors` of a checkpoint written before the sharded layout)."""
    index = folder / INDEX_FILE
    if index.is_file():
        return [folder / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    return sorted(folder.glob("*.safetensors"))


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every weight of a checkpoint folder by name, in either layout (`weight_files`)."""
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for path in weight_files(folder):
        weights.update(load_file(str(path)))
    return weights


def _nbytes(tensor: torch.Tensor, dtype: torch.dtype) -> int:
    """Bytes of `tensor` once written: floating tensors in the served `dtype`, others as they are."""
    size = dtype.itemsize if tensor.is_floating_point() else tensor.element_size()
    return tensor.numel() * size


class _Files:
    """This rank's weight files so far, each written under a partial name (renamed when the count is known)."""

    def __init__(self, out: Path, rank: int, max_file_bytes: int) -> None:
        self.out, self.rank, self.max_file_bytes = out, rank, max_file_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.written: list[dict] = []  # {"partial": path, "names": [...], "bytes": n}

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Keeps `tensor` for the current file; writes that file first when `tensor` would take it past the cap,
        and at once when `tensor` alone fills it."""
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + size > self.max_file_bytes:
            self.flush()
        self.pending[name] = tensor
        self.pending_bytes += size

    def flush(self) -> None:
        """Writes the pending tensors as one file and lets them go."""
        from safetensors.torch import save_file

        if not self.pending:
            return
        partial = self.out / f".model-rank-{self.rank}-{len(self.written)}.safetensors.partial"
        save_file(self.pending, str(partial), metadata={"format": "pt"})
        self.written.append({"partial": str(partial), "names": list(self.pending), "bytes": self.pending_bytes})
        self.pending, self.pending_bytes = {}, 0


def save(tensors: Iterable[tuple[str, torch.Tensor]], out: Path, dtype: torch.dtype, max_file_bytes: int) -> dict:
    """Writes the whole tensors `tensors` yields (the same names and shapes on every rank, in the same order)
    as this rank's share of `out`'s weight files; rank 0 writes the index once every file is in place. Every
    rank of the process group (if any) calls it. Returns what this rank did: its `files`, the `bytes` in them,
    the most bytes it `held` at once while saving (its unwritten file, under the cap, plus the tensor in flight
    and its served copy) and the `model_bytes`."""
    rank, world_size = _group()
    out.mkdir(parents=True, exist_ok=True)
    files = _Files(out, rank, max_file_bytes)
    owned = [0] * world_size  # bytes given to each rank so far
    held = model_bytes = 0
    for name, tensor in tensors:
        size = _nbytes(tensor, dtype)
        owner = owned.index(min(owned))
        owned[owner] += size
        model_bytes += size
        if owner == rank:
            files.add(name, (tensor.to(dtype) if tensor.is_floating_point() else tensor).detach().cpu().contiguous())
        held = max(held, files.pending_bytes + tensor.numel() * tensor.element_size())
        if files.pending_bytes >= max_file_bytes:
            files.flush()
        del tensor  # the generator gathers the next one: only one is in flight
    files.flush()
    mine = [{"names": part["names"], "bytes": part["bytes"]} for part in files.written]
    every = _all_gather(mine, world_size)
    count = sum(len(parts) for parts in every)
    first = sum(len(parts) for parts in every[:rank]) + 1
    if rank == 0:  # a rewrite (a retried update) may have left another layout's files
        for stale in [*out.glob("model*.safetensors"), out / INDEX_FILE]:
            stale.unlink(missing_ok=True)
    barrier()
    names = [file_name(first + number, count) for number in range(len(files.written))]
    for part, name in zip(files.written, names):
        os.replace(part["partial"], out / name)
    barrier()
    if rank == 0:
        weight_map = {tensor_name: file_name(number, count) for number, part in
                      enumerate((part for parts in every for part in parts), start=1) for tensor_name in part["names"]}
        index = {"metadata": {"total_size": sum(part["bytes"] for parts in every for part in parts)},
                 "weight_map": weight_map}
        partial = out / f".{INDEX_FILE}.partial"
        partial.write_text(json.dumps(index, indent=2) + "\n")
        os.replace(partial, out / INDEX_FILE)
    return {"files": names, "bytes": sum(part["bytes"] for part in mine), "held": held, "model_bytes": model_bytes}


def _group() -> tuple[int, int]:
    """(rank, world size) of the default process group; (0, 1) without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_gather(value, world_size: int) -> list:
    """Every rank's `value`, in rank order (a small list of names and sizes: the index's content)."""
    import torch.distributed as dist

    if world_size == 1:
        return [value]
    every = [None] * world_size
    dist.all_gather_object(every, value)
    return every
