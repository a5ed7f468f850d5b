"""Checkpoint folders, local or in an object store (`s3://...`): fetched before a step reads them,
published after it wrote them.

A checkpoint written by `steps.update` holds the model vLLM serves (safetensors, config, tokenizer),
`optimizer/` (AdamW's state, 2x the weights in fp32, read only by the next update) and
`metrics.json`. The serve step fetches the model alone.
"""

from collections.abc import Callable
from pathlib import Path

from steps.contracts.layout import METRICS_FILE

OPTIMIZER_DIR = "optimizer"
TRAINING_ONLY = (OPTIMIZER_DIR, METRICS_FILE)  # what serving a checkpoint does not need


def is_remote(url: str) -> bool:
    """Whether `url` names an object store (or any fsspec protocol) rather than a local folder."""
    return "://" in url and not url.startswith("file://")


def fetch(url: str, local: Path, skip: tuple[str, ...] = (), progress: Callable[[str], None] | None = None) -> Path:
    """A local folder holding `url`'s files: the folder itself when local, else a download through
    fsspec into `local`, file by file (a line to `progress` after each), leaving out the top-level
    entries named in `skip`."""
    if not is_remote(url):
        return Path(url.removeprefix("file://"))
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    root = root.rstrip("/")
    files = {path: info["size"] or 0 for path, info in fs.find(root, detail=True).items()
             if path[len(root) + 1:].split("/", 1)[0] not in skip}
    if not files:
        raise FileNotFoundError(f"no checkpoint files at {url}")
    total, done = sum(files.values()), 0
    for number, (path, size) in enumerate(sorted(files.items()), 1):
        target = local / path[len(root) + 1:]
        target.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(path, str(target))
        done += size
        if progress is not None:
            progress(f"fetched {number}/{len(files)} files, {done / 1e6:.0f}/{total / 1e6:.0f} MB, from {url}")
    return local


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
        fs.rm_file(marker)


def publish(local: Path, url: str) -> None:
    """Uploads a finished folder to a remote `url` (each file one PUT, so readers never see half a file), its
    `metrics.json` last: a reader that finds it finds the whole checkpoint (`steps.follow`); an earlier
    attempt's `metrics.json` there is removed first (`unmark`)."""
    import fsspec

    unmark(url)
    fs, path = fsspec.core.url_to_fs(url)
    root, marker = path.rstrip("/"), local / METRICS_FILE
    for entry in sorted(local.iterdir()):
        if entry.is_dir():
            fs.put(f"{entry}/", f"{root}/{entry.name}/", recursive=True)
        elif entry != marker:
            fs.put_file(str(entry), f"{root}/{entry.name}")
    if marker.exists():
        fs.put_file(str(marker), f"{root}/{METRICS_FILE}")
