"""Every `>>>` example in the repository runs and holds: one test per module that has one (fast tier, seconds).

    .venv/bin/python -m pytest -q tests/test_doctests.py
    .venv-train/bin/python -m pytest -q tests/test_doctests.py   # `make test` and `make test-fast` run both

Collected: the modules of the packages `steps/` and `workflows/` (imported by their dotted names), and the
scripts of `benchmarks/` and the helpers and tests of `tests/` (by their file), whose source has a line that
starts with `>>>`. Task material (the files of a task's folder, which has no `__init__.py`) is not code of the
repository and is left out. A module fails when it does not import, when an example fails, and when doctest
finds fewer examples than the file has `>>>` lines (an example in a nested function or a plain string, or one
skipped by a directive, never runs). The one module skipped is one that needs veRL in an
environment without it (the serving one, .venv): the train environment (.venv-train) has veRL and runs the
same file with no skip at all, so every example runs in one of the two.
"""

import doctest
import importlib
import importlib.util
import io
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("steps", "workflows")  # imported by dotted name
SCRIPTS = ("benchmarks", "tests")  # their top-level files, imported by file
EXAMPLE = re.compile(r"^\s*>>>", re.MULTILINE)
VERL = importlib.util.find_spec("verl") is not None


def files_with_examples(root: Path = REPO) -> list[Path]:
    """The modules under `root` with an example line: package modules (every folder up to the package's own has
    an `__init__.py`) and the top-level scripts of `benchmarks/` and `tests/`."""
    candidates = [path for folder in SCRIPTS for path in (root / folder).glob("*.py")]
    for package in (root / name for name in PACKAGES):
        candidates += [path for path in package.rglob("*.py")
                       if all((package / folder / "__init__.py").is_file()
                              for folder in path.relative_to(package).parents)]
    return sorted(path for path in candidates if EXAMPLE.search(path.read_text(encoding="utf-8")))


def load(path: Path) -> ModuleType:
    """The module at `path`: a package module by its dotted name, a helper of `tests/` (on sys.path already) by its
    name, anything else by its file, under a name no test module can shadow (`benchmarks/fake_vllm.py` and
    `tests/fake_vllm.py` are two modules)."""
    if path.is_relative_to(REPO) and path.relative_to(REPO).parts[0] in PACKAGES:
        return importlib.import_module(".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"))
    if path.parent == REPO / "tests":
        return importlib.import_module(path.stem)
    name = f"{path.parent.name}.{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def lacks_verl(error: BaseException) -> bool:
    """Whether an import failed for the want of veRL, in an environment that has none: a `ModuleNotFoundError` for
    it, or a module's `pytest.importorskip("verl")`."""
    if VERL:
        return False
    if isinstance(error, ModuleNotFoundError):
        return (error.name or "").split(".")[0] == "verl"
    return isinstance(error, pytest.skip.Exception) and "verl" in str(error)


def examples_hold(path: Path) -> int:
    """Runs the examples of the module at `path` and returns how many ran; fails as the module docstring says."""
    try:
        module = load(path)
    except (ImportError, pytest.skip.Exception) as error:  # importorskip's Skipped would skip silently
        if lacks_verl(error):
            pytest.skip(f"needs veRL ({error}): its examples run in the train environment (.venv-train)")
        raise AssertionError(f"{path.name} does not import: {error!r}") from error
    runner, report = doctest.DocTestRunner(), io.StringIO()
    for test in doctest.DocTestFinder().find(module):
        runner.run(test, out=report.write)
    written = len(EXAMPLE.findall(path.read_text(encoding="utf-8")))
    assert runner.failures == 0, f"{runner.failures} of {runner.tries} examples failed:\n{report.getvalue()}"
    assert runner.tries == written, (f"{written} lines start an example, but doctest runs {runner.tries}: an "
                                     "example in a nested function or a plain string, or one skipped by a directive, "
                                     "never runs")
    return runner.tries


@pytest.mark.parametrize("path", files_with_examples(), ids=lambda path: str(path.relative_to(REPO)))
def test_examples_hold(path: Path) -> None:
    examples_hold(path)


# Controls: the collection finds what it should, and each way an example can go wrong fails.

def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


WRONG = 'def double(x):\n    """Twice x.\n\n    >>> double(2)\n    5\n    """\n    return 2 * x\n'
RIGHT = WRONG.replace("    5\n", "    4\n")


def test_the_collection_takes_package_modules_and_scripts_not_task_material(tmp_path: Path) -> None:
    steps = tmp_path / "steps"
    write(steps / "__init__.py", "")
    found = [write(steps / "sub" / "__init__.py", RIGHT), write(steps / "sub" / "a.py", RIGHT),
             write(tmp_path / "benchmarks" / "b.py", RIGHT), write(tmp_path / "tests" / "c.py", RIGHT)]
    write(steps / "sub" / "none.py", "x = 1\n")
    write(steps / "tasks" / "t" / "environment" / "stats.py", RIGHT)  # no __init__.py: task material
    write(tmp_path / "tests" / "data" / "d.py", RIGHT)
    assert files_with_examples(tmp_path) == sorted(found)


def test_a_right_example_passes_and_a_wrong_one_fails(tmp_path: Path) -> None:
    assert examples_hold(write(tmp_path / "right.py", RIGHT)) == 1
    with pytest.raises(AssertionError, match=r"1 of 1 examples failed(.|\n)*Expected:\s+5\s+Got:\s+4"):
        examples_hold(write(tmp_path / "wrong.py", WRONG))


@pytest.mark.parametrize("text", [
    "def outer():\n    def inner():\n        '''\n        >>> 1\n        1\n        '''\n",  # a nested function
    "TABLE = \"\"\"\n>>> 1 + 1\n3\n\"\"\"\n",  # a plain string
    "'''A module.\n\n>>> 1 + 1  # doctest: +SKIP\n3\n'''\n",  # skipped by a directive
], ids=["nested", "string", "skipped"])
def test_an_example_that_never_runs_fails(tmp_path: Path, text: str) -> None:
    with pytest.raises(AssertionError, match="never runs"):
        examples_hold(write(tmp_path / "hidden.py", text))


def test_a_module_that_does_not_import_fails_and_is_not_skipped(tmp_path: Path) -> None:
    for name, text in [("missing", "import openforge_no_such_module\n"),
                       ("skipping", "import pytest\npytest.importorskip('openforge_no_such_module')\n")]:
        with pytest.raises(AssertionError, match="does not import"):
            examples_hold(write(tmp_path / f"{name}.py", text + '"""\n>>> 1\n1\n"""\n'))
