"""Experiment tracking with the real libraries, offline: W&B in offline mode (its run file read back record by
record), MLflow against a SQLite database and against a real MLflow tracking server on loopback (its basic-auth app;
read back through its client) and TensorBoard event files (read back with tensorboard's EventAccumulator). The run they log is `benchmarks/report_weight.py`'s synthetic one (the real proxy
store and trajectories step, the report's own fixture), with an update's grad norm, staleness and phase times added.

Every number the report plots must arrive in every tracker with the report's value (`REQUIRED` names the main ones,
as docs/tracking.md lists them; the control drops one on its way and the check catches it). On the cluster path the driver logs
through `submit.py` against the fake Argo server, its TensorBoard files landing in the S3 store (moto on loopback).
The libraries are the `tracking` extra, which `make setup` installs. The MLflow server is the full `mlflow` package,
which pins an older pyarrow than the project's: `make mlflow-server` (which `make test` runs) puts it in `.venv-mlflow`.
"""

import glob
import json
import os
import signal
import struct
import subprocess
import time
import urllib.request
from pathlib import Path

import fsspec
import pytest

from benchmarks.report_weight import synthetic_run
from steps import manifest, tracking
from steps.contracts import layout
from steps.contracts.config import RunConfig
from steps.contracts.manifest import IterationRecord
from steps.analytics import summarize_behaviour
from steps.report.data import load_run
from steps.report.index import summaries
from steps.settings import ConfigError
from workflows.config import load_config
from workflows.driver import driver_workflow
from held_relay import HeldRelay
from steps.net import free_port
from test_eval import fake_summary
from test_workflows import CLUSTER, FakeArgoServer, drive, fake_argo, s3_store  # noqa: F401 (fixtures)

ITERATIONS = 2
REPO = Path(__file__).resolve().parents[1]
MLFLOW_SERVER = REPO / ".venv-mlflow" / "bin" / "mlflow"
MLFLOW_USER, MLFLOW_PASSWORD = "openforge-ci", "a-long-test-password-1234"  # the server's admin, made at its start
# What the report plots, by the trackers' names: rewards, pass@k/pass^k, losses, grad norm, logprob gap, continuity,
# staleness, harness kills, phase and rollout times, behaviour, the evaluation's numbers (at the last iteration).
REQUIRED = ["train/mean_reward", "train/pass_at_k", "train/pass_hat_k", "train/infra_errors", "train/loss",
            "train/grad_norm", "train/entropy", "train/logprob_gap", "train/tokens", "train/calls",
            "train/continuity_direct", "train/harness_killed_memory", "train/staleness_max_versions_behind",
            "train/phase_rollouts_s", "train/phase_update_s", "train/agent_s", "train/update_train_s",
            "behaviour/direct/pass_rate", "behaviour/direct/self_verified", "behaviour/direct/tokens_per_call"]
EVAL_REQUIRED = ["eval/pass_at_1", "eval/pass_at_k", "eval/pass_hat_k", "eval/mean_reward"]


@pytest.fixture(scope="module")
def run_store(tmp_path_factory) -> str:
    """A two-iteration synthetic run whose updates also recorded a grad norm and whose manifest records carry
    staleness and phase times, as a local run's do; its URL."""
    store = tmp_path_factory.mktemp("tracked-runs")
    run_url = synthetic_run(store, "tracked", rollouts=4, iterations=ITERATIONS)
    for n in range(ITERATIONS):
        metrics_url = layout.metrics_url(layout.checkpoint_url(run_url, n + 1, ""))
        manifest.write_json(metrics_url, manifest.read_json(metrics_url) | {"grad_norm": 0.5 + n, "entropy": 1.25})
        manifest.record(run_url, IterationRecord(n, "local", status="Succeeded",
                                                 timings_s={"rollouts_s": 3.0 + n, "update_s": 2.0},
                                                 staleness={"max_behind": n, "mean_behind": n / 2, "dropped": 0}))
    return run_url


def tracked_config(run_url: str, tmp_path: Path, *trackers: str, **fields) -> RunConfig:
    """The run's config with `trackers` on: MLflow in a SQLite file, TensorBoard in its default folder."""
    store, name = run_url.rsplit("/", 1)
    return RunConfig(run=name, store=store, trackers=trackers,
                     **{"mlflow_tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", **fields})


@pytest.fixture(autouse=True)
def wandb_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B writes its run file and sends nothing."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def expected(run_url: str, n: int) -> dict[str, float]:
    """Iteration n's numbers from the whole run, as the report loads it (not the one-iteration load the trackers use)."""
    return tracking.iteration_numbers(load_run(run_url), n)


def wandb_records(path: str):
    """The records of a W&B run file: a LevelDB-style log (wandb's `datastore`: a 7-byte header, then 32 KiB blocks
    of chunks, each with a 7-byte header: CRC, length, type full/first/middle/last), each a `Record` protobuf."""
    from wandb.proto import wandb_internal_pb2

    data, pos, pending, block = Path(path).read_bytes(), 7, b"", 32768
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        body, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        pending = body if kind in (1, 2) else pending + body
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def read_wandb(folder: Path) -> tuple[dict[int, dict], dict, dict]:
    """What the offline W&B runs under `folder` hold: history by step, config, summary (every run file, in order)."""
    history, config, summary = {}, {}, {}
    for path in sorted(glob.glob(str(folder / "wandb" / "offline-run-*" / "run-*.wandb"))):
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                step = items.pop("_step")
                history.setdefault(step, {}).update({k: v for k, v in items.items() if not k.startswith("_")})
            elif kind in ("run", "config"):
                updates = record.run.config.update if kind == "run" else record.config.update
                config |= {i.key: json.loads(i.value_json) for i in updates if i.key != "_wandb"}
            elif kind == "summary":
                summary |= {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.summary.update}
    return history, config, summary


def read_mlflow(uri: str, project: str) -> tuple[dict[int, dict], dict, dict]:
    """The run's MLflow metrics by step, params and tags, through MLflow's client."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run, = client.search_runs([client.get_experiment_by_name(project).experiment_id])
    history: dict[int, dict] = {}
    for name in run.data.metrics:
        for metric in client.get_metric_history(run.info.run_id, name):
            history.setdefault(metric.step, {})[name] = metric.value
    return history, run.data.params, run.data.tags


def read_tensorboard(folder: str) -> tuple[dict[int, dict], dict]:
    """TensorBoard's scalars by step and its texts, read back with its EventAccumulator."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(folder, size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    history: dict[int, dict] = {}
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            history.setdefault(event.step, {})[tag] = event.value
    texts = {tag: events.Tensors(tag)[-1].tensor_proto.string_val[0].decode() for tag in events.Tags()["tensors"]}
    return history, texts


def check_logged(history: dict[int, dict], run_url: str, steps: range = range(ITERATIONS)) -> None:
    """Every number of every iteration is logged at its step with the report's value, `REQUIRED` among them."""
    for n in steps:
        want = expected(run_url, n)
        missing = sorted(set(REQUIRED) - set(want))
        assert not missing, f"the fixture's run lacks {missing}"
        assert sorted(set(want) - set(history.get(n, {}))) == [], f"iteration {n}: not logged"
        assert history[n] == pytest.approx(want, rel=1e-6), f"iteration {n}"
    assert set(EVAL_REQUIRED) <= set(history[ITERATIONS - 1])  # synthetic_run evaluates its last iteration


def test_the_numbers_are_the_reports_own(run_store):
    """What the trackers get is every number of the report's iteration table (`index.summaries`), its behaviour means
    (`summarize_behaviour` by harness) and the evaluation's overall numbers, each with the report's value; texts left
    out. Read from the whole run here, from that one iteration by the trackers."""
    run = load_run(run_store)
    for n in range(ITERATIONS):
        numbers = tracking.iteration_numbers(load_run(run_store, only=n), n)
        table = summaries(run)[n]
        assert {k: v for k, v in numbers.items() if k.startswith("train/")} == {
            tracking.metric_name("train", k): float(v) for k, v in table.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}
        assert table["status"] == "Succeeded" and "train/status" not in numbers
        means, = summarize_behaviour(run.iterations[n].behaviour, ["harness"])
        assert numbers["behaviour/direct/pass_rate"] == means["pass_rate"]
        assert numbers["behaviour/direct/tokens_per_call"] == means["tokens_per_call"]
    overall = run.evals[ITERATIONS - 1]["overall"]
    assert {k: v for k, v in numbers.items() if k.startswith("eval/")} == {f"eval/{k}": v for k, v in overall.items()}


def log_run(config: RunConfig, lines: list[str]) -> None:
    """What the driver does over a run: start the trackers, log each iteration that succeeded, close them."""
    with tracking.Trackers.start(config, lines.append) as trackers:
        for n in range(ITERATIONS):
            trackers.log_iteration(n)


def test_each_tracker_logs_the_config_once_and_every_number_the_report_plots(run_store, tmp_path):
    config = tracked_config(run_store, tmp_path, "wandb", "mlflow", "tensorboard")
    lines: list[str] = []
    log_run(config, lines)
    assert [line.split(" logs this run")[0] for line in lines] == ["tracking: wandb", "tracking: mlflow",
                                                                    "tracking: tensorboard"], lines
    report = layout.report_index_url(run_store)

    history, params, summary = read_wandb(Path(layout.tracking_url(run_store)))
    check_logged(history, run_store)
    assert params["iterations"] == 2 and params["trackers"] == ["wandb", "mlflow", "tensorboard"]
    assert summary["report"] == report

    history, params, tags = read_mlflow(config.mlflow_tracking_uri, config.tracker_project)
    check_logged(history, run_store)
    assert params["iterations"] == "2" and params["run"] == "tracked" and tags["report"] == report

    history, texts = read_tensorboard(layout.tensorboard_url(run_store))
    check_logged(history, run_store)
    assert "iterations: 2" in texts["config"] and texts["report"] == report


def test_the_check_catches_a_number_a_tracker_did_not_log(run_store, tmp_path, monkeypatch):
    """Control: a TensorBoard tracker that drops the grad norm on its way fails `check_logged`."""
    real = tracking.TensorBoardTracker.log
    monkeypatch.setattr(tracking.TensorBoardTracker, "log", lambda self, step, numbers: real(
        self, step, {k: v for k, v in numbers.items() if k != "train/grad_norm"}))
    log_run(tracked_config(run_store, tmp_path, "tensorboard", tensorboard_dir=str(tmp_path / "tb")), [])
    history, _ = read_tensorboard(str(tmp_path / "tb"))
    with pytest.raises(AssertionError, match="not logged"):
        check_logged(history, run_store)


def test_a_resumed_driver_logs_into_the_same_runs(run_store, tmp_path):
    """A driver that stopped after iteration 0 and a second one that logs iteration 1: one MLflow run (found by its
    tag), one W&B run id, one TensorBoard folder; the config logged again changes nothing."""
    config = tracked_config(run_store, tmp_path, "wandb", "mlflow", "tensorboard", tensorboard_dir=str(tmp_path / "tb"))
    for n in range(ITERATIONS):
        with tracking.Trackers.start(config, print) as trackers:
            trackers.log_iteration(n)
    check_logged(read_mlflow(config.mlflow_tracking_uri, config.tracker_project)[0], run_store)
    check_logged(read_tensorboard(str(tmp_path / "tb"))[0], run_store)
    runs = glob.glob(f"{layout.tracking_url(run_store)}/wandb/offline-run-*")
    assert len({path.rsplit("-", 1)[-1] for path in runs}) == 1, runs  # one run id, one folder per driver


def test_a_tracker_that_fails_to_start_is_one_line_and_the_others_go_on(run_store, tmp_path):
    """TensorBoard's folder is a file: it is said in one line and left out; MLflow logs every iteration."""
    (tmp_path / "taken").write_text("a file, not a folder")
    config = tracked_config(run_store, tmp_path, "tensorboard", "mlflow", tensorboard_dir=str(tmp_path / "taken"))
    lines: list[str] = []
    log_run(config, lines)
    failed, = [line for line in lines if "did not start" in line]
    assert failed.startswith("tracking: tensorboard did not start, the run goes on without it: ") and "\n" not in failed
    check_logged(read_mlflow(config.mlflow_tracking_uri, config.tracker_project)[0], run_store)


@pytest.mark.parametrize("overrides, error", [
    (["trackers=[comet]"], "config key 'trackers' takes wandb, mlflow, tensorboard"),
    (["trackers=[wandb,wandb]"], "names a tracker twice"),
    (["trackers=[mlflow]"], "config key 'mlflow_tracking_uri' must be"),
    (["trackers=[mlflow]", "mlflow_tracking_uri=mlruns"], "config key 'mlflow_tracking_uri' must be"),
    (["trackers=[mlflow]", "mlflow_tracking_uri=https://me:hunter2@mlflow.example.com"], "must not hold a password"),
    (["tracker_project=a/b"], "config key 'tracker_project'"),
    (["wandb_secret=My_Key"], "config key 'wandb_secret' must be a Kubernetes Secret's name"),
])
def test_a_bad_tracking_key_is_one_sentence_at_load(overrides, error):
    with pytest.raises(ConfigError, match=error.replace("[", r"\[")) as raised:
        load_config(None, overrides)
    assert "\n" not in str(raised.value) and "hunter2" not in str(raised.value)


def test_a_tracker_whose_library_is_missing_is_refused_at_load(monkeypatch):
    """Before anything heavy starts; the control: with the library there, the same config loads."""
    assert load_config(None, ["trackers=[wandb]"]).trackers == ("wandb",)
    monkeypatch.setitem(__import__("sys").modules, "wandb", None)  # import wandb now fails, as where it is missing
    with pytest.raises(ConfigError, match=r"names wandb, whose library this Python lacks; install .*\[tracking\]"):
        load_config(None, ["trackers=[wandb]"])


def test_the_driver_pod_takes_credentials_from_secrets_by_name_only():
    """WANDB_API_KEY and MLflow's token or username and password come from the Secrets the config names (optional
    keys), for the trackers the run has; no other env changes, and a run without trackers renders as before."""
    config = load_config(CLUSTER, ["run=demo", "trackers=[wandb,mlflow,tensorboard]",
                                   "mlflow_tracking_uri=https://mlflow.example.com", "wandb_secret=team-wandb"])
    env = driver_workflow(config).to_dict()["spec"]["templates"][0]["container"]["env"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env
            if e["name"] == "WANDB_API_KEY" or e["name"].startswith("MLFLOW_TRACKING_")}
    assert refs == {"WANDB_API_KEY": {"name": "team-wandb", "key": "api-key", "optional": True},
                    "MLFLOW_TRACKING_TOKEN": {"name": "openforge-mlflow", "key": "token", "optional": True},
                    "MLFLOW_TRACKING_USERNAME": {"name": "openforge-mlflow", "key": "username", "optional": True},
                    "MLFLOW_TRACKING_PASSWORD": {"name": "openforge-mlflow", "key": "password", "optional": True}}
    assert all("value" not in e for e in env if e["name"] in refs)
    plain = driver_workflow(load_config(CLUSTER, ["run=demo"])).to_dict()["spec"]["templates"][0]["container"]["env"]
    assert [e for e in env if e["name"] not in refs] == plain


def test_the_argo_driver_logs_each_iteration_into_tensorboard_in_the_store(fake_argo: FakeArgoServer,  # noqa: F811
                                                                          s3_store: str, tmp_path):
    """`submit.py` against the fake Argo server, `eval_every=2` of 2 iterations: once each Workflow succeeded the driver
    logs its numbers (iteration 0 with its evaluation, iteration 1, then the final checkpoint's evaluation at step 2);
    the event files land under the run's `tracking/tensorboard` in S3 and read back with what the report has."""
    run_url = f"{s3_store}/tb"
    manifest.write_json(f"{run_url}/checkpoints/iteration-1/metrics.json", {"loss": 0.5, "grad_norm": 2.0})
    first, final = fake_summary(run_url, 0), fake_summary(run_url, 2)  # what the evaluate steps would have written
    assert drive(fake_argo, s3_store, "--harness", "codex", "run=tb", "iterations=2", "eval_every=2",
                 "trackers=[tensorboard]") == 0
    fs, path = fsspec.core.url_to_fs(layout.tensorboard_url(run_url))
    fs.get(path, str(tmp_path / "tb"), recursive=True)
    history, texts = read_tensorboard(str(tmp_path / "tb"))
    assert sorted(history) == [0, 1, 2] and history[0]["train/loss"] == 0.5 and history[0]["train/grad_norm"] == 2.0
    assert history == {n: pytest.approx(expected(run_url, n)) for n in range(3)}
    assert history[0]["eval/pass_at_k"] == first["overall"]["pass_at_k"]
    assert history[2] == pytest.approx({k: v for k, v in expected(run_url, 2).items() if k.startswith("eval/")})
    assert history[2]["eval/tries"] == final["overall"]["tries"]
    assert "trackers: [\"tensorboard\"]" in texts["config"] and texts["report"] == layout.report_index_url(run_url)

@pytest.mark.parametrize("staleness", [0, 1])
def test_the_local_runner_logs_each_iteration_once_it_succeeded(tmp_path, monkeypatch, staleness):
    """`run_synchronous` and `run_overlapped` (whose `finish` runs on the update's thread) log each iteration into
    TensorBoard after its record is written, the update's grad norm among its numbers. The steps are stubbed (as in
    tests/test_staleness.py): the real loop with vLLM and veRL is tests/test_local_run.py's slow run."""
    from workflows import local

    def update(config, iteration, *args):
        checkpoint = config.checkpoint_url(iteration + 1)
        manifest.write_json(layout.metrics_url(checkpoint), {"loss": 0.25, "grad_norm": 1.0 + iteration})
        return checkpoint

    for name, stub in {"collect_iteration": lambda *args: [], "update_iteration": update, "say": lambda text: None,
                       "refresh_report": lambda run_url: None}.items():
        monkeypatch.setattr(local, name, stub)
    config = load_config(None, [f"store={tmp_path}", "run=loc", "iterations=2", f"max_staleness={staleness}",
                                "trackers=[tensorboard]"], check_dataset=False)
    manifest.write_run_config(config.run_url, config.to_dict())
    loop = local.run_overlapped if staleness else local.run_synchronous
    with tracking.Trackers.start(config, print) as trackers:
        assert loop(config, 0, {}, "http://proxy", "admin", {}, tmp_path, trackers) == 0
    history, texts = read_tensorboard(layout.tensorboard_url(config.run_url))
    assert [history[n]["train/grad_norm"] for n in (0, 1)] == [1.0, 2.0]
    assert history == {n: pytest.approx(expected(config.run_url, n)) for n in (0, 1)}
    assert json.loads(texts["config"].split("max_staleness: ")[1].split("\n")[0]) == staleness


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory) -> str:
    """`mlflow server --app-name basic-auth` on 127.0.0.1 (one worker, SQLite stores); its URL. Every call needs the
    admin's username and password (`default_permission = NO_PERMISSIONS`)."""
    if not MLFLOW_SERVER.exists():
        pytest.skip("no MLflow server here: `make mlflow-server` installs it (`make test` does)")
    folder = tmp_path_factory.mktemp("mlflow-server")
    (folder / "auth.ini").write_text(
        f"[mlflow]\ndefault_permission = NO_PERMISSIONS\ndatabase_uri = sqlite:///{folder}/auth.db\n"
        f"admin_username = {MLFLOW_USER}\nadmin_password = {MLFLOW_PASSWORD}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
    port, log = free_port(), folder / "server.log"
    env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(folder / "auth.ini"), "MLFLOW_FLASK_SERVER_SECRET_KEY": "test-csrf"}
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [str(MLFLOW_SERVER), "server", "--app-name", "basic-auth", "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1", "--backend-store-uri", f"sqlite:///{folder}/mlflow.db",
             "--default-artifact-root", str(folder / "artifacts")],
            cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        yield url
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)


def server_config(run_url: str, tmp_path: Path, uri: str, project: str, *trackers: str) -> RunConfig:
    """The run's config logging into the MLflow server at `uri`, experiment `project` (one per test)."""
    return tracked_config(run_url, tmp_path, "mlflow", *trackers, mlflow_tracking_uri=uri, tracker_project=project,
                          tensorboard_dir=str(tmp_path / "tb"))


@pytest.fixture
def mlflow_login(monkeypatch: pytest.MonkeyPatch) -> None:
    """The env a driver pod gets from `mlflow_secret`'s username and password keys (`tracker_env`)."""
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", MLFLOW_USER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", MLFLOW_PASSWORD)


@pytest.mark.slow
def test_mlflow_over_http_with_basic_auth_logs_every_number_into_one_run_across_drivers(
        run_store, tmp_path, mlflow_server, mlflow_login):
    """Two drivers against the real server (the first stops after iteration 0): one MLflow run holds both iterations,
    every number at its step with the report's value, the config's params once and the report's link."""
    config = server_config(run_store, tmp_path, mlflow_server, "over-http")
    for n in range(ITERATIONS):
        lines: list[str] = []
        with tracking.Trackers.start(config, lines.append) as trackers:
            trackers.log_iteration(n)
        assert lines == [f"tracking: mlflow logs this run to {mlflow_server} run {trackers_run_id(config)}"], lines
    history, params, tags = read_mlflow(mlflow_server, "over-http")  # one run: read_mlflow unpacks exactly one
    check_logged(history, run_store)
    assert params["iterations"] == "2" and tags["report"] == layout.report_index_url(run_store)
    assert tags[tracking.RUN_TAG] == tracking.run_key(config)


def trackers_run_id(config: RunConfig) -> str:
    """The MLflow run the server holds for `config`'s run (found by its tag, as a resumed driver finds it)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=config.mlflow_tracking_uri)
    experiment = client.get_experiment_by_name(config.tracker_project)
    run, = client.search_runs([experiment.experiment_id], f"tags.`{tracking.RUN_TAG}` = '{tracking.run_key(config)}'")
    return run.info.run_id


@pytest.mark.slow
def test_a_wrong_mlflow_password_is_one_line_that_does_not_name_it(run_store, tmp_path, mlflow_server, monkeypatch):
    """The server refuses the driver: the tracker does not start, said in one line without the password, and the run's
    other tracker logs every iteration. The control: the same config with the right password starts."""
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", MLFLOW_USER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong-password-hunter2")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    config = server_config(run_store, tmp_path, mlflow_server, "refused", "tensorboard")
    lines: list[str] = []
    log_run(config, lines)
    failed, = [line for line in lines if "did not start" in line]
    assert failed.startswith("tracking: mlflow did not start, the run goes on without it: ") and "\n" not in failed
    assert "hunter2" not in failed and ("401" in failed or "nauthori" in failed), failed
    check_logged(read_tensorboard(str(tmp_path / "tb"))[0], run_store)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", MLFLOW_PASSWORD)
    lines = []
    log_run(server_config(run_store, tmp_path, mlflow_server, "refused"), lines)
    assert lines == [f"tracking: mlflow logs this run to {mlflow_server} run {trackers_run_id(config)}"]


@pytest.mark.slow
def test_an_mlflow_server_gone_for_a_while_costs_no_step(run_store, tmp_path, mlflow_server, mlflow_login, monkeypatch):
    """The server is cut off after iteration 0 (a relay in front of it closes every connection and refuses new ones):
    logging iteration 1 fails, said in one line, and TensorBoard logs on. The server is back when the driver closes
    its trackers: MLflow catches up on iteration 1 first, so it holds every step. Client retries are off so the test
    waits for none (a driver's are MLflow's, docs/tracking.md)."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    lines: list[str] = []
    with HeldRelay(mlflow_server) as relay:
        config = server_config(run_store, tmp_path, relay.url, "cut-off", "tensorboard")
        trackers = tracking.Trackers.start(config, lines.append)
        trackers.log_iteration(0)
        relay.cut()
        trackers.log_iteration(1)
        assert read_mlflow(mlflow_server, "cut-off")[0].keys() == {0}  # iteration 1 missed, for now
        with HeldRelay(mlflow_server, port=relay.server_address[1]):  # the server reachable again
            trackers.close()
    failed, caught_up = [line for line in lines if "mlflow could not" in line or "mlflow logs again" in line]
    assert failed.startswith("tracking: mlflow could not log iteration 1, tries again at the next step: ")
    assert caught_up == "tracking: mlflow logs again; it caught up on step(s) 1" and "\n" not in failed
    check_logged(read_tensorboard(str(tmp_path / "tb"))[0], run_store)
    check_logged(read_mlflow(mlflow_server, "cut-off")[0], run_store)


class FlakyTracker:
    """A tracker whose `log` fails while `down` is set; what it logged, by step."""

    where = "nowhere"

    def __init__(self):
        self.down, self.logged = False, {}

    def log_config(self, config: dict, report: str) -> None:
        pass

    def log(self, step: int, numbers: dict[str, float]) -> None:
        if self.down:
            raise ConnectionError("the server is down")
        self.logged[step] = numbers

    def close(self) -> None:
        self.logged["closed"] = True


def flaky_trackers(monkeypatch) -> tuple[tracking.Trackers, FlakyTracker, list[str]]:
    """Trackers holding one `FlakyTracker`, each step's numbers {"step": n} (nothing read from a store)."""
    flaky, lines = FlakyTracker(), []
    monkeypatch.setattr(tracking.Trackers, "_read", lambda self, what, n, evaluation: {"step": float(n)})
    return tracking.Trackers(RunConfig(), {"flaky": flaky}, lines.append), flaky, lines


def test_a_tracker_catches_up_on_the_steps_it_missed_in_order(monkeypatch):
    trackers, flaky, lines = flaky_trackers(monkeypatch)
    trackers.log_iteration(0)
    flaky.down = True
    trackers.log_iteration(1)
    trackers.log_iteration(2)
    flaky.down = False
    trackers.log_iteration(3)
    assert list(flaky.logged) == [0, 1, 2, 3] and flaky.logged[2] == {"step": 2.0}
    assert lines[-1] == "tracking: flaky logs again; it caught up on step(s) 1, 2" and trackers.missed == {}


def test_a_tracker_failing_three_steps_in_a_row_is_left_out_and_the_control_is_not(monkeypatch):
    trackers, flaky, lines = flaky_trackers(monkeypatch)
    flaky.down = True
    for n in range(3):
        trackers.log_iteration(n)
    assert trackers.started == {} and lines[-1].startswith("tracking: flaky could not log step(s) 0, 1, 2 and is "
                                                           "left out: ConnectionError: the server is down")
    trackers.close()
    assert "closed" not in flaky.logged
    # The control: two failures, then the tracker answers again; it stays and holds every step.
    trackers, flaky, lines = flaky_trackers(monkeypatch)
    flaky.down = True
    trackers.log_iteration(0)
    trackers.log_iteration(1)
    flaky.down = False
    trackers.close()
    assert list(flaky.logged) == [0, 1, "closed"]
