"""The names a run owns on the cluster, and the driver run as a pod of its own (`submit.py --detach`).

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q -n 0 tests/test_run_identity.py

Each run's Workflows, labels and update JobSets carry its id (`workflows.iteration.run_id`), unique per exact run
name; a Workflow of another run found under one of this run's names stops the driver with one sentence. The Argo
Server is `FakeArgoServer` (tests/test_workflows.py: a loopback double, since no Argo Server can run here),
which answers a create of an existing name as the real one does: HTTP 409 with grpc-gateway's error body.
"""

import re

import pytest

from steps import manifest
from workflows import jobset
from workflows.evaluation import workflow_name as eval_workflow_name
from workflows.iteration import (ITERATION_LABEL, RUN_LABEL, RUN_NAME_ANNOTATION, iteration_workflow, run_id,
                                 update_labels, workflow_name)
from test_workflows import FakeArgoServer, cluster_config, drive, fake_argo, s3_store  # noqa: F401 - fixtures

pytestmark = pytest.mark.filterwarnings("ignore::pydantic.PydanticDeprecatedSince20")
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
    assert again.status_code == 409 and again.json()["code"] == 6 and "already exists" in again.json()["message"]

