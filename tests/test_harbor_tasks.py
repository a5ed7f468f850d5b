"""Real-shaped Harbor tasks, whose Dockerfiles install what they need, built and graded in local mode.

`tests/data/harbor-tasks/` holds five tasks in the shape of the public Harbor sets (the cookbook's
recipes, TermiGen, Terminal-Bench 2): `FROM ubuntu:24.04` or `python:3.11-slim`, `RUN apt-get update &&
apt-get install -y ...`, `RUN pip3 install --break-system-packages pytest`, a virtual environment in
/opt, a tool written to /usr/local/bin; shell, Python and pytest verifiers. Each must build locally,
its oracle must pass `steps.tasks check`, an agent that does nothing must score 0, and what its RUN
steps installed must stay in the task's layer, never reaching the host.

Nothing is downloaded: builds run with `OPENFORGE_BUILD_NETWORK=none` (`apt-get update` then warns and
keeps the host's package lists; every package the tasks install is one the host has), and pip
installs from wheels repacked from this venv (`tests/offline_packages.py`) through
`OPENFORGE_BUILD_WHEELS`. Layers are cached in a folder of this test session (`OPENFORGE_CACHE`).

    .venv/bin/python -m pytest -q tests/test_harbor_tasks.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from importlib.metadata import distribution
from pathlib import Path

import pytest

from steps.sandbox import Sandbox, SandboxError
from steps.tasks import Task, load_dataset, load_task
from steps.tasks.check import OK, check_dataset
from steps.tasks.verify import run_verifier
from tests.offline_packages import WheelError, build_wheels, repack_wheel

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
# Until local mode's sandbox root is layered, a RUN step cannot write /usr, /var or /opt and a build
# has no switch for its network; these tests would fail, or reach PyPI, so they wait for it.
needs_layered_root = pytest.mark.skip(reason="waits for the layered sandbox root (branch sandbox, 'sandbox: layered "
                                             "root'): RUN steps writing /usr and /var, OPENFORGE_BUILD_NETWORK, "
                                             "OPENFORGE_BUILD_WHEELS and OPENFORGE_CACHE")


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


def run_in(box: Sandbox, script: str, log: Path) -> tuple[int, str]:
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


def test_binary_and_editable_distributions_are_not_repacked(tmp_path):
    with pytest.raises(WheelError, match="(?i)markupsafe is not a pure-Python"):
        repack_wheel(distribution("markupsafe"), tmp_path)
    with pytest.raises(WheelError, match="editable"):
        repack_wheel(distribution("openforge"), tmp_path)
    with pytest.raises(WheelError, match="not installed"):
        build_wheels(["no-such-distribution-here"], tmp_path)
    assert repack_wheel(distribution("iniconfig"), tmp_path).is_file()  # the control: a pure one is


def test_tasks_load_with_their_harbor_fields():
    tasks, errors = load_dataset(DATASET)
    assert errors == []
    assert sorted(task.name for task in tasks) == TASKS == sorted(INSTALLED)
    for task in tasks:
        assert task.dockerfile is not None and task.solution_dir is not None
        assert not task.config.ignored_fields, f"{task.name}: {task.config.ignored_fields}"


@needs_layered_root
def test_every_oracle_passes_check(offline_build, tmp_path):
    tasks, errors = load_dataset(DATASET)
    results = check_dataset(tasks, errors, tmp_path, jobs=2)
    failures = {r.task: f"{r.reason}\n{r.details}" for r in results if r.status != OK}
    assert failures == {}
    assert len(results) == len(TASKS)


@needs_layered_root
@pytest.mark.parametrize("name", TASKS)
def test_an_agent_that_does_nothing_scores_zero(offline_build, tmp_path, name):
    task = task_named(name)
    box = Sandbox.create(tmp_path / "sandbox", task, network=False)
    try:
        verdict = run_verifier(box, task, tmp_path / "verifier")
    finally:
        box.remove()
    log = (verdict.output_dir / "test-stdout.txt").read_text(errors="replace")
    assert verdict.reward == 0, f"{verdict.error}\n{log[-2000:]}"  # 0, not None: the verifier ran and said no


@needs_layered_root
@pytest.mark.parametrize("name", TASKS)
def test_what_run_installed_stays_in_the_task_layer(offline_build, tmp_path, name):
    task = task_named(name)
    host_lists = sorted(os.listdir("/var/lib/apt/lists"))
    host_has = {path for path in INSTALLED[name] if Path(path).exists()}
    host_has_pytest = host_imports_pytest()
    box = Sandbox.create(tmp_path / "sandbox", task, network=False)
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


@needs_layered_root
def test_offline_build_without_wheels_fails_at_the_pip_step(offline_build, tmp_path, monkeypatch):
    # The control for the fixture: with the network off and no wheels, nothing can be fetched.
    monkeypatch.delenv("OPENFORGE_BUILD_WHEELS")
    monkeypatch.setenv("OPENFORGE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SandboxError, match=r"line 12 \(RUN\)"):
        Sandbox.create(tmp_path / "sandbox", task_named("orders-report-pytest"))


PLANTED_PYTEST_INI = "[pytest]\n"
# Turns every test's report into a pass: what a verifier must never let the agent's files do.
PLANTED_CONFTEST = """import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""


@needs_layered_root
def test_planted_pytest_config_cannot_pass_the_verifier(offline_build, tmp_path):
    task = task_named("orders-report-pytest")
    box = Sandbox.create(tmp_path / "sandbox", task, network=False)
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


@needs_layered_root
def test_check_cli_builds_and_grades_a_task(offline_build):
    run = subprocess.run([sys.executable, "-m", "steps.tasks", "check", str(DATASET / "stock-reorder")], cwd=REPO,
                         env={**os.environ, **offline_build}, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 tasks: 1 ok, 0 broken, 0 skipped" in run.stdout
