"""Which ends of a rollout pod Argo retries: the cluster's, never the agent's (docs/workflows.md, "Retries").

A rollout pod's attempt is retried when its end matches one of `RETRIED`'s causes, each a conjunction of tests on
the variables Argo gives `retryStrategy.expression` (`buildRetryStrategyLocalScope` in Argo v3.5-3.7's
workflow/controller/operator.go): `lastRetry.exitCode` (the `main` container's exit code as a string, "-1" when
it never terminated), `lastRetry.status` (the node's phase: Failed or Error) and `lastRetry.message` (the node's
message, set by `inferFailedReason` from the pod's `status.message` when the kubelet wrote one, else from the
first failed container, init containers first, as "NAME: REASON (exit code N)[: termination message]"; or
"pod deleted" by `podReconciliation` for a pod that vanished). Only exact messages and prefixes the cluster
writes are matched, never a substring: the agent can write a container's termination message (the kubelet's
/dev/termination-log is world-writable), which only ever comes after "main: ...".

What the agent causes is never among them: its container's OOM kill (guarded by the runner, else "main:
OOMKilled (exit code 137)"), its pod's ephemeral-storage or emptyDir limit ("Pod ephemeral local storage usage
exceeds the total limit of containers ...", "Usage of EmptyDir volume ... exceeds the limit ...", "Container
main exceeded its local ephemeral storage limit ..."), a node low on pids or inodes (no per-pod bound holds the
agent's forks or files), a deadline past the agent's start, any other exit of the runner.
"""

from dataclasses import dataclass

EXIT_CODE, STATUS, MESSAGE = "lastRetry.exitCode", "lastRetry.status", "lastRetry.message"
# The deadline the kubelet's active-deadline handler writes into the pod's status.message
# (pkg/kubelet/active_deadline.go, `activeDeadlineHandler`: reason DeadlineExceeded).
DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"


@dataclass(frozen=True)
class Test:
    """`variable == value`, or with `prefix` `variable startsWith value` (an expr-lang operator)."""

    variable: str
    value: str
    prefix: bool = False

    def render(self) -> str:
        """The test in Argo's expression language (expr-lang/expr), the value single-quoted."""
        if "'" in self.value or "\\" in self.value:
            raise ValueError(f"a retry test's value must not hold quotes or backslashes: {self.value!r}")
        return f"{self.variable} {'startsWith' if self.prefix else '=='} '{self.value}'"

    def holds(self, values: dict[str, str]) -> bool:
        """Whether the test holds for these variables' values."""
        value = values[self.variable]
        return value.startswith(self.value) if self.prefix else value == self.value


def exit_code(code: str) -> Test:
    """`lastRetry.exitCode == code`."""
    return Test(EXIT_CODE, code)


def status(phase: str) -> Test:
    """`lastRetry.status == phase`."""
    return Test(STATUS, phase)


def message(text: str, prefix: bool = False) -> Test:
    """`lastRetry.message == text`, or with `prefix` `lastRetry.message startsWith text`."""
    return Test(MESSAGE, text, prefix)


# The init containers of a rollout pod (`workflows.iteration`): they copy OpenForge and the harness, fetch the task
# and close the app's state folder before the agent exists, so their failure is the cluster's (an image, the proxy).
INIT_CONTAINERS = ("openforge", "harness", "task", "app-state")

# cause -> the conjunctions, any of which makes an attempt's end that cause. Where each message comes from:
RETRIED: dict[str, list[tuple[Test, ...]]] = {
    # the runner's own infra_error (steps.rollout: exit code 3)
    "infra_error": [(exit_code("3"),)],
    # the pod vanished before Argo saw its end: preempted by the scheduler, evicted through the Eviction API (a
    # drain), deleted by the taint manager or the pod GC for a lost node, or by a person (`podReconciliation`)
    "pod_deleted": [(status("Error"), message("pod deleted"))],
    # deleted the same ways, but Argo saw the runner stopped by the kubelet's SIGTERM (143) or, past the grace
    # period, SIGKILL (137), with no pod message: no process of the agent's can signal the root runner
    "pod_terminated": [(status("Failed"), exit_code(code), message(f"main: Error (exit code {code})"))
                       for code in ("143", "137")],
    # the node went away under the pod (Argo v3.7's `inferFailedReason` for a Failed pod whose containers never
    # reported an end; v3.5 and v3.6 read that as Succeeded), or its containers were lost with it (the kubelet's
    # ContainerStatusUnknown)
    "node_lost": [(status("Failed"), exit_code("-1"),
                   message("pod failed: neither main nor wait container completed successfully")),
                  (status("Failed"), message("main: ContainerStatusUnknown (exit code 137)", prefix=True)),
                  # the kubelet's graceful node shutdown (pkg/kubelet/nodeshutdown: `nodeShutdownMessage`)
                  (message("Pod was terminated in response to imminent node shutdown.", prefix=True),)],
    # the kubelet's node-pressure eviction of memory or disk (pkg/kubelet/eviction/helpers.go, `nodeLowMessageFmt`),
    # which never takes a pod within its limits while one over them is there: `synchronize` evicts for a pod's own
    # storage limits first, and the rollout's requests equal its limits; its admission refusal under pressure
    # (`nodeConditionMessageFmt`); the kubelet's preemption for a critical pod (pkg/kubelet/preemption); any refusal
    # at admission, that one included (pkg/kubelet/kubelet.go `rejectPod`: "Pod was rejected: " + the reason)
    "evicted": [(message(f"The node was low on resource: {r}.", prefix=True),) for r in ("memory", "ephemeral-storage")]
    + [(message(text, prefix=True),)
       for text in ("The node had condition: ", "Preempted in order to admit critical pod", "Pod was rejected: ")],
    # the pod's deadline before the runner started (image pulls, init containers: `main` never terminated)
    "setup_deadline": [(message(DEADLINE_MESSAGE), exit_code("-1"))],
    # an init container failed (a bad image, the proxy unreachable for the task's files)
    "setup_failed": [(message(f"{name}: ", prefix=True),) for name in INIT_CONTAINERS],
}


def expression() -> str:
    """The rollout template's `retryStrategy.expression`: any cause of `RETRIED`."""
    return " || ".join(f"({' && '.join(t.render() for t in tests)})"
                       for conjunctions in RETRIED.values() for tests in conjunctions)


def retry_cause(exit_code_: str | None, phase: str, message_: str | None) -> str | None:
    """The cause of `RETRIED` an attempt's end is (a rollout Pod node's exit code, phase and message), or None
    when it is not retried.

    >>> retry_cause("3", "Failed", "main: Error (exit code 3)"), retry_cause(None, "Error", "pod deleted")
    ('infra_error', 'pod_deleted')
    >>> retry_cause("137", "Failed", "main: OOMKilled (exit code 137)") is None
    True
    """
    values = {EXIT_CODE: "-1" if exit_code_ is None else exit_code_, STATUS: phase, MESSAGE: message_ or ""}
    for cause, conjunctions in RETRIED.items():
        if any(all(t.holds(values) for t in tests) for tests in conjunctions):
            return cause
    return None
