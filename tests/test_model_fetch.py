"""A model from the Hugging Face Hub: fetched once into the run's store, and the Workflows and configs that ask for it.

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q -n 0 tests/test_model_fetch.py

`FakeHub` is a test double: this machine reaches no network, so a small HTTP server on 127.0.0.1 speaks the hub's
routes that `steps.fetch_model` calls (those of huggingface_hub's own client: the model's revision with its files,
then each file by commit, errors with the hub's `X-Error-Code`) for the tiny model built at test time. The store is a
real S3 endpoint on loopback (moto, the `s3_server` fixture), written through s3fs.
"""

import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import fsspec
import pytest
import yaml

from steps import manifest
from steps.contracts import layout
from steps.contracts.config import RunConfig
from steps.fetch_model import FetchedModel, HubError, HubModel, fetch_model, hub_model, read_record, wanted
from steps.net import HOST
from workflows import commands, shape
from workflows.config import ConfigError, load_config, validate_for_argo
from workflows.evaluation import evaluation_workflow
from workflows.iteration import iteration_workflow
from workflows.lint import semantic_problems

from test_workflows import (CLUSTER, GOLDEN, drive, fake_argo, s3_store, schema_errors,  # noqa: F401 (fixtures)
                            workflow_validator)

REPO = Path(__file__).resolve().parents[1]
REPO_ID = "tiny-org/tiny-model"
TOKEN = "hf_secret_token_0123456789"
pytestmark = pytest.mark.filterwarnings("ignore::pydantic.PydanticDeprecatedSince20")
GOLDEN_HUB = "iteration-codex-hub-it0.yaml"
API = "api"  # FakeHub.flaky's key for the revision route
HUB_OVERRIDES = ["run=golden", "iterations=2", f"model=hf://{REPO_ID}"]


class FakeHub:
    """A loopback double of the hub's download API for one repository built from a local folder: `GET
    /api/models/{repo}/revision/{revision}` (the commit `sha` and `siblings` with sizes), `GET
    /{repo}/resolve/{sha}/{file}` (the bytes); `RepoNotFound` (401 anonymous, 404 with a token) for any other
    repository, `RevisionNotFound` for another revision. It records each request's path and authorization header,
    and fails the first `flaky` downloads of a file with a 503 (a transient error) or cuts them short, and the first
    `flaky[API]` answers of the revision route with those statuses; it lists but refuses (404) the files in
    `unserved`."""

    def __init__(self, folder: Path, gated: bool = False) -> None:
        self.files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
        self.files["README.md"] = b"# tiny\n"  # not wanted: never fetched
        self.sha = hashlib.sha1(b"".join(sorted(self.files.values()))).hexdigest()
        self.gated, self.requests, self.flaky, self.unserved = gated, [], {}, set()
        self.server = ThreadingHTTPServer((HOST, 0), self.handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://{HOST}:{self.server.server_address[1]}"

    def handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def answer(self, status: int, body: bytes, headers: dict | None = None) -> None:
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                auth = self.headers.get("authorization")
                path = self.path.split("?", 1)[0]
                hub.requests.append((path, auth))
                api = f"/api/models/{REPO_ID}/revision/"
                if path.startswith(api):
                    return self.info(path[len(api):], auth)
                prefix = f"/{REPO_ID}/resolve/{hub.sha}/"
                if path[len(prefix):] in hub.unserved:
                    return self.answer(404, b"{}", {"X-Error-Code": "EntryNotFound"})
                if path.startswith(prefix) and path[len(prefix):] in hub.files:
                    return self.file(path[len(prefix):])
                self.refuse(auth)

            def refuse(self, auth: str | None) -> None:
                self.answer(401 if auth is None else 404, b'{"error": "Repository not found"}',
                            {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"})

            def info(self, revision: str, auth: str | None) -> None:
                if hub.flaky.get(API):
                    return self.answer(hub.flaky[API].pop(0), b"busy")
                if hub.gated and auth != f"Bearer {TOKEN}":
                    return self.answer(403, b"{}", {"X-Error-Code": "GatedRepo"})
                if revision not in ("main", hub.sha):
                    return self.answer(404, b"{}", {"X-Error-Code": "RevisionNotFound"})
                siblings = [{"rfilename": name, "size": len(data)} for name, data in sorted(hub.files.items())]
                body = json.dumps({"id": REPO_ID, "sha": hub.sha, "siblings": siblings}).encode()
                self.answer(200, body, {"Content-Type": "application/json"})

            def file(self, name: str) -> None:
                data = hub.files[name]
                if hub.flaky.get(name):
                    kind = hub.flaky[name].pop(0)
                    if kind == "503":
                        return self.answer(503, b"busy")
                    self.send_response(200)  # "short": the connection ends half way through the body
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 2])
                    self.close_connection = True
                    return
                self.answer(200, data, {"X-Repo-Commit": hub.sha})

        return Handler

    def downloads(self) -> list[str]:
        """The files requested, in order."""
        return [path.rsplit("/", 1)[-1] for path, _ in self.requests if "/resolve/" in path]

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's files (safetensors, config, tokenizer), built once for this module."""
    from steps.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("hub-model"), seed=0)


@pytest.fixture
def hub(tiny_folder: Path):
    fake = FakeHub(tiny_folder)
    yield fake
    fake.close()


def store_files(url: str) -> dict[str, bytes]:
    """Every file under `url` in the store, by its name there."""
    fs, root = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    return {path[len(root.rstrip("/")) + 1:]: fs.cat_file(path) for path in fs.find(root)}


def run_step(model: str, run_url: str, endpoint: str, token: str | None = None) -> subprocess.CompletedProcess:
    """`python -m steps.fetch_model` as the Workflow runs it, with the token (or none) in its environment."""
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    argv = commands.fetch_model(RunConfig(model=model, run="r", store="x", hub_endpoint=endpoint), sys.executable)
    argv[argv.index("--run-url") + 1] = run_url
    return subprocess.run(argv, env={**env, "PYTHONPATH": str(REPO), **({"HF_TOKEN": token} if token else {})},
                          cwd=REPO, capture_output=True, text=True, timeout=120)


# ---- the fetch ----

def test_fetch_streams_the_model_into_the_store_once(hub: FakeHub, s3_store: str) -> None:
    """The wanted files land in the run's base-model/ byte for byte, the record pins the commit; a second fetch
    (a later iteration, a resumed run) finds the record and downloads nothing."""
    run_url = f"{s3_store}/run"
    record, fetched = fetch_model(HubModel(REPO_ID), run_url, hub.url)
    assert fetched and record.sha == hub.sha and record.model == f"hf://{REPO_ID}"
    expected = {name: data for name, data in hub.files.items() if wanted(name)}
    assert {".safetensors" in name for name in expected} == {True, False} and "README.md" not in expected
    assert store_files(layout.base_model_url(run_url)) == expected
    assert read_record(run_url) == FetchedModel(f"hf://{REPO_ID}", hub.sha, hub.url,
                                                {name: len(data) for name, data in expected.items()})
    assert RunConfig(model=f"hf://{REPO_ID}", store=s3_store, run="run").checkpoint_url(0) == \
        layout.base_model_url(run_url)
    downloads = len(hub.downloads())
    again, fetched = fetch_model(HubModel(REPO_ID), run_url, hub.url)
    assert not fetched and again == record and len(hub.downloads()) == downloads


def test_a_half_written_copy_is_fetched_again(hub: FakeHub, s3_store: str) -> None:
    """No record, no copy: files an interrupted fetch left are never taken for the model, and none is left beside
    the new copy (control, that a run with the record is not fetched again: the first test)."""
    run_url = f"{s3_store}/run"
    fs, root = fsspec.core.url_to_fs(layout.base_model_url(run_url))
    fs.pipe_file(f"{root}/config.json", b"half")
    fs.pipe_file(f"{root}/model-00002-of-00002.safetensors", b"a shard of an earlier commit")
    assert read_record(run_url) is None
    fetch_model(HubModel(REPO_ID), run_url, hub.url)
    assert store_files(layout.base_model_url(run_url)) == {n: d for n, d in hub.files.items() if wanted(n)}
    assert "config.json" in hub.downloads()


def test_transient_errors_are_retried(hub: FakeHub, s3_store: str) -> None:
    """A 503 and a body cut short are tried again, from the start of that file; the copy is whole."""
    weights = next(name for name in hub.files if name.endswith(".safetensors"))
    hub.flaky = {weights: ["503", "short"]}
    run_url = f"{s3_store}/run"
    fetch_model(HubModel(REPO_ID), run_url, hub.url, backoff_s=0.01)
    assert hub.downloads().count(weights) == 3
    assert store_files(layout.base_model_url(run_url))[weights] == hub.files[weights]


def test_the_revision_route_is_retried_but_a_refused_file_is_not(hub: FakeHub, s3_store: str) -> None:
    """A 502 then a 429 from the revision route are tried again; a 404 for a listed file is not (one sentence, no
    record written)."""
    hub.flaky = {API: [502, 429]}
    record, _ = fetch_model(HubModel(REPO_ID), f"{s3_store}/run", hub.url, backoff_s=0.01)
    assert record.sha == hub.sha and [p for p, _ in hub.requests if p.startswith("/api/")].count(
        f"/api/models/{REPO_ID}/revision/main") == 3
    hub.flaky, hub.unserved, before = {}, {"tokenizer.json"}, hub.downloads().count("tokenizer.json")
    with pytest.raises(HubError, match=r"^the hub refused tokenizer.json \(HTTP 404\), which it had listed$"):
        fetch_model(HubModel(REPO_ID), f"{s3_store}/other", hub.url, backoff_s=0.01)
    assert hub.downloads().count("tokenizer.json") == before + 1
    assert read_record(f"{s3_store}/other") is None


def test_the_token_is_a_bearer_header_only_when_given_and_never_printed(hub: FakeHub, s3_store: str) -> None:
    """With a token every request to the hub carries `authorization: Bearer <token>`, and the step's output does not
    hold it; control: without one no request carries an authorization header."""
    done = run_step(f"hf://{REPO_ID}", f"{s3_store}/with", hub.url, TOKEN)
    assert done.returncode == 0, done.stderr
    assert {auth for _, auth in hub.requests} == {f"Bearer {TOKEN}"}
    assert TOKEN not in done.stdout + done.stderr and hub.sha in done.stderr
    hub.requests.clear()
    done = run_step(f"hf://{REPO_ID}", f"{s3_store}/without", hub.url)
    assert done.returncode == 0, done.stderr
    assert hub.requests and {auth for _, auth in hub.requests} == {None}


def test_a_gated_model_needs_the_token(tiny_folder: Path, s3_store: str) -> None:
    """A gated model without the token: one sentence naming the Secret; with it, fetched (control)."""
    gated = FakeHub(tiny_folder, gated=True)
    try:
        done = run_step(f"hf://{REPO_ID}", f"{s3_store}/run", gated.url)
        assert done.returncode == 1 and done.stderr.count("\n") == 1
        assert "is gated" in done.stderr and "hub_secret" in done.stderr and "Traceback" not in done.stderr
        assert run_step(f"hf://{REPO_ID}", f"{s3_store}/run", gated.url, TOKEN).returncode == 0
    finally:
        gated.close()


@pytest.mark.parametrize("model, words", [("hf://tiny-org/no-such-model", "has no model tiny-org/no-such-model"),
                                          (f"hf://{REPO_ID}@v9", "has no revision 'v9'")])
def test_an_unknown_model_or_revision_is_one_sentence(hub: FakeHub, s3_store: str, model: str, words: str) -> None:
    """A 401/404 from the hub is one sentence on stderr, exit code 1, nothing written to the run."""
    done = run_step(model, f"{s3_store}/run", hub.url)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and read_record(f"{s3_store}/run") is None


def test_a_run_keeps_its_model(hub: FakeHub, s3_store: str) -> None:
    """A run that holds one hub model refuses to fetch another into the same base-model/."""
    run_url = f"{s3_store}/run"
    fetch_model(HubModel(REPO_ID), run_url, hub.url)
    with pytest.raises(Exception, match="already holds hf://tiny-org/tiny-model"):
        fetch_model(HubModel(REPO_ID, hub.sha), run_url, hub.url)


def test_the_local_runner_fetches_into_its_store(hub: FakeHub, tmp_path: Path) -> None:
    """Without Argo, the local runner runs the same step into the local store before it serves, once; what it
    serves and trains is that copy."""
    from workflows import local

    config = RunConfig(model=f"hf://{REPO_ID}", hub_endpoint=hub.url, store=str(tmp_path / "runs"), run="local")
    config, _ = local.open_run(config)
    assert config.model == f"hf://{REPO_ID}"  # not taken for a folder
    served = local.base_model(config)
    assert served == layout.base_model_url(config.run_url) == config.checkpoint_url(0)
    expected = {name: data for name, data in hub.files.items() if wanted(name)}
    assert {p.name: p.read_bytes() for p in Path(served).iterdir()} == expected
    downloads = len(hub.downloads())
    assert local.base_model(config) == served and len(hub.downloads()) == downloads


# ---- the config ----

def test_a_hub_id_is_accepted_for_an_argo_run() -> None:
    """`org/name[@revision]` (no such folder here) and `hf://org/name` both load as the hub model and pass the
    cluster checks; an existing folder of that shape stays a folder."""
    for given, expected in (("Qwen/Qwen3-8B", "hf://Qwen/Qwen3-8B"), ("hf://Qwen/Qwen3-8B@v1", "hf://Qwen/Qwen3-8B@v1"),
                            ("Qwen/Qwen3-8B@main", "hf://Qwen/Qwen3-8B")):
        config = load_config(CLUSTER, ["run=demo", f"model={given}"])
        assert config.model == expected
        validate_for_argo(config)
        assert config.checkpoint_url(0) == "s3://openforge/runs/demo/base-model"
    assert load_config(CLUSTER, ["model=steps/tasks"]).model == "steps/tasks"  # a folder of this repository
    assert load_config(None, []).model == RunConfig.model  # the tiny model, built locally when missing


@pytest.mark.parametrize("model", ["hf://Qwen", "hf://Qwen/Qwen3-8B/extra", "hf://Qwen/../etc", "hf://a--b/c"])
def test_a_bad_hub_id_is_refused(model: str) -> None:
    with pytest.raises(ConfigError, match=r"config key 'model' names a hub model as hf://org/name\[@revision\]"):
        load_config(CLUSTER, [f"model={model}"])


def test_a_local_folder_is_still_refused_for_an_argo_run() -> None:
    """Control: the Argo check still refuses a model pods cannot read, and names the hub form as an answer."""
    with pytest.raises(ConfigError, match="must be an s3:// URL or a hub model"):
        validate_for_argo(load_config(CLUSTER, ["model=steps/tasks"]))


def test_hub_model_parsing() -> None:
    assert hub_model("Qwen/Qwen3-8B@refs/pr/1") == HubModel("Qwen/Qwen3-8B", "refs/pr/1")
    assert hub_model("runs/tiny-model") == HubModel("runs/tiny-model")  # the shape alone: the config decides


# ---- the Workflows ----

def hub_config(*overrides: str):
    return load_config(CLUSTER, [*HUB_OVERRIDES, *overrides])


def test_golden_iteration_with_a_hub_model(workflow_validator) -> None:  # noqa: F811 (the fixture)
    """Iteration 0 with a hub model equals its golden YAML (OPENFORGE_UPDATE_GOLDEN=1 rewrites it), validates
    against Argo's strict schema and has no dangling reference."""
    workflow = iteration_workflow(hub_config(), 0)
    path = GOLDEN / GOLDEN_HUB
    if os.environ.get("OPENFORGE_UPDATE_GOLDEN") == "1":
        path.write_text(workflow.to_yaml())
    golden = yaml.safe_load(path.read_text())
    assert workflow.to_dict() == golden
    assert schema_errors(workflow_validator, golden) == [] and semantic_problems(golden) == []


def test_iteration_0_fetches_before_collect_and_serves_the_copy() -> None:
    """fetch-model runs first, collect waits for it, serve and update read the store's copy, the token comes from
    the optional Secret and is never in the YAML."""
    spec = iteration_workflow(hub_config(), 0).to_dict()["spec"]
    templates = {t["name"]: t for t in spec["templates"]}
    tasks = {t["name"]: t for t in templates["iteration"]["dag"]["tasks"]}
    assert "depends" not in tasks["fetch-model"] and tasks["collect"]["depends"] == "fetch-model"
    copy = "s3://openforge/runs/golden/base-model"
    assert copy in templates["serve"]["container"]["command"] and copy in templates["update"]["container"]["command"]
    assert copy in templates["trajectories"]["container"]["command"]
    env = {e["name"]: e for e in templates["fetch-model"]["container"]["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "openforge-hub", "key": "token", "optional": True}


def test_later_iterations_do_not_fetch() -> None:
    """Iteration 1 serves the checkpoint iteration 0 wrote: its Workflow has no fetch-model (nor does any iteration
    of an s3:// model, the control); with max_staleness 1, iteration 1 may start first and fetches too (a no-op
    once the run holds the model)."""
    def names(config, iteration: int) -> set[str]:
        return {t["name"] for t in iteration_workflow(config, iteration).to_dict()["spec"]["templates"]}

    assert shape.FETCH_MODEL in names(hub_config(), 0)
    assert shape.FETCH_MODEL not in names(hub_config(), 1)
    assert shape.FETCH_MODEL not in names(load_config(CLUSTER, ["run=golden"]), 0)
    assert shape.FETCH_MODEL in names(hub_config("max_staleness=1"), 1)


def test_an_eval_run_of_a_hub_model_fetches_it() -> None:
    spec = evaluation_workflow(hub_config(), 0).to_dict()["spec"]
    tasks = {t["name"]: t for t in next(t for t in spec["templates"] if t["name"] == "evaluation")["dag"]["tasks"]}
    assert tasks["collect"]["depends"] == "fetch-model"
    assert semantic_problems(evaluation_workflow(hub_config(), 0).to_dict()) == []


def test_the_driver_submits_a_hub_run(fake_argo, s3_store: str, s3_server: dict) -> None:  # noqa: F811 (fixtures)
    """`submit.py` with a hub model: the run's config keeps it as hf://, iteration 0's Workflow fetches it first and
    serves the copy, iteration 1's does not fetch."""
    endpoint = f"s3_endpoint={s3_server['endpoint_url']}"  # the driver's store is the config's (submit.use_store)
    assert drive(fake_argo, s3_store, "run=hub", "iterations=2", f"model={REPO_ID}", endpoint) == 0
    assert manifest.read_run_config(f"{s3_store}/hub")["model"] == f"hf://{REPO_ID}"
    dags = {name: {t["name"]: t.get("depends") for t in next(
        tpl for tpl in workflow["spec"]["templates"] if tpl["name"] == "iteration")["dag"]["tasks"]}
        for name, workflow in fake_argo.workflows.items()}
    assert dags["openforge-hub-it0"]["collect"] == "fetch-model" and "fetch-model" not in dags["openforge-hub-it1"]
