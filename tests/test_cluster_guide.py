"""The RBAC YAML of docs/cluster.md grants what the rendered Workflows and the driver do, and the guide's commands
are the project's own.

Nothing here runs a Kubernetes API server, so "what they do" is read off what is rendered and called: each resource
template's `action` on its object's kind (kubectl `apply` reads, creates or patches; `create` with a success
condition reads until it holds; `delete -l ... --wait` lists, deletes and watches), what Argo's executor needs in
every pod (WorkflowTaskResults: Argo's docs/workflow-rbac.md), the Argo Server calls `workflows.argo.ArgoClient`
makes for the driver (in `--auth-mode=client` the server acts with the caller's rights), and the Kubernetes calls
`workflows.preflight.with_api_server` makes (recorded on a double of the kubernetes client).
"""

import re
from pathlib import Path
from types import SimpleNamespace

import yaml

from workflows import preflight
from workflows.iteration import iteration_workflow
from test_workflows import cluster_config

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "cluster.md"
# kubectl's verbs per resource-template action (Argo runs `kubectl <action>` in its executor; `apply` gets the
# object, then creates or patches it; a success condition is read with get; `--wait` watches the deletion)
ACTION_VERBS = {"apply": {"get", "create", "patch"}, "create": {"create", "get"}, "delete": {"list", "delete", "watch"}}
# the Argo Server routes the driver calls, as the Kubernetes verbs the server then uses on workflows
DRIVER_VERBS = {("argoproj.io", "workflows"): {"create", "get", "update", "delete"},
                ("", "pods"): {"delete"},  # a retry deletes the retried nodes' pods (RetryWorkflow)
                ("argoproj.io", "workflowtaskresults"): {"create", "patch"}}  # the executor, in every pod
# the kubernetes client's calls, as (namespace, group, resource, verb)
CALLS = {"list_namespaced_endpoint_slice": ("discovery.k8s.io", "endpointslices", "list"),
         "read_namespaced_endpoints": ("", "endpoints", "get"), "read_namespaced_service": ("", "services", "get")}


def granted(documents: list[dict], account: str, namespace: str) -> dict[tuple[str, str], set[str]]:
    """(group, resource) -> verbs the Roles bound to `account` (in `namespace`'s run) grant, by the namespace the
    Role is in: {namespace: {(group, resource): verbs}}."""
    roles = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in documents if d["kind"] == "Role"}
    rights: dict = {}
    for binding in (d for d in documents if d["kind"] == "RoleBinding"):
        if {"kind": "ServiceAccount", "name": account, "namespace": namespace} not in binding["subjects"]:
            continue
        where = binding["metadata"]["namespace"]
        for rule in roles[(where, binding["roleRef"]["name"])]["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    rights.setdefault(where, {}).setdefault((group, resource), set()).update(rule["verbs"])
    return rights


def rbac_documents(text: str) -> list[dict]:
    """The YAML block of the guide that holds the Roles."""
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "kind: Role" in b]
    return [d for d in yaml.safe_load_all(block) if d]


def needed(config) -> dict[tuple[str, str], set[str]]:
    """What the run's service account must be allowed in its namespace: every resource template's kubectl verbs on
    its object (an iteration across nodes, with the NetworkPolicies), the executor's and the driver's."""
    spec = iteration_workflow(config, 0).to_dict()["spec"]
    needs: dict = {key: set(verbs) for key, verbs in DRIVER_VERBS.items()}
    for template in spec["templates"]:
        if "resource" not in template:
            continue
        resource = template["resource"]
        if "manifest" in resource:
            kind = yaml.safe_load(resource["manifest"])
            name = kind["kind"].lower()
            group, plural = kind["apiVersion"].rpartition("/")[0], name[:-1] + "ies" if name.endswith("y") else name + "s"
        else:  # `kubectl delete <plural>.<group> -l ...`
            plural, _, group = resource["flags"][0].partition(".")
        needs.setdefault((group, plural), set()).update(ACTION_VERBS[resource["action"]])
    return needs


def api_server_reads() -> set[tuple[str, str, str]]:
    """The calls `with_api_server` makes to read the API server's addresses, recorded on a kubernetes-client double
    (no API server runs here) answering with one EndpointSlice."""
    calls = []

    class Recorder:
        def __getattr__(self, name):
            def call(*args, **kwargs):
                # read_namespaced_X(name, namespace), list_namespaced_X(namespace)
                calls.append((name, kwargs.get("namespace") or args[1 if name.startswith("read_") else 0]))
                endpoint = SimpleNamespace(addresses=["10.0.0.5"], conditions=None)
                return SimpleNamespace(items=[SimpleNamespace(endpoints=[endpoint])],
                                       spec=SimpleNamespace(cluster_ip="10.96.0.1"), subsets=[])
            return call

    preflight.with_api_server(cluster_config("run=t"), api=Recorder(), discovery=Recorder())
    assert calls, "with_api_server read nothing"
    return {(namespace, *CALLS[name][:2], CALLS[name][2]) for name, namespace in calls}


def missing(documents: list[dict]) -> list[str]:
    """Every right the run needs that the guide's RBAC does not grant, as one line each."""
    config = cluster_config("run=t", "update_nodes=2")
    rights = granted(documents, config.service_account, config.namespace)
    lines = [f"{config.namespace}: {sorted(verbs - rights.get(config.namespace, {}).get(key, set()))} on {key}"
             for key, verbs in needed(config).items() if verbs - rights.get(config.namespace, {}).get(key, set())]
    lines += [f"{namespace}: {verb} on {(group, resource)}" for namespace, group, resource, verb in api_server_reads()
              if verb not in rights.get(namespace, {}).get((group, resource), set())]
    return lines


def test_the_guides_rbac_grants_what_the_run_does() -> None:
    """The Roles bound to the run's service account cover every kubectl verb of the rendered resource templates,
    the executor's and the driver's, and the reads of the API server's addresses in `default`. Controls: the same
    YAML with one verb removed, or with the `default` Role left out, is caught."""
    documents = rbac_documents(GUIDE.read_text())
    assert missing(documents) == []
    for group, resource, verb in (("networking.k8s.io", "networkpolicies", "patch"),
                                  ("jobset.x-k8s.io", "jobsets", "watch"), ("argoproj.io", "workflowtaskresults", "create")):
        planted = list(yaml.safe_load_all(yaml.safe_dump_all(documents)))  # a deep copy
        for rule in (r for d in planted if d["kind"] == "Role" for r in d["rules"]):
            if resource in rule["resources"] and verb in rule["verbs"]:
                rule["verbs"].remove(verb)
        assert any(resource in line and verb in line for line in missing(planted)), (resource, verb)
    without_default = [d for d in documents if d["metadata"]["namespace"] != "default"]
    assert any(line.startswith("default:") for line in missing(without_default))


def test_the_guides_commands_are_the_projects(capsys) -> None:
    """Each `python workflows/submit.py` action and flag, and each `make` target, the guide uses exists (read off
    `submit.py --help` and the Makefile). Control: a made-up flag is not in that help."""
    from workflows import submit

    text = GUIDE.read_text()
    try:
        submit.parse_args(["--help"])
    except SystemExit:
        pass
    help_text = capsys.readouterr().out
    commands = re.findall(r"python workflows/submit\.py([^\n]*)", text)
    assert commands and "--no-such-flag" not in help_text
    for command in commands:
        words = command.split()
        assert words[0] in submit.ACTIONS or words[0].startswith("--"), command
        for flag in re.findall(r"(?<!\S)(--[a-z-]+)", command):
            assert flag in help_text, flag
    makefile = (GUIDE.parents[1] / "Makefile").read_text()
    for target in re.findall(r"^make (\w+)", text, re.M):
        assert re.search(rf"^{target}:", makefile, re.M), target
