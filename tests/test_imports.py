"""No import cycle between the packages of `steps/`: every import counts, function-local and TYPE_CHECKING ones too.

A package here is `steps.X` (a module of its own, or a folder with all below it). An entry point (`__main__`) stands
apart: nothing imports it, so `python -m steps.tasks check` may use grading, which imports the tasks."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def module_names(root: Path) -> dict[str, Path]:
    """Every module under `root/steps`, by its dotted name (a package by its folder's)."""
    names = {}
    for path in sorted((root / "steps").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imported(name: str, path: Path, names: dict[str, Path]) -> set[str]:
    """The modules of `names` that the module `name` imports, anywhere in its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in names:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def package(name: str) -> str:
    """`steps.X` of a module below it; an entry point is its own."""
    return name if name.endswith(".__main__") else ".".join(name.split(".")[:2])


def package_cycles(root: Path) -> list[list[str]]:
    """Each group of packages that import one another in a ring (strongly connected, more than one)."""
    names = module_names(root)
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        for target in imported(name, path, names):
            if package(target) != package(name):
                graph.setdefault(package(name), set()).add(package(target))

    def reach(start: str) -> set[str]:
        seen, pending = set(), [start]
        while pending:
            for nxt in graph.get(pending.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    pending.append(nxt)
        return seen

    reachable = {node: reach(node) for node in graph}
    rings = {frozenset({node, *(other for other in reachable[node] if node in reachable.get(other, ()))})
             for node in graph if node in reachable[node]}
    return sorted(sorted(ring) for ring in rings)


def test_no_import_cycle_between_the_packages_of_steps() -> None:
    assert package_cycles(REPO) == []


def test_a_planted_cycle_is_found(tmp_path: Path) -> None:
    """Control: the sandbox importing grading again inside a function (the cycle it had with the tasks' grading)."""
    for relative in ("steps/__init__.py", "steps/tasks/__init__.py", "steps/tasks/__main__.py",
                     "steps/sandbox/__init__.py", "steps/grading/__init__.py", "steps/grading/verify.py"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("")
    (tmp_path / "steps/tasks/__main__.py").write_text("from steps.grading.verify import run_verifier\n")
    (tmp_path / "steps/sandbox/__init__.py").write_text("from steps.tasks import Task\n")
    (tmp_path / "steps/grading/verify.py").write_text("from steps.sandbox import Sandbox\nfrom steps.tasks import Task\n")
    assert package_cycles(tmp_path) == []  # an entry point using grading is no cycle
    (tmp_path / "steps/sandbox/__init__.py").write_text("from steps.tasks import Task\n\n"
                                                         "def grade():\n    from .. import grading\n")
    assert package_cycles(tmp_path) == [["steps.grading", "steps.sandbox"]]
    (tmp_path / "steps/sandbox/__init__.py").write_text("from steps.tasks import Task\n")
    (tmp_path / "steps/tasks/__init__.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                       "    from steps.grading.verify import run_verifier\n")
    assert package_cycles(tmp_path) == [["steps.grading", "steps.sandbox", "steps.tasks"]]
