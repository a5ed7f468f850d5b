"""The built-in GUI tasks: each oracle (Playwright driving chromium, or xdotool on an X display) passes through
the real `steps.tasks check`, a no-op fails, the site's state cannot be faked by the agent, and the browser in
the sandbox reaches only loopback. Real parts throughout: bubblewrap, chromium, Xvfb, the task's site."""

import os
import shutil
import socket
import subprocess
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from scripted_model import oracle_command
from steps.rollout import RolloutSpec, run_rollout
import steps.sandbox.pod
from steps.sandbox import LocalSandbox, SandboxError
from steps.sandbox.app import APP_STATE_DIR, APP_STATE_KEPT
from steps.tasks import load_dataset, load_task
from steps.grading.verify import run_verifier

REPO = Path(__file__).resolve().parents[1]
GUI = REPO / "steps" / "tasks" / "gui"
SIGNUP = GUI / "gui-signup-form"
FORGED_SIGNUP = ('{"signups": [{"name": "Ada Lovelace", "email": "ada@example.org", "plan": "pro", '
                 '"terms": "yes"}]}')


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "steps.tasks", *args], cwd=REPO, capture_output=True, text=True,
                          check=False, timeout=600)


def copy_task(name: str, root: Path, solve: str | None = None) -> Path:
    """A copy of a GUI task under `root`, with another solve.sh when given."""
    task = root / name
    shutil.copytree(GUI / name, task)
    if solve is not None:
        (task / "solution" / "solve.sh").write_text(solve)
    return task


def test_the_gui_dataset_has_six_tasks_of_graded_difficulty_sharing_one_environment():
    tasks, errors = load_dataset(GUI)
    assert not errors and len(tasks) >= 6
    assert {task.difficulty for task in tasks} == {"easy", "medium", "hard"}
    assert all(task.config.app for task in tasks)
    first = sorted(p.relative_to(SIGNUP / "environment") for p in (SIGNUP / "environment").rglob("*"))
    for task in tasks:  # byte-identical build contexts: one cached layer serves them all
        files = sorted(p.relative_to(task.environment_dir) for p in task.environment_dir.rglob("*"))
        assert files == first, task.name
        for path in files:
            if (task.environment_dir / path).is_file():
                assert (task.environment_dir / path).read_bytes() == (SIGNUP / "environment" / path).read_bytes()


def test_every_gui_oracle_passes_through_check():
    done = run_cli("check", str(GUI), "--jobs", "2")
    count = len(load_dataset(GUI)[0])
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{count} tasks: {count} ok, 0 broken" in done.stdout


def test_a_no_op_solution_fails_every_gui_task(tmp_path):
    names = [task.name for task in load_dataset(GUI)[0]]
    for name in names:
        copy_task(name, tmp_path, solve="#!/bin/bash\ntrue\n")
    done = run_cli("check", str(tmp_path), "--jobs", "2")
    assert done.returncode == 1
    assert f"{len(names)} tasks: 0 ok, {len(names)} broken" in done.stdout, done.stdout
    assert done.stdout.count("reward 0 != 1: the verifier rejects the oracle's work") == len(names), done.stdout


FORGER = f"""#!/bin/bash
# The agent fakes the site's record: in the app's own path, in the workspace, and with no site visit at all.
mkdir -p {APP_STATE_DIR}
echo '{FORGED_SIGNUP}' > {APP_STATE_DIR}/state.json
echo '{FORGED_SIGNUP}' > /app/state.json
"""


@pytest.mark.parametrize("name", ["gui-shop-checkout", "gui-desktop-launch"])
def test_a_rollout_runs_the_app_beside_the_harness_and_grades_its_state(name, scripted, scripted_proxy, tmp_path):
    """The `direct` harness, its model calls through the real proxy (the scripted double answers with the oracle
    as one shell call): the app shares the rollout's tunnel namespace; a no-op rollout of the same task scores 0."""
    rewards = []
    for command, run in ((oracle_command(GUI / name), "oracle"), ("true", "no-op")):
        scripted.set_commands([command])
        spec = RolloutSpec(task=GUI / name, harness="direct", proxy_url=scripted_proxy.url,
                           rollout_id=f"{name}-{run}-{os.getpid()}-{len(rewards)}", out=tmp_path / run,
                           admin_key="test-admin-key")
        result = run_rollout(spec)
        assert result.status == "ok", result
        rewards.append(result.reward)
    assert rewards == [1.0, 0.0]


def test_state_the_agent_writes_is_not_what_the_verifier_grades(tmp_path):
    task = load_task(copy_task("gui-signup-form", tmp_path, solve=FORGER))
    box = LocalSandbox.create(tmp_path / "box", task)
    try:
        box.copy_in(task.solution_dir, "/solution")
        assert box.run(["bash", "/solution/solve.sh"], timeout_s=60, as_agent=True).exit_code == 0
        verdict = run_verifier(box, task, tmp_path / "verifier")
        assert verdict.reward == 0, (tmp_path / "verifier" / "test-stdout.txt").read_text()
        # Control: the very same content, had the site kept it, passes: only where it comes from differs.
        (box.root / APP_STATE_KEPT / "state.json").write_text(FORGED_SIGNUP)
        assert run_verifier(box, task, tmp_path / "control").reward == 1
    finally:
        box.remove()


def test_a_graded_app_path_cannot_carry_the_agents_forgery(tmp_path):
    # The task even makes the app's path a graded path: what the verifier finds there is still the app's.
    task_dir = copy_task("gui-signup-form", tmp_path, solve=FORGER)
    toml = (task_dir / "task.toml").read_text().replace(
        "[verifier]\n", f'[verifier]\ngraded_paths = ["/app", "{APP_STATE_DIR}"]\n')
    (task_dir / "task.toml").write_text(toml)
    done = run_cli("check", str(task_dir))
    assert "reward 0 != 1" in done.stdout, done.stdout


def test_the_agent_sees_neither_the_apps_processes_nor_its_files(tmp_path):
    task = load_task(SIGNUP)
    box = LocalSandbox.create(tmp_path / "box", task)
    probe = ("import os, urllib.request\n"
             "urllib.request.urlopen('http://127.0.0.1:8080/signup', timeout=10).read()\n"  # the site is there
             "cmds = [open(f'/proc/{p}/cmdline', 'rb').read() for p in os.listdir('/proc') if p.isdigit()]\n"
             "assert not any(b'/opt/site/' b'site.py' in c for c in cmds), cmds\n"  # split: not the probe's own
             f"assert not os.listdir('{APP_STATE_DIR}') if os.path.isdir('{APP_STATE_DIR}') else True\n")
    log = tmp_path / "probe.log"
    try:
        assert box.run(["python3", "-c", probe], timeout_s=60, as_agent=True, stdout_path=log).exit_code == 0, \
            log.read_text()
        # Control: the app did run, and kept its state on the runner's side.
        assert (box.root / APP_STATE_KEPT / "state.json").is_file()
        assert "GET /signup" in (box.root / "app.log").read_text()
    finally:
        box.remove()


def test_an_app_that_never_gets_ready_is_an_infrastructure_failure(tmp_path):
    task_dir = copy_task("gui-signup-form", tmp_path)
    toml = (task_dir / "task.toml").read_text().replace('app = "python3 /opt/site/site.py"', 'app = "exit 3"')
    (task_dir / "task.toml").write_text(toml)
    box = LocalSandbox.create(tmp_path / "box", load_task(task_dir))
    try:
        with pytest.raises(SandboxError, match="the task's app ended before it was ready"):
            box.run(["true"], timeout_s=30, as_agent=True)
    finally:
        box.remove()


def host_address() -> str | None:
    """This host's address on its outward interface (no packet is sent), or None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
            return probe.getsockname()[0]
        except OSError:
            return None


class Hello(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"hello from the host")

    def log_message(self, *args):
        pass


BROWSE = """
import sys
from playwright.sync_api import sync_playwright, Error
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True)
    page = browser.new_page()
    page.goto("http://127.0.0.1:8080/signup")
    print("local:", page.title())
    for url in sys.argv[1:]:
        try:
            page.goto(url, timeout=5000)
            print("reached:", url, page.content()[:200])
        except Error as exc:
            print("blocked:", url, str(exc).splitlines()[0])
    browser.close()
"""


def test_the_browser_in_the_sandbox_loads_the_site_and_nothing_beyond_loopback(tmp_path):
    address = host_address()
    if address is None or address.startswith("127."):
        pytest.skip("this host has no non-loopback address to try")
    server = ThreadingHTTPServer(("0.0.0.0", 0), Hello)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    box = LocalSandbox.create(tmp_path / "box", load_task(SIGNUP))
    log = tmp_path / "browse.log"
    (box.host_path("/tmp") / "browse.py").write_text(BROWSE)
    try:
        urls = [f"http://{address}:{port}/", f"http://127.0.0.1:{port}/", "http://1.1.1.1/"]
        box.run(["python3", "/tmp/browse.py", *urls], timeout_s=120, as_agent=True, stdout_path=log)
        output = log.read_text()
        assert "local: Sign up" in output, output
        for url in urls:
            assert f"blocked: {url}" in output, output
        assert "reached:" not in output
        # Control: the host's server answers the host at that address.
        assert urllib.request.urlopen(urls[0], timeout=5).read() == b"hello from the host"
    finally:
        server.shutdown()
        box.remove()


def test_a_pod_without_the_apps_sidecar_is_an_infrastructure_failure_not_a_silent_zero(tmp_path, monkeypatch):
    live = tmp_path / "live"  # the sidecar's state volume as the rollout container mounts it
    live.mkdir(mode=0o700)
    monkeypatch.setattr(steps.sandbox.pod, "APP_LIVE", live)
    monkeypatch.setattr(steps.sandbox.pod, "APP_START_TIMEOUT_S", 0.2)
    with pytest.raises(SandboxError, match="the task's \\[environment\\] app was not ready within"):
        steps.sandbox.pod.PodSandbox.create(tmp_path / "out", load_task(SIGNUP))
    # Control: with the sidecar's ready file there, the pod gets past that check to the next one (a root runner
    # refuses a task folder the agent uid can read, before the pod is touched).
    assert os.geteuid() == 0
    (live / "ready").touch()
    with pytest.raises(SandboxError, match="is readable by the agent uid"):
        steps.sandbox.pod.PodSandbox.create(tmp_path / "out2", load_task(SIGNUP))
