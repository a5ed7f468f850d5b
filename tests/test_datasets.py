"""Datasets from where users keep them: a local folder anywhere, an s3:// prefix, a Harbor registry dataset; uploaded
to the run's store at submit and pinned in its manifest, read back by the plan, and served task by task to rollout
pods by the proxy's admin route (`steps.datasets`, `workflows.datasets`).

Real parts throughout: the moto S3 server on loopback, git repositories made in tmp_path, a Harbor registry.json
served over loopback HTTP, the real proxy process. The Harbor registry's format is Harbor's own
(laude-institute/harbor src/harbor/models/registry.py: a list of datasets with name, version, tasks of name,
git_url, git_commit_id, path)."""

import dataclasses
import http.server
import io
import json
import shutil
import subprocess
import tarfile
import threading
import urllib.error
import urllib.request
from pathlib import Path

import fsspec
import pytest

from proxy_process import ADMIN_KEY
from steps.net import free_port
from steps import datasets, manifest, plan
from steps.contracts import layout
from steps.settings import ConfigError
from steps.tasks import BUILTIN_DATASET
from test_workflows import cluster_config, drive, fake_argo, s3_store  # noqa: F401 (fixtures)
from workflows import local
from workflows.datasets import check_dataset, stage_datasets
from workflows.config import REPO_ROOT
from workflows.iteration import iteration_workflow

TASKS = ("hello-file", "greet-script")


def copy_tasks(into: Path, names=TASKS) -> Path:
    """A dataset of a few built-in tasks in a folder of its own, outside the repository."""
    into.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copytree(BUILTIN_DATASET / name, into / name)
    return into


def run_plan(dataset: str, capsys) -> list[dict]:
    """`steps.plan`'s JSON list for iteration 0 of `dataset`."""
    assert plan.main(["--dataset", dataset, "--iteration", "0", "--tasks-per-iteration", "4",
                      "--samples-per-task", "1"]) == 0
    return json.loads(capsys.readouterr().out)


# ---- a local dataset anywhere, and an s3:// one ----

def test_a_local_dataset_is_uploaded_pinned_and_planned_from_the_store(tmp_path: Path, s3_store: str, capsys) -> None:
    folder = copy_tasks(tmp_path / "mine")
    config = cluster_config(f"store={s3_store}", "run=local-ds", f"dataset={folder}")
    record = stage_datasets(config, REPO_ROOT)
    stored = layout.dataset_url(layout.datasets_url(config.run_url), layout.TRAIN_DATASET)
    assert sorted(t["name"] for t in record["train"]["tasks"]) == sorted(TASKS)
    assert manifest.read_json(layout.datasets_record_url(config.run_url)) == record
    hashes = {t["name"]: t["sha256"] for t in record["train"]["tasks"]}
    assert hashes["hello-file"] == datasets.content_hash(folder / "hello-file")
    planned = run_plan(stored, capsys)
    # Each item's task is its folder in the snapshot: what the rollout pod asks the proxy for.
    assert sorted(item["task"] for item in planned) == sorted(TASKS)
    assert planned[0]["deadline_s"] > 0


def test_an_s3_dataset_is_snapshotted_into_the_run(tmp_path: Path, s3_store: str, capsys) -> None:
    source = f"{s3_store}/shared-tasks"
    fs, root = fsspec.core.url_to_fs(source)
    for path in datasets.task_files(copy_tasks(tmp_path / "up")):
        fs.put_file(str(path), f"{root}/{path.relative_to(tmp_path / 'up').as_posix()}")
    config = cluster_config(f"store={s3_store}", "run=s3-ds", f"dataset={source}")
    check_dataset(config, "dataset", REPO_ROOT)
    record = stage_datasets(config, REPO_ROOT)
    fs.rm(root, recursive=True)  # the source moves on; the run keeps its snapshot
    assert record["train"]["source"] == source and len(record["train"]["tasks"]) == 2
    stored = layout.dataset_url(layout.datasets_url(config.run_url), layout.TRAIN_DATASET)
    assert sorted(item["task"] for item in run_plan(stored, capsys)) == sorted(TASKS)


def test_submit_uploads_the_dataset_before_creating_a_workflow(tmp_path: Path, fake_argo, s3_store: str,
                                                                capsys) -> None:
    folder = copy_tasks(tmp_path / "mine")
    assert drive(fake_argo, s3_store, "run=sub-ds", "iterations=1", f"dataset={folder}") == 0
    record = manifest.read_json(layout.datasets_record_url(f"{s3_store}/sub-ds"))
    assert record["train"]["source"] == str(folder) and len(record["train"]["tasks"]) == 2
    assert "2 tasks of" in capsys.readouterr().out
    # A broken task stops the run before any Workflow is created (only the lint came before).
    shutil.rmtree(folder / "hello-file" / "tests")
    fake_argo.requests.clear()
    assert drive(fake_argo, s3_store, "run=sub-broken", "iterations=1", f"dataset={folder}") == 2
    assert "config key 'dataset': task hello-file" in capsys.readouterr().err
    assert {path for _, path, _, _ in fake_argo.calls("POST")} == {"/api/v1/workflows/openforge/lint"}
    assert manifest.read_run_config(f"{s3_store}/sub-broken") is None


def test_a_dataset_that_cannot_be_used_is_refused_naming_the_key(tmp_path: Path, s3_store: str) -> None:
    with pytest.raises(ConfigError, match=r"^config key 'dataset': '.*nowhere' does not exist"):
        cluster_config(f"store={s3_store}", f"dataset={tmp_path / 'nowhere'}")
    with pytest.raises(ConfigError, match=r"config key 'dataset': the s3 prefix .* holds no task folder"):
        cluster_config(f"store={s3_store}", f"dataset={s3_store}/empty")
    with pytest.raises(ConfigError, match=r"config key 'dataset': the s3 prefix 's3://no-such-bucket/t' (cannot be "
                                          r"read|holds no task folder)"):
        cluster_config(f"store={s3_store}", "dataset=s3://no-such-bucket/t")
    with pytest.raises(ConfigError, match=r"config key 'eval_dataset': .* does not exist"):
        cluster_config(f"store={s3_store}", f"eval_dataset={tmp_path / 'nowhere'}")
    # Control: the same keys with a dataset that is there load.
    folder = copy_tasks(tmp_path / "there")
    assert cluster_config(f"store={s3_store}", f"dataset={folder}", f"eval_dataset={folder}").dataset == str(folder)


def test_an_argo_run_takes_an_absolute_dataset_and_the_local_runner_refuses_a_remote_one(tmp_path: Path) -> None:
    folder = copy_tasks(tmp_path / "abs")
    config = cluster_config("run=abs", f"dataset={folder}")
    rendered = iteration_workflow(config, 0).to_dict()
    plan_step = next(t for t in rendered["spec"]["templates"] if t["name"] == "plan")
    argv = plan_step["container"]["command"]
    assert argv[argv.index("--dataset") + 1] == f"{config.run_url}/datasets/train"
    assert local.local_store_problem(dataclasses.replace(config, store="runs")) is None
    remote = dataclasses.replace(config, store="runs", dataset="harbor://x@1")
    assert "config key 'dataset'" in local.local_store_problem(remote)


# ---- Harbor registry datasets ----

def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def task_repo(tmp_path: Path) -> tuple[Path, str]:
    """A git repository holding the tasks under `tasks/`, committed; then changed and committed again."""
    repo = tmp_path / "task-repo"
    copy_tasks(repo / "tasks")
    git("init", "-q", cwd=repo)
    git("-c", "user.email=t@example.com", "-c", "user.name=t", "add", ".", cwd=repo)
    git("-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-qm", "tasks", cwd=repo)
    pinned = git("rev-parse", "HEAD", cwd=repo)
    (repo / "tasks/hello-file/instruction.md").write_text("A later instruction.\n")
    git("-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-qam", "later", cwd=repo)
    return repo, pinned


@pytest.fixture
def registry(tmp_path: Path):
    """Harbor's registry.json on loopback HTTP: `demo@1.0` pins the first commit, `demo@head` names none."""
    repo, pinned = task_repo(tmp_path)
    entries = [{"name": name, "git_url": str(repo), "path": f"tasks/{name}"} for name in TASKS]
    listing = [{"name": "demo", "version": "1.0", "description": "",
                "tasks": [{**e, "git_commit_id": pinned} for e in entries], "metrics": []},
               {"name": "demo", "version": "head", "description": "", "tasks": entries}]
    body = json.dumps(listing).encode()

    class Registry(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/registry.json" else 404)
            self.end_headers()
            self.wfile.write(body if self.path == "/registry.json" else b"")

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {"url": f"http://127.0.0.1:{server.server_port}/registry.json", "repo": repo, "pinned": pinned}
    server.shutdown()


def test_a_harbor_dataset_resolves_to_tasks_pinned_at_their_commit(registry: dict, s3_store: str) -> None:
    config = cluster_config(f"store={s3_store}", "run=harbor-ds", "dataset=harbor://demo@1.0",
                            f"dataset_registry={registry['url']}")
    record = stage_datasets(config, REPO_ROOT)["train"]
    assert {(t["name"], t["git_commit_id"], t["path"]) for t in record["tasks"]} == \
        {(name, registry["pinned"], f"tasks/{name}") for name in TASKS}
    stored = layout.dataset_url(layout.datasets_url(config.run_url), layout.TRAIN_DATASET)
    # The instruction of the pinned commit, not the repository's later one.
    fs, root = fsspec.core.url_to_fs(stored)
    assert fs.cat_file(f"{root}/hello-file/instruction.md") == (BUILTIN_DATASET / "hello-file/instruction.md").read_bytes()
    # Without a commit in the registry, the head is checked out and its commit recorded.
    head = stage_datasets(dataclasses.replace(config, run="harbor-head", dataset="harbor://demo@head"), REPO_ROOT)
    assert {t["git_commit_id"] for t in head["train"]["tasks"]} == {git("rev-parse", "HEAD", cwd=registry["repo"])}
    assert head["train"]["sha256"] != record["sha256"]


def test_an_unknown_harbor_name_or_version_is_refused(registry: dict) -> None:
    with pytest.raises(ConfigError, match=r"config key 'dataset': the Harbor registry .* has no dataset named 'nope'"):
        cluster_config("dataset=harbor://nope@1.0", f"dataset_registry={registry['url']}")
    with pytest.raises(ConfigError, match=r"config key 'dataset': Harbor dataset 'demo' has no version '9' "
                                          r"\(it has 1.0, head\)"):
        cluster_config("dataset=harbor://demo@9", f"dataset_registry={registry['url']}")
    with pytest.raises(ConfigError, match=r"harbor://NAME@VERSION"):
        cluster_config("dataset=harbor://demo", f"dataset_registry={registry['url']}")
    assert cluster_config("dataset=harbor://demo@1.0", f"dataset_registry={registry['url']}")  # control


# ---- the proxy's task route, and unpacking in the rollout pod ----

@pytest.fixture
def task_proxy(proxy, tmp_path: Path):
    """The real proxy serving a local run's dataset snapshot (`--tasks`), no model behind it."""
    run = tmp_path / "run"
    copy_tasks(Path(layout.dataset_url(layout.datasets_url(str(run)), layout.TRAIN_DATASET)))
    return proxy(f"http://127.0.0.1:{free_port()}",
                 extra=["--model-name", "tiny", "--weight-version", "0", "--tasks", layout.datasets_url(str(run))])


def get(url: str, key: str | None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_proxy_serves_a_task_only_to_its_admin_key(task_proxy, tmp_path: Path) -> None:
    into = tmp_path / "private" / "tasks"
    dest = datasets.fetch_task(task_proxy.url, ADMIN_KEY, "train", "hello-file", into)
    assert dest == into / "hello-file"
    assert datasets.content_hash(dest) == datasets.content_hash(BUILTIN_DATASET / "hello-file")
    # The agent's side has no admin key: a rollout's key or none is refused, and nothing is sent.
    for key in (None, "rollout-key"):
        status, body = get(f"{task_proxy.url}/tasks/train/hello-file", key)
        assert status == 401 and b"task.toml" not in body
    # A traversal in the name never reaches the store's other folders.
    for name in ("..", "..%2F..%2Fcalls", "%2E%2E"):
        status, _ = get(f"{task_proxy.url}/tasks/train/{name}", ADMIN_KEY)
        assert status == 404
    assert get(f"{task_proxy.url}/tasks/other/hello-file", ADMIN_KEY)[0] == 404
    assert get(f"{task_proxy.url}/tasks/train/no-such-task", ADMIN_KEY)[0] == 404


def tar_of(members: dict[str, bytes], link: str | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo("tests/evil")
            info.type, info.linkname = tarfile.SYMTYPE, link
            tar.addfile(info)
    return buffer.getvalue()


def test_unpacking_refuses_traversal_links_and_size(tmp_path: Path) -> None:
    dest = tmp_path / "tasks" / "t"
    for bad in (tar_of({"../outside": b"x"}), tar_of({"/etc/evil": b"x"}), tar_of({"ok": b"x"}, link="/etc/passwd")):
        with pytest.raises(datasets.TaskArchiveError, match="not a plain file inside the task folder"):
            datasets.unpack_task(bad, dest)
    assert not (tmp_path / "tasks" / "outside").exists()
    with pytest.raises(datasets.TaskArchiveError, match="over the limit"):
        datasets.unpack_task(tar_of({"big": b"x" * 2048}), dest, max_bytes=1024)
    # Control: a plain task tar unpacks.
    datasets.unpack_task(tar_of({"task.toml": b"[task]\n", "tests/test.sh": b"exit 0\n"}), dest)
    assert (dest / "tests" / "test.sh").read_text() == "exit 0\n"


def test_a_task_over_the_size_bound_is_not_packed(tmp_path: Path) -> None:
    copy_tasks(tmp_path / "ds")
    with pytest.raises(datasets.TaskArchiveError, match="over the limit of 10"):
        datasets.task_tar(str(tmp_path / "ds"), "hello-file", max_bytes=10)
    with pytest.raises(datasets.TaskArchiveError, match="not a task folder name"):
        datasets.task_tar(str(tmp_path / "ds"), "../ds")
    assert tarfile.open(fileobj=io.BytesIO(datasets.task_tar(str(tmp_path / "ds"), "hello-file"))).getnames()


def test_the_rollout_pod_fetches_its_task_through_the_proxy() -> None:
    """The rollout template: an init container asks the proxy (admin key) for the task into the root-only folder,
    after OpenForge's copy made it; the runner reads it there; the serve pod's proxy serves the run's snapshots."""
    config = cluster_config("run=fetch", "eval_every=1", "eval_dataset=steps/tasks/builtin")
    templates = {t["name"]: t for t in iteration_workflow(config, 0).to_dict()["spec"]["templates"]}
    for name, dataset in (("rollout", "train"), ("eval-rollout", "eval")):
        inits = templates[name]["initContainers"]
        assert [c["name"] for c in inits][:1] == ["openforge"] and inits[-1]["name"] == "task"
        argv = inits[-1]["command"]
        assert argv[argv.index("--dataset") + 1] == dataset
        assert argv[argv.index("--into") + 1] == "/openforge/private/tasks"
        assert inits[-1]["env"][0]["valueFrom"]["secretKeyRef"]["key"] == "admin-key"
        command = templates[name]["container"]["command"]
        assert command[command.index("--task") + 1] == "/openforge/private/tasks/{{inputs.parameters.task}}"
    serve = templates["serve"]["container"]["command"]
    assert serve[serve.index("--tasks") + 1] == layout.datasets_url(config.run_url)
