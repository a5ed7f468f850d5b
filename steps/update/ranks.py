"""The update's ranks: where this process stands among them and which rows of the batch are its own.

Alone, `python -m steps.update` is rank 0 of 1. Under torchrun (`steps.update.launch`, built by
`workflows.commands.update` when `update_gpus` or `update_nodes` > 1) the launcher's RANK, WORLD_SIZE and
LOCAL_RANK say where it stands; veRL's FSDP2 engine shards the model and AdamW over all ranks and treats
every rank as one data-parallel replica: each trains on its own rows and the gradients are averaged. veRL's
`train_mini_batch` reads its `mini_batch_size` as the global one and splits it over the ranks, so each rank
must hold its share of every mini-batch (`shard_rows`) to make the update one rank would make on the whole
batch (`docs/update.md`, "On many GPUs").
"""

import json
import os
import sys
import time
from dataclasses import dataclass

import torch

# The update's exit code for a refused input (`steps.update.train.main`, kept by `steps.update.launch`).
REFUSED = 2


@dataclass(frozen=True)
class Ranks:
    """This process's rank among `world_size` update processes (torchrun's numbering: a node's ranks are
    consecutive, `local_rank` counts within the node)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def first(self) -> bool:
        """Rank 0: the one that writes the checkpoint's shared files and speaks for the update."""
        return self.rank == 0


def process_group(backend: str, launched: bool = True) -> None:
    """The default process group of `backend`: the launcher's ranks (RANK, WORLD_SIZE, MASTER_* from torchrun) meeting
    at its MASTER_PORT, or, alone, one process whose store is in memory (`HashStore`): a port picked free and bound a
    moment later can be taken in between by any connection on the machine (EADDRINUSE, seen on CPU with rollouts
    beside an overlapped update; a GPU pod on the host network shares the node's ports). With `launched` False a
    launcher's group is left to veRL (`initialize_global_process_group_ray`, which makes one only when none is).

    Checked on an NVIDIA H200 (torch 2.11, `benchmarks/gpu_checks.py`): NCCL's one-rank communicator is made
    through the in-memory store (its unique id is exchanged there) and an all-reduce and FSDP2 step run on it."""
    from steps.net import free_port

    alone = "MASTER_PORT" not in os.environ and os.environ.get("WORLD_SIZE", "1") == "1"
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))  # for readers of the variable; nothing binds it alone
    if torch.distributed.is_initialized():
        return
    if alone:
        torch.distributed.init_process_group(backend=backend, store=torch.distributed.HashStore(), rank=0, world_size=1)
    elif launched:
        torch.distributed.init_process_group(backend=backend, rank=int(os.environ["RANK"]),
                                             world_size=int(os.environ["WORLD_SIZE"]))


def current() -> Ranks:
    """The ranks as the launcher set them in the environment (none set: a single process)."""
    return Ranks(rank=int(os.environ.get("RANK", "0")), world_size=int(os.environ.get("WORLD_SIZE", "1")),
                 local_rank=int(os.environ.get("LOCAL_RANK", "0")))


def refuse(line: str) -> int:
    """Says a refusal's one `line` and returns `REFUSED`. Under torchrun every rank writes it to its own
    TORCHELASTIC_ERROR_FILE, which `steps.update.launch` reads and prints once: the first rank to exit stops the
    others, so a line only rank 0 printed would be lost whenever another rank refused first. Alone it is printed.
    """
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:  # torchrun's own format (a message and a timestamp), read into its ProcessFailure
        with open(error_file, "w") as out:
            json.dump({"message": line, "timestamp": int(time.time())}, out)
    else:
        print(line, file=sys.stderr, flush=True)
    return REFUSED


def mini_batch_sizes(samples: int, mini_batches: int) -> list[int]:
    """The sizes of the consecutive mini-batches `samples` rows split into: `mini_batches` of them (fewer when there
    are fewer samples), as near equal as can be, the first ones a row larger where the count does not divide.
    Any sample count trains, though it varies per iteration (failed rollouts, multi-sample rollouts); the
    advantages are the whole batch's groups', computed before the split, so it changes no group.

    >>> mini_batch_sizes(7, 3), mini_batch_sizes(8, 4), mini_batch_sizes(2, 4), mini_batch_sizes(0, 2)
    ([3, 2, 2], [2, 2, 2, 2], [1, 1], [])
    """
    if not samples:
        return []
    count = min(mini_batches, samples)
    size, extra = divmod(samples, count)
    return [size + (k < extra) for k in range(count)]


def shard_rows(samples: int, mini_batches: int, world_size: int) -> list[list[int]]:
    """Each rank's rows of a batch of `samples` rows in its mini-batches (`mini_batch_sizes`, in order, as one rank
    trains them): rank r's k-th mini-batch is its consecutive part of the k-th. Where a mini-batch does not
    split evenly, its last ranks get row `samples`, the empty filler sample (`batch.FILLER`: no trained token).

    >>> shard_rows(4, 1, 1), shard_rows(5, 1, 2), shard_rows(4, 2, 2)
    ([[0, 1, 2, 3]], [[0, 1, 2], [3, 4, 5]], [[0, 2], [1, 3]])
    >>> shard_rows(7, 3, 2)
    [[0, 1, 3, 5], [2, 7, 4, 6]]
    """
    shards: list[list[int]] = [[] for _ in range(world_size)]
    first = 0
    for size in mini_batch_sizes(samples, mini_batches):
        per_rank = -(-size // world_size)
        rows = [*range(first, first + size), *[samples] * (per_rank * world_size - size)]
        for rank, shard in enumerate(shards):
            shard.extend(rows[rank * per_rank:(rank + 1) * per_rank])
        first += size
    return shards


def gather_rows(local: torch.Tensor, shards: list[list[int]], rows: int) -> torch.Tensor:
    """The [rows, ...] tensor whose rows are every rank's `local` rows put back where `shards` took them from
    (all ranks call it; `local` has the same shape on every rank)."""
    parts = [local]
    if len(shards) > 1:
        parts = [torch.empty_like(local) for _ in shards]
        torch.distributed.all_gather(parts, local.contiguous())
    full = torch.zeros((rows, *local.shape[1:]), dtype=local.dtype)
    for shard, part in zip(shards, parts, strict=True):
        full[shard] = part
    return full


def barrier() -> None:
    """Waits for every rank (nothing to wait for alone)."""
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.barrier()


def gather_objects(mine: dict) -> list[dict]:
    """Every rank's `mine`, in rank order (all ranks call it); alone, or before the process group is up, this
    rank's only."""
    if not (torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1):
        return [mine]
    every: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(every, mine)
    return every
