"""Harbor tasks, the bubblewrap sandbox, `steps.tasks check` and the metrics, with real parts.

Every sandbox here is a real bwrap namespace (install with `apt-get install -y bubblewrap`); the
built-in dataset's oracles and verifiers really run. About 15 s on two cores:

    .venv/bin/python -m pytest -q tests/test_tasks.py
"""

from __future__ import annotations

import doctest
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import steps.sandbox.dockerfile
import steps.metrics
import steps.tasks.schema
import steps.grading.verify
from steps.sandbox.network import ProxyTunnel
from steps.sandbox import LocalSandbox, SandboxError
from steps.tasks import BUILTIN_DATASET, DatasetError, load_dataset, load_task
from steps.grading.verify import run_verifier

REPO = Path(__file__).resolve().parents[1]
TASK_TOML = """schema_version = "1.1"
[metadata]
difficulty = "easy"
category = "test"
[agent]
timeout_sec = 30.0
[verifier]
timeout_sec = 30.0
[environment]
build_timeout_sec = 60.0
"""
REWARD_WHEN_ANSWER_IS_42 = """#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/answer.txt 2>/dev/null)" = "42" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


def make_task(root: Path, name: str, dockerfile: str = "FROM python:3.11-slim\nWORKDIR /app\n",
              files: dict[str, str] | None = None, solve: str = "echo 42 > /app/answer.txt\n",
              test: str = REWARD_WHEN_ANSWER_IS_42) -> Path:
    """Write a small task folder: `files` maps paths (relative to the task) to contents."""
    contents = {"task.toml": TASK_TOML, "instruction.md": "Write 42 into /app/answer.txt.\n",
                "environment/Dockerfile": dockerfile, "tests/test.sh": test, "solution/solve.sh": solve,
                **(files or {})}
    for relative, text in contents.items():
        path = root / name / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / name


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "steps.tasks", *args], cwd=REPO, capture_output=True,
                          text=True, check=False, timeout=300)


def processes_with(marker: str) -> list[int]:
    """Live pids whose command line contains `marker` (zombies, already dead, are not counted)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in cmdline and state != "Z" and int(entry) != os.getpid():
            found.append(int(entry))
    return found


# --- loading ---------------------------------------------------------------------------------------

def test_builtin_dataset_loads_with_graded_difficulty():
    tasks, errors = load_dataset(BUILTIN_DATASET)
    assert errors == []
    assert len(tasks) >= 12
    assert {t.difficulty for t in tasks} >= {"trivial", "easy", "medium", "hard"}
    for task in tasks:
        assert task.config.agent_timeout_s == 300 and task.config.verifier_timeout_s == 60, task.name
        assert task.category and task.solve_script.is_file() and task.dockerfile is not None, task.name
        assert "/app" in task.instruction, task.name
        assert sum(f.stat().st_size for f in task.path.rglob("*") if f.is_file()) < 16_000, task.name


def test_broken_tasks_get_one_error_each_and_the_rest_load(tmp_path):
    dataset = tmp_path / "dataset"
    shutil.copytree(BUILTIN_DATASET, dataset)
    (dataset / "hello-file" / "instruction.md").unlink()
    (dataset / "count-errors" / "task.toml").write_text('version = "1.0"\n[agent]\ntimeout_sec = = 3\n')
    (dataset / "csv-stats" / "tests" / "test.sh").unlink()
    (dataset / "edit-config" / "task.toml").write_text("[agent]\ntimeout = 300\n")
    (dataset / "unique-names" / "task.toml").write_text('[verifier]\ntimeout_sec = "fast"\n')
    shutil.rmtree(dataset / "greet-script" / "environment")

    tasks, errors = load_dataset(dataset)

    messages = {error.task: error.message for error in errors}
    assert messages["hello-file"] == "instruction.md is missing"
    assert messages["count-errors"].startswith("task.toml is not valid TOML:") and "line 3" in messages["count-errors"]
    assert messages["csv-stats"] == "tests/test.sh (the verifier) is missing"
    assert messages["edit-config"] == "task.toml: unknown field [agent] timeout (did you mean timeout_sec?)"
    assert messages["unique-names"] == "task.toml: [verifier] timeout_sec must be a number of seconds > 0, got 'fast'"
    assert "environment/Dockerfile is missing" in messages["greet-script"]
    assert len(errors) == 6
    assert len(tasks) == len(list(BUILTIN_DATASET.iterdir())) - 6
    assert str(errors[0]).startswith(f"{errors[0].task}: ")


def test_dataset_as_list_file_or_python_list(tmp_path):
    (tmp_path / "tasks.txt").write_text(f"# two tasks\n{BUILTIN_DATASET}/hello-file\n{BUILTIN_DATASET}/csv-stats\n")
    (tmp_path / "tasks.yaml").write_text(f"tasks:\n  - {BUILTIN_DATASET}/hello-file\n")
    assert [t.name for t in load_dataset(tmp_path / "tasks.txt")[0]] == ["hello-file", "csv-stats"]
    assert [t.name for t in load_dataset(tmp_path / "tasks.yaml")[0]] == ["hello-file"]
    assert [t.name for t in load_dataset(BUILTIN_DATASET / "hello-file")[0]] == ["hello-file"]
    tasks, errors = load_dataset([BUILTIN_DATASET / "hello-file", BUILTIN_DATASET / "hello-file"])
    assert len(tasks) == 1 and "same task name" in errors[0].message
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset(tmp_path / "nowhere")


def test_harbor_fields_and_defaults(tmp_path):
    path = make_task(tmp_path, "full")
    (path / "task.toml").write_text("""version = "1.0"
[metadata]
author_name = "x"
[verifier]
env = { MODE = "strict" }
[agent]
timeout_sec = 120.0
[environment]
workdir = "/work/here"
memory = "4G"
storage = "20G"
cpus = 2
allow_internet = false
""")
    (path / "instruction.md").write_text("<!-- harbor-canary GUID 1234 -->\n\nDo the thing in /app.\n")
    task = load_task(path)
    assert task.instruction == "Do the thing in /app.\n"
    assert task.config.agent_timeout_s == 120 and task.config.verifier_timeout_s == 600
    resources = task.config.resources
    assert (resources.memory_mb, resources.storage_mb, resources.cpus) == (4096, 20480, 2)
    assert task.config.verifier_env == {"MODE": "strict"} and task.config.allow_internet is False
    assert LocalSandbox.create(tmp_path / "box", task).workdir == "/work/here"


def test_newer_harbor_schema_loads_and_unknown_fields_are_listed(tmp_path):
    path = make_task(tmp_path, "newer")
    (path / "task.toml").write_text("""schema_version = "2.0"
artifacts = []
[task]
name = "harbor/hello-world"
authors = [{ name = "A", email = "a@example.com" }]
[verifier]
timeout_sec = 120.0
[environment]
memory_mb = 1024
network_mode = "public"
sandbox_flavour = "firecracker"
""")
    task = load_task(path)
    assert task.name == "harbor/hello-world" and task.config.verifier_timeout_s == 120
    assert task.config.ignored_fields == ("[environment] sandbox_flavour",)
    assert "ignores [environment] sandbox_flavour" in run_cli("list", str(path)).stdout


# --- steps.tasks check -----------------------------------------------------------------------------

@pytest.mark.parametrize("dataset", [BUILTIN_DATASET, BUILTIN_DATASET.parent / "toy"], ids=["builtin", "toy"])
def test_check_shipped_datasets_all_oracles_pass(dataset):
    done = run_cli("check", str(dataset), "--jobs", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    count = len(load_dataset(dataset)[0])
    assert f"{count} tasks: {count} ok, 0 broken" in done.stdout
    assert "FROM image is replaced by the host system" in done.stdout
    assert done.stdout.count(" ok ") == count


def test_a_graded_file_reaches_the_verifier_and_a_missing_one_is_simply_absent(tmp_path):
    """`graded_paths` may name single files (the toy task grades /logs/agent/answer.txt): one the oracle wrote
    is graded; one it never wrote is absent for the verifier, which then rejects the work: not a crash."""
    graded = TASK_TOML.replace("[verifier]\n", '[verifier]\ngraded_paths = ["/logs/agent/reply.txt"]\n')
    test = REWARD_WHEN_ANSWER_IS_42.replace("/app/answer.txt", "/logs/agent/reply.txt")
    dataset = tmp_path / "tasks"
    make_task(dataset, "writes-it", files={"task.toml": graded}, test=test,
              solve="mkdir -p /logs/agent && echo 42 > /logs/agent/reply.txt\n")
    make_task(dataset, "never-writes-it", files={"task.toml": graded}, test=test, solve="true\n")
    done = run_cli("check", str(dataset), "--jobs", "2")
    lines = {line.split()[2]: line for line in done.stdout.splitlines() if line.startswith("[")}
    assert " ok " in lines["writes-it"], done.stdout
    assert "reward 0 != 1" in lines["never-writes-it"] and "crashed" not in lines["never-writes-it"], done.stdout


def test_check_names_each_broken_task_with_its_reason(tmp_path):
    dataset = tmp_path / "dataset"
    shutil.copytree(BUILTIN_DATASET / "hello-file", dataset / "hello-file")
    make_task(dataset, "no-instruction").joinpath("instruction.md").unlink()
    make_task(dataset, "oracle-fails", solve="echo 'cannot do it'\nexit 3\n")
    make_task(dataset, "oracle-rejected", solve="echo 41 > /app/answer.txt\n")
    make_task(dataset, "verifier-crashes", test="#!/bin/bash\necho 'checker blew up'\nexit 5\n")
    make_task(dataset, "build-fails", dockerfile="FROM debian:12\nRUN echo 'no such package' && exit 4\n")
    make_task(dataset, "no-oracle").joinpath("solution", "solve.sh").unlink()
    hangs = make_task(dataset, "oracle-hangs", solve="sleep 600\n")
    (hangs / "task.toml").write_text(TASK_TOML.replace("[agent]\ntimeout_sec = 30.0", "[agent]\ntimeout_sec = 1.0"))

    done = run_cli("check", str(dataset), "--jobs", "2", "--work-dir", str(tmp_path / "work"))

    assert done.returncode == 1, done.stdout + done.stderr
    lines = {re.match(r"\[\s*\d+/\d+\] \S+\s+([^\s:]+)", line).group(1): line
             for line in done.stdout.splitlines() if line.startswith("[")}
    assert " ok " in lines["hello-file"] and " skipped " in lines["no-oracle"]
    assert "broken  no-instruction: load error: instruction.md is missing" in lines["no-instruction"]
    assert "oracle failed with exit code 3" in lines["oracle-fails"]
    assert "reward 0 != 1" in lines["oracle-rejected"]
    assert "oracle timed out after 1 s" in lines["oracle-hangs"]
    assert "verifier crashed: the verifier wrote neither reward.txt nor reward.json (test.sh exit code 5)" \
        in lines["verifier-crashes"]
    assert "environment build failed: environment/Dockerfile line 2 (RUN): RUN failed with exit code 4" \
        in lines["build-fails"]
    for tail in ("| no such package", "| cannot do it", "| checker blew up"):  # the log lines that explain it
        assert f"\n    {tail}\n" in done.stdout
    assert "8 tasks: 1 ok, 6 broken, 1 skipped" in done.stdout
    kept = tmp_path / "work" / "oracle-rejected" / "sandbox" / "disk.img"  # the oracle's changes, kept for a look
    shown = subprocess.run(["debugfs", "-R", "cat /root/app/answer.txt", str(kept)], capture_output=True, text=True)
    assert shown.stdout == "41\n", shown.stderr
    assert not (tmp_path / "work" / "hello-file" / "sandbox").exists()  # kept only for broken tasks


# --- sandbox ---------------------------------------------------------------------------------------

DOCKERFILE = """FROM python:3.11-slim
ARG GREETING=hello
ENV APP_HOME=/app \\
    MESSAGE="two words"
WORKDIR $APP_HOME
COPY data/ ./data/
COPY *.txt /opt/notes/
COPY --chmod=755 run.sh .
RUN echo "$GREETING $MESSAGE" > built.txt && mkdir -p /srv/cache && ./run.sh > /srv/cache/out
RUN <<EOF
echo "from a heredoc" > /app/heredoc.txt
EOF
WORKDIR sub
USER nobody
CMD ["sleep", "infinity"]
"""


@pytest.fixture
def env_task(tmp_path) -> Path:
    return make_task(tmp_path, "env-task", dockerfile=DOCKERFILE, files={
        "environment/data/input.csv": "a,b\n1,2\n", "environment/one.txt": "1\n", "environment/two.txt": "2\n",
        "environment/run.sh": "#!/bin/sh\necho ran in $(pwd)\n"})


def test_dockerfile_workdir_copy_env_run_are_applied(env_task, tmp_path):
    box = LocalSandbox.create(tmp_path / "box", load_task(env_task))
    assert box.workdir == "/app/sub"
    assert box.env["APP_HOME"] == "/app" and box.env["MESSAGE"] == "two words" and "GREETING" not in box.env
    assert box.host_path("/app/built.txt").read_text() == "hello two words\n"
    assert box.host_path("/app/data/input.csv").read_text() == "a,b\n1,2\n"
    assert sorted(p.name for p in box.host_path("/opt/notes").iterdir()) == ["one.txt", "two.txt"]
    assert os.access(box.host_path("/app/run.sh"), os.X_OK)
    assert box.host_path("/srv/cache/out").read_text() == "ran in /app\n"
    assert box.host_path("/app/heredoc.txt").read_text() == "from a heredoc\n"
    assert any("FROM python:3.11-slim" in note and "host system" in note for note in box.notes)
    assert any("USER nobody is ignored" in note for note in box.notes)
    out = tmp_path / "out.txt"
    result = box.run(["sh", "-c", "pwd; echo $MESSAGE; echo ${GREETING:-unset}; id -u"], timeout_s=30, stdout_path=out)
    assert result.exit_code == 0 and not result.timed_out
    assert out.read_text() == "/app/sub\ntwo words\nunset\n0\n"


def test_failing_run_step_raises_with_its_output(tmp_path):
    dockerfile = "FROM debian:12\nWORKDIR /app\nRUN echo boom-output && exit 7\n"
    task = load_task(make_task(tmp_path, "bad-run", dockerfile=dockerfile))
    with pytest.raises(SandboxError) as failure:
        LocalSandbox.create(tmp_path / "box", task)
    message = str(failure.value)
    assert "line 3" in message and "exit code 7" in message and "boom-output" in message
    with pytest.raises(SandboxError, match="not empty"):
        LocalSandbox.create(tmp_path / "box", task)


def test_timeout_kills_the_whole_process_tree(tmp_path):
    box = LocalSandbox.create(tmp_path / "box", load_task(make_task(tmp_path, "t")))
    marker = f"{time.time() % 1000 + 1000:.6f}"  # a unique `sleep` argument to find the processes by
    script = f"sleep {marker} & (setsid sleep {marker} &) ; nohup sleep {marker} >/dev/null 2>&1 & exec sleep {marker}"
    started = time.monotonic()
    result = box.run(["bash", "-c", script], timeout_s=1.5)
    assert result.timed_out and result.exit_code != 0
    assert time.monotonic() - started < 10
    assert processes_with(f"sleep {marker}") == []


def test_background_processes_end_with_their_command(tmp_path):
    box = LocalSandbox.create(tmp_path / "box", load_task(make_task(tmp_path, "t")))
    marker = f"{time.time() % 1000 + 2000:.6f}"
    result = box.run(["bash", "-c", f"(setsid sleep {marker} &); echo started"], timeout_s=30)
    assert result.exit_code == 0 and not result.timed_out
    assert processes_with(f"sleep {marker}") == []


def test_sandbox_setup_failure_is_an_error_not_an_exit_code(tmp_path):
    box = LocalSandbox.create(tmp_path / "box", load_task(make_task(tmp_path, "t")))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SandboxError, match="cannot bind .* at /opt/ro/inside in the sandbox: Read-only"):
        box.run(["true"], timeout_s=30, extra_binds=[(empty, "/opt/ro", True), (empty, "/opt/ro/inside", True)])
    with pytest.raises(SandboxError, match="working directory /nowhere does not exist"):
        box.run(["true"], timeout_s=30, cwd="/nowhere")
    out = tmp_path / "out.txt"
    assert box.run(["no-such-harness"], timeout_s=30, stdout_path=out).exit_code == 127  # the command's failure
    assert "not found" in out.read_text()


def test_verifier_is_invisible_until_copied_in(tmp_path):
    task = load_task(make_task(tmp_path, "t"))
    box = LocalSandbox.create(tmp_path / "box", task)
    out = tmp_path / "agent.txt"
    probe = f"ls /tests; cat {task.test_script}; ls {task.path}; ls /; echo done"
    box.run(["sh", "-c", probe], timeout_s=30, stdout_path=out)
    seen = out.read_text()
    assert "No such file or directory" in seen and "reward.txt" not in seen and "done" in seen
    assert "tests" not in seen.split("done")[0].split()  # not in `ls /` either
    box.copy_in(task.tests_dir, "/tests")
    assert box.run(["grep", "-q", "reward.txt", "/tests/test.sh"], timeout_s=30).exit_code == 0


def test_absolute_paths_and_host_path(tmp_path):
    box = LocalSandbox.create(tmp_path / "box", load_task(make_task(tmp_path, "t")))
    script = "echo 42 > answer.txt; echo 1 > /logs/verifier/reward.txt; echo x > /tmp/x; echo y > ~/y"
    result = box.run(["sh", "-c", script], timeout_s=30)
    assert result.exit_code == 0
    assert box.host_path("/app/answer.txt") == tmp_path / "box" / "merged" / "app" / "answer.txt"
    assert box.host_path("/app/answer.txt").read_text() == "42\n"
    assert box.host_path("/logs/verifier/reward.txt").read_text() == "1\n"
    assert box.host_path("/root/y").read_text() == "y\n" and box.host_path("/tmp/x").is_file()
    assert box.run(["touch", "/usr/evil"], timeout_s=30).exit_code == 0  # the sandbox's own layer of /usr...
    assert not Path("/usr/evil").exists() and (tmp_path / "box" / "upper" / "sys" / "usr" / "evil").is_file()
    box.remove()  # ...which never reaches the host's


def test_agent_symlinks_cannot_redirect_host_side_copies(tmp_path):
    task = load_task(make_task(tmp_path, "t"))
    box = LocalSandbox.create(tmp_path / "box", task)
    outside = tmp_path / "outside"
    outside.mkdir()
    box.run(["sh", "-c", f"ln -s {outside} /tests; ln -s {outside} /app/escape"], timeout_s=30)
    box.copy_in(task.tests_dir, "/tests")
    assert list(outside.iterdir()) == []
    assert box.host_path("/tests/test.sh").is_file() and not box.host_path("/tests").is_symlink()
    assert box.host_path("/app/escape").is_relative_to(box.fs)  # resolved inside the sandbox


def test_reward_planted_by_the_agent_does_not_count(tmp_path):
    task = load_task(make_task(tmp_path, "t"))
    box = LocalSandbox.create(tmp_path / "box", task)
    cheat = ("echo '{\"reward\": 1}' > /logs/verifier/reward.json; mkdir -p /tests; "
             "printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh")
    box.run(["sh", "-c", cheat], timeout_s=30)
    verdict = run_verifier(box, task, tmp_path / "verifier")
    assert verdict.reward == 0.0 and verdict.error is None
    assert (tmp_path / "verifier" / "reward.txt").read_text() == "0\n"


def test_the_network_is_loopback_only_and_a_tunnel_reaches_one_host_port(tmp_path):
    box = LocalSandbox.create(tmp_path / "box", load_task(make_task(tmp_path, "t")))
    servers = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    ports = [server.getsockname()[1] for server in servers]
    for server in servers:
        threading.Thread(target=lambda s=server: [s.accept()[0].close() for _ in range(3)], daemon=True).start()

    def connect(port: int) -> list[str]:
        return ["python3", "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5)"]
    try:
        assert box.run(connect(ports[0]), timeout_s=30).exit_code != 0  # by default: nothing of the host's
        with ProxyTunnel(f"of-test-{os.getpid()}", "127.0.0.1", ports[0]) as tunnel:
            assert box.run(connect(ports[0]), timeout_s=30, network=tunnel).exit_code == 0  # the tunnel's port
            assert box.run(connect(ports[1]), timeout_s=30, network=tunnel).exit_code != 0  # and nothing else
        control = socket.create_connection(("127.0.0.1", ports[1]), timeout=5)  # it was listening all along
        control.close()
    finally:
        for server in servers:
            server.close()
        box.remove()


def test_harness_folder_bound_read_only(tmp_path):
    box = LocalSandbox.create(tmp_path / "box", load_task(make_task(tmp_path, "t")))
    harness = tmp_path / "harnesses" / "tool-1.0"
    harness.mkdir(parents=True)
    (harness / "tool").write_text("#!/bin/sh\necho tool says $1\n")
    (harness / "tool").chmod(0o755)
    out = tmp_path / "out.txt"
    bind = [(tmp_path / "harnesses", "/opt/openforge/harnesses", True)]
    assert box.run(["/opt/openforge/harnesses/tool-1.0/tool", "hi"], timeout_s=30, stdout_path=out,
                   extra_binds=bind).exit_code == 0
    assert out.read_text() == "tool says hi\n"
    assert box.run(["touch", "/opt/openforge/harnesses/x"], timeout_s=30, extra_binds=bind).exit_code != 0
    assert not (harness.parent / "x").exists()


# --- pure functions --------------------------------------------------------------------------------

@pytest.mark.parametrize("module", [steps.metrics, steps.sandbox.dockerfile, steps.tasks.schema, steps.grading.verify])
def test_doctests(module):
    failures, tried = doctest.testmod(module)
    assert tried > 0 and failures == 0


def test_metrics_over_a_dataset():
    per_task, overall = steps.metrics.dataset_metrics(
        {"always": [1.0] * 4, "never": [0.0] * 4, "half": [1.0, 0.0, 1.0, 0.0], "flaky-infra": [1.0, None, None, 0.0]},
        k=2)
    assert per_task["half"].pass_at_k == pytest.approx(5 / 6) and per_task["half"].pass_hat_k == pytest.approx(1 / 6)
    assert per_task["flaky-infra"].tries == 2
    assert overall.pass_at_k == pytest.approx((1 + 0 + 5 / 6 + 1) / 4)
    assert overall.pass_hat_k == pytest.approx((1 + 0 + 1 / 6 + 0) / 4)
    assert json.dumps(overall.__dict__)  # plain numbers, ready for a result file


def test_a_sandbox_left_mounted_by_a_killed_runner_is_swept_by_the_next_one(tmp_path):
    """SIGKILL skips a runner's exit handlers: its sandbox stays mounted until the next sandbox is made."""
    code = ("import os, sys\nfrom pathlib import Path\nfrom steps.sandbox.local import LocalSandbox\nfrom steps.tasks import load_task\n"
            "LocalSandbox.create(Path(sys.argv[1]), load_task(Path(sys.argv[2])))\nos.kill(os.getpid(), 9)\n")
    dead = tmp_path / "dead"
    subprocess.run([sys.executable, "-c", code, str(dead), str(BUILTIN_DATASET / "hello-file")], check=False)
    assert os.path.ismount(dead / "merged") and os.path.ismount(dead / "upper")  # the leak, as it was
    box = LocalSandbox.create(tmp_path / "next", load_task(BUILTIN_DATASET / "hello-file"))
    box.remove()
    assert not os.path.ismount(dead / "merged") and not os.path.ismount(dead / "upper")
