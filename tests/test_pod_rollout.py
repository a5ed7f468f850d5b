"""Rollouts in pod mode (`steps.rollout --isolation pod`): the real runner, harness, proxy and verifier
inside a stand-in for the Kubernetes rollout pod, driven by the scripted model of test_rollout.py.

Why the pod is simulated: this machine (and CI) has no container engine and no Kubernetes (neither can be
installed from the package registries it reaches), but the tests run as root. So each test builds the pod itself:
`unshare --mount --pid --fork` gives a private mount table and PID namespace, a tmpfs becomes the pod's
`/`, filled with the task's image as OpenForge's own builder lays it out (`LocalSandbox.create`: WORKDIR,
COPY...), the host's /usr and /etc bound read-only (the image's system; its apt archives too, gigabytes
not worth copying per test), a fresh /proc, and the emptyDir /openforge laid out by the init container's
own script (`workflows.iteration.app_layout`) from a copy of the repository, with Python and the harness
cache bound where the init containers copy them. Then
`chroot` into it and run the exact command and environment of the workflow's rollout template, from the
image's WORKDIR, as root, with a fake secret in the runner's environment. Only the test's tmp folder is
written on the host; the network is the host's, so the harness reaches the proxy on 127.0.0.1. A GUI task's pod
also runs its app as the sidecar does, on a loopback of the pod's own (`run_in_pod(with_app=True)`).
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path

import pytest

from steps.datasets import folder_name
from steps.harnesses import cache_root
from steps.sandbox.pod import AGENT_UID
from steps.sandbox import LocalSandbox
from steps.tasks import BUILTIN_DATASET, load_task
from test_harnesses import installed_exe
from steps.sandbox.app import APP_STATE_KEPT
from test_gui_tasks import FORGED_SIGNUP, SIGNUP
from test_rollout import ADMIN_KEY, oracle, tool_outputs
from workflows.config import load_config
from workflows.iteration import app_layout, iteration_workflow

pytestmark = pytest.mark.slow  # each test builds a simulated pod and runs a rollout in it: 2-7 s apiece
REPO = Path(__file__).resolve().parents[1]
SECRET = f"fake-secret-{uuid.uuid4().hex}"  # what the runner holds and the agent must never see
POD_SCRIPT = r"""
set -e
mount -t tmpfs -o mode=0755 pod "$ROOT"
cd "$ROOT"
# The image's files but its /usr and /etc, which are the host's, bound below, and its apt archive (on a host
# that keeps one, gigabytes of .debs), bound read-only: copying those was most of each test's time.
tar -C "$IMAGE" --anchored --exclude=./usr --exclude=./etc --exclude=./var/cache/apt/archives -c . | tar -x
mkdir -p usr etc dev proc opt/openforge tmp/rollout openforge && chmod 777 openforge  # an emptyDir is world-writable
for system in usr etc; do mount --bind "$SYSTEM/$system" "$system"; mount -o remount,bind,ro "$system"; done
if [ -d "$IMAGE/var/cache/apt/archives" ]; then
  mkdir -p var/cache/apt/archives
  mount --bind "$IMAGE/var/cache/apt/archives" var/cache/apt/archives
  mount -o remount,bind,ro var/cache/apt/archives
fi
mount --rbind /dev dev
mount -t proc proc proc
cp -a "$APP" opt/openforge/app
mount --bind "$OUT" tmp/rollout
chroot . /bin/sh -c "$LAYOUT"
# What the `task` init container fetches from the proxy (steps.datasets, tested in test_datasets.py) into the root-only
# folder: here copied from the host.
mkdir -p openforge/private/tasks && cp -a "$TASK_DIR" "openforge/private/tasks/$TASK_FOLDER"
rm -rf opt/openforge  # the steps image's files are not in the task's image
for open in $WORLD_WRITABLE; do  # what the image would leave open to everyone: a tmpfs where /usr, /etc are bound
  case "$open" in
    /) chmod 777 . ;;
    /usr/*|/etc/*) mount -t tmpfs -o mode=0777 open ".$open" ;;
    *) mkdir -p ".$open" && chmod 777 ".$open" ;;
  esac
done
mkdir openforge/python openforge/harnesses
mount --bind "$PYTHON" openforge/python
mount --bind "$SITE" "openforge/python/$SITE_IN_PYTHON"
mount --bind "$HARNESSES" openforge/harnesses
for bound in openforge/python "openforge/python/$SITE_IN_PYTHON" openforge/harnesses; do
  mount -o remount,bind,ro "$bound"
done
if [ -n "$APP_CMD" ]; then  # the app sidecar: the same image in a mount namespace of its own, its state volume its own
  ip link set lo up  # the pod's loopback, which the two share
  mkdir -p var/lib/openforge/app var/lib/openforge/app-live
  mount --bind "$APP_STATE" var/lib/openforge/app-live
  mount -o remount,bind,ro var/lib/openforge/app-live
  unshare --mount --propagation private sh -c 'mount --bind "$0" var/lib/openforge/app && exec chroot . bash -c "$1"' \
    "$APP_STATE" "$APP_CMD" >"$APP_LOG" 2>&1 </dev/null &
fi
user=""
if [ -n "$RUNNER_UID" ]; then  # a runner that is not root owns what it must write (/ for /tests) and read
  chown "$RUNNER_UID:$RUNNER_UID" .
  chown -R "$RUNNER_UID:$RUNNER_UID" openforge/private tmp/rollout logs ".$WORKDIR"
  user="--userspec=$RUNNER_UID:$RUNNER_UID"
fi
chroot $user . /bin/sh -c 'cd "$0" && exec "$@"' "$WORKDIR" "$@"
"""


def copy_repository(target: Path) -> None:
    """What images/steps.Dockerfile copies to /opt/openforge/app."""
    ignore = shutil.ignore_patterns("__pycache__")
    for name in ("steps", "workflows", "configs"):
        shutil.copytree(REPO / name, target / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, target / name)


def rollout_pod(config, values: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The rollout template's command and plain environment, with Argo's input parameters filled in, as on the
    first try (`{{retries}}` 0)."""
    template = next(t for t in iteration_workflow(config, 0).to_dict()["spec"]["templates"] if t["name"] == "rollout")
    argv = []
    for arg in template["container"]["command"]:
        for name, value in values.items():
            arg = arg.replace(f"{{{{inputs.parameters.{name}}}}}", value)
        argv.append(arg.replace("{{retries}}", "0"))
    assert not any("{{" in arg for arg in argv), f"an Argo variable was not filled in: {argv}"
    return argv, {e["name"]: e["value"] for e in template["container"]["env"] if "value" in e}


def run_in_pod(proxy, task_dir: Path, harness: str, tmp_path: Path, extra_args: tuple[str, ...] = (),
               patch_app=None, runner_uid: int | None = None, world_writable: tuple[str, ...] = (),
               driver: str | None = None, with_app: bool = False,
               image_env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, dict, str]:
    """One rollout in a fresh simulated pod (see the module docstring); returns the process, result.json, rollout id.

    `world_writable`: pod paths the image leaves mode 0777. `driver`: Python run (`python -P -c`, with the task
    folder and `extra_args` as arguments) instead of the rollout template's command; it writes result.json.
    `with_app`: the task's app runs as the `rollout-app` pod's sidecar does (its own mount namespace, its state
    volume root-only, read-only at APP_LIVE in the pod), on a loopback of the pod's own (no proxy then), and with
    the image's own /usr and /etc (the task's Playwright is there)."""
    task = load_task(task_dir)
    image = LocalSandbox.create(tmp_path / "image", task)  # the task's image, as the builder lays it out
    app = tmp_path / "app"
    copy_repository(app)
    relative = (task_dir.relative_to(REPO) if task_dir.is_relative_to(REPO) else Path("extra") / task_dir.name)
    if not (app / relative).exists():
        shutil.copytree(task_dir, app / relative)
    if patch_app:
        patch_app(app)
    out, root = tmp_path / "out", tmp_path / "pod"
    out.mkdir()
    root.mkdir()
    rollout_id = f"pod-{harness}-{task.name}-{uuid.uuid4().hex[:6]}"
    config = load_config(REPO / "configs" / "cluster-example.yaml", ["run=pod", f"harness={harness}", "model_name=tiny"])
    argv, env = rollout_pod(config, {"task": folder_name(task.name), "rollout_id": rollout_id, "sample": "0",
                                     "proxy_url": proxy.url if proxy else "http://127.0.0.1:9"})
    if driver is not None:
        argv = [argv[0], "-P", "-c", driver, argv[argv.index("--task") + 1]]
    env |= {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
            "OPENFORGE_ADMIN_KEY": ADMIN_KEY, "OPENFORGE_TEST_SECRET": SECRET, "KUBERNETES_SERVICE_HOST": "10.96.0.1",
            **(image_env or {})}  # `image_env`: what the task image's ENV puts in the container's environment
    python_version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    setup = {"ROOT": str(root), "IMAGE": str(image.fs), "APP": str(app), "OUT": str(out), "LAYOUT": app_layout(),
             "PYTHON": sys.base_prefix, "SITE": sysconfig.get_path("purelib"),
             "SITE_IN_PYTHON": f"lib/{python_version}/site-packages", "HARNESSES": str(cache_root()),
             "WORKDIR": image.workdir, "PATH": os.environ["PATH"], "RUNNER_UID": str(runner_uid or ""),
             "WORLD_WRITABLE": " ".join(world_writable), "SYSTEM": "", "APP_CMD": "",
             "TASK_DIR": str(app / relative), "TASK_FOLDER": folder_name(task.name)}
    if with_app:
        (tmp_path / "app-state").mkdir(mode=0o700)  # as the init container leaves the volume
        setup |= {"SYSTEM": str(image.fs), "APP_CMD": task.config.app, "APP_STATE": str(tmp_path / "app-state"),
                  "APP_LOG": str(tmp_path / "app.log")}
    command = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv, *extra_args]
    done = subprocess.run(["unshare", "--mount", "--pid", "--fork", "--propagation", "private",
                           *(["--net"] if with_app else []), "sh", "-c", POD_SCRIPT, "pod", *command], env=setup,
                          capture_output=True, text=True, timeout=300)
    result_path = out / "result.json"
    assert result_path.exists(), f"no result.json; exit code {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done, json.loads(result_path.read_text()), rollout_id


@pytest.fixture(autouse=True)
def needs_root_and_unshare():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("the simulated pod needs root and util-linux unshare")


@pytest.mark.parametrize("harness, task_name", [("direct", "csv-stats"),
                                               pytest.param("codex", "hello-file", marks=pytest.mark.harness)])
def test_the_oracle_in_the_pod_earns_reward_1(harness, task_name, scripted, scripted_proxy, tmp_path):
    """The image's files (csv-stats COPYs its data), the harness from the init containers, grading as root."""
    if harness != "direct":
        installed_exe(harness)  # skips when the harness is not installed
    scripted.set_commands([oracle(task_name)])
    done, result, rollout_id = run_in_pod(scripted_proxy, BUILTIN_DATASET / task_name, harness, tmp_path)
    assert done.returncode == 0 and (result["status"], result["reward"]) == ("ok", 1.0), (result, done.stderr[-2000:])
    assert result["num_calls"] == len(scripted_proxy.calls(rollout_id)) >= 2
    assert any(note.startswith("pod mode") for note in result["notes"])
    assert not any("NOT uid-isolated" in note for note in result["notes"])


SNOOP = """R=$(cut -d' ' -f4 /proc/$PPID/stat); echo "runner=$R: $(tr '\\0' ' ' < /proc/$R/cmdline)"
cat /proc/$R/environ; echo "environ exit $?"
ls /openforge/private; cat /openforge/private/app/steps/tasks/builtin/hello-file/tests/test.sh
echo "secret copies: $(cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c fake-secret)"
echo "task files found: $(find / -xdev \\( -name test.sh -o -name solve.sh -o -name task.toml \\) 2>/dev/null | wc -l)"
echo "verify.py found: $(find / -xdev -name verify.py 2>/dev/null)"
"""


def test_the_agent_cannot_read_the_verifier_or_the_runners_environment(scripted, scripted_proxy, tmp_path):
    """The verifier sits root-only in /openforge/private until grading; the runner's environ is root's."""
    scripted.set_commands([SNOOP, oracle("hello-file")])
    done, result, rollout_id = run_in_pod(scripted_proxy, BUILTIN_DATASET / "hello-file", "direct", tmp_path)
    output = tool_outputs(scripted_proxy.calls(rollout_id))[0].replace("\\n", "\n")
    assert "steps.rollout" in output.split("runner=")[1].splitlines()[0], output  # the pid read is the runner's
    assert "environ exit 1" in output and output.count("Permission denied") >= 3, output
    assert SECRET not in output and ADMIN_KEY not in output and "echo 1 > /logs/verifier/reward.txt" not in output
    assert "secret copies: 0" in output and "task files found: 0" in output, output
    assert "verify.py found: /openforge/app/steps/grading/verify.py\n" in output, output  # the search did run there
    assert done.returncode == 0 and (result["status"], result["reward"]) == ("ok", 1.0), result


def test_the_images_env_reaches_the_agent_in_the_pod_and_the_runners_does_not(scripted, scripted_proxy, tmp_path):
    """As in Docker, the image's ENV is the agent's environment (and the verifier's); what the template, Kubernetes
    and Argo add for the runner is not (the control: each of those is in the container's environment)."""
    scripted.set_commands(['echo "greeting=$IMAGE_GREETING path=$PATH secret=${OPENFORGE_TEST_SECRET:-none} '
                           'k8s=${KUBERNETES_SERVICE_HOST:-none} safe=${PYTHONSAFEPATH:-none}"', oracle("hello-file")])
    path = "/opt/image-tools/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    done, result, rollout_id = run_in_pod(scripted_proxy, BUILTIN_DATASET / "hello-file", "direct", tmp_path,
                                          image_env={"IMAGE_GREETING": "from-the-image", "PATH": path})
    output = tool_outputs(scripted_proxy.calls(rollout_id))[0]
    assert "greeting=from-the-image" in output and "/opt/image-tools/bin:" in output, output
    assert "secret=none k8s=none safe=none" in output, output
    assert (result["status"], result["reward"]) == ("ok", 1.0), result


def test_the_agent_runs_as_an_unprivileged_uid(scripted, scripted_proxy, tmp_path):
    """`id -u` in the agent's shell says AGENT_UID; it owns the workspace, not OpenForge's files or /root."""
    scripted.set_commands(["id -u; touch /app/mine && stat -c 'owner %u' /app/mine; touch /openforge/app/x; ls /root"])
    done, result, rollout_id = run_in_pod(scripted_proxy, BUILTIN_DATASET / "hello-file", "direct", tmp_path)
    output = tool_outputs(scripted_proxy.calls(rollout_id))[0]
    assert output.startswith(json.dumps(f"exit code: 2\n{AGENT_UID}\nowner {AGENT_UID}\n")[:-1]), output
    assert "/openforge/app/x': Permission denied" in output and "'/root': Permission denied" in output, output
    assert done.returncode == 0 and (result["status"], result["reward"]) == ("ok", 0.0), result


FORGE_OUTPUTS = """echo ok > /tmp/rollout/status; echo 1 > /tmp/rollout/reward; echo 1 > /tmp/rollout/result.json
mv /tmp/rollout /tmp/gone; ls /tmp/rollout; echo "forged: $(cat /tmp/rollout/reward 2>&1)"
"""


def test_the_agent_cannot_set_the_outputs_argo_shows(scripted, scripted_proxy, tmp_path):
    """The rollout node's `status` and `reward` (files in OUT, /tmp/rollout) are the runner's: the agent can
    neither write nor replace them, and they hold the result's values, not the agent's 1."""
    scripted.set_commands([FORGE_OUTPUTS])
    done, result, rollout_id = run_in_pod(scripted_proxy, BUILTIN_DATASET / "hello-file", "direct", tmp_path)
    output = tool_outputs(scripted_proxy.calls(rollout_id))[0]
    assert output.count("Permission denied") >= 5, output  # three writes, the move, the listing
    assert done.returncode == 0 and (result["status"], result["reward"]) == ("ok", 0.0), result
    out = tmp_path / "out"
    assert ((out / "status").read_text(), (out / "reward").read_text()) == ("ok", "0")


def test_a_crashing_harness_in_the_pod_is_an_infra_error_with_exit_code_3(scripted, scripted_proxy, tmp_path):
    """A harness that dies before its first model call (here `direct` with a raise) is never scored."""
    def crash(app: Path) -> None:
        direct = app / "steps" / "harnesses" / "direct.py"
        code = direct.read_text()
        direct.write_text(code.replace("    calls, answer = agent_loop(", "    raise RuntimeError('crashed')\n"
                                                                          "    calls, answer = agent_loop("))

    scripted.set_commands([oracle("hello-file")])
    done, result, _ = run_in_pod(scripted_proxy, BUILTIN_DATASET / "hello-file", "direct", tmp_path, patch_app=crash)
    assert done.returncode == 3 and (result["status"], result["reward"]) == ("infra_error", None), result
    assert "no model call that was answered" in result["error"]
    assert "RuntimeError: crashed" in Path(result["paths"]["harness_log"].replace("/tmp/rollout", str(tmp_path / "out"))).read_text()


def test_a_timed_out_agent_leaves_no_process_for_the_verifier(scripted, scripted_proxy, tmp_path):
    """A background process that left the agent's session is killed with the rest: the verifier (which
    runs in the same pod) finds no process of the agent uid and writes 1, while the rollout counts 0."""
    task = tmp_path / "no-survivors"
    shutil.copytree(BUILTIN_DATASET / "hello-file", task)
    (task / "tests" / "test.sh").write_text(f"""#!/bin/bash
mkdir -p /logs/verifier
alive=""
for status in /proc/[0-9]*/status; do
  uid=$(awk '/^Uid:/ {{print $2}}' "$status" 2>/dev/null); state=$(awk '/^State:/ {{print $2}}' "$status" 2>/dev/null)
  if [ "$uid" = {AGENT_UID} ] && [ "$state" != Z ]; then alive="$alive $status"; fi
done
echo "alive:$alive"
if [ -z "$alive" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
""")
    scripted.set_commands(["setsid sleep 600 </dev/null >/dev/null 2>&1 & sleep 600"])
    done, result, _ = run_in_pod(scripted_proxy, task, "direct", tmp_path, extra_args=("--agent-timeout", "4"))
    assert done.returncode == 0 and (result["status"], result["reward"]) == ("agent_timeout", 0.0), result
    assert result["rewards"] == {"reward": 1.0}, (tmp_path / "out" / "verifier" / "test-stdout.txt").read_text()
    assert result["durations"]["agent_s"] < 30


def test_a_runner_that_is_not_root_says_the_agent_is_not_uid_isolated(scripted, scripted_proxy, tmp_path):
    """Without root the runner cannot switch users: the rollout still works, and result.json and stderr say so."""
    scripted.set_commands(["id -u", oracle("hello-file")])
    done, result, rollout_id = run_in_pod(scripted_proxy, BUILTIN_DATASET / "hello-file", "direct", tmp_path,
                                          runner_uid=AGENT_UID + 1)
    assert done.returncode == 0 and (result["status"], result["reward"]) == ("ok", 1.0), (result, done.stderr)
    assert tool_outputs(scripted_proxy.calls(rollout_id))[0] == json.dumps(f"exit code: 0\n{AGENT_UID + 1}\n")
    assert any("NOT uid-isolated" in note for note in result["notes"]) and "NOT uid-isolated" in done.stderr


# ---- the verifier loads nothing the agent could change ----

GRADE = r"""
import json, sys
from pathlib import Path
import steps.sandbox.pod as pod
from steps.tasks import load_task
from steps.grading.verify import run_verifier

task, agent, guard = load_task(Path(sys.argv[1])), sys.argv[2], sys.argv[3]
out = Path("/tmp/rollout")
if guard != "guarded":
    pod.close = lambda paths, uid: []  # the control: the image's open paths stay open to the agent
box = pod.PodSandbox.create(out, task)
box.run(["bash", "-c", agent], timeout_s=60, as_agent=True, stdout_path=out / "agent.log")
env = {"PATH": box.env["PATH"], "PYTHONNOUSERSITE": "1", "PYTHONSAFEPATH": "1"}
result = {"notes": box.notes}
if guard == "unguarded":
    box.prepare_verifier = lambda env: env  # the control: nothing checked or cleaned before grading
verdict = run_verifier(box, task, out / "verifier", env)  # grading calls box.prepare_verifier
result |= {"reward": verdict.reward, "error": verdict.error}
if verdict.reward is None and "not graded (reward 0)" in (verdict.error or ""):
    result |= {"reward": 0.0, "refused": verdict.error}  # as steps.rollout scores it
result["agent_log"] = (out / "agent.log").read_text()
log = out / "verifier" / "test-stdout.txt"
result["verifier_log"] = log.read_text() if log.exists() else ""
(out / "result.json").write_text(json.dumps(result))
"""
# The task's check, in Python: 1 only when the agent wrote "hello" into /app/answer.txt, which no attack here does.
CHECK = "import sys; sys.exit(open('/app/answer.txt').read().strip() != 'hello')"
PYTHON_CHECK = f"""#!/bin/bash
if python3 -c "{CHECK}" 2>/dev/null; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""
PYTEST_CHECK = """#!/bin/bash
cat > /tests/test_answer.py <<'PY'
def test_answer():
    assert open('/app/answer.txt').read().strip() == 'hello'
PY
cd /tests && if LD_LIBRARY_PATH=/openforge/python/lib /openforge/python/bin/python3 -m pytest -q -p no:cacheprovider \\
    /tests/test_answer.py >&2; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""
CACHE_CHECK = """#!/bin/bash
# A verifier that keeps its expected answer in /tmp between steps (and reuses one that is there).
[ -f /tmp/expected.txt ] || echo hello > /tmp/expected.txt
if [ "$(cat /app/answer.txt 2>/dev/null)" = "$(cat /tmp/expected.txt)" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
echo "home $(stat -c %u "$HOME") $(ls -A "$HOME" | wc -l) tmpdir $(stat -c %u "$TMPDIR") $(ls -A "$TMPDIR" | wc -l)"
echo "left: $(ls -A /tests /solution 2>&1 | tr '\\n' ' ')"
"""
SITE = f"/usr/local/lib/python{sys.version_info.major}.{sys.version_info.minor}/dist-packages"
ETC_PYTHON = f"/etc/python{sys.version_info.major}.{sys.version_info.minor}"
ATTACKS = {  # name -> (what the image leaves 0777, the agent's commands, the verifier)
    "pth-in-site-dir": ((SITE,), f"echo 'import os; os._exit(0)' > {SITE}/zz-agent.pth", PYTHON_CHECK),
    # Debian's python3 imports /usr/lib/python3.X/sitecustomize.py, a link into /etc/python3.X.
    "sitecustomize": ((ETC_PYTHON,), f"echo 'import os; os._exit(0)' > {ETC_PYTHON}/sitecustomize.py", PYTHON_CHECK),
    "fake-python3-on-path": (("/usr/local/bin",), "printf '#!/bin/sh\\nexit 0\\n' > /usr/local/bin/python3; "
                                                  "chmod +x /usr/local/bin/python3", PYTHON_CHECK),
    "fake-bash-on-path": (("/usr/local/bin",), "printf '#!/bin/sh\\necho 1 > /logs/verifier/reward.txt\\n' > "
                                               "/usr/local/bin/bash; chmod +x /usr/local/bin/bash", PYTHON_CHECK),
    "pytest-config-at-root": (("/",), "printf '[pytest]\\naddopts = --collect-only\\n' > /pytest.ini; "
                                      "echo 'collect_ignore_glob = [\"*\"]' > /conftest.py", PYTEST_CHECK),
    "answer-planted-in-tmp": (("/solution", "/tests"), "touch /app/answer.txt; : > /tmp/expected.txt; "
                                                       "echo x > /solution/solve.sh; echo x > /tests/x", CACHE_CHECK),
}


def grade_in_pod(tmp_path: Path, attack: str, guard: str) -> dict:
    """The agent's commands of `ATTACKS[attack]` as the agent uid in a fresh simulated pod, then the verifier
    with `guard`: "guarded" (closing paths before the agent, `prepare_verifier` after), "after" (only
    `prepare_verifier`) or "unguarded" (neither: the control). Returns the driver's result."""
    open_paths, agent, test_sh = ATTACKS[attack]
    task = tmp_path / "attacked"
    shutil.copytree(BUILTIN_DATASET / "hello-file", task)
    (task / "tests" / "test.sh").write_text(test_sh)
    done, result, _ = run_in_pod(None, task, "direct", tmp_path, extra_args=(agent, guard), world_writable=open_paths,
                                 driver=GRADE)
    assert done.returncode == 0, done.stderr[-3000:]
    return result


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_what_the_agent_plants_for_the_verifier_is_never_loaded(attack, tmp_path):
    """Each attack earns 0: the open path is closed before the agent runs (noted), or its leftovers removed."""
    result = grade_in_pod(tmp_path, attack, "guarded")
    assert result["reward"] == 0.0 and "refused" not in result, result
    if attack != "answer-planted-in-tmp":
        assert "Permission denied" in result["agent_log"], result  # the plant itself failed
        assert any("were closed before it ran" in note for note in result["notes"]), result
    else:
        assert "home 0 0 tmpdir 0 0" in result["verifier_log"], result  # fresh, root's, empty
        assert "/tests: test.sh \n" in result["verifier_log"] and "solve.sh" not in result["verifier_log"], result


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_the_same_attack_without_the_guard_earns_reward_1(attack, tmp_path):
    """Control: with nothing closed and `prepare_verifier` skipped, each plant does fool the verifier."""
    result = grade_in_pod(tmp_path, attack, "unguarded")
    assert result["reward"] == 1.0, result


@pytest.mark.parametrize("attack", ["pth-in-site-dir", "fake-bash-on-path", "pytest-config-at-root"])
def test_a_plant_found_after_the_agent_refuses_grading_with_reward_0(attack, tmp_path):
    """Had a path stayed open (nothing closed before the agent), `prepare_verifier` finds the agent's file and
    refuses: reward 0 with the reason, never an infra error."""
    result = grade_in_pod(tmp_path, attack, "after")
    assert result["reward"] == 0.0 and "not graded (reward 0)" in result["refused"], result
    assert f"agent uid {AGENT_UID} owns or may write" in result["refused"]


@pytest.mark.parametrize("closed", [True, False])
def test_a_rollout_closes_the_images_open_path_before_the_agent_runs(closed, scripted, scripted_proxy, tmp_path):
    """Through `steps.rollout`: the image leaves a PATH folder 0777 and the agent puts a `bash` there that
    writes reward 1. Closed before the agent (noted in result.json), the plant fails and the rollout earns 0;
    the control, with `close` disabled in the pod's copy of OpenForge, earns 1."""
    def without_lock(app: Path) -> None:
        pod_py = app / "steps" / "sandbox" / "pod.py"
        text = pod_py.read_text().replace("closed = close(", "closed = [] and close(")
        pod_py.write_text(text.replace("found = open_to(paths, self.agent_uid)", "found = []"))

    _, agent, _ = ATTACKS["fake-bash-on-path"]
    scripted.set_commands([agent])
    done, result, rollout_id = run_in_pod(scripted_proxy, BUILTIN_DATASET / "hello-file", "direct", tmp_path,
                                          world_writable=("/usr/local/bin",), patch_app=None if closed else without_lock)
    assert done.returncode == 0 and result["status"] == "ok", result
    assert result["reward"] == (0.0 if closed else 1.0), result
    assert any("were closed before it ran" in note for note in result["notes"]) is closed, result["notes"]
    assert ("Permission denied" in tool_outputs(scripted_proxy.calls(rollout_id))[0]) is closed
    print(f"setup {result['durations']['setup_s']} s")


# ---- a task's app as the pod's sidecar ----

APP_RUN = r"""
import json, sys
from pathlib import Path
from steps.sandbox.pod import PodSandbox
from steps.tasks import load_task
from steps.grading.verify import run_oracle, run_verifier

task, agent = load_task(Path(sys.argv[1])), sys.argv[2]
out = Path("/tmp/rollout")
box = PodSandbox.create(out, task)
if agent == "oracle":
    run_oracle(box, task, out / "agent.log")
else:
    box.run(["bash", "-c", agent], timeout_s=60, as_agent=True, stdout_path=out / "agent.log")
verdict = run_verifier(box, task, out / "verifier")
(out / "result.json").write_text(json.dumps({"reward": verdict.reward, "error": verdict.error, "notes": box.notes,
                                             "agent_log": (out / "agent.log").read_text()}))
"""
FORGE_STATE = f"""for state in /var/lib/openforge/app-live /var/lib/openforge/app; do
  mkdir -p $state; echo '{FORGED_SIGNUP}' > $state/state.json
done
ls /var/lib/openforge/app-live"""


@pytest.mark.parametrize("agent", ["oracle", "forge"])
def test_a_gui_task_in_the_pod_is_graded_on_its_sidecars_state(agent, tmp_path):
    """The signup form in a simulated `rollout-app` pod: the site runs as the sidecar, the runner waits for it, and
    the oracle (Playwright and chromium, as the agent uid) earns 1 through the site. The agent writing the state
    itself, at the sidecar's volume or where the verifier reads it, is denied and earns 0."""
    done, result, _ = run_in_pod(None, SIGNUP, "direct", tmp_path, driver=APP_RUN, with_app=True,
                                 extra_args=("oracle" if agent == "oracle" else FORGE_STATE,))
    assert done.returncode == 0, (done.stderr[-3000:], (tmp_path / "app.log").read_text()[-2000:])
    assert result["reward"] == (1.0 if agent == "oracle" else 0.0), result
    if agent == "forge":
        assert result["agent_log"].count("Permission denied") >= 3, result["agent_log"]
    assert json.loads((tmp_path / "out" / APP_STATE_KEPT / "state.json").read_text())["signups"] == (
        json.loads(FORGED_SIGNUP)["signups"] if agent == "oracle" else [])
