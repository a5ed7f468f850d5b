"""Adversarial rollouts: scripted agents that try to raise their reward without doing the task, to void a
failing rollout, or to reach the shared server; every attack must end in reward 0, never in infra_error.

Two levels:
- `test_an_attack_that_wins_in_the_agents_own_root_loses_in_the_verifiers`: the agent's commands run in a
  real local sandbox; the task's verifier then runs twice: in the agent's own root (what graded rollouts
  before the pristine verifier: the control, which the attack wins with reward 1) and through
  `run_verifier` (the pristine root: reward 0). An attack that does not win its control is not an attack,
  and the control fails the test.
- `test_attacks_through_the_real_harness_and_proxy_score_0`: the same attacks as tool calls of a real
  harness (`direct`, and Codex where installed) through the real recording proxy, graded end to end by
  `steps.rollout`; the oracle (1) and doing nothing (0) run in the same module as controls.
The model is `tests/scripted_model.py` (a small random model cannot call tools; see its docstring).
"""

import contextlib
import json
import os
import shutil
import socket
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest

from steps.rollout import RolloutSpec, run_rollout
from steps.sandbox import LocalSandbox
from steps.sandbox.common import copy_tree, links_under
from steps.tasks import BUILTIN_DATASET, load_task
from steps.grading.verify import run_verifier
from test_harnesses import installed_exe
from test_rollout import oracle, tool_outputs

ADMIN_KEY = "test-admin-key"
WIN = "import os; os.makedirs('/logs/verifier', exist_ok=True); open('/logs/verifier/reward.txt', 'w').write('1'); os._exit(0)"
FAKE_OK = "printf '#!/bin/sh\\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; exit 0\\n'"
USER_SITE = "$(python3 -c 'import site; print(site.getusersitepackages())')"
SYSTEM_SITE = "$(python3 -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))')"

# attack name -> (task, the agent's shell commands). Each wins with reward 1 where the verifier runs in the
# agent's own root, as it did before.
ATTACKS = {
    "user-site-pth": ("csv-stats", f'mkdir -p {USER_SITE} && echo "{WIN}" > {USER_SITE}/zz.pth'),
    "system-site-pth": ("csv-stats", f'mkdir -p {SYSTEM_SITE} && echo "{WIN}" > {SYSTEM_SITE}/zz.pth'),
    "usercustomize": ("csv-stats", f'mkdir -p {USER_SITE} && echo "{WIN}" > {USER_SITE}/usercustomize.py'),
    "fake-python3-on-path": ("csv-stats", f"{FAKE_OK} > /usr/local/bin/python3 && chmod +x /usr/local/bin/python3"),
    "fake-bash-on-path": ("hello-file", f"{FAKE_OK} > /usr/local/bin/bash && chmod +x /usr/local/bin/bash"),
    "fake-tr-on-path": ("hello-file", "printf '#!/bin/sh\\necho hello\\n' > /usr/local/bin/tr && "
                                      "chmod +x /usr/local/bin/tr && touch /app/answer.txt"),
}
# Attacks that did not win before either (the grading area was already reset), kept so they stay lost.
HELD = {
    "planted-tests-and-reward": ("hello-file", "mkdir -p /tests /logs/verifier && echo 1 > /logs/verifier/reward.txt && "
                                               f"{FAKE_OK} > /tests/test.sh && chmod -R a-w /tests /logs/verifier"),
    "reward-file-as-a-folder": ("hello-file", "rm -rf /logs/verifier && mkdir -p /logs/verifier/reward.txt/x"),
}


def agent_root_reward(box: LocalSandbox, task) -> float | None:
    """The control: the verifier run the old way, in the agent's own root with HOME=/root."""
    box.reset_dir("/logs/verifier")
    box.copy_in(task.tests_dir, "/tests")
    box.run(["bash", "/tests/test.sh"], timeout_s=60)
    reward = box.host_path("/logs/verifier/reward.txt")
    return float(reward.read_text()) if reward.is_file() else None


@pytest.mark.parametrize("attack", ATTACKS)
def test_an_attack_that_wins_in_the_agents_own_root_loses_in_the_verifiers(attack, tmp_path):
    task_name, command = ATTACKS[attack]
    task = load_task(BUILTIN_DATASET / task_name)
    box = LocalSandbox.create(tmp_path / "sandbox", task)
    try:
        assert box.run(["bash", "-c", command], timeout_s=60, stdout_path=tmp_path / "agent.log").exit_code == 0, \
            (tmp_path / "agent.log").read_text()
        verdict = run_verifier(box, task, tmp_path / "verifier")
        assert verdict.reward == 0.0, f"{attack}: {verdict}"
        assert agent_root_reward(box, task) == 1.0, f"control: {attack} does not win in the agent's own root"
    finally:
        box.remove()


def test_a_symlink_to_where_the_verifier_keeps_its_answers_is_removed(tmp_path):
    folder = tmp_path / "expected-answer"
    shutil.copytree(BUILTIN_DATASET / "hello-file", folder)
    (folder / "tests" / "expected.txt").write_text("a secret only the verifier has\n")
    (folder / "tests" / "test.sh").write_text(
        "#!/bin/bash\nif cmp -s /app/answer.txt /tests/expected.txt; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n")
    task = load_task(folder)
    box = LocalSandbox.create(tmp_path / "sandbox", task)
    try:
        box.run(["bash", "-c", "ln -s /tests/expected.txt /app/answer.txt && ln -s ../tests /app/up"], timeout_s=30)
        verdict = run_verifier(box, task, tmp_path / "verifier")
        assert verdict.reward == 0.0
        assert any("/app/answer.txt was a symlink" in note for note in box.notes), box.notes
        assert agent_root_reward(box, task) == 1.0  # control: the link wins where the verifier follows it
    finally:
        box.remove()


def test_the_agent_sees_no_secret_of_the_host_and_no_host_path(tmp_path):
    task = load_task(BUILTIN_DATASET / "hello-file")
    box = LocalSandbox.create(tmp_path / "sandbox", task)
    out = tmp_path / "out.txt"
    harness = tmp_path / "harnesses" / "tool-1.0"  # brought in as a harness is
    harness.mkdir(parents=True)
    try:
        script = ("for f in /etc/shadow /etc/shadow- /etc/gshadow /etc/gshadow-; do cat $f >/dev/null 2>&1 && echo READ $f; done; "
                  "head -c 10 /etc/passwd >/dev/null && echo passwd-ok; cat /proc/self/mountinfo; ls /var/log")
        binds = [(tmp_path / "harnesses", "/opt/openforge/harnesses", True)]
        assert box.run(["bash", "-c", script + "; ls /opt/openforge/harnesses"], timeout_s=30, stdout_path=out,
                       extra_binds=binds).exit_code == 0
        text = out.read_text()
        assert "tool-1.0" in text and "READ" not in text and "passwd-ok" in text  # control: a world-readable file of /etc is there
        assert "lowerdir=layer/root" in text  # it is the sandbox's own mount table...
        assert str(tmp_path) not in text and str(Path.home()) + "/" not in text  # ...naming no host folder
        assert Path("/etc/shadow").is_file()  # control: the host has the file the sandbox cannot read
    finally:
        box.remove()


def test_processes_and_memory_are_limited_as_the_task_declares(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENFORGE_SANDBOX_PIDS", "200")
    task = load_task(BUILTIN_DATASET / "hello-file")  # memory_mb = 1024
    box = LocalSandbox.create(tmp_path / "sandbox", task)
    out = tmp_path / "out.txt"
    try:
        if box.limits.notes:
            pytest.skip(f"this host gives no cgroups to enforce them: {box.limits.notes}")
        forks = ("python3 -c 'import os, time\nfor n in range(400):\n    try:\n        pid = os.fork()\n"
                 "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
                 "print(\"started\", n)'")
        box.run(["bash", "-c", forks], timeout_s=60, stdout_path=out)
        assert 150 < int(out.read_text().split()[-1]) <= 200, out.read_text()[-500:]
        allocate = "python3 -c 'b = bytearray({} * 2**20); b[::4096] = b\"x\" * len(b[::4096]); print(\"held\")'"
        assert box.run(["bash", "-c", allocate.format(1500)], timeout_s=60, stdout_path=out).exit_code != 0
        assert box.run(["bash", "-c", allocate.format(200)], timeout_s=60, stdout_path=out).exit_code == 0  # control
    finally:
        box.remove()


def test_filling_the_disk_fills_only_the_sandboxs_own(tmp_path):
    folder = tmp_path / "small-disk"
    shutil.copytree(BUILTIN_DATASET / "hello-file", folder)
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace("storage_mb = 1024", "storage_mb = 64"))
    task = load_task(folder)
    box = LocalSandbox.create(tmp_path / "sandbox", task)
    out = tmp_path / "out.txt"
    try:
        assert not [note for note in box.notes if "storage_mb" in note], box.notes
        box.run(["bash", "-c", "dd if=/dev/zero of=/app/big bs=1M count=200; stat -c %s /app/big"], timeout_s=60,
                stdout_path=out)
        assert "No space left on device" in out.read_text(), out.read_text()
        assert int(out.read_text().split()[-1]) < 64 * 2**20  # stopped at the task's 64 MiB
        (tmp_path / "runner-still-writes.txt").write_text("x" * 1_000_000)  # control: the runner's disk is fine
        assert box.run(["bash", "-c", "rm /app/big && echo hello > /app/answer.txt"], timeout_s=30).exit_code == 0
        assert run_verifier(box, task, tmp_path / "verifier").reward == 1.0  # room again: the work counts
    finally:
        box.remove()


def test_graded_folders_nested_past_pythons_recursion_limit_are_copied(tmp_path):
    """An agent's workspace nested 1,200 deep (Python's recursion limit is 1,000): copied whole, links found."""
    inner = deep = tmp_path / "app"
    deep.mkdir()
    for _ in range(1200):  # one level at a time: pathlib's and os.makedirs's own mkdir recurse
        inner = inner / "d"
        os.mkdir(inner)
    (inner / "link").symlink_to("/tests")
    try:
        copy_tree(deep, tmp_path / "copy")
        copied = (tmp_path / "copy").joinpath(*["d"] * 1200, "link")
        assert copied.is_symlink() and links_under(tmp_path / "copy") == [copied]
    finally:  # bottom up, here: a later session's clean-up of old temporary folders (rmtree) would recurse
        for top in (deep, tmp_path / "copy"):
            (top.joinpath(*["d"] * 1200, "link")).unlink(missing_ok=True)
            for depth in range(1200, -1, -1):
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(top.joinpath(*["d"] * depth))


@pytest.mark.parametrize("attack", ["truncate -s 1T /app/huge"])  # 0 bytes on the agent's disk, 1 TiB to copy
def test_graded_files_that_cannot_be_brought_over_score_0_and_fill_nothing_of_the_hosts(attack, tmp_path):
    folder = tmp_path / "task"
    shutil.copytree(BUILTIN_DATASET / "hello-file", folder)
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace("storage_mb = 1024", "storage_mb = 64"))
    task = load_task(folder)
    box = LocalSandbox.create(tmp_path / "sandbox", task)
    free_before = shutil.disk_usage(tmp_path).free
    try:
        box.run(["bash", "-c", attack], timeout_s=120)
        verdict = run_verifier(box, task, tmp_path / "verifier")  # never raises: a 0 or a refusal, both the agent's
        assert verdict.reward in (0.0, None), verdict
        assert free_before - shutil.disk_usage(tmp_path).free < 256 * 2**20  # the host's disk took none of it
    finally:
        box.remove()


# --- through a real harness and the real proxy ------------------------------------------------------

def _json_in(tool_output: str) -> dict:
    """The JSON object a probe printed, out of the tool result the harness sent back (itself JSON text)."""
    text = json.loads(tool_output)
    text = text if isinstance(text, str) else json.dumps(text)
    return json.loads(text[text.index("{"):text.rindex("}") + 1])


def rollout(proxy, scripted, task: Path, commands: list[str], tmp_path: Path, harness: str = "direct"):
    scripted.set_commands(commands)
    rollout_id = f"attack-{harness}-{task.name}-{uuid.uuid4().hex[:6]}"
    spec = RolloutSpec(task=task, harness=harness, proxy_url=proxy.url, rollout_id=rollout_id,
                       out=tmp_path / rollout_id, admin_key=ADMIN_KEY)
    return run_rollout(spec)


@pytest.mark.parametrize("attack", [*ATTACKS, *HELD])
def test_attacks_through_the_real_harness_and_proxy_score_0(attack, scripted, scripted_proxy, tmp_path):
    task_name, command = {**ATTACKS, **HELD}[attack]
    result = rollout(scripted_proxy, scripted, BUILTIN_DATASET / task_name, [command], tmp_path)
    assert (result.status, result.reward) == ("ok", 0.0), result


@pytest.mark.parametrize("task_name", ["hello-file", "csv-stats", "greet-script"])
def test_controls_the_oracle_scores_1_and_nothing_scores_0(task_name, scripted, scripted_proxy, tmp_path):
    task = BUILTIN_DATASET / task_name
    assert rollout(scripted_proxy, scripted, task, [oracle(task_name)], tmp_path).reward == 1.0
    assert rollout(scripted_proxy, scripted, task, ["true"], tmp_path).reward == 0.0


# The verifier of greet-script runs the agent's /app/greet.sh: whatever that does to the verifier.
WRITER = "( while true; do echo 1 > /logs/verifier/.r$$ && mv -f /logs/verifier/.r$$ /logs/verifier/reward.txt; done ) >/dev/null 2>&1 &"
GRADING_ATTACKS = {
    "kill-the-verifier": "kill -9 $PPID; kill -9 -1",
    "hang-the-verifier": "sleep 600",
    "remove-the-grading-area": "rm -rf /logs/verifier /tests; kill -9 $PPID",
    "background-reward-writer": f"{WRITER} echo nope",  # rewrites the reward after test.sh wrote its 0
    "write-then-kill-test.sh": "echo 1 > /logs/verifier/reward.txt; kill -9 $(pgrep -f /tests/test.sh)",
    "rewrite-test.sh-in-place": "printf 'echo 1 > /logs/verifier/reward.txt\\n%.0s' {1..200} > /tests/test.sh",
}


def greet_script(body: str) -> str:
    """The agent's command: write /app/greet.sh with `body`, for the verifier to run."""
    return f"cat > /app/greet.sh <<'AGENT'\n#!/bin/bash\n{body}\nAGENT\nchmod +x /app/greet.sh"


@pytest.mark.parametrize("attack", GRADING_ATTACKS)
def test_an_agent_that_attacks_its_verifier_scores_0_never_infra_error(attack, scripted, scripted_proxy, tmp_path):
    result = rollout(scripted_proxy, scripted, BUILTIN_DATASET / "greet-script",
                     [greet_script(GRADING_ATTACKS[attack])], tmp_path)
    assert (result.status, result.reward) == ("ok", 0.0), result


@pytest.mark.parametrize("supervised", [True, False])
def test_a_background_writer_is_caught_by_the_supervisor(supervised, tmp_path, monkeypatch):
    """A verifier that runs the agent's program, writes its 0, then takes a moment to finish (cleanup): the
    program's leftover writer sets the reward to 1 in that moment. Supervised, the reward is not trusted
    (0); the control, test.sh run plainly, is fooled every time."""
    folder = tmp_path / "slow-ending"
    shutil.copytree(BUILTIN_DATASET / "greet-script", folder)
    (folder / "tests" / "test.sh").write_text(
        "#!/bin/bash\n/app/greet.sh >/dev/null 2>&1\necho 0 > /logs/verifier/reward.txt\nsleep 1\n")
    task = load_task(folder)
    if not supervised:
        monkeypatch.setattr(LocalSandbox, "supervised", lambda self, supervised, plain: plain)
    box = LocalSandbox.create(tmp_path / "sandbox", task)
    try:
        box.run(["bash", "-c", greet_script(f"{WRITER} echo nope")], timeout_s=30)
        verdict = run_verifier(box, task, tmp_path / "verifier")
    finally:
        box.remove()
    if supervised:
        assert verdict.reward is None and "still running when test.sh ended" in verdict.error, verdict
    else:
        assert verdict.reward == 1.0, verdict


def test_the_verifier_and_what_it_runs_cannot_change_tests_but_can_write_the_reward(tmp_path):
    folder = tmp_path / "probe"
    shutil.copytree(BUILTIN_DATASET / "hello-file", folder)
    (folder / "tests" / "test.sh").write_text(
        "#!/bin/bash\ntouch /tests/x 2>/dev/null && echo tests-writable; echo 0 > /logs/verifier/reward.txt\n")
    task = load_task(folder)
    box = LocalSandbox.create(tmp_path / "sandbox", task)
    try:
        verdict = run_verifier(box, task, tmp_path / "verifier")
        assert verdict.reward == 0.0  # control: the reward file was written
        assert "tests-writable" not in (tmp_path / "verifier" / "test-stdout.txt").read_text()
    finally:
        box.remove()


def test_the_sandbox_reaches_its_proxy_and_nothing_else_on_the_host(scripted, scripted_proxy, tmp_path):
    """A stand-in for vLLM (any service on the host's loopback) is out of reach; the proxy is in reach."""
    service = socket.create_server(("127.0.0.1", 0))
    port = service.getsockname()[1]
    threading.Thread(target=lambda: [service.accept()[0].close() for _ in range(2)], daemon=True).start()
    probe = ("python3 - <<'PY' > /app/net.json\nimport json, socket, urllib.request, urllib.error\nout = {}\n"
             f"for name, port in (('service', {port}), ('proxy', {scripted_proxy.port})):\n"
             "    try:\n        socket.create_connection(('127.0.0.1', port), timeout=3).close(); out[name] = 'open'\n"
             "    except OSError as e:\n        out[name] = str(e)\n"
             f"try:\n    urllib.request.urlopen('http://127.0.0.1:{scripted_proxy.port}/rollouts', timeout=5)\n"
             "except urllib.error.HTTPError as e:\n    out['admin'] = e.code\n"
             "print(json.dumps(out))\nPY\ncat /app/net.json")
    try:
        result = rollout(scripted_proxy, scripted, BUILTIN_DATASET / "hello-file", [probe], tmp_path)
        (output,) = tool_outputs(scripted_proxy.calls(result.rollout_id))
        seen = _json_in(output)
        assert seen["proxy"] == "open" and seen["admin"] == 401  # its proxy, whose admin routes want the key
        assert seen["service"] != "open", seen
        socket.create_connection(("127.0.0.1", port), timeout=3).close()  # control: the service was listening
    finally:
        service.close()


@pytest.mark.harness
@pytest.mark.parametrize("attack", ["system-site-pth", "fake-bash-on-path"])
def test_attacks_through_codex_score_0(attack, scripted, scripted_proxy, tmp_path):
    installed_exe("codex")
    task_name, command = ATTACKS[attack]
    result = rollout(scripted_proxy, scripted, BUILTIN_DATASET / task_name, [command], tmp_path, harness="codex")
    assert (result.status, result.reward, result.num_calls >= 2) == ("ok", 0.0, True), result
