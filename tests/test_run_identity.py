"""The names a run owns on the cluster, and the driver run as a pod of its own (`submit.py --detach`).

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q -n 0 tests/test_run_identity.py

Each run's Workflows, labels and update JobSets carry its id (`workflows.iteration.run_id`), unique per exact run
name; a Workflow of another run found under one of this run's names stops the driver with one sentence. The Argo
Server is `FakeArgoServer` (tests/test_workflows.py: a loopback double, since no Argo Server can run here),
which answers a create of an existing name as the real one does: HTTP 409 with grpc-gateway's error body.
"""

import os
import re
import time

import pytest
from pathlib import Path
import yaml
from hera.exceptions import AlreadyExists
from hera.workflows.models import WorkflowCreateRequest

from steps import manifest
from steps.settings import ConfigError
from workflows import jobset
from workflows.argo import ArgoClient
from workflows.driver import RETRY_UNLESS_STOPPED, TOKEN_FILE, driver_workflow
from workflows.driver import workflow_name as driver_name
from workflows.lint import semantic_problems
from workflows.evaluation import workflow_name as eval_workflow_name
from workflows.iteration import (ITERATION_LABEL, RUN_LABEL, RUN_NAME_ANNOTATION, iteration_workflow, run_id,
                                 update_labels, workflow_name)
from test_workflows import (GOLDEN, FakeArgoServer, cluster_config, drive, fake_argo, s3_store,  # noqa: F401
                            schema_errors, workflow_validator)

pytestmark = pytest.mark.filterwarnings("ignore::pydantic.PydanticDeprecatedSince20")
DRIVER_GOLDEN = GOLDEN / "driver.yaml"
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # a DNS-1123 label, and a valid label value
LONG_A, LONG_B = "sweep-" + "x" * 60 + "-lr1e-6", "sweep-" + "x" * 60 + "-lr3e-6"  # alike in their first 66


def old_run_label(run: str) -> str:
    """The run label before run ids: lower-cased and cut at 40 characters (the control)."""
    return re.sub(r"[^a-z0-9-]+", "-", run.lower()).strip("-")[:40].rstrip("-") or "run"


@pytest.mark.parametrize("a, b", [("exp_1", "EXP-1"), ("exp_1", "exp-1"), (LONG_A, LONG_B)])
def test_distinct_runs_get_distinct_names(a: str, b: str) -> None:
    """Two run names the old label folded together get two ids, so two sets of Workflow names and labels."""
    assert old_run_label(a) == old_run_label(b)  # the control: the old names collided
    assert run_id(a) != run_id(b)
    first, second = cluster_config(f"run={a}"), cluster_config(f"run={b}")
    assert workflow_name(first, 0) != workflow_name(second, 0)
    assert eval_workflow_name(first, 2) != eval_workflow_name(second, 2)
    assert update_labels(first, 0)[RUN_LABEL] != update_labels(second, 0)[RUN_LABEL]


def test_a_readable_name_is_its_own_id_and_no_other_name_takes_it() -> None:
    """A name that already is a readable id stays as it is; a name whose id would look like it cannot take it."""
    assert run_id("demo") == "demo" and workflow_name(cluster_config("run=demo"), 3) == "openforge-demo-it3"
    hashed = run_id("Demo")
    assert "--" in hashed and run_id(hashed) != hashed  # `--` is never kept as it is: it is rehashed


def test_every_name_fits_its_kubernetes_limit() -> None:
    """A 200-character run name: the Workflow names (with the resubmit's `-<5 random>`), the run label and the
    update JobSet's name fit 63 characters and are DNS-1123 labels; the old label's Workflow names did not fit the
    resubmit's suffix at the same iteration (the control)."""
    config = cluster_config("run=" + "R_" * 100)
    names = [workflow_name(config, 99_999), eval_workflow_name(config, 99_999)]
    for name in names:
        assert len(f"{name}-abcde") <= 63 and DNS_LABEL.fullmatch(name), name
        assert len(jobset.jobset_name(f"{name}-abcde")) <= 63
    assert len(run_id(config.run)) <= 63 and DNS_LABEL.fullmatch(run_id(config.run))
    assert len(f"openforge-{old_run_label(config.run)}-eval99999-abcde") > 63
    workflow = iteration_workflow(config, 0)
    assert workflow.labels[RUN_LABEL] == run_id(config.run)
    assert workflow.annotations[RUN_NAME_ANNOTATION] == config.run  # the exact name, kept


def test_the_clean_update_selector_is_the_runs_own() -> None:
    """Across nodes, `clean-update` deletes only JobSets labelled with this run's id and iteration: the selectors
    of `exp_1` and `EXP-1` differ (with the old label they were one, and would delete each other's JobSet)."""
    def selector(run: str) -> list[str]:
        workflow = iteration_workflow(cluster_config(f"run={run}", "update_nodes=2"), 1).to_dict()
        clean = next(t for t in workflow["spec"]["templates"] if t["name"] == "clean-update")
        return clean["resource"]["flags"]

    first, second = selector("exp_1"), selector("EXP-1")
    assert f"{RUN_LABEL}={run_id('exp_1')},{ITERATION_LABEL}=1" in first
    assert first != second
    workflow = iteration_workflow(cluster_config("run=exp_1", "update_nodes=2"), 1).to_dict()
    update = next(t for t in workflow["spec"]["templates"] if t["name"] == "update")
    labels = yaml.safe_load(update["resource"]["manifest"])["metadata"]["labels"]
    assert (labels[RUN_LABEL], labels[ITERATION_LABEL]) == (run_id("exp_1"), "1")  # what the selector matches


def test_a_workflow_of_another_run_is_refused(fake_argo: FakeArgoServer, s3_store: str, capsys) -> None:  # noqa: F811
    """A run whose first Workflow's name is taken by another run's stops with one sentence naming both; the
    other run's Workflow is left alone. The control: the same name taken by this run's own Workflow is followed."""
    mine = cluster_config("run=cl", "iterations=1", f"store={s3_store}", f"argo_server={fake_argo.url}")
    theirs = iteration_workflow(mine, 0).to_dict()
    theirs["metadata"]["annotations"][RUN_NAME_ANNOTATION] = "someone-else"
    fake_argo.workflows[workflow_name(mine, 0)] = theirs
    code = drive(fake_argo, s3_store, "--harness", "codex", "run=cl", "iterations=1")
    error, = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2
    assert f"workflow {workflow_name(mine, 0)} already exists" in error and "run 'someone-else'" in error
    assert fake_argo.workflows[workflow_name(mine, 0)] is theirs
    assert not fake_argo.calls("PUT")

    fake_argo.workflows[workflow_name(mine, 0)] = iteration_workflow(mine, 0).to_dict()  # this run's own
    assert drive(fake_argo, s3_store, "resume", "--run", "cl") == 0
    assert manifest.read_iterations(mine.run_url)[0].status == "Succeeded"


def test_the_fake_answers_a_taken_name_as_argo_does(fake_argo: FakeArgoServer) -> None:  # noqa: F811
    """The 409 the driver's check rests on: a create of an existing name is HTTP 409 with grpc-gateway's body
    (code 6, ALREADY_EXISTS), which Hera turns into AlreadyExists."""
    import requests

    body = {"namespace": "openforge", "workflow": {"metadata": {"name": "w"}, "spec": {}}}
    assert requests.post(f"{fake_argo.url}/api/v1/workflows/openforge", json=body, timeout=5).status_code == 200
    again = requests.post(f"{fake_argo.url}/api/v1/workflows/openforge", json=body, timeout=5)
    assert again.status_code == 409
    assert again.json() == {"error": 'workflows.argoproj.io "w" already exists', "code": 6,
                            "message": 'workflows.argoproj.io "w" already exists', "details": []}
    service = ArgoClient(fake_argo.url, "t", "openforge").service
    request = WorkflowCreateRequest(namespace="openforge", workflow=iteration_workflow(cluster_config("run=w"), 0).build())
    service.create_workflow(request)
    with pytest.raises(AlreadyExists, match="already exists"):
        service.create_workflow(request)



# ---- the driver in the cluster (--detach) ----

class DeletingArgoServer(FakeArgoServer):
    """`FakeArgoServer` with the Argo Server's delete route, `DELETE /api/v1/workflows/{ns}/{name}` (what
    Hera's `delete_workflow` calls): a detach replaces the run's ended driver Workflow."""

    def handle(self, method: str, path: str, body: dict | None) -> tuple[int, dict]:
        """Deletes a workflow; every other route as the base class."""
        parts = path.strip("/").split("/")
        if method == "DELETE" and len(parts) == 5:
            if self.workflows.pop(parts[4], None) is None:
                return 404, {"code": 5, "message": f"workflows.argoproj.io \"{parts[4]}\" not found"}
            self.script.pop(parts[4], None)
            return 200, {}
        return super().handle(method, path, body)

    def _handler(self):
        handler = super()._handler()
        handler.do_DELETE = handler._serve
        return handler


@pytest.fixture
def argo(fake_argo: FakeArgoServer) -> DeletingArgoServer:  # noqa: F811 - its environment (token, no cluster)
    """A fresh fake Argo Server that deletes too."""
    fake = DeletingArgoServer()
    yield fake
    fake.server.shutdown()


def test_detach_creates_only_the_driver(argo: DeletingArgoServer, s3_store: str, capsys) -> None:  # noqa: F811
    """`--detach` checks every Workflow (the driver's too), records the run's config in the store, creates exactly
    the driver Workflow and returns 0 at once; `status` then reads the run from the store."""
    started = time.monotonic()
    assert drive(argo, s3_store, "--harness", "codex", "run=dt", "iterations=2", "--detach") == 0
    assert time.monotonic() - started < 10
    config = cluster_config("run=dt", "iterations=2", f"store={s3_store}", f"argo_server={argo.url}",
                            f"s3_endpoint={os.environ['AWS_ENDPOINT_URL']}")
    linted = [body["workflow"]["metadata"]["name"] for _, path, body, _ in argo.calls("POST") if path.endswith("/lint")]
    created = [body["workflow"]["metadata"]["name"] for _, path, body, _ in argo.calls("POST")
               if not path.endswith("/lint")]
    assert linted == [workflow_name(config, 0), workflow_name(config, 1), driver_name(config)]
    assert created == [driver_name(config)] and list(argo.workflows) == created
    assert argo.workflows[driver_name(config)] == driver_workflow(config).build().model_dump(by_alias=True,
                                                                                            exclude_none=True)
    assert manifest.read_run_config(config.run_url)["iterations"] == 2
    assert f"{argo.url}/workflows/openforge/{driver_name(config)}" in capsys.readouterr().out
    assert drive(argo, s3_store, "status", "--run", "dt") == 0
    shown = capsys.readouterr().out
    assert "iteration 1: Pending" in shown
    assert f"driver: Pending    {driver_name(config)}  {argo.url}/workflows/openforge/{driver_name(config)}" in shown


def test_the_driver_resumes_the_run_in_the_cluster() -> None:
    """The driver's pod runs `resume` against the in-cluster server with the run's store, its service account's
    token file, the steps' S3 env; a deadline per attempt, retried unless the run stopped at a failed iteration."""
    config = cluster_config("run=Exp_1", "argo_server_in_cluster=https://argo.example:2746", "driver_deadline_s=600")
    workflow = driver_workflow(config).to_dict()
    spec, = workflow["spec"]["templates"]
    assert spec["container"]["command"] == ["python", "workflows/submit.py", "resume", "--run", "Exp_1",
                                            "--argo-server", "https://argo.example:2746", f"store={config.store}"]
    env = {e["name"]: e for e in spec["container"]["env"]}
    assert env["ARGO_TOKEN_FILE"]["value"] == TOKEN_FILE
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == config.s3_secret
    assert workflow["spec"]["serviceAccountName"] == config.service_account
    assert spec["activeDeadlineSeconds"] == 600 and spec["retryStrategy"]["expression"] == RETRY_UNLESS_STOPPED
    assert workflow["metadata"]["labels"]["openforge.dev/run"] == run_id("Exp_1")
    assert workflow["metadata"]["annotations"][RUN_NAME_ANNOTATION] == "Exp_1"
    assert len(driver_name(cluster_config("run=" + "R_" * 100))) <= 63


def test_the_driver_workflow_is_golden_and_valid(workflow_validator) -> None:  # noqa: F811
    """The driver's Workflow equals tests/golden/driver.yaml (OPENFORGE_UPDATE_GOLDEN=1 rewrites it), passes Argo's
    strict schema and the semantic lint; a misspelt key in it is caught (the control)."""
    workflow = driver_workflow(cluster_config("run=golden"))
    if os.environ.get("OPENFORGE_UPDATE_GOLDEN") == "1":
        DRIVER_GOLDEN.write_text(workflow.to_yaml())
    golden = yaml.safe_load(DRIVER_GOLDEN.read_text())
    assert workflow.to_dict() == golden
    assert schema_errors(workflow_validator, golden) == [] and semantic_problems(golden) == []
    golden["spec"]["templates"][0]["retryStrategy"]["expresion"] = "true"
    assert "expresion" in "\n".join(schema_errors(workflow_validator, golden))


def test_a_second_detach_is_refused_while_the_driver_runs(argo: DeletingArgoServer, s3_store: str, capsys) -> None:
    """`resume --detach` while the run's driver Workflow runs is one sentence naming it, and creates nothing. The
    control: once that driver has ended, `resume --detach` replaces it with a new one."""
    assert drive(argo, s3_store, "--harness", "codex", "run=dd", "iterations=1", "--detach") == 0
    config = cluster_config("run=dd", f"store={s3_store}")
    argo.script[driver_name(config)] = ["Running"]
    capsys.readouterr()
    assert drive(argo, s3_store, "resume", "--run", "dd", "--detach") == 2
    error, = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert f"already has a driver running in the cluster (workflow {driver_name(config)}, Running)" in error
    assert drive(argo, s3_store, "--harness", "codex", "run=dd", "iterations=1", "--detach") == 2  # start again
    assert "already exists" in capsys.readouterr().err
    assert len([c for c in argo.calls("POST") if not c[1].endswith("/lint")]) == 1 and not argo.calls("DELETE")

    argo.script[driver_name(config)] = ["Succeeded"]
    assert drive(argo, s3_store, "resume", "--run", "dd", "--detach") == 0
    assert len(argo.calls("DELETE")) == 1 and len([c for c in argo.calls("POST") if not c[1].endswith("/lint")]) == 2
    assert driver_name(config) in argo.workflows


def test_detach_needs_an_argo_server(s3_store: str, capsys) -> None:  # noqa: F811
    """Without an Argo server there is no cluster to detach into: one sentence, exit 2, nothing recorded."""
    from workflows import submit

    assert submit.main(["--harness", "codex", "run=nd", f"store={s3_store}", "--detach"]) == 2
    assert "--detach runs the driver in the cluster" in capsys.readouterr().err
    assert manifest.read_run_config(f"{s3_store}/nd") is None


def test_the_token_file_is_read_on_every_request(argo: DeletingArgoServer, tmp_path) -> None:
    """In the driver's pod the Argo token is the service account's file, which the kubelet rewrites: each request
    sends the file's token of that moment (a token read once would expire with the pod still running)."""
    token = tmp_path / "token"
    token.write_text("first\n")
    client = ArgoClient(argo.url, None, "openforge", token_file=str(token))
    assert client.phase_if_any("none") is None
    token.write_text("second")
    assert client.phase_if_any("none") is None
    assert [auth for *_, auth in argo.requests] == ["Bearer first", "Bearer second"]


def test_the_driver_keys_are_checked() -> None:
    """`argo_server_in_cluster` must be an http(s) URL and `driver_deadline_s` at least 1, each refused with one
    sentence naming the key; the control: good values load."""
    from workflows.config import ConfigError

    with pytest.raises(ConfigError, match=r"^config key 'argo_server_in_cluster' must be an http:// or https:// URL"):
        cluster_config("argo_server_in_cluster=argo-server.argo:2746")
    with pytest.raises(ConfigError, match=r"^config key 'driver_deadline_s' must be at least 1, got 0$"):
        cluster_config("driver_deadline_s=0")
    config = cluster_config("argo_server_in_cluster=http://argo-server.argo:2746", "driver_deadline_s=1")
    assert (config.argo_server_in_cluster, config.driver_deadline_s) == ("http://argo-server.argo:2746", 1)


def test_the_driver_trusts_the_in_cluster_server_by_the_mounted_ca(tmp_path: Path) -> None:
    """Argo's server has a self-signed certificate unless given one, which no system CA signed: with `argo_ca_secret`
    the driver's pod mounts that Secret's ca.crt and its `resume` checks the server against it; with
    `argo_insecure_tls` it passes that on; with neither it trusts the system's CAs. Each command's overrides are
    read back as the pod's `submit.py` reads them (the mounted file is made here). Control: no Secret, no mount."""
    mounted = driver_workflow(cluster_config("run=ca", "argo_ca_secret=argo-server-ca")).to_dict()
    spec, = mounted["spec"]["templates"]
    assert spec["volumes"] == [{"name": "argo-ca", "secret": {"secretName": "argo-server-ca",
                                                              "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]
    assert spec["container"]["volumeMounts"] == [{"name": "argo-ca", "mountPath": "/etc/openforge/argo-ca"}]
    override = spec["container"]["command"][-1]
    assert override == "argo_ca_bundle=/etc/openforge/argo-ca/ca.crt"
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    assert cluster_config(f"argo_ca_bundle={ca}").argo_ca_bundle == str(ca)  # the pod's own load accepts it
    insecure, = driver_workflow(cluster_config("run=ca", "argo_insecure_tls=true")).to_dict()["spec"]["templates"]
    assert insecure["container"]["command"][-1] == "argo_insecure_tls=true" and "volumes" not in insecure
    plain, = driver_workflow(cluster_config("run=ca")).to_dict()["spec"]["templates"]
    assert plain["container"]["command"][-1].startswith("store=") and "volumes" not in plain
    with pytest.raises(ConfigError, match="argo_ca_secret"):
        cluster_config("argo_ca_secret=Not_A_Name")
