"""A run's datasets in its store: uploaded at submit, read back by the plan, and served task by task to rollout pods.

    python -m steps.datasets fetch-task --proxy-url http://10.0.0.7:8100 --dataset train --task hello-file \
        --into /openforge/private/tasks [--wait-s 600]
    python -m steps.datasets wait-proxy --proxy-url http://10.96.0.7:8100 --wait-s 1820

On Argo the driver uploads every task of the run's `dataset` (and `eval_dataset`) to
`layout.dataset_url(layout.datasets_url(run), ...)`, one folder per task (`upload_tasks`); the plan and evaluate steps
read that snapshot (`local_copy`). A rollout pod has no S3 access: its init container asks the proxy's admin route
`GET /tasks/{dataset}/{task}` for its one task folder as a tar (`task_tar`, bounded by `MAX_TASK_BYTES`) and unpacks
it into the pod's root-only folder (`fetch_task`, which refuses any member that would land outside it). The agent
never holds the admin key, so it cannot ask for a task, its own verifier included.

The proxy is reached at the serve Service's address, which outlives any one serve pod: a serve started again (a
retried Workflow) answers there once it is ready, so a rollout's fetch waits up to `--wait-s` for it to answer, and
the `serve-ready` step waits for it before the first rollout starts (`wait_for_proxy`).
"""

import argparse
import contextlib
import hashlib
import io
import os
import re
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import fsspec

from steps.net import healthy
from steps.tasks import Task

# The most bytes one task's tar may hold, packed or unpacked: a task folder is instructions, tests and a Docker
# build context (the image itself is built elsewhere), so more than this is a mistake, not a task.
MAX_TASK_BYTES = 64 * 1024 * 1024
# A task's folder name in the store: one path component of these characters (task names may hold a `/`).
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class TaskArchiveError(ValueError):
    """A task that cannot be packed or unpacked: missing, too large, or a member outside its folder."""


def folder_name(task_name: str) -> str:
    """The task's folder in a stored dataset: its name as one safe path component.

    >>> folder_name("hello-file"), folder_name("org/task 1"), folder_name("..")
    ('hello-file', 'org-task-1', 'task-')
    """
    name = _UNSAFE.sub("-", task_name).strip("-") or "task"
    return name if name.strip(".") else f"task-{name.strip('.')}"


def is_url(source: str) -> bool:
    """Whether `source` is a URL (`s3://...`) rather than a path on this machine."""
    return "://" in source


def task_files(folder: Path) -> list[Path]:
    """The task folder's files, in name order (what is uploaded and what its content hash covers)."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def content_hash(folder: Path) -> str:
    """SHA-256 over the task folder's file names and bytes: the same task gives the same hash wherever it is."""
    digest = hashlib.sha256()
    for path in task_files(folder):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def upload_tasks(tasks: list[Task], dest: str) -> list[dict]:
    """Uploads each task folder to `dest/<folder_name>/`; returns one `{"name", "folder", "sha256"}` per task."""
    fs, root = fsspec.core.url_to_fs(dest)
    pinned = []
    for task in sorted(tasks, key=lambda t: t.name):
        folder = folder_name(task.name)
        for path in task_files(task.path):
            target = f"{root.rstrip('/')}/{folder}/{path.relative_to(task.path).as_posix()}"
            fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            fs.put_file(str(path), target)
        pinned.append({"name": task.name, "folder": folder, "sha256": content_hash(task.path)})
    return pinned


def download(source: str, dest: Path) -> None:
    """Copies every file below the URL `source` into `dest`, keeping their paths below it."""
    fs, root = fsspec.core.url_to_fs(source)
    root = root.rstrip("/")
    for key in fs.find(root):
        relative = key[len(root):].lstrip("/")
        if not relative or ".." in Path(relative).parts:
            continue
        (dest / relative).parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(key, str(dest / relative))


@contextlib.contextmanager
def local_copy(source: str) -> Iterator[Path]:
    """The dataset `source` as a folder on this machine: itself when it is a path, else a temporary copy of the
    URL's files (removed on exit)."""
    if not is_url(source):
        yield Path(source)
        return
    with tempfile.TemporaryDirectory(prefix="openforge-dataset-") as tmp:
        download(source, Path(tmp))
        yield Path(tmp)


def task_tar(dataset: str, folder: str, max_bytes: int = MAX_TASK_BYTES) -> bytes:
    """The task folder `folder` of the stored dataset `dataset` as an uncompressed tar, members relative to it."""
    if folder != folder_name(folder):
        raise TaskArchiveError(f"task {folder!r} is not a task folder name (letters, digits, '.', '_' and '-')")
    fs, root = fsspec.core.url_to_fs(dataset)
    base = f"{root.rstrip('/')}/{folder}"
    found = fs.find(base, detail=True) if fs.isdir(base) else {}  # one listing gives every file's size
    if not found:
        raise TaskArchiveError(f"task {folder!r} is not in the run's dataset")
    total = sum(info["size"] for info in found.values())
    if total > max_bytes:
        raise TaskArchiveError(f"task {folder!r} holds {total} bytes, over the limit of {max_bytes}")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for key in sorted(found):
            data = fs.cat_file(key)
            info = tarfile.TarInfo(key[len(base):].lstrip("/"))
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def unpack_task(data: bytes, dest: Path, max_bytes: int = MAX_TASK_BYTES) -> None:
    """Unpacks a task tar into `dest`: plain files and folders only, each inside `dest`, `max_bytes` in all."""
    if len(data) > max_bytes:
        raise TaskArchiveError(f"the task's tar is {len(data)} bytes, over the limit of {max_bytes}")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        members = tar.getmembers()
        for member in members:
            parts = Path(member.name).parts
            if member.name.startswith("/") or ".." in parts or not (member.isfile() or member.isdir()):
                raise TaskArchiveError(f"the task's tar holds {member.name!r}, which is not a plain file inside "
                                       f"the task folder")
        if sum(m.size for m in members) > max_bytes:
            raise TaskArchiveError(f"the task's tar unpacks to more than {max_bytes} bytes")
        dest.mkdir(parents=True, exist_ok=True)
        # Python's "data" filter checks the same again (paths, links, modes) as it extracts.
        tar.extractall(dest, filter="data")


def wait_for_proxy(proxy_url: str, wait_s: float, poll_s: float = 2.0) -> None:
    """Returns once the proxy's `/health` answers 200 (a serve that is up and ready); a TaskArchiveError naming the
    address after `wait_s` seconds without an answer. A refused or unanswered connection is a serve still starting
    (or none behind the Service yet), so it is asked again."""
    deadline = time.monotonic() + wait_s
    while not healthy(proxy_url, timeout_s=10):
        if time.monotonic() >= deadline:
            raise TaskArchiveError(f"the proxy at {proxy_url} did not answer within {wait_s:.0f} s (no serve ready "
                                   f"behind that address)")
        time.sleep(poll_s)


def fetch_task(proxy_url: str, admin_key: str, dataset: str, task: str, into: Path,
               max_bytes: int = MAX_TASK_BYTES, timeout_s: float = 120.0, wait_s: float = 0.0) -> Path:
    """Asks the proxy for one task folder of the run's dataset and unpacks it to `into/<task>`; returns that path.
    With `wait_s`, first waits that long at most for the proxy to answer (`wait_for_proxy`)."""
    if wait_s:
        wait_for_proxy(proxy_url, wait_s)
    request = urllib.request.Request(f"{proxy_url.rstrip('/')}/tasks/{dataset}/{task}",
                                     headers={"Authorization": f"Bearer {admin_key}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            data = response.read(max_bytes + 1)
    except urllib.error.HTTPError as exc:
        raise TaskArchiveError(f"the proxy refused task {task!r} of dataset {dataset!r}: {exc.code} "
                               f"{exc.read(500).decode(errors='replace')}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise TaskArchiveError(f"the proxy at {proxy_url} could not be reached for task {task!r}: {exc}") from None
    dest = into / folder_name(task)
    unpack_task(data, dest, max_bytes)
    return dest


def main(argv: list[str] | None = None) -> int:
    """`fetch-task`: one task folder from the proxy into a folder (the rollout pod's init container); exit 1 on
    any problem, said in one sentence."""
    p = argparse.ArgumentParser(prog="python -m steps.datasets", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="action", required=True)
    fetch = sub.add_parser("fetch-task", help="one task folder from the proxy, unpacked into --into/<task>")
    fetch.add_argument("--proxy-url", required=True)
    fetch.add_argument("--dataset", required=True, help="train or eval: which of the run's datasets")
    fetch.add_argument("--task", required=True, help="the task's folder in the run's dataset (the plan item's task)")
    fetch.add_argument("--into", type=Path, required=True)
    fetch.add_argument("--wait-s", type=float, default=0.0, help="wait this long at most for the proxy to answer")
    wait = sub.add_parser("wait-proxy", help="wait until the proxy answers /health (a serve ready at that address)")
    wait.add_argument("--proxy-url", required=True)
    wait.add_argument("--wait-s", type=float, required=True)
    args = p.parse_args(argv)
    if args.action == "wait-proxy":
        try:
            wait_for_proxy(args.proxy_url, args.wait_s)
        except TaskArchiveError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    key = os.environ.get("OPENFORGE_ADMIN_KEY", "")
    if not key:
        print("error: OPENFORGE_ADMIN_KEY is not set; the proxy serves tasks only to its admin key", file=sys.stderr)
        return 1
    try:
        print(fetch_task(args.proxy_url, key, args.dataset, args.task, args.into, wait_s=args.wait_s))
    except TaskArchiveError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
