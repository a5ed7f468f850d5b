"""The console scripts of `pyproject.toml` (`openforge-submit`, `openforge-plan`, ...): every target imports
in the serving environment (the update's too: veRL is imported only when a worker is built), is a
`main(argv)` returning an exit code, and runs as the script pip writes for it, from any folder.

The targets are read from `pyproject.toml`, not from the installed metadata: the environment is an
editable install, and its scripts appear when `make setup` reinstalls after pyproject.toml changed.
"""

import importlib
import inspect
import subprocess
import sys
import tomllib
import typing
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
# What pip's console-script wrapper runs (pip._vendor.distlib's template, less its argv[0] rewrite).
WRAPPER = "import sys\nfrom {module} import {function}\nif __name__ == '__main__':\n    sys.exit({function}())\n"


def test_every_step_with_a_command_line_has_a_script() -> None:
    """Each `python -m` entry point of a step and the driver is a script, named after what it runs."""
    assert {target.split(":")[0] for target in SCRIPTS.values()} == {
        "workflows.submit", "steps.serve", "steps.proxy.__main__", "steps.plan", "steps.rollout",
        "steps.trajectories.__main__", "steps.update.__main__", "steps.tasks.__main__", "steps.harnesses.__main__",
        "steps.manifest", "steps.evaluate", "steps.report.__main__", "steps.export", "steps.sft.samples",
        "steps.sft.__main__"}
    assert all(name.startswith("openforge-") for name in SCRIPTS)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_each_script_target_imports_and_prints_its_help(name: str, capsys) -> None:
    """The target is `main(argv=None) -> int`; `--help` goes through its parser and exits 0."""
    module, _, function = SCRIPTS[name].partition(":")
    main = getattr(importlib.import_module(module), function)
    assert typing.get_type_hints(main)["return"] is int and list(inspect.signature(main).parameters) == ["argv"]
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0 and "usage:" in capsys.readouterr().out


def test_the_installed_submit_script_runs_from_another_folder(tmp_path: Path) -> None:
    """`openforge-submit` imports `workflows.submit` as a package (not `python workflows/submit.py`'s path
    setup) and finds the default config and the dataset wherever it is started; a bad key is still one
    sentence and exit code 2 (control: the same script works)."""
    module, _, function = SCRIPTS["openforge-submit"].partition(":")
    script = tmp_path / "openforge-submit"
    script.write_text(WRAPPER.format(module=module, function=function))
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    argv = [sys.executable, str(script), "--config", str(REPO / "configs" / "cluster-example.yaml"), "--dry-run",
            "run=installed"]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "kind: Workflow" in done.stdout and "installed" in done.stdout
    refused = subprocess.run([*argv, "iteratons=2"], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "error: unknown config key 'iteratons' (in the override iteratons=2) (did you mean iterations?)"]
