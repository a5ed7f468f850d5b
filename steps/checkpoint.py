"""Checkpoint folders, local or in an object store (`s3://...`): fetched before a step reads them,
published after it wrote them, deleted when the run keeps no more of them (`keep_checkpoints`).

A checkpoint written by `steps.update` holds the model vLLM serves (safetensors, config, tokenizer),
`optimizer/` (AdamW's state, one file per rank ending `_rank_{R}.pt`, read only by the next update) and
`metrics.json`. The serve step fetches the model alone; an update's rank fetches the model once per node and
its own optimizer shard (`fetch_rank`).

Every object this module moves is counted in `IO` (per process): a step reports what it read and wrote
(`docs/update.md`, "What each rank reads and writes"). A local folder is used where it is and counts nothing.
"""

import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from steps.contracts.config import RunConfig
from steps.contracts.layout import METRICS_FILE, checkpoint_url

OPTIMIZER_DIR = "optimizer"
TRAINING_ONLY = (OPTIMIZER_DIR, METRICS_FILE)  # what serving a checkpoint does not need
# A per-rank file of `optimizer/` (veRL's `optim_world_size_N_rank_R.pt`, `extra_state_...`, the master weights').
RANK_FILE = re.compile(r"_rank_(\d+)\.pt$")
# In a node's shared folder: written by local rank 0 once the weights are complete.
READY = ".ready"


@dataclass
class Transfers:
    """Bytes and objects moved through this module by this process."""

    read_bytes: int = 0
    read_objects: int = 0
    written_bytes: int = 0
    written_objects: int = 0
    deleted_bytes: int = 0
    deleted_objects: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counts as a JSON-ready dict."""
        return asdict(self)


IO = Transfers()  # this process's counts: one update rank, one serve step


def io_counts(rank: int = 0) -> dict:
    """This process's bytes and objects moved through the store so far (`IO`), as update rank `rank` of its node
    (torchrun's GROUP_RANK) says them in `metrics.json`'s `io` and its last stderr line."""
    return {"rank": rank, "node": int(os.environ.get("GROUP_RANK", "0")), **IO.as_dict()}


def is_remote(url: str) -> bool:
    """Whether `url` names an object store (or any fsspec protocol) rather than a local folder."""
    return "://" in url and not url.startswith("file://")


def fetch(url: str, local: Path, skip: tuple[str, ...] = (), progress: Callable[[str], None] | None = None,
          keep: Callable[[str], bool] | None = None) -> Path:
    """A local folder holding `url`'s files: the folder itself when local, else a download through
    fsspec into `local`, file by file (a line to `progress` after each), leaving out the top-level
    entries named in `skip` and (`keep`) the files whose path below `url` it refuses."""
    if not is_remote(url):
        return Path(url.removeprefix("file://"))
    if not download(url, local, skip, progress, keep):
        raise FileNotFoundError(f"no checkpoint files at {url}")
    return local


def download(url: str, local: Path, skip: tuple[str, ...] = (), progress: Callable[[str], None] | None = None,
             keep: Callable[[str], bool] | None = None) -> int:
    """`fetch`'s download of a remote `url` into `local`; returns the number of files (0: none there)."""
    fs, root, listed = remote_files(url, skip, keep)
    files = {path: info["size"] or 0 for path, info in listed.items()}
    total, done = sum(files.values()), 0
    for number, (path, size) in enumerate(sorted(files.items()), 1):
        target = local / path[len(root) + 1:]
        target.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(path, str(target))
        done += size
        IO.read_bytes += target.stat().st_size
        IO.read_objects += 1
        if progress is not None:
            progress(f"fetched {number}/{len(files)} files, {done / 1e6:.0f}/{total / 1e6:.0f} MB, from {url}")
    return len(files)


def remote_files(url: str, skip: tuple[str, ...] = (), keep: Callable[[str], bool] | None = None,
                 fresh: bool = False) -> tuple[Any, str, dict[str, dict]]:
    """What a fetch of a remote `url` takes: its filesystem, its root and each file's listing entry (its size and,
    where the store has one, its version: S3's ETag) by path, leaving out the top-level entries named in `skip` and
    (`keep`) the files whose path below `url` it refuses; `fresh`: not from a listing fsspec cached earlier."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    root = root.rstrip("/")
    if fresh:
        fs.invalidate_cache()
    return fs, root, {path: info for path, info in fs.find(root, detail=True).items()
                      if path[len(root) + 1:].split("/", 1)[0] not in skip
                      and (keep is None or keep(path[len(root) + 1:]))}


def node_folder(environ: dict | None = None) -> Path | None:
    """The folder the update's ranks of this node share for the weights they fetch, or None alone.

    A node's ranks run in one pod (one container: one temporary folder). torchrun gives each of its workers
    TORCHELASTIC_RUN_ID, the same for one launch (`torch/distributed/elastic/agent/server/
    local_elastic_agent.py`, `_start_workers`; a fresh uuid with `--standalone`, `torch/distributed/run.py`
    `run`, but "none" for a multi-node static rendezvous), and starts each as a child of its agent, so the parent's
    pid tells this launch's ranks from any other's on the machine.

    >>> node_folder({}) is None
    True
    >>> node_folder({"TORCHELASTIC_RUN_ID": "abc", "LOCAL_WORLD_SIZE": "2"}).name.startswith("openforge-node-abc-")
    True
    """
    environ = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" not in environ or int(environ.get("LOCAL_WORLD_SIZE", "1")) <= 1:
        return None
    import tempfile

    return Path(tempfile.gettempdir()) / f"openforge-node-{environ['TORCHELASTIC_RUN_ID']}-{os.getppid()}"


def fetch_rank(url: str, local: Path, rank: int = 0, world_size: int = 1, local_rank: int = 0,
               node: Path | None = None, progress: Callable[[str], None] | None = None,
               poll_s: float = 0.2, optimizer: bool = True) -> Path:
    """An update rank's local copy of the checkpoint at `url`: the folder itself when local; else the weights,
    config and tokenizer fetched once per node (local rank 0 into `node`, the others wait for it: `node_folder`;
    `node` None: into `local`, alone), linked into `local`, and `local/optimizer/` with its shared small files
    and only this rank's `*_rank_{rank}.pt`, or every rank's when it was saved by another number of ranks (the
    load reshards them, `steps.update.reshard`). `optimizer` False: no `optimizer/` at all (supervised
    fine-tuning starts its own; an update's AdamW state is twice its fp32 weights)."""
    if not is_remote(url):
        return Path(url.removeprefix("file://"))
    url = url.rstrip("/")
    if node is None:
        fetch(url, local, skip=TRAINING_ONLY, progress=progress)
    else:
        weights = node / "weights"
        if local_rank == 0:
            fetch(url, weights, skip=TRAINING_ONLY, progress=progress)
            (node / READY).touch()
        while not (node / READY).exists():  # a failed local rank 0 exits, and torchrun stops this one too
            time.sleep(poll_s)
        local.mkdir(parents=True, exist_ok=True)
        for entry in weights.iterdir():
            (local / entry.name).symlink_to(entry)
    if not optimizer:
        return local
    state_url, folder = f"{url}/{OPTIMIZER_DIR}", local / OPTIMIZER_DIR
    download(state_url, folder, keep=lambda path: not RANK_FILE.search(path), progress=progress)
    state = folder / "state.json"
    saved = json.loads(state.read_text()).get("world_size", 1) if state.is_file() else world_size
    mine = f"_rank_{rank}.pt"
    download(state_url, folder, progress=progress,
             keep=lambda path: bool(RANK_FILE.search(path)) and (saved != world_size or path.endswith(mine)))
    return local


def fetch_shards(url: str, local: Path, progress: Callable[[str], None] | None = None) -> None:
    """Downloads the per-rank files of `url`'s `optimizer/` that `local/optimizer/` lacks (`fetch_rank` fetched
    one rank's): a skipped update's rank 0 copies every rank's state to the new checkpoint."""
    if is_remote(url):
        folder = local / OPTIMIZER_DIR
        download(f"{url.rstrip('/')}/{OPTIMIZER_DIR}", folder, progress=progress,
                 keep=lambda path: bool(RANK_FILE.search(path)) and not (folder / path).exists())


def release(node: Path | None, local_rank: int, local_world_size: int) -> None:
    """This rank is done with `node` (`fetch_rank`); the last of the node's ranks to say so removes it."""
    if node is None or not node.exists():
        return
    (node / f".done-{local_rank}").touch()
    if len(list(node.glob(".done-*"))) >= local_world_size:
        shutil.rmtree(node, ignore_errors=True)


def unmark(url: str) -> None:
    """Removes the checkpoint's `metrics.json` at `url` (a folder or a remote URL), if there is one, before the
    checkpoint is written again: an earlier attempt's must not make a half rewritten checkpoint look complete."""
    if not is_remote(url):
        (Path(url.removeprefix("file://")) / METRICS_FILE).unlink(missing_ok=True)
        return
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    marker = f"{path.rstrip('/')}/{METRICS_FILE}"
    fs.invalidate_cache()  # a listing cached before another writer's upload would hide its metrics.json
    if fs.exists(marker):
        size = fs.size(marker) or 0
        fs.rm_file(marker)
        IO.deleted_bytes += size
        IO.deleted_objects += 1


def publish(local: Path, url: str) -> None:
    """Uploads a finished folder to a remote `url` (each file one PUT, so readers never see half a file), its
    `metrics.json` last: a reader that finds it finds the whole checkpoint (`steps.follow`); an earlier
    attempt's `metrics.json` there is removed first (`unmark`)."""
    import fsspec

    unmark(url)
    files = sorted(path for path in local.rglob("*") if path.is_file() and path != local / METRICS_FILE)
    upload(local, url, [*files, *([local / METRICS_FILE] if (local / METRICS_FILE).exists() else [])])


def upload(local: Path, url: str, files: Iterable[Path]) -> None:
    """Uploads each of `files` (below `local`) to the same path below a remote `url`, in order, one PUT each."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    root = root.rstrip("/")
    for path in files:
        fs.put_file(str(path), f"{root}/{path.relative_to(local).as_posix()}")
        IO.written_bytes += path.stat().st_size
        IO.written_objects += 1


def publish_rank(local: Path, url: str, rank: int) -> None:
    """Uploads to a remote `url` the files only this rank wrote in `local` (on another node than rank 0's, only it
    has them): its weight files (`model-*.safetensors`, `steps.update.shards`) and `optimizer/*_rank_{rank}.pt`."""
    upload(local, url, [*sorted(local.glob("model-*.safetensors")),
                        *sorted((local / OPTIMIZER_DIR).glob(f"*_rank_{rank}.pt"))])


def delete(url: str) -> None:
    """Deletes the checkpoint folder at `url` (local or remote), its `metrics.json` first: a half deleted
    checkpoint never looks complete."""
    import fsspec

    unmark(url)
    fs, root = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    files = fs.find(root.rstrip("/"), detail=True)
    for path, info in sorted(files.items()):
        fs.rm_file(path)
        IO.deleted_bytes += info["size"] or 0
        IO.deleted_objects += 1
    if not is_remote(url):  # a local store's empty folders stay behind; an object store has none
        shutil.rmtree(root, ignore_errors=True)


def written(run_url: str) -> list[int]:
    """The iterations whose checkpoint folder exists in the run's `checkpoints/` (finished or not), in order."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(checkpoint_url(run_url, 1, "").rsplit("/", 1)[0])
    fs.invalidate_cache()
    if not fs.exists(root):
        return []
    names = (path.rstrip("/").rsplit("/", 1)[-1] for path in fs.ls(root, detail=False))
    return sorted(int(match.group(1)) for name in names if (match := re.fullmatch(r"iteration-(\d+)", name)))


def expired(iterations: Iterable[int], latest: int, keep: int, protected: Iterable[int]) -> list[int]:
    """Which of `iterations` a run keeping its last `keep` checkpoints (0: all) deletes once checkpoint `latest`
    is written: those older than the last `keep` up to `latest`, never iteration 0's (the base model) nor a
    `protected` one; nothing above `latest` (an update may be writing it).

    >>> expired([1, 2, 3, 4, 5, 6], latest=5, keep=2, protected=[2])
    [1, 3]
    >>> expired([1, 2, 3], latest=3, keep=0, protected=[])
    []
    """
    if keep <= 0:
        return []
    done = sorted(i for i in iterations if 0 < i <= latest)
    kept = set(done[-keep:]) | set(protected)
    return [i for i in done if i not in kept]


def protected(pinned: Iterable[int], evaluated: Iterable[int], latest: int, max_staleness: int) -> set[int]:
    """The checkpoints `keep_checkpoints` never deletes: the `pinned` ones, each one an evaluation is scheduled
    for or recorded (`evaluated`), and the ones being served or trained next (`latest` and the `max_staleness`
    before it: with S >= 1 rollouts are served up to S versions behind the one the next update trains).

    >>> sorted(protected([1], [4], latest=9, max_staleness=1))
    [1, 4, 8, 9]
    """
    return {*pinned, *evaluated, *range(max(latest - max_staleness, 0), latest + 1)}


def retire(config: RunConfig, latest: int, evaluations: Iterable[int],
           say: Callable[[str], None] = print) -> list[int]:
    """Deletes the run's checkpoints `expired` under `keep_checkpoints` once `latest` is written, each through the
    store, never a `protected` one (`evaluations`: the iterations whose checkpoint an evaluation recorded, plus
    the ones `eval_every` schedules); says which in one line; returns their iterations. A store that fails to
    delete is said and left for the next iteration's try: the run goes on."""
    if config.keep_checkpoints <= 0:
        return []
    scheduled = [i for i in range(latest + 1) if config.evaluates_at(i)]
    keep_also = protected(config.pin_checkpoints, [*evaluations, *scheduled], latest, config.max_staleness)
    try:
        gone = expired(written(config.run_url), latest, config.keep_checkpoints, keep_also)
        for iteration in gone:
            delete(checkpoint_url(config.run_url, iteration, ""))
    except OSError as error:
        say(f"warning: keep_checkpoints: cannot delete an old checkpoint ({type(error).__name__}: {error}); "
            "tried again after the next iteration")
        return []
    if gone:
        say(f"keep_checkpoints={config.keep_checkpoints}: deleted the checkpoints of iterations "
            f"{', '.join(map(str, gone))} ({IO.deleted_bytes / 1e6:.1f} MB deleted by this process so far)")
    return gone
