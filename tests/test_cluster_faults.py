"""The rollout template's retries: what the cluster does to a rollout pod is retried, what its agent does never is.

No Argo controller or kubelet runs here, so each fault is written as the pod status Kubernetes gives it (the
kubelet's eviction manager, active-deadline handler, node shutdown manager and preemption; the scheduler's and
the taint manager's deletions), turned into the node's `lastRetry` variables as Argo v3.7's controller does
(`argo_end`: `inferFailedReason`, `getExitCode`, `podReconciliation`'s "pod deleted"; workflow/controller/
operator.go), and the rendered `retryStrategy.expression` is evaluated on them by `evaluate`, a small evaluator of
the subset of expr-lang/expr (Argo's expression language, `argoexpr.EvalBool`) the expression is written in:
single-quoted strings, `lastRetry.*` variables, `==`, `startsWith`, `&&`, `||` and parentheses, with expr's
precedence (expr v1.16-1.17, the versions Argo v3.5-3.7 build with: parser/operator/operator.go gives `==` and
`startsWith` 20, `&&` 15, `||` 10; its checker takes `startsWith` on Argo's untyped map values and a string).
Anything else in the expression fails the test.
"""

import re

import pytest

from steps.contracts.config import RunConfig
from workflows import faults
from workflows.argo import ArgoClient
from workflows.config import ConfigError, validate
from workflows.iteration import RETRY_ON_INFRA_ERROR, iteration_workflow

from tests.test_workflows import fake_argo  # noqa: F401 - the fake Argo Server fixture

TOKEN = re.compile(r"\s*(?:(?P<string>'[^'\\]*')|(?P<op>==|&&|\|\||\(|\))|(?P<word>[A-Za-z_][A-Za-z0-9_.]*))")


def tokens(expression: str) -> list[tuple[str, str]]:
    """The expression's tokens as (kind, text); a character outside the subset raises."""
    found, at = [], 0
    while at < len(expression.rstrip()):
        match = TOKEN.match(expression, at)
        if not match:
            raise ValueError(f"not in the evaluated subset of expr-lang: {expression[at:at + 30]!r}")
        kind = match.lastgroup
        found.append((kind, match.group(kind)))
        at = match.end()
    return found


def evaluate(expression: str, variables: dict[str, str]) -> bool:
    """The boolean value of `expression` with `lastRetry.*` bound to `variables` (an unknown name raises, as expr's
    compile step does for a name not in its env)."""
    items = tokens(expression)
    position = 0

    def take(expected: str | None = None) -> tuple[str, str]:
        nonlocal position
        if position >= len(items):
            raise ValueError("the expression ends early")
        item = items[position]
        if expected is not None and item[1] != expected:
            raise ValueError(f"expected {expected!r}, found {item[1]!r}")
        position += 1
        return item

    def peek() -> str | None:
        return items[position][1] if position < len(items) else None

    def operand() -> str:
        kind, text = take()
        if kind == "string":
            return text[1:-1]
        if kind == "word" and text in variables:
            return variables[text]
        raise ValueError(f"unknown name or misplaced token {text!r}")

    def comparison() -> bool:
        if peek() == "(":
            take("(")
            value = disjunction()
            take(")")
            return value
        left = operand()
        op = take()[1]
        right = operand()
        if op == "==":
            return left == right
        if op == "startsWith":
            return left.startswith(right)
        raise ValueError(f"operator {op!r} is not in the evaluated subset")

    def conjunction() -> bool:
        value = comparison()
        while peek() == "&&":
            take("&&")
            value = comparison() and value
        return value

    def disjunction() -> bool:
        value = conjunction()
        while peek() == "||":
            take("||")
            value = conjunction() or value
        return value

    result = disjunction()
    if position != len(items):
        raise ValueError(f"trailing tokens from {items[position][1]!r}")
    return result


def argo_end(pod: dict) -> dict[str, str]:
    """The `lastRetry` variables Argo v3.7 gives the retry expression for a rollout pod that ended this way.

    `pod`: `deleted` (Argo never saw its end: `podReconciliation` marks the node Error, "pod deleted"), else
    `message` (the pod's status.message, which `inferFailedReason` takes first), `inits` (init containers'
    (name, reason, exit code) in order), `main` ((reason, exit code, termination message) or None while it never
    terminated)."""
    main = pod.get("main")
    exit_code = "-1" if main is None else str(main[1])  # buildRetryStrategyLocalScope: "-1" without one
    if pod.get("deleted"):
        return {faults.EXIT_CODE: exit_code, faults.STATUS: "Error", faults.MESSAGE: "pod deleted"}
    if pod.get("message"):
        return {faults.EXIT_CODE: exit_code, faults.STATUS: "Failed", faults.MESSAGE: pod["message"]}
    for name, reason, code in pod.get("inits", []):
        if code != 0:  # not Argo's own `init`: the default branch (137 and 143 ignored there)
            if code in (137, 143):
                continue
            return {faults.EXIT_CODE: exit_code, faults.STATUS: "Failed",
                    faults.MESSAGE: f"{name}: {reason} (exit code {code})"}
    if main is not None and main[1] != 0:
        text = f"main: {main[0]} (exit code {main[1]})" + (f": {main[2]}" if main[2] else "")
        return {faults.EXIT_CODE: exit_code, faults.STATUS: "Failed", faults.MESSAGE: text}
    return {faults.EXIT_CODE: exit_code, faults.STATUS: "Failed",
            faults.MESSAGE: "pod failed: neither main nor wait container completed successfully"}


COPIED = [("openforge", "Completed", 0), ("harness", "Completed", 0), ("task", "Completed", 0)]
DEADLINE = faults.DEADLINE_MESSAGE
# Each fault: the pod's end, and whether the cluster caused it (retried) or the agent (never retried).
CLUSTER = {
    "runner's infra_error (exit 3)": {"inits": COPIED, "main": ("Error", 3, "")},
    "evicted: node low on memory": {"message": "The node was low on resource: memory. Threshold quantity: 100Mi, "
                                               "available: 80Mi. ", "main": ("Error", 137, "")},
    "evicted: node low on disk": {"message": "The node was low on resource: ephemeral-storage. Threshold quantity: "
                                             "10Gi, available: 9Gi. Container wait was using 20Ki, request is 0, has "
                                             "larger consumption of ephemeral-storage. ", "main": ("Error", 137, "")},
    "refused at admission under disk pressure": {"message": "Pod was rejected: The node had condition: "
                                                           "[DiskPressure]. "},
    "preempted by the kubelet for a critical pod": {"message": "Preempted in order to admit critical pod",
                                                    "main": ("Error", 137, "")},
    "refused at admission: out of cpu": {"message": "Pod was rejected: Node didn't have enough resource: cpu, "
                                                    "requested: 4000, used: 1000, capacity: 4000"},
    "preempted by the scheduler, gone before Argo saw it": {"deleted": True, "inits": COPIED},
    "preempted by the scheduler, runner stopped by SIGTERM": {"inits": COPIED, "main": ("Error", 143, "")},
    "drained (Eviction API), runner SIGKILLed after grace": {"inits": COPIED, "main": ("Error", 137, "")},
    "deleted by a person before it started": {"deleted": True},
    "node lost (pod GC: node no longer exists)": {"inits": COPIED, "main": None},
    "node lost, containers unknown": {"inits": COPIED, "main": ("ContainerStatusUnknown", 137,
                                                                "The container could not be located when the pod "
                                                                "was terminated")},
    "node shut down": {"message": "Pod was terminated in response to imminent node shutdown.",
                       "main": ("Error", 137, "")},
    "image pull failing until the deadline": {"message": DEADLINE, "main": None},
    "init containers' copy past the deadline": {"message": DEADLINE, "inits": COPIED[:1], "main": None},
    "harness image missing (init container failed)": {"inits": [("openforge", "Completed", 0),
                                                                ("harness", "Error", 1)]},
    "task fetch failed (proxy unreachable)": {"inits": [*COPIED[:2], ("task", "Error", 2)]},
}
AGENT = {
    "agent OOM, runner not guarded (group kill)": {"inits": COPIED, "main": ("OOMKilled", 137, "")},
    "agent filled its pod's ephemeral-storage limit": {
        "message": "Pod ephemeral local storage usage exceeds the total limit of containers 12544Mi. ",
        "main": ("Error", 137, "")},
    "agent filled its container's storage limit": {
        "message": "Container main exceeded its local ephemeral storage limit \"12544Mi\". ",
        "main": ("Error", 137, "")},
    "agent filled the app's emptyDir": {"message": "Usage of EmptyDir volume \"app-state\" exceeds the limit "
                                                   "\"256Mi\". ", "main": ("Error", 137, "")},
    "agent's fork bomb: node low on pids": {"message": "The node was low on resource: pids. Threshold quantity: "
                                                       "1000, available: 10. ", "main": ("Error", 137, "")},
    "agent's files: node low on inodes": {"message": "The node was low on resource: inodes. ",
                                          "main": ("Error", 137, "")},
    "deadline past the runner's start": {"message": DEADLINE, "inits": COPIED, "main": ("Error", 137, "")},
    "runner exit 1": {"inits": COPIED, "main": ("Error", 1, "")},
    "runner exit 2": {"inits": COPIED, "main": ("Error", 2, "")},
    "agent spoofs a deletion in the termination log": {"inits": COPIED, "main": ("Error", 143, "pod deleted")},
    "agent spoofs an eviction in the termination log": {
        "inits": COPIED, "main": ("Error", 137, "The node was low on resource: memory. ")},
}
# The same pods with one thing changed each, from a cluster fault to the agent's: the control for each retry.
CONTROLS = {
    "evicted: node low on disk": "agent filled its pod's ephemeral-storage limit",
    "evicted: node low on memory": "agent's fork bomb: node low on pids",
    "drained (Eviction API), runner SIGKILLed after grace": "agent OOM, runner not guarded (group kill)",
    "image pull failing until the deadline": "deadline past the runner's start",
    "preempted by the scheduler, runner stopped by SIGTERM": "agent spoofs a deletion in the termination log",
    "runner's infra_error (exit 3)": "runner exit 1",
}


@pytest.mark.parametrize("fault", sorted(CLUSTER))
def test_what_the_cluster_does_is_retried(fault: str) -> None:
    """Each cluster fault is retried, and counted under a cause."""
    end = argo_end(CLUSTER[fault])
    assert evaluate(RETRY_ON_INFRA_ERROR, end), (fault, end)
    assert faults.retry_cause(end[faults.EXIT_CODE], end[faults.STATUS], end[faults.MESSAGE]) is not None


@pytest.mark.parametrize("fault", sorted(AGENT))
def test_what_the_agent_does_is_never_retried(fault: str) -> None:
    """Each of the agent's doings ends its rollout unretried (its runner grades it, or it counts as the agent's)."""
    end = argo_end(AGENT[fault])
    assert not evaluate(RETRY_ON_INFRA_ERROR, end), (fault, end)
    assert faults.retry_cause(end[faults.EXIT_CODE], end[faults.STATUS], end[faults.MESSAGE]) is None


@pytest.mark.parametrize("retried, control", sorted(CONTROLS.items()))
def test_each_retry_has_a_control_one_change_away(retried: str, control: str) -> None:
    """The pair differs in what caused the end, and so in the decision; the earlier rule (`exitCode == '3'`)
    retries none of the cluster's faults but the runner's own, and a careless wide one retries the agent's."""
    cluster, agent = argo_end(CLUSTER[retried]), argo_end(AGENT[control])
    assert evaluate(RETRY_ON_INFRA_ERROR, cluster) and not evaluate(RETRY_ON_INFRA_ERROR, agent)
    old, wide = "lastRetry.exitCode == '3'", "lastRetry.exitCode == '3' || lastRetry.exitCode == '137'"
    assert evaluate(old, cluster) == (retried == "runner's infra_error (exit 3)")
    assert not evaluate(old, agent)
    if agent[faults.EXIT_CODE] == "137":
        assert evaluate(wide, agent)  # would void the agent's failure: the message, not the code, tells


def test_the_evaluator_refuses_what_it_cannot_evaluate_faithfully() -> None:
    """A control for the evaluator: operators outside the subset, unknown names and bad syntax raise."""
    values = {faults.EXIT_CODE: "3", faults.STATUS: "Failed", faults.MESSAGE: ""}
    assert evaluate("(lastRetry.exitCode == '3') || lastRetry.status == 'Error'", values)
    assert not evaluate("lastRetry.exitCode == '3' && lastRetry.status == 'Error'", values)
    assert evaluate("lastRetry.status == 'Error' && lastRetry.exitCode == '4' || lastRetry.exitCode == '3'", values)
    for bad in ("lastRetry.exitCode != '3'", "lastRetry.message contains 'x'", "asInt(lastRetry.exitCode) == 3",
                "lastRetry.code == '3'", "(lastRetry.exitCode == '3'", "lastRetry.exitCode == \"3\""):
        with pytest.raises(ValueError):
            evaluate(bad, values)


def test_the_python_causes_agree_with_the_rendered_expression() -> None:
    """`retry_cause` (what the driver counts) decides as the expression Argo evaluates, on every end above and
    on each cause's own tests."""
    for pod in [*CLUSTER.values(), *AGENT.values()]:
        end = argo_end(pod)
        cause = faults.retry_cause(end[faults.EXIT_CODE], end[faults.STATUS], end[faults.MESSAGE])
        assert (cause is not None) == evaluate(RETRY_ON_INFRA_ERROR, end)
    with pytest.raises(ValueError):
        faults.Test(faults.MESSAGE, "it's").render()


def rollout_template(config: RunConfig) -> dict:
    """The rendered `rollout` template of iteration 0."""
    templates = iteration_workflow(config, 0).to_dict()["spec"]["templates"]
    return next(t for t in templates if t["name"] == "rollout")


def test_the_rollout_template_retries_with_backoff_and_bounds_setup_apart() -> None:
    """retryPolicy Always (a deleted pod's node is an Error), the expression, the limit, a backoff without
    maxDuration (Argo counts it from the first attempt and would refuse a retry after a long first attempt), and a
    deadline of the plan's plus `rollout_setup_timeout_s`, which Argo's expression template computes."""
    config = RunConfig(rollout_retries=4, rollout_setup_timeout_s=900)
    rollout = rollout_template(config)
    assert rollout["retryStrategy"] == {"limit": 4, "retryPolicy": "Always", "expression": RETRY_ON_INFRA_ERROR,
                                        "backoff": {"duration": "15s", "factor": 2}}
    deadline = rollout["activeDeadlineSeconds"]
    assert deadline == "{{=asInt(inputs.parameters.deadline) + 900}}"
    body = re.fullmatch(r"\{\{=asInt\(inputs\.parameters\.deadline\) \+ (\d+)\}\}", deadline)
    assert int(body.group(1)) + 480 == 1380  # a plan item's 480 s (agent + verifier + margin) and the setup's 900
    assert rollout_template(RunConfig(rollout_setup_timeout_s=0))["activeDeadlineSeconds"].endswith("+ 0}}")


def test_a_negative_setup_timeout_is_refused_in_one_sentence() -> None:
    """`rollout_setup_timeout_s` must be 0 or more; the control passes."""
    validate(RunConfig(rollout_setup_timeout_s=0), check_dataset=False)
    with pytest.raises(ConfigError, match="rollout_setup_timeout_s.*0 or more"):
        validate(RunConfig(rollout_setup_timeout_s=-1), check_dataset=False)


def test_the_driver_counts_the_rollouts_the_cluster_ended_by_cause(fake_argo) -> None:
    """`progress` of an ended Workflow counts the Failed and Error rollout pods by retry cause from the node status;
    an agent's end and a succeeded pod are not counted (the controls)."""
    ends = [("Error", None, "pod deleted"), ("Failed", "137", "The node was low on resource: memory. "),
            ("Failed", "3", "main: Error (exit code 3)"), ("Failed", "3", "main: Error (exit code 3)"),
            ("Failed", "137", "main: OOMKilled (exit code 137)"), ("Succeeded", "0", "")]
    nodes = {f"n{i}": {"id": f"n{i}", "name": f"wf.collect.rollout({i})", "type": "Pod", "templateName": "rollout",
                       "phase": phase, "message": message, "outputs": {"exitCode": code} if code else None}
             for i, (phase, code, message) in enumerate(ends)}
    fake_argo.workflows["wf"] = {"metadata": {"name": "wf", "namespace": "argo"}, "spec": {}}
    fake_argo._status = lambda name: {"phase": "Failed", "nodes": nodes}  # the nodes are read once it ended
    progress = ArgoClient(fake_argo.url, "test-token", "argo").progress("wf")
    assert progress.infra_ends == {"evicted": 1, "infra_error": 2, "pod_deleted": 1}
    assert (progress.rollouts_done, progress.rollouts_failed) == (1, 5)
