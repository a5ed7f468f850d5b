"""What Argo's schema cannot see: DAG tasks name existing templates, `{{...}}` references resolve, no cycles.

    problems = semantic_problems(iteration_workflow(config, 0).to_dict())   # [] when the workflow is sound

Checked on the Workflow as a plain dict (what is submitted): the entrypoint and exit handler exist;
in every DAG, task names are unique, each task's template exists, `depends` names tasks of the same
DAG and has no cycle, every `{{tasks.X...}}` a task uses names a task it (transitively) depends on,
`{{item...}}` appears only in a fan-out task, arguments match the called template's inputs; in
every template, each `{{inputs.parameters.Y}}` is a declared input and `{{workflow.parameters.Z}}`
a workflow argument. `argo lint` does some of this, but it needs a server; this runs anywhere.
"""

import json
import re

REF = re.compile(r"\{\{\s*([^{}]+?)\s*\}\}")
DEPENDS_TOKEN = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z]+)?")


def _refs(node: object) -> list[str]:
    """Every `{{...}}` expression inside a dict/list/string, without the braces."""
    return REF.findall(json.dumps(node))


def depends_on(task: dict) -> set[str]:
    """The task names a DAG task's `depends` expression (or `dependencies` list) mentions.

    >>> sorted(depends_on({"depends": "(serve && plan.Succeeded) || !rollout.AnySucceeded"}))
    ['plan', 'rollout', 'serve']
    """
    names = set(task.get("dependencies") or [])
    for token in DEPENDS_TOKEN.findall(task.get("depends") or ""):
        names.add(token.split(".")[0])
    return names


def _ancestors(graph: dict[str, set[str]], name: str) -> set[str]:
    """Every task `name` waits for, directly or through others."""
    seen: set[str] = set()
    stack = list(graph.get(name, ()))
    while stack:
        current = stack.pop()
        if current not in seen:
            seen.add(current)
            stack.extend(graph.get(current, ()))
    return seen


def _dag_problems(template: dict, templates: dict[str, dict]) -> list[str]:
    """Problems of one DAG template's tasks."""
    where = f"DAG {template['name']!r}"
    tasks = template["dag"].get("tasks", [])
    names = [t["name"] for t in tasks]
    problems = [f"{where} has two tasks named {n!r}" for n in sorted({n for n in names if names.count(n) > 1})]
    graph = {t["name"]: depends_on(t) for t in tasks}
    for task in tasks:
        name = task["name"]
        problems += [f"{where}: task {name!r} depends on unknown task {d!r}" for d in sorted(graph[name] - set(names))]
        if name in _ancestors(graph, name):
            problems.append(f"{where}: task {name!r} depends on itself (a cycle)")
        if task.get("template") not in templates:
            problems.append(f"{where}: task {name!r} calls unknown template {task.get('template')!r}")
        else:
            problems += _argument_problems(where, task, templates[task["template"]])
        fan_out = "withParam" in task or "withItems" in task or "withSequence" in task
        for ref in _refs({k: v for k, v in task.items() if k != "name"}):
            parts = ref.split(".")
            if parts[0] == "tasks" and len(parts) > 1 and parts[1] not in _ancestors(graph, name):
                problems.append(f"{where}: task {name!r} uses {{{{{ref}}}}} but does not depend on task {parts[1]!r}")
            if parts[0] == "item" and not fan_out:
                problems.append(f"{where}: task {name!r} uses {{{{{ref}}}}} without withParam/withItems")
    return problems


def _argument_problems(where: str, task: dict, template: dict) -> list[str]:
    """Arguments the template does not declare, and declared inputs without value or default."""
    declared = {p["name"]: p for p in template.get("inputs", {}).get("parameters", [])}
    given = {p["name"] for p in task.get("arguments", {}).get("parameters", [])}
    problems = [f"{where}: task {task['name']!r} passes {n!r}, which template {template['name']!r} does not take"
                for n in sorted(given - set(declared))]
    problems += [f"{where}: task {task['name']!r} does not pass {n!r} to template {template['name']!r}"
                 for n, p in declared.items() if n not in given and "value" not in p and "default" not in p]
    return problems


def _template_problems(template: dict, workflow_params: set[str]) -> list[str]:
    """`{{inputs.parameters.Y}}` and `{{workflow.parameters.Z}}` references inside one template."""
    declared = {p["name"] for p in template.get("inputs", {}).get("parameters", [])}
    body = {k: v for k, v in template.items() if k != "dag"}  # a DAG's own refs are checked per task
    problems = []
    for ref in _refs(body):
        parts = ref.split(".")
        if parts[:2] == ["inputs", "parameters"] and parts[2] not in declared:
            problems.append(f"template {template['name']!r} uses {{{{{ref}}}}} but declares no input {parts[2]!r}")
        if parts[:2] == ["workflow", "parameters"] and parts[2] not in workflow_params:
            problems.append(f"template {template['name']!r} uses {{{{{ref}}}}} but the workflow has no argument {parts[2]!r}")
    return problems


def semantic_problems(workflow: dict) -> list[str]:
    """Every problem found in a Workflow dict (as `Workflow.to_dict()` gives it), one sentence each."""
    spec = workflow.get("spec", {})
    templates = {t["name"]: t for t in spec.get("templates", [])}
    problems = [f"{key} names unknown template {spec[key]!r}" for key in ("entrypoint", "onExit")
                if key in spec and spec[key] not in templates]
    if "entrypoint" not in spec:
        problems.append("the workflow has no entrypoint")
    workflow_params = {p["name"] for p in spec.get("arguments", {}).get("parameters", [])}
    for template in templates.values():
        problems += _template_problems(template, workflow_params)
        if "dag" in template:
            problems += _dag_problems(template, templates)
    return problems
