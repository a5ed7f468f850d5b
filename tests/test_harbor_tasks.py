"""Real-shaped Harbor tasks, whose Dockerfiles install what they need, built and graded in local mode.

`tests/data/harbor-tasks/` holds five tasks in the shape of the public Harbor sets (the cookbook's
recipes, TermiGen, Terminal-Bench 2): `FROM ubuntu:24.04` or `python:3.11-slim`, `RUN apt-get update &&
apt-get install -y ...`, `RUN pip3 install --break-system-packages pytest`, a virtual environment in
/opt, a tool written to /usr/local/bin; shell, Python and pytest verifiers. Each must build locally,
its oracle must pass `steps.tasks check`, an agent that does nothing must score 0, and what its RUN
steps installed must stay in the task's layer, never reaching the host. The pytest verifiers are also
attacked as an agent would (planted pytest config, a module that exits 0, a leftover process writing
the reward), each with the public sets' plain verifier as the control that is fooled.
`ini-to-json` is python:3.11-slim's plain `pip install -r requirements.txt` (PEP 668: see sandbox_build).

Nothing is downloaded: builds run with `OPENFORGE_BUILD_NETWORK=none` (`apt-get update` then warns and
keeps the host's package lists; every package the tasks install is one the host has), and pip
installs from wheels repacked from this venv (`tests/offline_packages.py`) through
`OPENFORGE_BUILD_WHEELS`. Layers are cached in a folder of this test session (`OPENFORGE_CACHE`).

    .venv/bin/python -m pytest -q tests/test_harbor_tasks.py      # about 70 s on two shared cores
"""

from __future__ import annotations

import os
import posixpath
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from importlib.metadata import PathDistribution, distribution
from pathlib import Path

import pytest

from steps.sandbox import LocalSandbox, SandboxError
from steps.tasks import Task, load_dataset, load_task
from steps.grading.check import OK, check_dataset
from steps.grading.verify import run_verifier
from tests.offline_packages import WheelError, build_wheels, repack_wheel

pytestmark = pytest.mark.slow  # every test builds task layers from Dockerfiles
REPO = Path(__file__).resolve().parents[1]
DATASET = REPO / "tests" / "data" / "harbor-tasks"
TASKS = sorted(path.name for path in DATASET.iterdir() if (path / "task.toml").is_file())
# What the tasks' RUN steps put into system folders, none of which the host has.
INSTALLED = {
    "jq-event-summary": ["/var/lib/apt/lists"],  # emptied by the RUN step: the host's lists stay
    "stock-reorder": ["/usr/local/bin/stockctl", "/opt/stockctl/stock.db"],
    "orders-report-pytest": ["/usr/bin/python", "/usr/local/bin/pytest"],
    "wordfreq-venv": ["/opt/venv/bin/pytest"],
    "ini-to-json": ["/usr/local/bin/pytest"],
}
# Tasks that do not build in local mode yet, with the reason (none today: a python:3.x-slim image's plain
# `pip install` works since RUN steps set PIP_BREAK_SYSTEM_PACKAGES, as that image's own pip would install).
BUILD_GAPS: dict[str, str] = {}


def task_params() -> list:
    """TASKS for parametrize, those in BUILD_GAPS expected to fail (strictly: a fix makes them fail loudly)."""
    return [pytest.param(name, marks=pytest.mark.xfail(raises=SandboxError, strict=True, reason=BUILD_GAPS[name]))
            if name in BUILD_GAPS else name for name in TASKS]



@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of pytest's wheels and its dependencies', repacked from this venv."""
    folder = tmp_path_factory.mktemp("wheels")
    build_wheels(["pytest"], folder)
    return folder


@pytest.fixture(scope="module")
def offline_build(wheels: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Every build in this module: no network, pip from `wheels`, layers cached for this module only.

    Yields the variables, for subprocesses that build (the CLI).
    """
    variables = {"OPENFORGE_BUILD_NETWORK": "none", "OPENFORGE_BUILD_WHEELS": str(wheels),
                 "OPENFORGE_CACHE": str(tmp_path_factory.mktemp("cache"))}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in variables.items():
            patch.setenv(name, value)
        yield variables


def task_named(name: str) -> Task:
    return load_task(DATASET / name)


def run_in(box: LocalSandbox, script: str, log: Path) -> tuple[int, str]:
    """Run a shell script in the sandbox; (exit code, its output)."""
    result = box.run(["bash", "-c", script], timeout_s=60, stdout_path=log)
    return result.exit_code, log.read_text(errors="replace")


def test_wheels_are_reproducible_and_install_offline(tmp_path):
    first = build_wheels(["pytest"], tmp_path / "a")
    second = build_wheels(["pytest"], tmp_path / "b")
    names = {path.name.split("-")[0].lower() for path in first}
    assert {"pytest", "pluggy", "iniconfig", "packaging", "pygments"} <= names
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second], "the same files give the same wheels"
    with zipfile.ZipFile(next(p for p in first if p.name.startswith("pytest-"))) as wheel:
        listed = wheel.namelist()
    assert not [name for name in listed if name.startswith("..") or name.endswith(".pyc")]
    assert any(name.endswith(".dist-info/RECORD") for name in listed)
    # The host's own python installs them with no index at all, and the pytest it gets runs.
    site = tmp_path / "site"
    subprocess.run(["/usr/bin/python3", "-m", "pip", "install", "-q", "--no-index", "--find-links", str(tmp_path / "a"),
                    "--target", str(site), "pytest"], check=True, capture_output=True, timeout=120)
    version = subprocess.run(["/usr/bin/python3", "-m", "pytest", "--version"], env={"PYTHONPATH": str(site)},
                             capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and distribution("pytest").version in version.stdout + version.stderr


def installed_distribution(site: Path, name: str, wheel_tag: str, editable: bool = False) -> PathDistribution:
    """A distribution installed by hand into `site`: one module and its .dist-info, as pip leaves them."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (site / f"{name}.py").write_text("VALUE = 1\n")
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    purelib = "true" if wheel_tag == "py3-none-any" else "false"
    (info / "WHEEL").write_text(f"Wheel-Version: 1.0\nRoot-Is-Purelib: {purelib}\nTag: {wheel_tag}\n")
    if editable:
        (info / "direct_url.json").write_text('{"url": "file:///src", "dir_info": {"editable": true}}')
    (info / "RECORD").write_text(f"{name}.py,,\n{info.name}/METADATA,,\n{info.name}/WHEEL,,\n{info.name}/RECORD,,\n"
                                 f"../../../bin/{name},,\n")
    return PathDistribution(info)


def test_binary_and_editable_distributions_are_not_repacked(tmp_path):
    site, out = tmp_path / "site", tmp_path / "wheels"
    out.mkdir()
    with pytest.raises(WheelError, match="compiled is not a pure-Python"):
        repack_wheel(installed_distribution(site, "compiled", "cp311-cp311-manylinux_2_17_x86_64"), out)
    with pytest.raises(WheelError, match="from_source is an editable install"):
        repack_wheel(installed_distribution(site, "from_source", "py3-none-any", editable=True), out)
    with pytest.raises(WheelError, match="no-such-distribution-here is not installed"):
        build_wheels(["no-such-distribution-here"], out)
    # The control: a pure one is repacked, with its module and metadata but not the script outside site-packages.
    with zipfile.ZipFile(repack_wheel(installed_distribution(site, "pure", "py3-none-any"), out)) as wheel:
        assert wheel.namelist() == ["pure-1.0.dist-info/METADATA", "pure-1.0.dist-info/WHEEL", "pure.py",
                                    "pure-1.0.dist-info/RECORD"]
        assert wheel.read("pure.py") == b"VALUE = 1\n"


def test_tasks_load_with_their_harbor_fields():
    tasks, errors = load_dataset(DATASET)
    assert errors == []
    assert sorted(task.name for task in tasks) == TASKS == sorted(INSTALLED)
    for task in tasks:
        assert task.dockerfile is not None and task.solution_dir is not None
        assert not task.config.ignored_fields, f"{task.name}: {task.config.ignored_fields}"


def test_every_oracle_passes_check(offline_build, tmp_path):
    tasks, errors = load_dataset(DATASET)
    results = check_dataset(tasks, errors, tmp_path, jobs=2)
    failures = {r.task: f"{r.reason}\n{r.details}" for r in results if r.status != OK}
    assert sorted(failures) == sorted(BUILD_GAPS), failures
    assert len(results) == len(TASKS)


@pytest.mark.parametrize("name", task_params())
def test_an_agent_that_does_nothing_scores_zero(offline_build, tmp_path, name):
    task = task_named(name)
    box = LocalSandbox.create(tmp_path / "sandbox", task)
    try:
        verdict = run_verifier(box, task, tmp_path / "verifier")
    finally:
        box.remove()
    log = (verdict.output_dir / "test-stdout.txt").read_text(errors="replace")
    assert verdict.reward == 0, f"{verdict.error}\n{log[-2000:]}"  # 0, not None: the verifier ran and said no


@pytest.mark.parametrize("name", task_params())
def test_what_run_installed_stays_in_the_task_layer(offline_build, tmp_path, name):
    task = task_named(name)
    host_lists = sorted(os.listdir("/var/lib/apt/lists"))
    host_has = {path for path in INSTALLED[name] if Path(path).exists()}
    host_has_pytest = host_imports_pytest()
    box = LocalSandbox.create(tmp_path / "sandbox", task)
    try:
        for path in INSTALLED[name]:
            if path == "/var/lib/apt/lists":
                code, output = run_in(box, f'test -z "$(ls -A {path})"', tmp_path / "check.log")
                assert code == 0, f"{path} should be empty in the sandbox after the RUN step's rm: {output}"
            else:
                code, output = run_in(box, f"test -e {path}", tmp_path / "check.log")
                assert code == 0, f"{path} is missing in the sandbox: {output}"
                assert path in host_has or not Path(path).exists(), f"{path} reached the host"
    finally:
        box.remove()
    assert sorted(os.listdir("/var/lib/apt/lists")) == host_lists, "a RUN step changed the host's apt lists"
    assert host_imports_pytest() == host_has_pytest, "pip installed pytest into the host's python"


def host_imports_pytest() -> bool:
    return subprocess.run(["/usr/bin/python3", "-c", "import pytest"], capture_output=True, timeout=60).returncode == 0


def test_offline_build_without_wheels_fails_at_the_pip_step(offline_build, tmp_path, monkeypatch):
    # The control for the fixture: with the network off and no wheels, nothing can be fetched.
    monkeypatch.delenv("OPENFORGE_BUILD_WHEELS")
    monkeypatch.setenv("OPENFORGE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SandboxError, match=r"line 12 \(RUN\)"):
        LocalSandbox.create(tmp_path / "sandbox", task_named("orders-report-pytest"))


def build_note(root: Path) -> str:
    """The sandbox's build.log, which says when the task's layer came from the cache ("" when it was built)."""
    log = root / "build.log"
    return log.read_text() if log.is_file() else ""


def test_a_second_build_reuses_the_cached_layer(offline_build, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENFORGE_CACHE", str(tmp_path / "cache"))  # empty: the first build really builds
    task = task_named("stock-reorder")
    first = LocalSandbox.create(tmp_path / "first", task)
    first_note = build_note(first.root)
    first.remove()
    second = LocalSandbox.create(tmp_path / "second", task)
    try:
        second_note = build_note(second.root)
        code, output = run_in(second, "stockctl show SKU-1112", tmp_path / "show.log")
    finally:
        second.remove()
    assert "reused" not in first_note and "was built before; reused" in second_note
    assert code == 0 and "gasket 8mm" in output, output
    assert second.layer == first.layer and first.layer.is_relative_to(tmp_path / "cache")
    assert [p for p in first.layer.rglob("stockctl") if p.as_posix().endswith("usr/local/bin/stockctl")]
    # The control: a changed build context is a different layer, built anew.
    changed = tmp_path / "changed"
    shutil.copytree(task.path, changed)
    with open(changed / "environment" / "seed.sql", "a") as seed:
        seed.write("INSERT INTO items VALUES ('SKU-2000', 'shim 1mm', 0, 10);\n")
    third = LocalSandbox.create(tmp_path / "third", load_task(changed))
    third_note = build_note(third.root)
    third.remove()
    assert third.layer != first.layer and "reused" not in third_note


PLANTED_PYTEST_INI = "[pytest]\n"
# Turns every test's report into a pass: what a verifier must never let the agent's files do.
PLANTED_CONFTEST = """import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""


def test_planted_pytest_config_cannot_pass_the_verifier(offline_build, tmp_path):
    task = task_named("orders-report-pytest")
    box = LocalSandbox.create(tmp_path / "sandbox", task)
    try:
        for folder in ("/", "/workspace"):
            box.host_path(folder).joinpath("pytest.ini").write_text(PLANTED_PYTEST_INI)
            box.host_path(folder).joinpath("conftest.py").write_text(PLANTED_CONFTEST)
        verdict = run_verifier(box, task, tmp_path / "verifier")
        assert verdict.reward == 0, verdict.error
        # The control: the same tests as the public sets ship them (no pytest.ini of their own) and run
        # them (a plain `pytest DIR/test_outputs.py`) are fooled by the planted files.
        box.copy_in(task.tests_dir / "test_outputs.py", "/plain-tests/test_outputs.py")
        code, output = run_in(box, "cd /workspace && pytest /plain-tests/test_outputs.py -rA", tmp_path / "plain.log")
        assert code == 0 and "3 passed" in output, output[-2000:]
    finally:
        box.remove()


# Agent code that the tests will run: it leaves a process behind that keeps writing a reward of 1,
# which the runner prefers to reward.txt, then exits 0 without doing the task.
REWARD_WRITER = """import os
import time

if os.fork() == 0:
    os.setsid()
    for fd in (0, 1, 2):
        os.close(fd)
    while True:
        try:
            with open(f"/logs/verifier/.{os.getpid()}", "w") as reward:
                reward.write('{"reward": 1}')
            os.replace(f"/logs/verifier/.{os.getpid()}", "/logs/verifier/reward.json")
        except OSError:
            pass
        time.sleep(0.005)
os._exit(0)
"""
# The public sets' verifier: the tests' exit code becomes the reward, whatever else is running.
PLAIN_TEST_SH = """#!/bin/bash
cd {workdir}
{pytest} /tests/test_outputs.py -rA
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


@pytest.mark.parametrize(("name", "agent_file", "pytest_path"), [
    ("orders-report-pytest", "/workspace/report.py", "pytest"),
    ("wordfreq-venv", "/app/wordfreq.py", "/opt/venv/bin/pytest"),
])
def test_agent_code_run_by_the_tests_cannot_write_the_reward(offline_build, tmp_path, name, agent_file, pytest_path,
                                                             monkeypatch):
    task = task_named(name)
    # The control: the same task with the public sets' plain test.sh, run without the grading supervisor
    # (which alone also catches the writer: tests/test_attacks.py), is fooled.
    plain = tmp_path / "plain"
    shutil.copytree(task.path, plain)
    (plain / "tests" / "test.sh").write_text(PLAIN_TEST_SH.format(workdir=posixpath.dirname(agent_file),
                                                                  pytest=pytest_path))
    for label, graded_task, expected in (("hardened", task, 0), ("plain", load_task(plain), 1)):
        if label == "plain":
            monkeypatch.setattr(LocalSandbox, "supervised", lambda self, supervised, plain: plain)
        box = LocalSandbox.create(tmp_path / f"sandbox-{label}", graded_task)
        try:
            box.host_path(agent_file).write_text(REWARD_WRITER)
            verdict = run_verifier(box, graded_task, tmp_path / f"verifier-{label}")
        finally:
            box.remove()
        log = (verdict.output_dir / "test-stdout.txt").read_text(errors="replace")
        assert " failed" in log, log[-2000:]  # every test fails: the task is not done
        assert verdict.reward == expected, f"{label}: {verdict.error}\n{log[-2000:]}"


# Tests as the public sets write them: the agent's module imported into pytest itself.
IN_PROCESS_TESTS = """import sys
sys.path.insert(0, "/app")


def test_counts_ignore_case():
    from wordfreq import top_words
    assert top_words("The cat. the CAT! The end.", 2) == [("the", 3), ("cat", 2)]
"""


def test_agent_module_that_exits_0_cannot_pass_the_tests(offline_build, tmp_path):
    task = task_named("wordfreq-venv")
    # The control: the same verifier with tests that import the agent's module is fooled.
    in_process = tmp_path / "in-process"
    shutil.copytree(task.path, in_process)
    (in_process / "tests" / "test_outputs.py").write_text(IN_PROCESS_TESTS)
    for label, graded_task, expected in (("child process", task, 0), ("in process", load_task(in_process), 1)):
        box = LocalSandbox.create(tmp_path / f"sandbox-{label}", graded_task)
        try:
            box.host_path("/app/wordfreq.py").write_text("import os\n\nos._exit(0)\n")
            verdict = run_verifier(box, graded_task, tmp_path / f"verifier-{label}")
        finally:
            box.remove()
        log = (verdict.output_dir / "test-stdout.txt").read_text(errors="replace")
        assert verdict.reward == expected, f"{label}: {verdict.error}\n{log[-2000:]}"


def test_check_cli_builds_and_grades_a_task(offline_build):
    run = subprocess.run([sys.executable, "-m", "steps.tasks", "check", str(DATASET / "stock-reorder")], cwd=REPO,
                         env={**os.environ, **offline_build}, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 tasks: 1 ok, 0 broken, 0 skipped" in run.stdout
