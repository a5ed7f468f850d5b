"""A task's app in pod mode: the rollout pod's sidecar (the rendered Workflow), the plan that routes app tasks to
that pod, and the runner's side in `steps.sandbox.pod` (waiting for the sidecar, keeping the state the verifier
grades when the agent's command ends).

Why no pod: this machine has no Kubernetes (nor can it install one), so the Workflow is checked as the
YAML Argo would get, and the runner's side runs on folders of the test's tmp dir standing in for the volume
mounts (`APP_LIVE`, `APP_STATE_DIR`), with a real subprocess as the agent's command.
"""

import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

import steps.sandbox.pod as pod
from steps import plan
from steps.sandbox import SandboxError
from steps.sandbox.app import APP_STATE_DIR, APP_STATE_KEPT, READY_FILE
from steps.tasks import load_task
from workflows.config import load_config
from workflows.iteration import APP_ROLLOUTS, iteration_workflow, rollout_pod_patch, rollout_resources

REPO = Path(__file__).resolve().parents[1]
GUI = REPO / "steps" / "tasks" / "gui"
SIGNUP = GUI / "gui-signup-form"


def gui_config(*overrides: str):
    """The run config of a browser-use run on the GUI tasks, on Argo."""
    return load_config(REPO / "configs" / "cluster-example.yaml",
                       ["run=gui", "harness=browser-use", "dataset=steps/tasks/gui", *overrides])


def gui_spec(*overrides: str) -> dict:
    """The iteration-0 Workflow spec of a browser-use run on the GUI tasks, on Argo."""
    return iteration_workflow(gui_config(*overrides), 0).to_dict()["spec"]


def template(spec: dict, name: str) -> dict:
    return next(t for t in spec["templates"] if t["name"] == name)


def mounts(container: dict) -> dict[str, dict]:
    """A container's volume mounts by volume name."""
    return {m["name"]: m for m in container.get("volumeMounts", [])}


# ---- the Workflow ----

def test_config_load_accepts_a_gui_harness_on_argo():
    config = load_config(REPO / "configs" / "cluster-example.yaml", ["run=gui", "harness=computer-use"])
    assert config.argo_server and config.harness == "computer-use"


def test_an_app_rollout_pod_runs_the_app_as_a_sidecar_whose_state_the_agent_cannot_reach():
    """rollout-app: the sidecar is the task's image running `bash -c APP`; the state volume is the sidecar's to
    write at APP_STATE_DIR, the rollout container's read-only at APP_LIVE, and made 0700 (root's) by an init
    container before either starts, so the agent uid in the rollout container can neither read nor write it."""
    spec = gui_spec()
    app = template(spec, "rollout-app")
    (sidecar,) = app["sidecars"]
    assert sidecar["image"] == app["container"]["image"] == "{{inputs.parameters.image}}"
    assert sidecar["command"] == ["bash", "-c", "{{inputs.parameters.app}}"]
    assert "env" not in sidecar and "openforge" not in mounts(sidecar)  # no key, no OpenForge, no verifier
    assert mounts(sidecar)["app-state"] == {"name": "app-state", "mountPath": APP_STATE_DIR}
    main = mounts(app["container"])
    assert main["app-state"] == {"name": "app-state", "mountPath": str(pod.APP_LIVE), "readOnly": True}
    assert mounts(sidecar)["app-shm"]["mountPath"] == main["shm"]["mountPath"] == "/dev/shm"  # one each
    closing = next(c for c in app["initContainers"] if "app-state" in mounts(c))
    assert closing["command"] == ["sh", "-c", f"chmod 700 {mounts(closing)['app-state']['mountPath']}"]
    assert [c["name"] for c in app["initContainers"]][-1] == closing["name"]  # after the copies, before the app
    assert "shareProcessNamespace" not in app and app["automountServiceAccountToken"] is False
    assert "app" in {p["name"] for p in app["inputs"]["parameters"]}
    # Everything else is the plain rollout template's, but for the ephemeral storage, which has room for the state
    # volume (tests/test_workflows.py models both pods' resources).
    plain = template(spec, "rollout")
    assert "sidecars" not in plain and {v["name"] for v in plain["volumes"]} == {"openforge"}
    config = gui_config()
    assert app["podSpecPatch"] == rollout_pod_patch(config, app=True) != plain["podSpecPatch"]
    assert app["container"]["resources"] == rollout_resources(config, app=True, task=False)
    same = {k: v for k, v in app.items() if k not in ("name", "sidecars", "volumes", "initContainers", "inputs",
                                                      "container", "podSpecPatch")}
    assert same == {k: v for k, v in plain.items() if k not in ("name", "volumes", "initContainers", "inputs",
                                                                "container", "podSpecPatch")}
    assert {k: v for k, v in app["container"].items() if k not in ("volumeMounts", "resources")} == \
        {k: v for k, v in plain["container"].items() if k not in ("volumeMounts", "resources")}


def test_a_gui_harness_comes_into_the_pod_as_a_shell_harness_does():
    """browser-use: its virtualenv copied from the harness image (no Node); computer-use: OpenForge's Python (no
    copy). Control: an npm harness copies its Node too."""
    def copy(harness: str) -> list[str]:
        config = load_config(REPO / "configs" / "cluster-example.yaml", ["run=gui", f"harness={harness}"])
        inits = template(iteration_workflow(config, 0).to_dict()["spec"], "rollout")["initContainers"]
        return [c["command"][-1] for c in inits if c["name"] == "harness"]

    (browser_use,) = copy("browser-use")
    assert "/opt/openforge/harnesses/browser-use-0.13.14 " in browser_use and "node-" not in browser_use
    assert copy("computer-use") == []
    assert "node-" in copy("codex")[0]


def test_app_rollouts_fan_out_from_the_plans_own_output_and_both_feed_the_tables():
    spec = gui_spec("eval_every=1")
    assert template(spec, "plan")["outputs"]["parameters"][0]["name"] == APP_ROLLOUTS
    tasks = {t["name"]: t for t in template(spec, "collect")["dag"]["tasks"]}
    for prefix in ("", "eval-"):
        fanout = tasks[f"{prefix}rollout-app"]
        assert fanout["withParam"] == f"{{{{tasks.{prefix}plan.outputs.parameters.{APP_ROLLOUTS}}}}}"
        assert fanout["template"] == f"{prefix}rollout-app-chunk"  # one chunk of the app rollouts each
        chunk = {t["name"]: t for t in template(spec, f"{prefix}rollout-app-chunk")["dag"]["tasks"]}
        assert {"name": "app", "value": "{{item.app}}"} in chunk[f"{prefix}rollout-app"]["arguments"]["parameters"]
        assert chunk["items"]["arguments"]["parameters"][0]["value"].split("/")[-1] == \
            "app-rollouts-{{inputs.parameters.chunk}}.json"
        assert fanout["depends"] == tasks[f"{prefix}rollout"]["depends"]
        assert f"{prefix}rollout-app.AnySucceeded" in tasks[f"{prefix}trajectories"]["depends"]
    # An empty fan-out is Skipped by Argo: the evaluation waits for both either way.
    assert "eval-rollout-app.Skipped" in tasks["evaluate"]["depends"]


def test_the_plan_routes_app_tasks_to_its_app_rollouts_file(tmp_path, capsys):
    """GUI tasks go to the file with their app command; shell tasks stay on stdout. Control: without the flag
    (the local runner) stdout holds every rollout."""
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for task in (SIGNUP, REPO / "steps" / "tasks" / "builtin" / "hello-file"):
        (mixed / task.name).symlink_to(task)
    args = ["--dataset", str(mixed), "--iteration", "0", "--tasks-per-iteration", "2", "--samples-per-task", "2"]
    assert plan.main([*args, "--app-rollouts", str(tmp_path / "app.json")]) == 0
    shell, with_app = json.loads(capsys.readouterr().out), json.loads((tmp_path / "app.json").read_text())
    assert [r["rollout_id"] for r in shell] == ["it0-hello-file-s0", "it0-hello-file-s1"]
    assert all(r["app"] is None for r in shell)
    assert {r["app"] for r in with_app} == {load_task(SIGNUP).config.app} and len(with_app) == 2
    assert plan.main(args) == 0
    assert len(json.loads(capsys.readouterr().out)) == 4


# ---- the runner's side (steps.sandbox.pod) ----

@pytest.fixture
def volumes(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """(live, graded): the sidecar's state as the rollout container mounts it, and where the verifier reads it."""
    live, graded = tmp_path / "live", tmp_path / "graded" / "var" / "lib" / "openforge" / "app"
    live.mkdir(mode=0o700)
    monkeypatch.setattr(pod, "APP_LIVE", live)
    monkeypatch.setattr(pod, "APP_STATE", graded)
    return live, graded


def test_a_sidecar_that_never_gets_ready_is_an_infrastructure_failure(tmp_path, volumes, monkeypatch):
    """No ready file within the timeout: SandboxError (the rollout's infra_error, retried, never a 0), naming the
    sidecar. Control: a ready file that appears while the runner waits is found."""
    live, _ = volumes
    monkeypatch.setattr(pod, "APP_START_TIMEOUT_S", 0.3)
    with pytest.raises(SandboxError, match="app was not ready within 0.3 s: .* sidecar container `app`"):
        pod.PodSandbox.create(tmp_path / "out", load_task(SIGNUP))
    threading.Timer(0.3, (live / READY_FILE).touch).start()
    started = time.monotonic()
    pod.wait_for_app(live, 10)
    assert 0.2 < time.monotonic() - started < 5


def test_an_app_state_the_agent_uid_could_read_is_refused_before_the_agent_runs(tmp_path, monkeypatch):
    """The init container's chmod 700 missing (the volume left 0777, on a path the agent uid can walk): refused as
    an infra error naming the state, before anything of the agent runs or the pod is touched. Control: the same
    folder at 0700 is hidden from the agent uid."""
    reachable = Path(tempfile.mkdtemp(prefix="openforge-test-live-", dir="/tmp"))  # pytest's tmp is root-only
    try:
        reachable.chmod(0o755)
        live = reachable / "live"
        live.mkdir(mode=0o777)
        live.chmod(0o777)
        (live / READY_FILE).touch()
        monkeypatch.setattr(pod, "APP_LIVE", live)
        task_root = tmp_path / "private"  # root-only, as the init container keeps the tasks
        shutil.copytree(SIGNUP, task_root / SIGNUP.name)
        real_mkdir = Path.mkdir

        def only_in_tmp(self, *args, **kwargs):  # a refusal that did not happen must not reach the host's /logs
            assert str(self).startswith(str(tmp_path)), f"create went past the check: mkdir {self}"
            return real_mkdir(self, *args, **kwargs)

        monkeypatch.setattr(Path, "mkdir", only_in_tmp)
        with pytest.raises(SandboxError, match=f"the app's state {live} is reachable by the agent uid"):
            pod.PodSandbox.create(tmp_path / "out", load_task(task_root / SIGNUP.name))
        monkeypatch.undo()
        assert not pod.hidden_from(live, pod.AGENT_UID)
        live.chmod(0o700)
        assert pod.hidden_from(live, pod.AGENT_UID)
    finally:
        shutil.rmtree(reachable)


def agent_box(tmp_path: Path, live: Path) -> pod.PodSandbox:
    """A pod sandbox over the tmp dir: the workspace and out folder there, the app's state at `live`."""
    (tmp_path / "work").mkdir()
    return pod.PodSandbox(root=tmp_path / "out", workdir=str(tmp_path / "work"), agent_uid=None, app_live=live)


def test_the_verifier_grades_the_state_as_it_was_when_the_agents_command_ended(tmp_path, volumes):
    """The agent's command leaves a process behind (its own session, which the command's end does not reach)
    that rewrites the live state a moment later, and had planted a state where the verifier reads: the verifier
    still finds the state of the moment the command ended. Control: the live state did change."""
    live, graded = volumes
    (tmp_path / "out").mkdir(mode=0o700)
    (live / "state.json").write_text('{"signups": []}')
    box = agent_box(tmp_path, live)
    graded.parent.mkdir(parents=True)
    graded.mkdir()
    (graded / "state.json").write_text('{"signups": ["planted"]}')
    later = f"setsid sh -c 'sleep 0.5; echo forged > {live}/state.json' </dev/null >/dev/null 2>&1 &"
    done = box.run(["bash", "-c", f"echo '{{\"signups\": [\"ada\"]}}' > {live}/state.json; {later}"], timeout_s=30,
                   as_agent=True)
    assert done.exit_code == 0
    assert (tmp_path / "out" / APP_STATE_KEPT / "state.json").read_text().strip() == '{"signups": ["ada"]}'
    time.sleep(1)  # the left-behind process's write, if the runner let it live; the state changes after in any case
    (live / "state.json").write_text("forged")  # the control: the live state is not what the agent left
    assert box.for_verifier(load_task(SIGNUP)) is box
    assert sorted(p.name for p in graded.iterdir()) == ["state.json"]
    assert (graded / "state.json").read_text().strip() == '{"signups": ["ada"]}'


def test_without_an_agent_run_the_verifier_finds_an_empty_state(tmp_path, volumes):
    live, graded = volumes
    (live / "state.json").write_text("{}")
    box = agent_box(tmp_path, live)
    (tmp_path / "out").mkdir()
    box.for_verifier(load_task(SIGNUP))
    assert graded.is_dir() and list(graded.iterdir()) == []
