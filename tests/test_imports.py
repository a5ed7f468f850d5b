"""How the packages stand on each other, read from the source (every import, function-local ones too):

- the floor, `steps/contracts/`, imports nothing from `steps` or `workflows` beyond itself;
- no step imports `workflows/`;
- no two packages of `steps/` (a subpackage, or a module at its top) import each other, however indirectly.

Each rule has its control: a planted import is caught.
"""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FLOOR = "steps.contracts"
# The sandbox and the tasks still import each other (a sandbox runs a Task; a task is checked and graded in a
# sandbox): left to the change that puts the sandbox behind an interface.
KNOWN_CYCLES = [{"steps.sandbox", "steps.tasks"}]


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str) -> set[str]:
    """Every module an import statement anywhere in `source` names (absolute imports; `from a import b` names
    both `a` and `a.b`, which may be a module)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def package(module: str) -> str | None:
    """The unit a module belongs to: `steps.X` (a subpackage or a top-level module), `workflows`, or None."""
    parts = module.split(".")
    if parts[0] == "workflows":
        return "workflows"
    return ".".join(parts[:2]) if parts[0] == "steps" and len(parts) > 1 else None


def sources() -> dict[str, str]:
    files = [*REPO.glob("steps/**/*.py"), *REPO.glob("workflows/**/*.py")]
    return {module_name(path): path.read_text() for path in files}


def package_graph(modules: dict[str, str]) -> dict[str, set[str]]:
    """Which package imports which (among those `modules` define)."""
    known = {package(name) for name in modules} - {None}
    graph: dict[str, set[str]] = {unit: set() for unit in known}
    for name, source in modules.items():
        here = package(name)
        for target in imported(source):
            there = package(target)
            if here and there in known and there != here:
                graph[here].add(there)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The graph's strongly connected components of more than one package."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def floor_breaches(modules: dict[str, str]) -> list[str]:
    return sorted(f"{name} imports {target}" for name, source in modules.items() if name.startswith(FLOOR)
                  for target in imported(source)
                  if target.split(".")[0] in ("steps", "workflows") and not target.startswith(FLOOR) and target != "steps")


def test_the_floor_imports_nothing_above_it():
    modules = sources()
    assert floor_breaches(modules) == []
    planted = {**modules, f"{FLOOR}.planted": "def f():\n    from steps.trajectories import build_samples\n"}
    assert floor_breaches(planted) == [f"{FLOOR}.planted imports steps.trajectories",
                                       f"{FLOOR}.planted imports steps.trajectories.build_samples"]


def test_no_step_imports_workflows():
    graph = package_graph(sources())
    assert sorted(unit for unit, targets in graph.items() if unit != "workflows" and "workflows" in targets) == []
    planted = package_graph({**sources(), "steps.planted": "import workflows.config\n"})
    assert "workflows" in planted["steps.planted"]


def test_no_two_packages_import_each_other():
    modules = sources()
    assert [c for c in cycles(package_graph(modules)) if c not in KNOWN_CYCLES] == []
    planted = {**modules, "steps.contracts.planted": "def f():\n    import steps.manifest\n"}
    assert {"steps.contracts", "steps.manifest"} <= set().union(*cycles(package_graph(planted)))
