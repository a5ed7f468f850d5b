"""What one rollout may take and leave behind: the harness's own memory beside the task's, what a limit killed, every
byte that leaves the sandbox bounded, grading bounded, and the local runner's deadline (docs/reliability.md, "Limits").

The harness tests run real harness CLIs through the real proxy in real sandboxes; the model is
`tests/scripted_model.py` (a small random model cannot call tools). Each attack runs beside a control rollout (the
oracle, reward 1) that it must leave unharmed, and each bound has a control showing the attack would get through
without it.
"""

import json
import os
import shutil
import sys
import threading
import uuid
from pathlib import Path

import pytest

from steps.contracts.rollout import PlannedRollout, RolloutResult, harness_killed, read_result
from steps.rollout import RolloutSpec, run_rollout
from steps.sandbox import LocalSandbox
from steps.sandbox.common import MIB, Bounds, Output, copy_logs
from steps.sandbox.limits import Budget
from steps.tasks import BUILTIN_DATASET, load_task
from steps.grading.verify import run_verifier
from test_harnesses import installed_exe
from test_rollout import oracle, tool_outputs

ADMIN_KEY = "test-admin-key"
PYTHON = os.path.realpath("/usr/bin/python3")  # the host's, which is every sandbox's /usr/bin/python3
# A stand-in harness: a Python process that starts a tool (bash), reports where each runs, then holds memory.
FAKE_HARNESS = r'''
import subprocess, sys
print("harness", open("/proc/self/cgroup").read().split("memory:")[1].split()[0], flush=True)
subprocess.run(["bash", "-c", "sleep 0.3; echo tool $(grep -o 'memory:[^ ]*' /proc/self/cgroup); "
                "python3 -c 'import time; time.sleep(0.3); print(\"python of a tool\", "
                "open(\"/proc/self/cgroup\").read().split(\"memory:\")[1].split()[0])'"])
held = bytearray(int(sys.argv[1]) * 2**20); held[::4096] = b"x" * len(held[::4096])
print("harness held", sys.argv[1], flush=True)
'''


def small_task(tmp_path: Path, name: str = "hello-file", copy: str = "", **environment) -> Path:
    """A built-in task copied (as `name-copy`, its instruction marked with `copy`, so that the scripted model tells
    it apart) with `[environment]` fields changed (e.g. memory_mb=256)."""
    folder = tmp_path / "tasks" / (f"{name}-{copy}" if copy else name)
    shutil.copytree(BUILTIN_DATASET / name, folder)
    if copy:
        instruction = folder / "instruction.md"
        instruction.write_text(f"{instruction.read_text().strip()}\n\n({copy})\n")
    toml = folder / "task.toml"
    text = toml.read_text()
    for key, value in environment.items():
        lines = [line for line in text.splitlines() if not line.startswith(f"{key} =")]
        at = lines.index("[environment]") + 1
        text = "\n".join(lines[:at] + [f"{key} = {value}"] + lines[at:]) + "\n"
    toml.write_text(text)
    return folder


def spec_for(proxy, task: Path, harness: str, tmp_path: Path, **kwargs) -> RolloutSpec:
    rollout_id = f"{harness}-{task.name}-{uuid.uuid4().hex[:6]}"
    return RolloutSpec(task=task, harness=harness, proxy_url=proxy.url, rollout_id=rollout_id,
                       out=tmp_path / rollout_id, admin_key=ADMIN_KEY, **kwargs)


def needs_cgroups(box: LocalSandbox) -> None:
    if box.limits.notes:
        pytest.skip(f"this host gives no cgroups to enforce them: {box.limits.notes}")


def test_the_harness_and_its_tools_are_charged_to_their_own_groups(tmp_path):
    task = load_task(small_task(tmp_path, memory_mb=256))
    box = LocalSandbox.create(tmp_path / "sandbox", task, harness=Budget(memory_mb=1024, cpus=1))
    out = tmp_path / "out.txt"
    try:
        needs_cgroups(box)
        run = box.run(["python3", "-c", FAKE_HARNESS, "600"], timeout_s=60, stdout_path=out,
                      harness_programs=(PYTHON,))
        text = out.read_text()
        assert run.exit_code == 0 and "harness held 600" in text, text  # 600 MiB on a 256 MiB task: its own budget
        lines = text.splitlines()
        assert lines[0].startswith("harness /") and lines[0].endswith("/harness"), text
        assert next(line for line in lines if line.startswith("tool ")).endswith("/agent"), text
        # The harness's own program, started by a tool, is still the tool's: what moved never comes back.
        assert text.split("python of a tool ")[1].split()[0].endswith("/agent"), text
        assert box.limit_hits(run.exit_code) == [] and box.peaks_mb()["harness"] >= 600
    finally:
        box.remove()
    control = LocalSandbox.create(tmp_path / "control", task)  # no harness budget: the harness is charged to the task
    try:
        run = control.run(["python3", "-c", FAKE_HARNESS, "600"], timeout_s=60, stdout_path=tmp_path / "control.txt")
        assert run.exit_code == 137 and "harness held" not in (tmp_path / "control.txt").read_text()
        assert control.limit_hits(run.exit_code) == [{"process": "harness", "by": "memory", "count": 1}]
    finally:
        control.remove()


def test_a_tool_past_the_tasks_memory_is_killed_and_the_harness_lives(tmp_path):
    task = load_task(small_task(tmp_path, memory_mb=256))
    box = LocalSandbox.create(tmp_path / "sandbox", task, harness=Budget(memory_mb=512, cpus=1))
    out = tmp_path / "out.txt"
    script = ("import subprocess; r = subprocess.run(['bash', '-c', 'sleep 0.2; python3 -c \"b = bytearray(900 * 2**20); "
              "b[::4096] = b\\'x\\' * len(b[::4096])\"']); print('tool', r.returncode, flush=True)")
    try:
        needs_cgroups(box)
        run = box.run(["python3", "-c", script], timeout_s=60, stdout_path=out, harness_programs=(PYTHON,))
        assert run.exit_code == 0 and "tool -9" in out.read_text(), out.read_text()
        assert box.limit_hits(run.exit_code) == [{"process": "agent", "by": "memory", "count": 1}]
    finally:
        box.remove()


KILL_CASES = [pytest.param(name, marks=pytest.mark.harness) for name in ("openclaw", "codex", "claude-code")]


@pytest.mark.parametrize("harness", KILL_CASES)
def test_a_harness_completes_a_built_in_task_of_1024_mb_in_its_own_budget(harness, scripted, scripted_proxy, tmp_path,
                                                                          monkeypatch):
    """hello-file declares memory_mb = 1024, as Harbor tasks size it for their environment: the harness runs beside
    it in its own budget (its peak is counted in its own cgroup, not the task's). The control charges OpenClaw (peak
    about 0.9 GB) to a task of 128 MB, as it was charged to the task before: it is killed before its first call is
    answered, which no agent can have caused (an infra error, retried), and result.json says what killed it."""
    installed_exe(harness)
    scripted.set_commands([oracle("hello-file")])
    result = run_rollout(spec_for(scripted_proxy, BUILTIN_DATASET / "hello-file", harness, tmp_path))
    log = Path(result.paths.get("harness_log", "/dev/null")).read_text()[-3000:]
    assert (result.status, result.reward, result.killed) == ("ok", 1.0, []), f"{result}\n{log}"
    assert result.peak_memory_mb["harness"] > 20 > result.peak_memory_mb["agent"], result.peak_memory_mb
    if harness != "openclaw":
        return
    monkeypatch.setattr("steps.rollout.harness_budget", lambda spec: None)
    control = run_rollout(spec_for(scripted_proxy, small_task(tmp_path, memory_mb=128), harness, tmp_path))
    assert control.status == "infra_error" and harness_killed(control) == "memory", control


def test_a_harness_its_agent_ran_out_of_memory_is_graded_and_named_everywhere(scripted, scripted_proxy, tmp_path):
    """The agent's tool prints 1.5 GB, which the direct harness holds in memory: past the rollout's sum (task + harness)
    the harness is killed after its first call. That is graded like any rollout that ended (never retried: the agent
    caused it), and result.json, the iteration summary and the report's rollout row say what killed it."""
    from steps.report.data import rollout_row
    from workflows.local import summarize

    task = small_task(tmp_path, memory_mb=256)
    scripted.set_commands(["head -c 1500000000 /dev/zero | tr '\\0' a"])
    result = run_rollout(spec_for(scripted_proxy, task, "direct", tmp_path, harness_memory_mb=256))
    assert (result.status, result.reward, result.harness_exit_code) == ("ok", 0.0, 137), result
    assert result.num_calls >= 1 and result.killed[0] == {"process": "harness", "by": "memory", "count": 1}, result
    written = read_result(Path(result.paths["harness_log"]).parent / "result.json")
    assert harness_killed(written) == "memory" and rollout_row(written)["harness_killed"] == "memory"
    assert summarize(0, [written], "none", {})["harness_killed"] == {"memory": 1, "pids": 0}
    scripted.set_commands(["head -c 1500000 /dev/zero | tr '\\0' a"])  # control: 1.5 MB, nothing is killed
    control = run_rollout(spec_for(scripted_proxy, task, "direct", tmp_path, harness_memory_mb=256))
    assert (control.status, control.killed) == ("ok", []), control
    read_back = RolloutResult.from_json(json.loads(json.dumps(control.to_json())))
    assert summarize(0, [read_back], "none", {})["harness_killed"] == {"memory": 0, "pids": 0}


def test_output_through_a_pipe_is_cut_at_its_cap_and_the_writer_never_blocks(tmp_path):
    log = tmp_path / "out.log"
    with Output(log, 1000) as output:
        written = os.write(output.fd, b"x" * 600)
        child = os.fork()
        if child == 0:
            for _ in range(64):  # 4 MiB through a 64 KiB pipe: it would block if nobody drained it
                os.write(output.fd, b"y" * 65536)
            os._exit(0)
        output.started()
        os.waitpid(child, 0)
    assert written == 600 and log.stat().st_size < 1200 and output.dropped == 600 + 64 * 65536 - 1000
    assert log.read_bytes().startswith(b"x" * 600 + b"y" * 400) and b"output cut at 1000 bytes" in log.read_bytes()


def test_sparse_logs_are_copied_as_far_as_the_cap_reads(tmp_path):
    sparse = tmp_path / "sessions" / "flood.jsonl"
    sparse.parent.mkdir()
    with open(sparse, "wb") as handle:
        handle.truncate(2 << 40)  # 2 TiB apparent, nothing allocated
    small = tmp_path / "sessions" / "a.jsonl"
    small.write_text("{}\n")
    written, notes = copy_logs([(small, tmp_path / "kept" / "a.jsonl"), (sparse, tmp_path / "kept" / "flood.jsonl")],
                               cap=1 * MIB)
    assert [path.name for path in written] == ["a.jsonl", "flood.jsonl"]
    assert (tmp_path / "kept" / "flood.jsonl").stat().st_size == MIB - 3
    assert "kept 1048573 of its 2199023255552 bytes (0 allocated)" in notes[0], notes


def allocated_and_apparent(folder: Path, skip: tuple[str, ...] = ("disk.img",)) -> tuple[int, int]:
    """Bytes under `folder` as the disk holds them and as their sizes say (sandbox disks left out: storage_mb)."""
    allocated = apparent = 0
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.name not in skip:
            info = path.lstat()
            allocated += info.st_blocks * 512
            apparent += info.st_size
    return allocated, apparent


FLOOD = ("head -c 300000000 /dev/zero > /proc/$PPID/fd/1; readlink /proc/$PPID/fd/1 /proc/self/fd/1; "
         "mkdir -p /app/many && cd /app/many && seq 1 3000 | xargs touch; echo flooded")


def beside_a_control(scripted, scripted_proxy, tmp_path: Path, task: Path, command: str, bounds: Bounds):
    """Runs `command` as the agent on `task` while the oracle works hello-file beside it, both with `bounds`; returns
    (the attacked result, the control's), having checked that the control earned 1 and the attack left no more than
    its disk (the task's storage_mb) and a few logs on the host."""
    attack = spec_for(scripted_proxy, task, "direct", tmp_path, bounds=bounds)
    control = spec_for(scripted_proxy, BUILTIN_DATASET / "hello-file", "direct", tmp_path, bounds=bounds)
    scripted.set_scripts({(task / "instruction.md").read_text(): command,
                          (BUILTIN_DATASET / "hello-file" / "instruction.md").read_text(): oracle("hello-file")})
    results = {}
    threads = [threading.Thread(target=lambda s=s: results.__setitem__(s.rollout_id, run_rollout(s)))
               for s in (attack, control)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        scripted.set_scripts(None)
    attacked, unharmed = results[attack.rollout_id], results[control.rollout_id]
    assert (unharmed.status, unharmed.reward) == ("ok", 1.0), unharmed
    allocated, apparent = allocated_and_apparent(attack.out)
    assert allocated < 8 * MIB and apparent < 8 * MIB, (allocated, apparent)
    disk = (attack.out / "sandbox" / "disk.img").stat()
    assert disk.st_blocks * 512 <= load_task(task).config.resources.storage_mb * MIB, disk
    return attacked, unharmed


def test_a_flooding_agent_leaves_bounded_bytes_and_a_rollout_beside_it_unharmed(scripted, scripted_proxy, tmp_path):
    """300 MB to the harness's stdout through /proc/PID/fd/1, more graded files than the verifier takes: harness.log
    stays at its cap, the fd is a pipe (no host path), grading refuses with reward 0 (never infra_error); the oracle
    rollout running beside it earns 1."""
    attacked, _ = beside_a_control(scripted, scripted_proxy, tmp_path, small_task(tmp_path, copy="flood"), FLOOD,
                                   Bounds(log_bytes=1 * MIB, graded_files=2000))
    assert (attacked.status, attacked.reward) == ("ok", 0.0), attacked
    assert "more than 2000 files" in attacked.error, attacked.error
    log = Path(attacked.paths["harness_log"]).read_bytes()
    assert MIB <= len(log) < MIB + 4096 and b"output cut at" in log
    assert any("the harness's output was cut" in note for note in attacked.notes), attacked.notes
    outputs = json.dumps(tool_outputs(scripted_proxy.calls(attacked.rollout_id)))
    assert "pipe:[" in outputs and str(tmp_path) not in outputs, outputs[-2000:]


def task_with(tmp_path: Path, copy: str, files: dict[str, str], environment: dict | None = None) -> Path:
    """hello-file copied as `hello-file-COPY` with `files` (relative paths -> text) written over it."""
    folder = small_task(tmp_path, copy=copy, **(environment or {}))
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def test_what_the_verifier_runs_of_the_agents_leaves_bounded_bytes_and_a_rollout_beside_it_unharmed(
        scripted, scripted_proxy, tmp_path):
    """A verifier that runs the agent's program: the program leaves a 2 GiB sparse file in /logs/verifier and prints
    200 MB. Both are cut at the log cap, the reward file is read first (the verifier's 1), nothing is retried, and the
    oracle rollout beside it earns 1."""
    task = task_with(tmp_path, "verifier-flood", {"tests/test.sh": (
        "#!/bin/bash\nmkdir -p /logs/verifier\nbash /app/check.sh\necho 1 > /logs/verifier/reward.txt\n")})
    agent = ("printf 'truncate -s 2G /logs/verifier/a-big.log\\nhead -c 200000000 /dev/zero | tr \"\\\\\\\\0\" v\\n' "
             "> /app/check.sh && cat /app/check.sh")
    attacked, _ = beside_a_control(scripted, scripted_proxy, tmp_path, task, agent, Bounds(log_bytes=1 * MIB))
    assert (attacked.status, attacked.reward) == ("ok", 1.0), attacked
    verifier = Path(attacked.paths["verifier_output"])
    stdout = (verifier / "test-stdout.txt").read_bytes()
    assert stdout.startswith(b"v" * 1000) and MIB <= len(stdout) < MIB + 4096  # the attack ran; its output was cut
    assert (verifier / "a-big.log").stat().st_size < MIB
    assert any("a-big.log: kept" in note and "2147483648 bytes" in note for note in attacked.notes), attacked.notes


APP = '''
import http.server, pathlib
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        print("request", self.path, flush=True)
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
server = http.server.HTTPServer(("127.0.0.1", 8000), Handler)
pathlib.Path("/var/lib/openforge/app/ready").touch()
server.serve_forever()
'''


def test_a_task_apps_log_is_cut_at_the_cap_however_many_requests_the_agent_sends(tmp_path):
    task = load_task(task_with(tmp_path, "app-flood", {  # the task's own server, which prints every request
        "environment/app.py": APP, "environment/Dockerfile": "FROM python:3.11-slim\nWORKDIR /app\nCOPY app.py /opt/\n"},
        {"app": '"python3 /opt/app.py"'}))
    box = LocalSandbox.create(tmp_path / "sandbox", task, Bounds(log_bytes=1 * MIB))
    requests = ("python3 -c \"import urllib.request\nfor i in range(300): "
                "urllib.request.urlopen('http://127.0.0.1:8000/' + 'x' * 10000).read()\nprint('sent')\"")
    try:
        run = box.run(["bash", "-c", requests], timeout_s=120, stdout_path=tmp_path / "agent.log", as_agent=True)
        app_log = (box.root / "app.log").read_bytes()
        # The app's sandbox shares the task's cgroups and leaves them in place: the verifier still runs in them.
        assert box.limits.agent.folders and all(folder.is_dir() for folder in box.limits.agent.folders.values())
    finally:
        box.remove()
    assert run.exit_code == 0 and b"sent" in (tmp_path / "agent.log").read_bytes()  # 3 MB of request lines were made
    assert app_log.startswith(b"request /xxx") and MIB <= len(app_log) < MIB + 4096 and b"output cut at" in app_log


def test_graded_files_too_slow_to_bring_over_score_0_never_infra_error(tmp_path):
    task = load_task(BUILTIN_DATASET / "hello-file")
    box = LocalSandbox.create(tmp_path / "sandbox", task, Bounds(graded_seconds=0.2))
    try:
        box.run(["bash", "-c", "echo hello > /app/answer.txt; mkdir /app/m && cd /app/m && seq 1 40000 | xargs touch"],
                timeout_s=120)
        slow = run_verifier(box, task, tmp_path / "slow")
        box.bounds = Bounds()  # control: the same files within the default bounds are graded (the answer is right)
        graded = run_verifier(box, task, tmp_path / "graded")
    finally:
        box.remove()
    assert slow.reward is None and "not copied within 0.2 s" in slow.error, slow
    assert graded.reward == 1.0, graded


def test_the_images_env_reaches_the_agent_as_in_docker(scripted, scripted_proxy, tmp_path, monkeypatch):
    dockerfile = ("FROM python:3.11-slim\nWORKDIR /app\n"
                  "RUN mkdir -p /opt/tool/bin && printf '#!/bin/sh\\necho tool-ok\\n' > /opt/tool/bin/mytool && "
                  "chmod +x /opt/tool/bin/mytool\nENV PATH=/opt/tool/bin:$PATH GREETING=hello-env\n")
    task = task_with(tmp_path, "env", {"environment/Dockerfile": dockerfile})
    scripted.set_commands(['mytool; echo "greeting=$GREETING"'])
    result = run_rollout(spec_for(scripted_proxy, task, "direct", tmp_path))
    outputs = " ".join(tool_outputs(scripted_proxy.calls(result.rollout_id)))
    assert "tool-ok" in outputs and "greeting=hello-env" in outputs, outputs
    monkeypatch.setattr("steps.rollout.harness_path", lambda harness, image: harness)  # control: the harness's PATH
    scripted.set_commands(['mytool; echo "greeting=$GREETING"'])
    result = run_rollout(spec_for(scripted_proxy, task, "direct", tmp_path))
    assert "tool-ok" not in " ".join(tool_outputs(scripted_proxy.calls(result.rollout_id)))


@pytest.mark.harness
def test_a_sparse_session_log_of_two_gib_is_kept_as_far_as_the_cap(scripted, scripted_proxy, tmp_path):
    installed_exe("codex")
    scripted.set_commands(["mkdir -p ~/.codex/sessions/2026/12/03 && "
                           "truncate -s 2G ~/.codex/sessions/2026/12/03/rollout-flood.jsonl && echo made"])
    result = run_rollout(spec_for(scripted_proxy, BUILTIN_DATASET / "hello-file", "codex", tmp_path,
                                  bounds=Bounds(log_bytes=1 * MIB)))
    assert result.status == "ok", result
    kept = [Path(path) for path in result.paths["harness_logs"]]
    assert "rollout-flood.jsonl" in [path.name for path in kept]
    assert sum(path.stat().st_size for path in kept) <= MIB
    assert any("rollout-flood.jsonl: kept" in note and "2147483648" in note for note in result.notes), result.notes


@pytest.mark.slow  # it waits out a deadline of 40 s
def test_a_rollout_past_its_deadline_is_stopped_and_its_result_written_by_its_phase(scripted, scripted_proxy,
                                                                                    tmp_path):
    from workflows.local import run_rollout_step

    scripted.set_commands(["sleep 600"])
    item = PlannedRollout(task=str(BUILTIN_DATASET / "hello-file"), sample=0, rollout_id="late", image="", deadline_s=40,
                          cpus=1, memory_mb=2048, storage_mb=10240, gpus=0)
    env = {**os.environ, "OPENFORGE_ADMIN_KEY": ADMIN_KEY}
    out = tmp_path / "late"
    argv = [sys.executable, "-m", "steps.rollout", "--task", item.task, "--harness", "direct", "--proxy-url",
            scripted_proxy.url, "--rollout-id", "late", "--out", str(out), "--agent-timeout", "900"]
    code, _ = run_rollout_step(argv, env, 40, out, "late", item, "direct")
    result = json.loads((out / "result.json").read_text())
    assert (code, result["status"], result["reward"]) == (0, "agent_timeout", 0.0), result
    assert result["killed"] == [{"process": "harness", "by": "time", "count": 1}] and "deadline of 40 s" in result["error"]
    assert not [line for line in os.popen("ps -eo args").read().splitlines() if line.strip() == "sleep 600"]
    # Control: a step that never got as far as its agent is an infra error, retried.
    code, _ = run_rollout_step([sys.executable, "-c", "import time; time.sleep(60)"], env, 2, tmp_path / "early",
                               "early", item, "direct")
    early = json.loads((tmp_path / "early" / "result.json").read_text())
    assert (code, early["status"], early["reward"]) == (3, "infra_error", None), early


def test_the_sandboxs_init_shows_no_host_path_and_what_it_is_sent_cannot_void_the_run(tmp_path):
    """bwrap is the sandbox's pid 1: its command line named the sandbox's root on the host, and its stderr (where the
    runner reads bwrap's setup errors) was open to the agent through /proc/1/fd/2, so writing there made any command
    a SandboxError, an infra_error, retried: a failing rollout voided."""
    task = load_task(BUILTIN_DATASET / "hello-file")
    box = LocalSandbox.create(tmp_path / "sandbox", task)
    out = tmp_path / "out.txt"
    script = ("echo 'bwrap: a setup error, forged' > /proc/1/fd/2 && echo forged; tr '\\0' ' ' < /proc/1/cmdline; "
              "echo; ls -l /proc/1/fd/ /proc/self/fd/")
    try:
        run = box.run(["bash", "-c", script], timeout_s=30, stdout_path=out)
    finally:
        box.remove()
    text = out.read_text()
    assert run.exit_code == 0 and "forged" in text, text  # the write went through, and changed nothing
    assert "bwrap --args" in text and str(tmp_path) not in text, text
