"""Where a run's datasets come from, checked before anything starts and, for an Argo run, uploaded to its store.

    from workflows.datasets import check_dataset, stage_datasets
    check_dataset(config, "dataset", REPO_ROOT)        # a ConfigError naming `dataset` when it cannot be used
    stage_datasets(config, REPO_ROOT)                  # Argo: every task into <run>/datasets/, pinned in the manifest

`dataset` and `eval_dataset` each take one of:
  - a path on this machine (absolute, or relative to the repository): a task folder, a folder of task folders, or a
    .txt/.yaml list of task folders (`steps.tasks.load_dataset`);
  - an `s3://` prefix holding task folders;
  - a Harbor registry dataset, `harbor://NAME@VERSION`, looked up in `dataset_registry` (Harbor's registry.json:
    a JSON list of datasets, each with `name`, `version` and `tasks`, each task with `name`, `git_url`,
    `git_commit_id` and `path`, as Harbor's `DatasetSpec`/`RegistryTaskId` models in
    laude-institute/harbor src/harbor/models/registry.py read it); each task is checked out of its git repository
    at its commit.

An Argo run's pods see none of these places: at submit the driver copies every task into the run's store (a
snapshot: the run reads the same bytes however often it is retried, resumed or resubmitted, even after the source
moved on) and writes `manifest/datasets.json`, naming each task's SHA-256 and, for Harbor, its repository, commit and
path. The local runner reads a local dataset in place.
"""

import contextlib
import hashlib
import json
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import fsspec

from steps import manifest
from steps.contracts import layout
from steps.contracts.config import RunConfig
from steps.datasets import local_copy, upload_tasks
from steps.settings import ConfigError
from steps.tasks import DatasetError, Task, load_dataset, load_task

HARBOR = "harbor://"
ACCEPTED = ("give a task folder, a folder of task folders or a .txt/.yaml list of them, an s3:// prefix holding task "
            "folders, or a Harbor registry dataset harbor://NAME@VERSION")


def kind(source: str) -> str:
    """"harbor", "s3" or "path": where a dataset is kept.

    >>> kind("harbor://terminal-bench@2.0"), kind("s3://bucket/tasks"), kind("steps/tasks/builtin")
    ('harbor', 's3', 'path')
    """
    return "harbor" if source.startswith(HARBOR) else "s3" if source.startswith("s3://") else "path"


def harbor_reference(key: str, source: str) -> tuple[str, str]:
    """`harbor://NAME@VERSION` as (name, version); a ConfigError naming `key` otherwise.

    >>> harbor_reference("dataset", "harbor://org/name@1.0")
    ('org/name', '1.0')
    """
    name, at, version = source[len(HARBOR):].rpartition("@")
    if not at or not name or not version:
        raise ConfigError(f"config key {key!r}: a Harbor dataset is harbor://NAME@VERSION (e.g. "
                          f"harbor://terminal-bench@2.0), got {source!r}")
    return name, version


def read_registry(registry: str) -> list[dict]:
    """Harbor's registry.json at `registry` (an http(s) URL or a file): its list of datasets."""
    try:
        if registry.startswith(("http://", "https://")):
            with urllib.request.urlopen(registry, timeout=30) as response:
                raw = response.read()
        else:
            raw = Path(registry).read_bytes()
        datasets = json.loads(raw)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        raise ConfigError(f"config key 'dataset_registry': the Harbor registry {registry!r} could not be read "
                          f"({exc}); give the URL or path of a registry.json") from None
    if not isinstance(datasets, list) or not all(isinstance(d, dict) for d in datasets):
        raise ConfigError(f"config key 'dataset_registry': {registry!r} is not a Harbor registry (a JSON list of "
                          f"datasets with name, version and tasks)")
    return datasets


def harbor_tasks(config: RunConfig, key: str, source: str) -> list[dict]:
    """The registry's tasks of the Harbor dataset `source` (each `name`, `git_url`, `git_commit_id`, `path`); a
    ConfigError naming `key` when the registry has no such name or version."""
    name, version = harbor_reference(key, source)
    datasets = read_registry(config.dataset_registry)
    named = [d for d in datasets if d.get("name") == name]
    if not named:
        raise ConfigError(f"config key {key!r}: the Harbor registry {config.dataset_registry} has no dataset named "
                          f"{name!r}; {ACCEPTED}")
    chosen = [d for d in named if str(d.get("version")) == version]
    if not chosen:
        versions = ", ".join(sorted(str(d.get("version")) for d in named))
        raise ConfigError(f"config key {key!r}: Harbor dataset {name!r} has no version {version!r} (it has {versions})")
    tasks = chosen[0].get("tasks")
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, dict) and t.get("git_url") and t.get("path")
                                                           for t in tasks):
        raise ConfigError(f"config key {key!r}: Harbor dataset {name}@{version} lists no tasks with a git_url and "
                          f"a path")
    return tasks


def check_dataset(config: RunConfig, key: str, root: Path) -> None:
    """A ConfigError naming `key` (dataset or eval_dataset) when its dataset cannot be used: a path that is not
    there, an s3:// prefix that cannot be read or holds no task.toml, a Harbor name or version the registry lacks."""
    source = getattr(config, key)
    if kind(source) == "harbor":
        harbor_tasks(config, key, source)
    elif kind(source) == "s3":
        fs, prefix = fsspec.core.url_to_fs(source)
        try:
            found = [k for k in fs.find(prefix.rstrip("/")) if k.endswith("/task.toml")]
        except OSError as exc:
            raise ConfigError(f"config key {key!r}: the s3 prefix {source!r} cannot be read ({exc}); {ACCEPTED}") \
                from None
        if not found:
            raise ConfigError(f"config key {key!r}: the s3 prefix {source!r} holds no task folder (no task.toml "
                              f"below it); {ACCEPTED}")
    elif not local_path(source, root).exists():
        raise ConfigError(f"config key {key!r}: {source!r} does not exist (looked in {local_path(source, root)}); "
                          f"{ACCEPTED}")


def judged_tasks(source: str, root: Path) -> list[str]:
    """The tasks of a dataset on this machine whose verifier asks a judge model (`[verifier] judge`); [] for a
    dataset kept elsewhere (s3, Harbor: read when the run snapshots it) or one that cannot be read (said elsewhere)."""
    if kind(source) != "path":
        return []
    try:
        tasks, _ = load_dataset(local_path(source, root))
    except DatasetError:
        return []
    return [task.name for task in tasks if task.config.judge]


def local_path(source: str, root: Path) -> Path:
    """A path dataset on this machine: absolute, or relative to `root` (the repository)."""
    path = Path(source)
    return path if path.is_absolute() else root / path


def git(*args: str, cwd: Path) -> str:
    """One git command's output; a ConfigError with git's own words when it fails."""
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise ConfigError(f"config key 'dataset': git {' '.join(args[:2])} failed: {done.stderr.strip()[:300]}")
    return done.stdout.strip()


def checkout(url: str, commit: str | None, into: Path) -> str:
    """The repository at `url` checked out at `commit` (its default branch's head without one) in `into`;
    returns the commit it is at."""
    git("clone", "--quiet", "--no-checkout", url, str(into), cwd=into.parent)
    git("checkout", "--quiet", commit or "HEAD", cwd=into)
    return git("rev-parse", "HEAD", cwd=into)


@contextlib.contextmanager
def harbor_dataset(config: RunConfig, key: str, source: str) -> Iterator[tuple[list[Task], list[dict]]]:
    """The Harbor dataset's tasks checked out in a temporary folder, and each task's pin (its repository, commit
    and path): one clone per repository and commit."""
    with tempfile.TemporaryDirectory(prefix="openforge-harbor-") as tmp:
        clones: dict[tuple[str, str | None], tuple[Path, str]] = {}
        tasks, pins = [], []
        for entry in harbor_tasks(config, key, source):
            where = (entry["git_url"], entry.get("git_commit_id"))
            if where not in clones:
                into = Path(tmp) / f"repo-{len(clones)}"
                clones[where] = into, checkout(*where, into)
            clone, commit = clones[where]
            folder = (clone / entry["path"]).resolve()
            if not folder.is_relative_to(clone.resolve()):
                raise ConfigError(f"config key {key!r}: Harbor task {entry.get('name')!r} has a path outside its "
                                  f"repository: {entry['path']!r}")
            tasks.append(load_task(folder))
            pins.append({"name": tasks[-1].name, "git_url": entry["git_url"], "git_commit_id": commit,
                         "path": entry["path"]})
        yield tasks, pins


@contextlib.contextmanager
def tasks_of(config: RunConfig, key: str, root: Path) -> Iterator[tuple[list[Task], list[dict]]]:
    """The dataset under `key` loaded on this machine (a copy for s3:// and Harbor), with each task's origin pin
    (Harbor's repository and commit; empty for the others); a ConfigError when a task is broken."""
    source = getattr(config, key)
    try:
        if kind(source) == "harbor":
            with harbor_dataset(config, key, source) as found:
                yield found
            return
        with local_copy(source if kind(source) == "s3" else str(local_path(source, root))) as folder:
            tasks, errors = load_dataset(folder)
            if errors:
                raise ConfigError(f"config key {key!r}: task {errors[0].task} of {source} is broken: "
                                  f"{errors[0].message}")
            yield tasks, [{} for _ in tasks]
    except (DatasetError, OSError) as exc:
        raise ConfigError(f"config key {key!r}: {source} cannot be read: {exc}") from None


def stage_datasets(config: RunConfig, root: Path) -> dict:
    """Uploads the run's `dataset` (and `eval_dataset`, when set) into `layout.datasets_url(run)` and writes
    where each came from, with every task's content hash, to the manifest's `datasets.json`; returns that record."""
    record = {}
    for key, name in (("dataset", layout.TRAIN_DATASET), ("eval_dataset", layout.EVAL_DATASET)):
        if not getattr(config, key):
            continue
        with tasks_of(config, key, root) as (tasks, pins):
            uploaded = upload_tasks(tasks, layout.dataset_url(layout.datasets_url(config.run_url), name))
        by_name = {pin["name"]: pin for pin in pins if pin}
        entries = [{**by_name.get(entry["name"], {}), **entry} for entry in uploaded]
        listing = json.dumps(entries, sort_keys=True).encode()
        record[name] = {"key": key, "source": getattr(config, key), "tasks": entries,
                        "sha256": hashlib.sha256(listing).hexdigest()}
    manifest.write_json(layout.datasets_record_url(config.run_url), record)
    return record
