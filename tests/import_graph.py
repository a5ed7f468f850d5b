"""The import graph of `steps/` and `workflows/`, read from the source (every import, function-local ones too).

    python tests/import_graph.py              # the packages in layers, the floor at the bottom; exit 1 on a cycle
    python tests/import_graph.py --check      # only the problems: cycles, upward arrows; exit 1 if any

A unit of the picture is a package under `steps/` (`steps.proxy`), a module directly in `steps/` (`steps.rollout`)
or a module of `workflows/`; a package's `__main__` (its command line, `python -m steps.tasks`) is a unit of its own,
a program on top of the package that nothing imports. Each unit sits one layer above the highest unit it imports, so every arrow points
down; the layers are what `docs/architecture.md` shows. The rules (tests/test_imports.py): no cycle between
modules or between units; `steps.contracts` imports nothing outside itself; nothing in `steps/` imports `workflows/`.
"""

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("steps", "workflows")
FLOOR = "steps.contracts"


def modules(root: Path = REPO, roots: tuple[str, ...] = ROOTS) -> dict[str, Path]:
    """Every module under `roots`, by dotted name (a package by its own name)."""
    found = {}
    for top in roots:
        for path in sorted((root / top).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def edges(root: Path = REPO, roots: tuple[str, ...] = ROOTS) -> dict[str, set[str]]:
    """module -> the modules of `roots` it imports, anywhere in its body (`from a import b` is `a.b` when that is
    a module, else `a`)."""
    known = modules(root, roots)
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in known:  # `import steps.proxy.store.X` names its module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def unit(module: str) -> str:
    """The picture's unit of a module: its package under steps/, else the module itself; a `__main__` apart.

    >>> unit("steps.proxy.store"), unit("steps.rollout"), unit("workflows.local"), unit("steps.tasks.__main__")
    ('steps.proxy', 'steps.rollout', 'workflows.local', 'steps.tasks.__main__')
    """
    parts = module.split(".")
    return module if parts[-1] == "__main__" else ".".join(parts[:2])


def unit_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between units (no unit's arrows to itself)."""
    units: dict[str, set[str]] = defaultdict(set)
    for source, targets in graph.items():
        units[unit(source)]  # a unit that imports nothing still stands in the picture
        for target in targets:
            if unit(target) != unit(source):
                units[unit(source)].add(unit(target))
    return units


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected set of more than one node (Tarjan's algorithm, iterative), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    nodes = sorted(set(graph) | {t for targets in graph.values() for t in targets})
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(found)


def upward(graph: dict[str, set[str]]) -> list[str]:
    """The arrows that break the layering: the floor importing anything outside it, a step importing workflows/."""
    wrong = []
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            if unit(source) == FLOOR and unit(target) != FLOOR:
                wrong.append(f"{source} -> {target} (the floor imports nothing above it)")
            elif source.startswith("steps") and target.startswith("workflows"):
                wrong.append(f"{source} -> {target} (a step imports the wiring above it)")
    return wrong


def layers(units: dict[str, set[str]]) -> list[list[str]]:
    """The units by layer, the floor's first: each one a layer above the highest unit it imports (no cycle)."""
    level: dict[str, int] = {}

    def depth(name: str, seen: tuple[str, ...] = ()) -> int:
        if name not in level:
            level[name] = 1 + max((depth(t, seen + (name,)) for t in units.get(name, ())), default=-1)
        return level[name]

    for name in units:
        depth(name)
    return [sorted(n for n in level if level[n] == i) for i in range(max(level.values(), default=-1) + 1)]


def picture(units: dict[str, set[str]]) -> str:
    """The layers as text, the top first; each unit names the units it imports (all of them lower)."""
    lines = []
    for number, names in reversed(list(enumerate(layers(units)))):
        lines.append(f"layer {number}:")
        for name in names:
            below = ", ".join(sorted(units.get(name, ()))) or "-"
            lines.append(f"  {name:<24} -> {below}")
    return "\n".join(lines)


def problems(root: Path = REPO) -> list[str]:
    """Every cycle (between modules, between units) and every upward arrow, as sentences."""
    graph = edges(root)
    return ([f"import cycle between modules: {' <-> '.join(c)}" for c in cycles(graph)]
            + [f"import cycle between packages: {' <-> '.join(c)}" for c in cycles(unit_edges(graph))]
            + [f"upward import: {arrow}" for arrow in upward(graph)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tests/import_graph.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="print only the problems")
    args = p.parse_args(argv)
    found = problems()
    if not args.check and not any("cycle between packages" in problem for problem in found):
        print(picture(unit_edges(edges())))
    for problem in found:
        print(problem, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
