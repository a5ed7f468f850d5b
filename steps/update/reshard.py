"""AdamW's state saved by N ranks, loaded by M: each rank takes the rows of its own FSDP2 shard from the N files.

veRL saves the optimizer as one `torch.save` file per rank (`optim_world_size_N_rank_R.pt`: the optimizer's
`state_dict`, each moment a DTensor sharded on its first dimension) and loads only the files of its own world
size. FSDP2 shards every parameter the same way at any world size (dimension 0 cut in chunks of
ceil(rows / ranks), as `torch.chunk`), so the saved shards, joined in rank order, are the whole moments, and
each rank's new part is a range of their rows. The files are memory-mapped and one parameter's moments are
joined at a time. The fp32 master weights veRL saves beside them (`model_world_size_N_rank_R.pt`: the module's
`state_dict`, FSDP2's same dim-0 DTensor shards; `fsdp_checkpoint_manager.py`, `save_checkpoint`) are resharded
the same way, one parameter joined at a time (`load_weights`).
"""

from pathlib import Path

import torch


def optimizer_file(folder: Path, world_size: int, rank: int) -> Path:
    """veRL's name for one rank's optimizer shard."""
    return folder / f"optim_world_size_{world_size}_rank_{rank}.pt"


def weights_file(folder: Path, world_size: int, rank: int) -> Path:
    """veRL's name for one rank's shard of the fp32 master weights."""
    return folder / f"model_world_size_{world_size}_rank_{rank}.pt"


def load_weights(module: torch.nn.Module, folder: Path, saved_world_size: int) -> None:
    """Loads into `module` (FSDP2's, on this rank) the fp32 master weights saved by `saved_world_size` ranks."""
    from torch.distributed.tensor import DTensor

    saved = [torch.load(weights_file(folder, saved_world_size, rank), mmap=True, weights_only=False)
             for rank in range(saved_world_size)]
    state = {}
    for name, param in module.state_dict().items():
        if not isinstance(param, DTensor):  # not sharded: every rank saved the whole of it
            state[name] = _local(saved[0][name]).clone()
            continue
        state[name] = _my_rows(torch.cat([_local(shard[name]) for shard in saved]), param)
    module.load_state_dict(state)


def load(optimizer: torch.optim.Optimizer, folder: Path, saved_world_size: int) -> None:
    """Loads into `optimizer` (FSDP2's, on this rank, before its first step) the state saved by
    `saved_world_size` ranks in `folder`."""
    from torch.distributed.tensor import DTensor

    saved = [torch.load(optimizer_file(folder, saved_world_size, rank), mmap=True, weights_only=False)
             for rank in range(saved_world_size)]
    params = [param for group in optimizer.param_groups for param in group["params"]]
    state = {}
    for index, param in enumerate(params):
        if index not in saved[0]["state"]:
            continue  # a parameter without a gradient yet has no moments
        moments = {"step": saved[0]["state"][index]["step"].clone()}
        for key in ("exp_avg", "exp_avg_sq"):
            whole = torch.cat([_local(shard["state"][index][key]) for shard in saved])
            moments[key] = _my_rows(whole, param) if isinstance(param, DTensor) else whole.clone()
        state[index] = moments
    optimizer.load_state_dict({"state": state, "param_groups": saved[0]["param_groups"]})


def _local(value) -> torch.Tensor:
    """A saved moment's rows on the rank that saved it."""
    return value.to_local() if hasattr(value, "to_local") else value


def _my_rows(whole: torch.Tensor, param) -> torch.Tensor:
    """This rank's part of a whole moment, as a DTensor laid out like `param` (FSDP2: chunks of dimension 0)."""
    from torch.distributed.tensor import DTensor

    mesh = param.device_mesh
    rows, ranks = whole.shape[0], mesh.size()
    chunk = -(-rows // ranks)
    first = min(mesh.get_local_rank() * chunk, rows)
    local = whole[first:first + param.to_local().shape[0]].clone().to(param.to_local().device)
    return DTensor.from_local(local, mesh, param.placements, run_check=False, shape=param.shape, stride=param.stride())
