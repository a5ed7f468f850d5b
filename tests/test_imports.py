"""The import graph has no cycle and no upward arrow: the contracts floor imports nothing above it, no step imports
the wiring in workflows/, and docs/architecture.md shows the layers as they are (tests/import_graph.py)."""

import re
import subprocess
import sys
from pathlib import Path

import import_graph

REPO = Path(__file__).resolve().parents[1]


def test_no_import_cycle_and_no_upward_arrow_in_steps_and_workflows() -> None:
    assert import_graph.problems() == []


def test_the_checks_catch_a_planted_cycle_an_upward_arrow_and_a_function_local_import(tmp_path: Path) -> None:
    """The control: a tree with a module cycle hidden in a function body, a package cycle, the floor importing a
    step and a step importing workflows/ is reported on each count."""
    files = {
        "steps/__init__.py": "",
        "steps/contracts/__init__.py": "",
        "steps/contracts/layout.py": "from steps import a\n",
        "steps/a.py": "def late():\n    from steps.pkg import b\n",
        "steps/pkg/__init__.py": "",
        "steps/pkg/b.py": "import steps.a\nfrom . import c\n",
        "steps/pkg/c.py": "from workflows import wiring\n",
        "workflows/__init__.py": "",
        "workflows/wiring.py": "from steps.contracts import layout\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = import_graph.problems(tmp_path)
    assert "import cycle between modules: steps.a <-> steps.contracts.layout <-> steps.pkg.b <-> " \
           "steps.pkg.c <-> workflows.wiring" in found
    assert any(problem.startswith("import cycle between packages: ") for problem in found)
    assert "upward import: steps.contracts.layout -> steps.a (the floor imports nothing above it)" in found
    assert "upward import: steps.pkg.c -> workflows.wiring (a step imports the wiring above it)" in found


def test_the_picture_in_the_architecture_doc_is_the_graph_as_it_is() -> None:
    """docs/architecture.md holds the tool's picture verbatim: a change to the imports changes the doc with it."""
    shown = subprocess.run([sys.executable, str(REPO / "tests" / "import_graph.py")], capture_output=True,
                           text=True, check=True).stdout.strip()
    doc = (REPO / "docs" / "architecture.md").read_text()
    block = re.search(r"<!-- import graph -->\n```\n(.*?)\n```", doc, re.S)
    assert block is not None and block.group(1) == shown
