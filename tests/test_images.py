"""The images a cluster run pulls (`workflows/images.py`, docs/images.md): OpenForge's own, built by this machine's
container builder, and the task images, built by a kaniko Workflow and tagged with their environment's content hash.

    .venv/bin/python -m pytest -q tests/test_images.py
    OPENFORGE_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_images.py -k golden   # rewrite the golden file

No container engine, Kubernetes or Argo can run on this kind of machine, so: the builder is a script on PATH that
records what it is asked (the command line is the interface to docker, podman, buildah and nerdctl alike); the
Workflow is checked as the iteration's are (golden YAML, Argo's strict schema, the semantic lint) and submitted to
`FakeArgoServer`; the build contexts go to a real S3 endpoint on loopback (moto); and the registry is
`FakeRegistry`, a double speaking the Docker Registry HTTP API v2's manifest HEAD, since no registry server is
installable here.
"""

import gzip
import io
import os
import shutil
import stat
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import fsspec
import pytest
import yaml

from steps import plan
from steps.tasks import environment_hash, load_dataset, load_task
from workflows import commands, images, submit
from workflows.lint import semantic_problems

from test_workflows import (CLUSTER, GOLDEN, FakeArgoServer, cluster_config, fake_argo, s3_store,  # noqa: F401
                            schema_errors, workflow_validator)

REPO = Path(__file__).resolve().parents[1]
BUILTIN = REPO / "steps" / "tasks" / "builtin"
pytestmark = pytest.mark.filterwarnings("ignore::pydantic.PydanticDeprecatedSince20")
# What `images --registry r.example/me --tag 0.3.0` runs, in order, with docker.
DOCKER_COMMANDS = [
    "docker build -f images/steps.Dockerfile -t r.example/me/steps:0.3.0 .",
    "docker push r.example/me/steps:0.3.0",
    "docker build -f images/serve.Dockerfile -t r.example/me/serve:0.3.0 .",
    "docker push r.example/me/serve:0.3.0",
    "docker build -f images/train.Dockerfile -t r.example/me/train:0.3.0 .",
    "docker push r.example/me/train:0.3.0",
    "docker build -f images/harness.Dockerfile -t r.example/me/harness:0.3.0 .",
    "docker push r.example/me/harness:0.3.0",
    "docker build -f images/gui-task/Dockerfile -t r.example/me/gui-task:0.3.0 images/gui-task",
    "docker push r.example/me/gui-task:0.3.0",
]


# ---- OpenForge's images ----

@pytest.mark.parametrize("builder", images.BUILDERS)
def test_the_dry_run_prints_the_exact_commands_of_each_builder(builder: str, capsys) -> None:
    """--dry-run prints every build and push, for the builder asked for, and runs nothing."""
    assert submit.main(["images", "--registry", "r.example/me", "--tag", "0.3.0", "--builder", builder,
                        "--dry-run"]) == 0
    expected = [line.replace("docker", builder, 1) for line in DOCKER_COMMANDS]
    assert capsys.readouterr().out.splitlines() == expected
    assert submit.main(["images", "--registry", "r.example/me", "--tag", "0.3.0", "--builder", builder,
                        "--no-push", "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines() == expected[::2]


def test_every_dockerfile_is_built_and_names_the_command() -> None:
    """IMAGES covers every Dockerfile under images/, and each one's header points at the command that builds it."""
    dockerfiles = {p.relative_to(REPO).as_posix() for p in (REPO / "images").rglob("*Dockerfile")}
    assert {dockerfile for dockerfile, _ in images.IMAGES.values()} == dockerfiles
    for dockerfile in dockerfiles:
        assert "make images REGISTRY=" in (REPO / dockerfile).read_text(), dockerfile


def fake_builder(folder: Path, name: str, fail_on: str = "") -> Path:
    """An executable `name` in `folder` that appends its working folder and arguments to `folder/calls`, and exits
    1 when its first argument is `fail_on`."""
    script = folder / name
    script.write_text(f'#!/bin/sh\necho "$(pwd) {name} $*" >> {folder}/calls\n'
                      f'[ "$1" = "{fail_on}" ] && exit 1\nexit 0\n')
    script.chmod(0o755)
    return folder / "calls"


def test_the_first_builder_on_path_builds_and_pushes_from_the_repository(tmp_path: Path, monkeypatch, capsys) -> None:
    """Without --builder the first of BUILDERS on PATH runs every command, from the repository root."""
    calls = fake_builder(tmp_path, "podman")
    fake_builder(tmp_path, "nerdctl")  # later in BUILDERS: not used
    monkeypatch.setenv("PATH", str(tmp_path))
    assert submit.main(["images", "--registry", "r.example/me", "--tag", "0.3.0"]) == 0
    expected = [line.replace("docker", "podman", 1) for line in DOCKER_COMMANDS]
    assert calls.read_text().splitlines() == [f"{REPO} {line}" for line in expected]
    assert capsys.readouterr().out.splitlines() == expected


def test_a_failed_build_stops_the_rest(tmp_path: Path, monkeypatch, capsys) -> None:
    """The first command that fails ends the run with exit code 1; nothing after it runs."""
    calls = fake_builder(tmp_path, "buildah", fail_on="build")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert submit.main(["images", "--registry", "r.example/me", "--tag", "0.3.0"]) == 1
    assert calls.read_text().splitlines() == [f"{REPO} buildah build -f images/steps.Dockerfile -t "
                                              f"r.example/me/steps:0.3.0 ."]
    assert "failed" in capsys.readouterr().err


@pytest.mark.parametrize("argv, expected", [
    (["images", "--registry", "r.example/me", "--tag", "0.3.0"],
     "error: no container builder found on PATH (docker, podman, buildah, nerdctl); install one, or build in the "
     "cluster (docs/images.md)\n"),
    (["images", "--registry", "r.example/me", "--tag", "0.3.0", "--builder", "kaniko"],
     "error: --builder must be one of docker, podman, buildah, nerdctl, got 'kaniko'\n"),
    (["images", "--tag", "0.3.0"],
     "error: images: give the registry and the tag, e.g. --registry ghcr.io/me --tag 0.1.0\n"),
    (["--registry", "r.example/me"],
     "error: --registry, --tag and --builder are flags of `python workflows/submit.py images`\n"),
])
def test_a_missing_builder_or_flag_is_one_sentence(argv: list[str], expected: str, tmp_path: Path, monkeypatch,
                                                   capsys) -> None:
    """No builder on PATH (the control with one is the test above), an unknown one, a missing flag: one line, 2."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert submit.main(argv) == 2
    assert capsys.readouterr().err == expected


# ---- the content hash and the plan ----

def test_the_environment_hash_follows_content_names_and_modes_not_times(tmp_path: Path) -> None:
    """Bytes, a file's name and its executable bit change the hash; an mtime, other mode bits and copying do not."""
    folder = tmp_path / "environment"
    shutil.copytree(BUILTIN / "hello-file" / "environment", folder)
    (folder / "setup.sh").write_text("echo hi\n")
    before = environment_hash(folder)
    assert environment_hash(Path(shutil.copytree(folder, tmp_path / "copy"))) == before
    os.utime(folder / "setup.sh", (1, 1))
    (folder / "Dockerfile").chmod(0o600)  # a stricter umask's checkout
    assert environment_hash(folder) == before
    (folder / "setup.sh").chmod(0o755)
    assert environment_hash(folder) not in (before, "")
    (folder / "setup.sh").chmod(0o644)
    assert environment_hash(folder) == before
    (folder / "setup.sh").write_text("echo ho\n")
    assert environment_hash(folder) != before
    (folder / "setup.sh").write_text("echo hi\n")
    (folder / "setup.sh").rename(folder / "prepare.sh")
    assert environment_hash(folder) != before


def test_the_plan_names_each_task_image_by_its_environments_hash(tmp_path: Path) -> None:
    """The plan's image is `<prefix>task-<name>:<hash>` (no OpenForge tag), or the task's own docker_image."""
    tasks, errors = load_dataset(BUILTIN)
    assert not errors
    planned = plan.plan(tasks, 0, len(tasks), 1, image_prefix="r.example/me/task-", root=REPO)
    by_task = {Path(item.task).name: item.image for item in planned}
    assert by_task == {t.path.name: f"r.example/me/task-{t.name}:{environment_hash(t.environment_dir)}"
                       for t in tasks}
    own = prebuilt_task(tmp_path)
    (item,) = plan.plan([own], 0, 1, 1, image_prefix="r.example/me/task-", root=tmp_path)
    assert item.image == "docker.io/library/python:3.11-slim"
    argv = commands.plan(cluster_config("run=t"), 0)
    assert "--image-tag" not in argv and argv[argv.index("--image-prefix") + 1] == "ghcr.io/openforge/task-"


def prebuilt_task(tmp_path: Path):
    """A task whose task.toml names its own docker_image (and has no environment/)."""
    folder = tmp_path / "prebuilt"
    shutil.copytree(BUILTIN / "hello-file", folder, ignore=shutil.ignore_patterns("environment"))
    toml = (folder / "task.toml").read_text()
    (folder / "task.toml").write_text(toml.replace("[environment]", '[environment]\ndocker_image = '
                                                   '"docker.io/library/python:3.11-slim"', 1)
                                      if "[environment]" in toml else
                                      toml + '\n[environment]\ndocker_image = "docker.io/library/python:3.11-slim"\n')
    return load_task(folder)


# ---- the registry ----

class FakeRegistry:
    """A test double for a container registry on 127.0.0.1 (no registry server is installable here): it answers
    the Docker Registry HTTP API v2's `HEAD /v2/<name>/manifests/<reference>` with 200 for a tag it holds, 404 for
    one it does not, and 401 for a repository under `private/` (a registry that wants credentials). A repository
    under `token/` wants a Bearer token, which its token service `GET /token?service=&scope=` hands to anyone
    (as ghcr.io and Docker Hub do for public repositories). It records each request's method, path (with the
    query) and Accept header."""

    def __init__(self, held: set[str]) -> None:
        self.held = held  # "<name>:<tag>"
        self.requests: list[tuple[str, str, str]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                fake.requests.append((self.command, self.path, self.headers.get("accept", "")))
                name, _, tag = self.path.removeprefix("/v2/").partition("/manifests/")
                wants_token = name.startswith("token/") and self.headers.get("authorization") != "Bearer anonymous"
                code = (401 if name.startswith("private/") or wants_token
                        else 200 if f"{name}:{tag}" in fake.held else 404)
                self.send_response(code)
                if wants_token:
                    self.send_header("www-authenticate", f'Bearer realm="http://{fake.host}/token",'
                                                         f'service="fake",scope="repository:{name}:pull"')
                self.send_header("content-type", "application/vnd.oci.image.index.v1+json")
                self.send_header("content-length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                fake.requests.append((self.command, self.path, self.headers.get("accept", "")))
                data = b'{"token": "anonymous"}'
                self.send_response(200 if self.path.startswith("/token?") else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        return Handler


@pytest.fixture
def registry():
    """A fresh FakeRegistry holding nothing."""
    fake = FakeRegistry(set())
    yield fake
    fake.server.shutdown()


def test_tags_in_the_registry_and_docker_image_tasks_are_not_built(registry: FakeRegistry, tmp_path: Path) -> None:
    """A tag the registry holds is skipped, a missing one is built (the control), a task with its own docker_image
    is used as is; the HEAD asks for every manifest kind."""
    tasks = [load_task(BUILTIN / "hello-file"), load_task(BUILTIN / "csv-stats"), prebuilt_task(tmp_path)]
    hello = tasks[0].image_tag
    registry.held.add(f"me/task-hello-file:{hello}")
    config = cluster_config("run=t", f"image_registry={registry.host}/me")
    builds, notes = images.task_builds(tasks, config)
    assert [(b.task.name, b.image) for b in builds] == [
        ("csv-stats", f"{registry.host}/me/task-csv-stats:{tasks[1].image_tag}")]
    assert builds[0].context == f"s3://openforge/runs/task-contexts/csv-stats-{tasks[1].image_tag}.tar.gz"
    planned = plan.plan([tasks[1]], 0, 1, 1, image_prefix=commands.task_image_prefix(config), root=REPO)
    assert [item.image for item in planned] == [builds[0].image]  # what the plan's rollouts pull
    assert notes == [f"hello-file: {registry.host}/me/task-hello-file:{hello} is in the registry already",
                     f"{tasks[2].name}: runs in its docker_image docker.io/library/python:3.11-slim; nothing to build"]
    assert sorted(path for _, path, _ in registry.requests) == [
        f"/v2/me/task-csv-stats/manifests/{tasks[1].image_tag}", f"/v2/me/task-hello-file/manifests/{hello}"]
    assert all(set(images.MANIFEST_TYPES) == {t.strip() for t in accept.split(",")} for *_, accept in registry.requests)


def test_a_task_name_no_registry_takes_is_one_sentence(tmp_path: Path) -> None:
    """A task to build whose name is no repository name is refused before anything is uploaded; lower-case passes."""
    folder = Path(shutil.copytree(BUILTIN / "hello-file", tmp_path / "Hello_File"))
    config = cluster_config("run=t")
    with pytest.raises(submit.ConfigError, match="task 'Hello_File' cannot name an image"):
        images.task_builds([load_task(folder)], config, exists=lambda image: False)
    folder = folder.rename(tmp_path / "hello_file")
    assert [b.task.name for b in images.task_builds([load_task(folder)], config, exists=lambda image: False)[0]] \
        == ["hello_file"]


def test_a_registry_that_cannot_say_gets_the_image_built(registry: FakeRegistry) -> None:
    """401 (credentials wanted) and an unreachable registry are not 'present': the image is built; a registry that
    hands out anonymous Bearer tokens is asked again with one."""
    assert images.manifest_exists(f"{registry.host}/token/task-a:1") is False
    registry.held.add("token/task-a:1")
    assert images.manifest_exists(f"{registry.host}/token/task-a:1") is True
    assert ("GET", "/token?service=fake&scope=repository%3Atoken%2Ftask-a%3Apull", "") in registry.requests
    assert images.manifest_exists(f"{registry.host}/private/task-a:1") is None
    assert images.manifest_exists(f"{registry.host}/me/task-a:1") is False
    registry.held.add("me/task-a:1")
    assert images.manifest_exists(f"{registry.host}/me/task-a:1") is True
    registry.server.shutdown()
    registry.server.server_close()
    assert images.manifest_exists(f"{registry.host}/me/task-a:1", timeout_s=2) is None


# ---- the task images' Workflow ----

def golden_builds() -> list[images.TaskBuild]:
    """Three built-in tasks, none in the registry."""
    tasks = [load_task(BUILTIN / name) for name in ("hello-file", "csv-stats", "fix-median-bug")]
    return images.task_builds(tasks, cluster_config("run=golden"), exists=lambda image: False)[0]


def test_golden_yaml() -> None:
    """The task images' Workflow equals its committed YAML; OPENFORGE_UPDATE_GOLDEN=1 rewrites the file instead."""
    workflow = images.task_images_workflow(cluster_config("run=golden"), golden_builds())
    path = GOLDEN / "task-images.yaml"
    if os.environ.get("OPENFORGE_UPDATE_GOLDEN") == "1":
        path.write_text(workflow.to_yaml())
    assert workflow.to_dict() == yaml.safe_load(path.read_text()), "task-images.yaml changed; review and regenerate"


def test_the_workflow_validates_strictly_and_its_references_resolve(workflow_validator) -> None:
    """Argo's schema with no unknown key, and the semantic lint, pass; the lint catches a missing input (control)."""
    spec = images.task_images_workflow(cluster_config("run=golden"), golden_builds()).to_dict()
    assert schema_errors(workflow_validator, yaml.safe_load((GOLDEN / "task-images.yaml").read_text())) == []
    assert semantic_problems(spec) == []
    kaniko = next(t for t in spec["spec"]["templates"] if t["name"] == "kaniko")
    kaniko["inputs"]["parameters"] = [{"name": "image"}]
    assert semantic_problems(spec)


def test_the_build_pod_reads_its_context_from_the_store_and_pushes_with_the_secret() -> None:
    """kaniko's args name the item's context and destination; S3 and registry credentials come from Secrets."""
    config = cluster_config("run=golden", "registry_secret=my-pushes")
    spec = images.task_images_workflow(config, golden_builds()).to_dict()["spec"]
    kaniko = next(t for t in spec["templates"] if t["name"] == "kaniko")
    container = kaniko["container"]
    assert container["image"] == images.KANIKO and ":latest" not in images.KANIKO
    assert container["args"] == ["--context={{inputs.parameters.context}}", "--dockerfile=Dockerfile",
                                 "--destination={{inputs.parameters.image}}"]
    assert kaniko["volumes"] == [{"name": "registry", "secret": {"secretName": "my-pushes", "items": [
        {"key": ".dockerconfigjson", "path": "config.json"}]}}]
    assert container["volumeMounts"] == [{"name": "registry", "mountPath": "/kaniko/.docker"}]
    env = {e["name"]: e.get("value") or e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]}
    assert env == {"AWS_ACCESS_KEY_ID": "openforge-s3", "AWS_SECRET_ACCESS_KEY": "openforge-s3",
                   "AWS_ENDPOINT_URL": "http://minio.openforge.svc:9000", "S3_ENDPOINT": "http://minio.openforge.svc:9000", "S3_FORCE_PATH_STYLE": "true",
                   "AWS_REGION": "us-east-1"}
    (build,) = spec["templates"][1]["dag"]["tasks"]
    assert build["withItems"] == [{"context": b.context, "image": b.image} for b in golden_builds()]


@pytest.mark.parametrize("value", ["My_Secret", "", "-x"])
def test_a_bad_registry_secret_is_one_sentence(value: str) -> None:
    """registry_secret must be a Secret's name."""
    with pytest.raises(submit.ConfigError, match="config key 'registry_secret' must be a Kubernetes Secret's name"):
        cluster_config("run=t", f"registry_secret={value}")


def test_the_context_tar_is_the_folder_and_the_same_for_the_same_folder(tmp_path: Path) -> None:
    """The tar.gz holds the environment folder's files at its root, modes kept, bytes identical on every call."""
    folder = Path(shutil.copytree(BUILTIN / "fix-median-bug" / "environment", tmp_path / "environment"))
    (folder / "run.sh").write_text("#!/bin/sh\n")
    (folder / "run.sh").chmod(0o755)
    data = images.context_tar(folder)
    os.utime(folder / "run.sh", (5, 5))
    assert images.context_tar(folder) == data
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert "Dockerfile" in members and tar.extractfile("Dockerfile").read() == (folder / "Dockerfile").read_bytes()
        assert stat.S_IMODE(members["run.sh"].mode) == 0o755 and members["run.sh"].uid == 0


def test_the_driver_uploads_contexts_then_submits_the_workflow(fake_argo: FakeArgoServer, s3_store: str,  # noqa: F811
                                                              s3_server: dict, registry: FakeRegistry,
                                                              tmp_path: Path, capsys) -> None:
    """`images --dataset D`: contexts to the store, the Workflow linted, created and waited for; a second run
    with every tag in the registry builds nothing."""
    dataset = tmp_path / "dataset"
    for name in ("hello-file", "csv-stats"):
        shutil.copytree(BUILTIN / name, dataset / name)
    argv = ["images", "--dataset", str(dataset), "--config", str(CLUSTER), "--argo-server", fake_argo.url,
            "--poll", "0.01", f"store={s3_store}", f"s3_endpoint={s3_server['endpoint_url']}",
            f"image_registry={registry.host}/me"]  # the driver reaches the store at the config's endpoint
    assert submit.main(argv) == 0
    tasks, _ = load_dataset(dataset)
    config = cluster_config("run=t", f"store={s3_store}", f"s3_endpoint={s3_server['endpoint_url']}",
                            f"image_registry={registry.host}/me")
    builds, _ = images.task_builds(tasks, config, exists=lambda image: False)
    expected = images.task_images_workflow(config, builds)
    assert [(path, body["workflow"]["metadata"]["name"]) for _, path, body, _ in fake_argo.calls("POST")] == [
        ("/api/v1/workflows/openforge/lint", expected.name), ("/api/v1/workflows/openforge", expected.name)]
    assert fake_argo.workflows[expected.name] == expected.build().model_dump(by_alias=True, exclude_none=True)
    for build in builds:
        data = fsspec.open(build.context, "rb").open().read()
        assert data == images.context_tar(build.task.environment_dir)
    assert "task images: Succeeded" in capsys.readouterr().out
    registry.held.update(f"me/task-{b.task.name}:{b.task.image_tag}" for b in builds)
    assert submit.main(argv) == 0
    assert "nothing to build" in capsys.readouterr().out and len(fake_argo.calls("POST")) == 2


def test_task_images_need_an_s3_store(capsys) -> None:
    """The build pods read their contexts from the store: a local one is one sentence."""
    assert submit.main(["images", "--dataset", "steps/tasks/builtin", "store=runs"]) == 2
    assert capsys.readouterr().err == ("error: config key 'store' must be an s3:// URL to build task images in the "
                                       "cluster (each build reads its context from there), got 'runs'\n")
