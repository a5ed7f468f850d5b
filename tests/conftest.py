"""Session fixtures shared by the test suite: real parts at small scale, all on 127.0.0.1.

- `tiny_model`: the tiny Qwen2-style model + tokenizer, built once (seconds, no download).
- `vllm_server`: the real vLLM OpenAI server on CPU serving it as "tiny"; its root URL. The session starts
  it at its first test when any selected test uses it (`start_vllm_early`), so that tests before run meanwhile.
- `tiny_vision_model`, `vision_vllm`: the tiny Qwen2.5-VL model (`python -m steps.tiny_model OUT --vision`),
  and the real vLLM on CPU serving it as "tiny" (started only when a test asks for it).
- `s3_server`: a moto S3 server with one bucket; yields its endpoint, bucket and the env for s3fs.
- `proxy`: a factory that starts the real recording proxy (`python -m steps.proxy`) as a subprocess.
  Each started proxy (`tests/proxy_process.py`) has `.register(rollout_id)`, `.calls(rollout_id)` and
  `.client`, the `ProxyClient` of every admin route.
- `scripted`, `scripted_proxy` (per module): `tests/scripted_model.py`'s double of vLLM, which plays a model
  that calls the harness's shell tool (`scripted.set_commands([...])`), and a real proxy in front of it.

Markers (pyproject.toml): `vllm`, put on every user of `vllm_server` or `vision_vllm` here; `harness` and `slow`, put on
the tests themselves. `make test-fast` leaves all three out.
"""

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from proxy_process import ADMIN_KEY, ProxyProcess, start_proxy, stop_proxy
from steps.net import HOST, free_port
from steps.tiny_model import build_tiny_model
from steps.vllm_server import VllmServer, stop_vllm
from vllm_process import spawn_vllm, wait_ready

MODEL_NAME = "tiny"
S3_BUCKET = "openforge-test"
# Nothing in a test may download: tokenizers and models load from local folders only.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`vllm` on every test that uses `vllm_server` or `vision_vllm`, directly or through another fixture, so
    that none is forgotten (`make test-fast` leaves them out). Then the modules with a `slow` test go first,
    the others keeping their order: `make test` hands whole modules to two workers (pytest-xdist's
    `--dist loadfile`), and a run of minutes started last would leave the other worker idle at the end."""
    for item in items:
        if {"vllm_server", "vision_vllm"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.vllm)
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable: the order within each group stays


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's folder (seed 0), built once per test session."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture(scope="session")
def vllm_process(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """The session's vLLM process serving `tiny_model` as "tiny", started once and not waited for; stopped
    when the session ends. Tests use `vllm_server`."""
    server = spawn_vllm(tiny_model, name=MODEL_NAME, log_path=tmp_path_factory.mktemp("vllm") / "vllm.log")
    try:
        yield server
    finally:
        stop_vllm(server)


@pytest.fixture(autouse=True)
def restore_environment() -> Iterator[None]:
    """Puts back this process's environment after each test: the driver points its own s3fs/boto3 at the config's
    store by setting AWS_* there (`workflows.submit.use_store`), as a real driver should, and one test's store must
    not become the next one's. Only the store's variables: what a process sets up once for itself (the update's
    CPU process group reads RANK, WORLD_SIZE, ... that `steps.update.cpu` sets at its first use) must stay."""
    saved = {key: value for key, value in os.environ.items() if key.startswith("AWS_")}
    yield
    for key in [key for key in os.environ if key.startswith("AWS_")]:
        del os.environ[key]
    os.environ.update(saved)


@pytest.fixture(scope="session", autouse=True)
def start_vllm_early(request: pytest.FixtureRequest) -> None:
    """Starts the session's vLLM at the first test when a selected test will use it: its start (half a
    minute in CI, minutes under load) then runs beside the tests before that one instead of holding it up."""
    if any("vllm_server" in getattr(item, "fixturenames", ()) for item in request.session.items):
        request.getfixturevalue("vllm_process")


@pytest.fixture(scope="session")
def vllm_server(vllm_process: VllmServer) -> str:
    """The real vLLM server on CPU serving `tiny_model` as "tiny", ready; its root URL.

    vLLM's log is in the session's temporary folder; a failed start quotes its tail.
    """
    wait_ready(vllm_process)
    return vllm_process.base_url


@pytest.fixture(scope="session")
def tiny_vision_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2.5-VL model's folder (seed 0, `build_tiny_model(..., vision="qwen2_5_vl")`), built once:
    its `preprocessor_config.json` caps an image at 256 merged patches, its chat template renders an image part
    in a user or tool turn as `<|vision_start|><|image_pad|><|vision_end|>`."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-vision-model"), seed=0, vision="qwen2_5_vl")


@pytest.fixture(scope="session")
def vision_vllm(tiny_vision_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """The real vLLM server on CPU serving `tiny_vision_model` as "tiny", ready, with the serve step's flags for
    a vision checkpoint (`ServingOptions()`: at most 4 images per prompt, no video, the checkpoint's template).

    Yields its `VllmServer`: `.base_url` (root URL, without /v1), `.model_dir` (the checkpoint's folder: its
    tokenizer, `preprocessor_config.json`, `chat_template.jinja`), `.name` ("tiny"), `.log_path`. Started only
    when a test asks for it (a second vLLM costs a minute or more), once per session, stopped at its end. A test
    that swaps its weights swaps them back before it ends.
    """
    server = spawn_vllm(tiny_vision_model, name=MODEL_NAME,
                        log_path=tmp_path_factory.mktemp("vision-vllm") / "vllm.log")
    try:
        wait_ready(server, timeout_s=600)
        yield server
    finally:
        stop_vllm(server)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[dict]:
    """A moto S3 server on loopback with `S3_BUCKET` created.

    Yields {"endpoint_url", "bucket", "env"}; `env` (dummy keys, region, endpoint) is what a
    subprocess needs for s3fs/boto3 to use this server, e.g. `start_proxy(..., env=s3_server["env"])`.
    """
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address=HOST, port=port, verbose=False)
    server.start()
    endpoint = f"http://{HOST}:{port}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": endpoint}
    try:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket=S3_BUCKET)
        yield {"endpoint_url": endpoint, "bucket": S3_BUCKET, "env": env}
    finally:
        server.stop()


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., ProxyProcess]]:
    """A factory: `proxy(upstream, store=None, extra=[], env=None)` starts the real proxy and waits for /health.

    It writes rollout results under a run folder of its own, as iteration 0's (`--run-url`, `--iteration`; `extra`
    may name others). The store defaults to a fresh local folder; pass an `s3://` URL (and `env=s3_server["env"]`)
    for S3.
    The admin key is `ADMIN_KEY`. Module-scoped, so module fixtures can share one proxy; every proxy
    started is stopped when the test module ends.
    """
    tmp_path = tmp_path_factory.mktemp("proxy")
    started: list[ProxyProcess] = []

    def start(upstream: str, store: str | None = None, extra: list[str] = (), env: dict | None = None) -> ProxyProcess:
        store = store or str(tmp_path / f"store-{len(started)}")
        # Where it writes the results rollout pods send it, as the serve pod's proxy does (steps/proxy/results.py)
        results = ["--run-url", str(tmp_path / f"run-{len(started)}"), "--iteration", "0"]
        process = start_proxy(upstream, store, ADMIN_KEY, extra=results + list(extra), env=env,
                              log_path=tmp_path / f"proxy-{len(started)}.log")
        started.append(process)
        return process

    yield start
    for process in started:
        stop_proxy(process)


@pytest.fixture(scope="module")
def scripted():
    """The scripted vLLM double (a small random model cannot call tools), one per test module."""
    from scripted_model import ScriptedModel

    with ScriptedModel(model="tiny") as server:
        yield server


@pytest.fixture(scope="module")
def scripted_proxy(proxy, scripted):
    """A real recording proxy in front of `scripted`."""
    return proxy(scripted.url)
