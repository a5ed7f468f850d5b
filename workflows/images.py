"""The images a cluster run pulls: OpenForge's own, built on this machine, and the task images, built in the cluster.

    python workflows/submit.py images --registry ghcr.io/me --tag 0.1.0 [--builder docker] [--dry-run] [--no-push]
    python workflows/submit.py images --dataset steps/tasks/builtin [--config FILE] [--dry-run]
    make images REGISTRY=ghcr.io/me TAG=0.1.0

The first builds `IMAGES` (images/*.Dockerfile, from the repository root) with the first container builder on
PATH (`BUILDERS`, or `--builder`), tags each `<registry>/<name>:<tag>` and pushes it; `--dry-run` prints the
commands instead. The second builds one image per task of the dataset that needs one: a task whose task.toml
names a `docker_image` runs in that image as is, and an image whose tag is already in the registry (the Docker
Registry HTTP API's manifest HEAD, `manifest_exists`) is not built again. The tag is the content hash of the
task's environment folder (`steps.plan.task_image`, the name the plan gives its rollouts), so an OpenForge upgrade
rebuilds nothing. Each build context goes to the store as a tar.gz (`layout.task_context_url`), and a Workflow
(`task_images_workflow`) runs one kaniko pod per image that reads it from there and pushes
`<image_registry>/task-<name>:<hash>` with the docker-registry Secret `registry_secret`.
"""

import gzip
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import fsspec
from hera.workflows import DAG, Container, Env, Parameter, RetryStrategy, SecretVolume, Workflow
from hera.workflows.models import KeyToPath, PodGC, TTLStrategy

from steps.contracts import layout
from steps.contracts.config import RunConfig
from steps.plan import task_image
from steps.settings import ConfigError
from steps.tasks import Task
from workflows.commands import task_image_prefix
from workflows.iteration import s3_env, step_pod

REPO = Path(__file__).resolve().parents[1]
# name -> (Dockerfile, build context), both relative to the repository root. gui-task is the base a GUI task's
# environment/Dockerfile may start FROM (docs/gui.md); the other four are the Workflows' own.
IMAGES = {
    "steps": ("images/steps.Dockerfile", "."),
    "serve": ("images/serve.Dockerfile", "."),
    "train": ("images/train.Dockerfile", "."),
    "harness": ("images/harness.Dockerfile", "."),
    "gui-task": ("images/gui-task/Dockerfile", "images/gui-task"),
}
# The builders tried in this order; each takes `build -f FILE -t REF CONTEXT` and `push REF` (docker, podman,
# nerdctl: their `build`; buildah: `build`, its name for `bud` since 1.23).
BUILDERS = ("docker", "podman", "buildah", "nerdctl")
# kaniko builds a Dockerfile in an unprivileged pod, without a daemon, and reads its context from S3 (its README,
# "Using Amazon S3": `--context=s3://bucket/path.tar.gz`; S3_ENDPOINT and S3_FORCE_PATH_STYLE for MinIO, read in
# pkg/buildcontext/s3.go) and its push credentials from /kaniko/.docker/config.json ("Pushing to Different
# Registries"). v1.23.2 is the last release of GoogleContainerTools/kaniko (archived in 2025): pinned, not :latest.
KANIKO = "gcr.io/kaniko-project/executor:v1.23.2"
KANIKO_DOCKER_CONFIG = "/kaniko/.docker"
# `kubectl create secret docker-registry` stores the docker config under this key
# (kubernetes.io/docs/concepts/configuration/secret/#docker-config-secrets); kaniko reads it as config.json.
DOCKER_CONFIG_KEY = ".dockerconfigjson"
BUILD_PARALLELISM = 8  # kaniko pods at once: each pulls a base image and unpacks it on its node's disk
# HEAD /v2/<name>/manifests/<tag> answers 200 for a tag that exists; Accept names every manifest kind a builder
# pushes, or some registries answer 404 for one they hold (docs.docker.com/reference/api/registry/latest/,
# "Check if manifest exists"; distribution/distribution#4715).
MANIFEST_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.list.v2+json",
                  "application/vnd.docker.distribution.manifest.v2+json")
REGISTRY_TIMEOUT_S = 10
# A repository name's component: lower-case letters and digits, separated by '.', '_', '__' or dashes (the OCI
# distribution spec's <name> grammar, github.com/opencontainers/distribution-spec/blob/main/spec.md#pulling-manifests).
REPOSITORY_COMPONENT = re.compile(r"[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*")


def find_builder(wanted: str | None = None, which=shutil.which) -> str:
    """The container builder to use: `wanted`, else the first of `BUILDERS` on PATH; a ConfigError without one."""
    if wanted is not None and wanted not in BUILDERS:
        raise ConfigError(f"--builder must be one of {', '.join(BUILDERS)}, got {wanted!r}")
    for builder in [wanted] if wanted else BUILDERS:
        if which(builder):
            return builder
    raise ConfigError(f"no container builder found on PATH ({wanted or ', '.join(BUILDERS)}); install one, or "
                      f"build in the cluster (docs/images.md)")


def image_ref(registry: str, name: str, tag: str) -> str:
    """`<registry>/<name>:<tag>`.

    >>> image_ref("ghcr.io/me/", "steps", "0.1.0")
    'ghcr.io/me/steps:0.1.0'
    """
    return f"{registry.rstrip('/')}/{name}:{tag}"


def build_commands(builder: str, registry: str, tag: str, push: bool = True) -> list[list[str]]:
    """The commands that build (and with `push`, push) every image of `IMAGES`, run from the repository root.

    >>> build, push = build_commands("podman", "ghcr.io/me", "0.2.0")[:2]
    >>> build, push
    (['podman', 'build', '-f', 'images/steps.Dockerfile', '-t', 'ghcr.io/me/steps:0.2.0', '.'], ['podman', 'push', \
'ghcr.io/me/steps:0.2.0'])
    """
    commands = []
    for name, (dockerfile, context) in IMAGES.items():
        ref = image_ref(registry, name, tag)
        commands.append([builder, "build", "-f", dockerfile, "-t", ref, context])
        commands += [[builder, "push", ref]] if push else []
    return commands


def build_images(registry: str, tag: str, builder: str | None = None, push: bool = True, dry_run: bool = False,
                 run=subprocess.run, which=shutil.which) -> int:
    """Builds and pushes OpenForge's images; with `dry_run` prints the commands. Stops at the first that fails."""
    if not registry or not tag:
        raise ConfigError("images: give the registry and the tag, e.g. --registry ghcr.io/me --tag 0.1.0")
    for command in build_commands(choose_builder(builder, dry_run, which), registry, tag, push):
        print(" ".join(command), flush=True)
        if not dry_run and run(command, cwd=REPO).returncode != 0:
            print(f"error: `{' '.join(command)}` failed (its output is above)", file=sys.stderr)
            return 1
    return 0


def choose_builder(wanted: str | None, dry_run: bool, which=shutil.which) -> str:
    """The builder to run (`find_builder`); a dry run shows `wanted`, or the one a real run would use, or the first
    of `BUILDERS` when this machine has none (it runs nothing)."""
    if dry_run:
        try:
            return find_builder(wanted, which)
        except ConfigError:
            if wanted is None or wanted in BUILDERS:
                return wanted or BUILDERS[0]
            raise
    return find_builder(wanted, which)


# ---- task images ----

@dataclass(frozen=True)
class TaskBuild:
    """One task image to build: the task, the image it is pushed as, and its build context in the store."""

    task: Task
    image: str
    context: str


def registry_url(image: str) -> tuple[str, str, str]:
    """The registry's base URL, the repository and the tag of an image reference. Loopback registries speak
    plain HTTP (as docker treats them), others HTTPS; Docker Hub's API is registry-1.docker.io.

    >>> registry_url("ghcr.io/me/task-hello:ab12"), registry_url("127.0.0.1:5000/task-a:1")
    (('https://ghcr.io', 'me/task-hello', 'ab12'), ('http://127.0.0.1:5000', 'task-a', '1'))
    """
    host, _, rest = image.partition("/")
    repository, _, tag = rest.rpartition(":")
    host = "registry-1.docker.io" if host == "docker.io" else host
    loopback = host.split(":")[0] in ("localhost", "127.0.0.1", "[::1]")
    return f"{'http' if loopback else 'https'}://{host}", repository, tag


def manifest_exists(image: str, timeout_s: float = REGISTRY_TIMEOUT_S) -> bool | None:
    """Whether the registry holds the image's tag: True (200), False (404), None when it cannot say (it wants
    credentials this machine does not send, or cannot be reached), in which case the image is built: a build too
    many costs minutes, a missing image costs the run. A registry that asks for a Bearer token gets an anonymous
    one first, as public repositories on ghcr.io and Docker Hub do."""
    base, repository, tag = registry_url(image)
    url = f"{base}/v2/{repository}/manifests/{tag}"
    try:
        status, challenge = head(url, None, timeout_s)
        if status == 401 and (token := anonymous_token(challenge, repository, timeout_s)):
            status, _ = head(url, token, timeout_s)
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return {200: True, 404: False}.get(status)


def head(url: str, token: str | None, timeout_s: float) -> tuple[int, str]:
    """The status of a manifest HEAD and the registry's WWW-Authenticate challenge (empty without one)."""
    headers = {"Accept": ", ".join(MANIFEST_TYPES), **({"Authorization": f"Bearer {token}"} if token else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD", headers=headers),
                                    timeout=timeout_s) as response:
            return response.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("WWW-Authenticate", "")


def anonymous_token(challenge: str, repository: str, timeout_s: float) -> str | None:
    """A pull token for `repository` from the token service a `Bearer realm=...,service=...` challenge names,
    asked without credentials (the token authentication specification of the Docker Registry v2,
    distribution.github.io/distribution/spec/auth/token/: GET realm?service=S&scope=repository:NAME:pull answers
    {"token": ...} or {"access_token": ...}); None for any other challenge."""
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    if not challenge.lower().startswith("bearer ") or "realm" not in params:
        return None
    query = urllib.parse.urlencode({"service": params.get("service", ""),
                                    "scope": params.get("scope") or f"repository:{repository}:pull"})
    with urllib.request.urlopen(f"{params['realm']}?{query}", timeout=timeout_s) as response:
        body = json.load(response)
    return body.get("token") or body.get("access_token") or None


def task_builds(tasks: list[Task], config: RunConfig, exists=manifest_exists) -> tuple[list[TaskBuild], list[str]]:
    """The images to build for `tasks`, and one line per task that needs none (its own `docker_image`, or a tag
    the registry already holds)."""
    builds, notes = [], []
    for task in sorted(tasks, key=lambda t: t.name):
        image = task_image(task, task_image_prefix(config))
        if task.config.docker_image:
            notes.append(f"{task.name}: runs in its docker_image {image}; nothing to build")
        elif not REPOSITORY_COMPONENT.fullmatch(f"task-{task.name}"):
            raise ConfigError(f"task {task.name!r} cannot name an image (task-{task.name}): a task that is built "
                              f"needs a name of lower-case letters, digits, '.', '_' and '-'; rename it or set its "
                              f"docker_image")
        elif exists(image):
            notes.append(f"{task.name}: {image} is in the registry already")
        else:
            builds.append(TaskBuild(task, image, layout.task_context_url(config.store, task.name, task.image_tag)))
    return builds, notes


def context_tar(folder: Path) -> bytes:
    """The folder as a tar.gz, its entries sorted, with no owner or time of this machine's: the same folder makes
    the same bytes."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(folder.rglob("*"), key=lambda p: p.relative_to(folder).as_posix()):
            info = tar.gettarinfo(str(path), arcname=path.relative_to(folder).as_posix())
            info.uid, info.gid, info.uname, info.gname, info.mtime = 0, 0, "", "", 0
            tar.addfile(info, io.BytesIO(path.read_bytes()) if info.isfile() else None)
    return gzip.compress(raw.getvalue(), mtime=0)


def upload_contexts(builds: list[TaskBuild]) -> None:
    """Writes each build's context to the store, once per content hash."""
    for build in builds:
        fs, path = fsspec.core.url_to_fs(build.context)
        if not fs.exists(path):
            fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            fs.pipe_file(path, context_tar(build.task.environment_dir))


def kaniko_template(config: RunConfig) -> Container:
    """One kaniko pod: the context from the store, the Dockerfile at its root, the image pushed to its destination."""
    # The store as every other pod reads it (keys, or with `s3_credentials: pod-identity` the service account's
    # identity; endpoint and region). Kaniko's S3 context reads S3_ENDPOINT and S3_FORCE_PATH_STYLE for MinIO and
    # the like (its pkg/buildcontext/s3.go), and its AWS SDK wants a region, which MinIO ignores.
    env = s3_env(config)
    if config.s3_endpoint:
        env += [Env(name="S3_ENDPOINT", value=config.s3_endpoint), Env(name="S3_FORCE_PATH_STYLE", value="true")]
    if not config.s3_region:
        env.append(Env(name="AWS_REGION", value="us-east-1"))
    return Container(
        name="kaniko", image=KANIKO,
        # The emissary executor runs the command it is given; kaniko's image has no shell to look one up with.
        command=["/kaniko/executor"],
        args=["--context={{inputs.parameters.context}}", "--dockerfile=Dockerfile",
              "--destination={{inputs.parameters.image}}"],
        inputs=[Parameter(name="context"), Parameter(name="image")],
        env=env,
        volumes=[SecretVolume(name="registry", secret_name=config.registry_secret, mount_path=KANIKO_DOCKER_CONFIG,
                              items=[KeyToPath(key=DOCKER_CONFIG_KEY, path="config.json")])],
        retry_strategy=RetryStrategy(limit=2), **step_pod(config, "1", "2Gi"),
    )


def task_images_workflow(config: RunConfig, builds: list[TaskBuild]) -> Workflow:
    """The Workflow that builds `builds` in the cluster, one kaniko pod each. Its name is fixed by what it builds,
    so submitting the same builds twice finds the first Workflow."""
    items = [{"context": build.context, "image": build.image} for build in builds]
    digest = hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()[:10]
    with Workflow(name=f"openforge-task-images-{digest}", namespace=config.namespace, entrypoint="images",
                  service_account_name=config.service_account, parallelism=BUILD_PARALLELISM,
                  labels={"openforge.dev/role": "task-images"},
                  pod_gc=PodGC(strategy="OnPodSuccess"), ttl_strategy=TTLStrategy(seconds_after_success=86400)) as w:
        kaniko = kaniko_template(config)
        with DAG(name="images"):
            kaniko(name="build", with_items=items,
                   arguments={"context": "{{item.context}}", "image": "{{item.image}}"})
    return w
