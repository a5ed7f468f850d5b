"""The few Argo Server calls the driver makes, through Hera's `WorkflowsService`, with errors for people.

    client = ArgoClient("https://argo.example.com:2746", token=os.environ.get("ARGO_TOKEN"), namespace="openforge")
    client.lint(workflow); name = client.create(workflow); phase = client.wait(name)

Routes used (Argo Server API v1): lint `POST /api/v1/workflows/{ns}/lint`, create `POST /api/v1/workflows/{ns}`,
get `GET /api/v1/workflows/{ns}/{name}?fields=...`, retry `PUT .../{name}/retry`, resubmit `PUT .../{name}/resubmit`,
delete `DELETE .../{name}`.
Every get names the few fields it needs (`fields`): the server then sends those alone. A Workflow's node status
holds two nodes per rollout (a Retry node and its Pod), megabytes at 10,000 rollouts, so a poll reads the phase, the
pods' progress and one node's phase, a few hundred bytes, and the nodes are read once, when the Workflow has ended
(docs/workflows.md, "What the driver reads").
`wait` polls `get` itself: Hera 7.1's `Workflow.wait()` raises on the empty phase right after
creation and returns at `Pending`.
The server's TLS certificate is verified against the system's CAs, or `verify` (a CA bundle file); `verify=False`
accepts any (Argo's server makes itself a self-signed certificate unless given one: argo-workflows
docs/tls.md), and the driver says so.
"""

import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import field
from pathlib import Path

import requests
from hera.exceptions import AlreadyExists, HeraException, NotFound, Unauthorized, exception_from_server_response
from hera.workflows import Workflow, WorkflowsService
from hera.workflows.models import (WorkflowCreateRequest, WorkflowLintRequest, WorkflowResubmitRequest,
                                   WorkflowRetryRequest)

from workflows.faults import retry_cause
from workflows.iteration import ROLLOUT_TEMPLATES, RUN_NAME_ANNOTATION

DONE = ("Succeeded", "Failed", "Error")
RETRY_FAILED_ROLLOUTS = "templateName=rollout,phase=Failed"
# The message Argo gives each node it fails at the Workflow's deadline (spec.activeDeadlineSeconds): Argo v3.5-3.7's
# `applyExecutionControl` (workflow/controller/exec_control.go) for a node whose pod still runs or waits, and
# `failNodesWithoutCreatedPodsAfterDeadlineOrShutdown` (workflow/controller/operator.go) for one with no pod yet.
WORKFLOW_DEADLINE = "Step exceeded its deadline"
# The kubelet's message for a pod stopped at its own activeDeadlineSeconds, which Argo copies onto the node
# (`inferFailedReason` in operator.go takes the pod's status message; Argo's test/e2e/workflow_test.go checks it).
POD_DEADLINE = "Pod was active on the node longer than the specified deadline"
# The deadline each pod's template carries (workflows/iteration.py, docs/workflows.md "Deadlines").
TEMPLATE_DEADLINES = {"serve": "serve_timeout_s", "update": "update_timeout_s", "rollout": "the task's timeouts"}
# A retry's node selector: the serve daemon, started again (with restartSuccessful; see `retry_failed`).
RESTART_SERVE = "templateName=serve"
REQUEST_TIMEOUT_S = 30.0


class ArgoError(RuntimeError):
    """The Argo Server could not be reached or refused a request; the message is one sentence."""


class _TimeoutSession(requests.Session):
    """A session whose requests time out (Hera passes none, so an unreachable server would hang); with a
    `token_file`, each request's bearer token is read from that file (a pod's service account token, which the
    kubelet rewrites before it expires)."""

    def __init__(self, token_file: str | None = None) -> None:
        super().__init__()
        self.token_file = token_file

    def request(self, method, url, **kwargs):  # type: ignore[override]
        """`requests.Session.request` with a default timeout (and the token file's token)."""
        kwargs.setdefault("timeout", REQUEST_TIMEOUT_S)
        if self.token_file:
            token = Path(self.token_file).read_text().strip()
            kwargs["headers"] = {**(kwargs.get("headers") or {}), "Authorization": f"Bearer {token}"}
        return super().request(method, url, **kwargs)


@dataclasses.dataclass(frozen=True)
class Progress:
    """A workflow's phase and its rollout pods' counts, as `wait` reports them."""

    phase: str
    rollouts_done: int = 0
    rollouts_failed: int = 0
    collect: str = ""  # the phase of its `collect` DAG (serve, rollouts, trajectories); "" before it started
    # rollout pods that ended for a cause Argo retries (`workflows.faults.RETRIED`), by cause; the last attempt too
    infra_ends: dict[str, int] = field(default_factory=dict)
    pods: str = ""  # Argo's `status.progress`: its pods ended / its pods so far ("12/40")


def node_id(workflow: str, node: str) -> str:
    """The id Argo gives the node named `node` (`<workflow>.<task>...`) of Workflow `workflow`: the Workflow's name
    and the 32-bit FNV-1a hash of the node's name (argo-workflows pkg/apis/workflow/v1alpha1/workflow_types.go,
    `Workflow.NodeID`), so that a get can name one node's fields without reading the others.

    >>> node_id("openforge-demo-it0", "openforge-demo-it0.collect")
    'openforge-demo-it0-1275922602'
    """
    if node == workflow:
        return workflow
    digest = 0x811C9DC5
    for byte in node.encode():
        digest = ((digest ^ byte) * 0x01000193) & 0xFFFFFFFF
    return f"{workflow}-{digest}"


def poll_fields(name: str) -> str:
    """What a poll of Workflow `name` reads (Argo server's `fields` query, server/workflow/workflow_server.go
    `GetWorkflow` through util/fields `Cleaner`: dotted paths, each keeping that key and what is under it): the
    phase, the pods' progress and the phase of its `collect` DAG node. The Cleaner has no wildcard over a map's
    keys, so a node is named by its id (`node_id`)."""
    collect = node_id(name, f"{name}.collect")
    return f"status.phase,status.progress,status.nodes.{collect}.phase"


class ArgoClient:
    """One Argo Server and namespace."""

    def __init__(self, server: str, token: str | None, namespace: str, verify: bool | str = True,
                 token_file: str | None = None) -> None:
        self.server = server.rstrip("/")
        self.namespace = namespace
        # Hera hands `verify_ssl` to requests' `verify`, which takes a CA bundle's path as well as a bool.
        self.service = WorkflowsService(host=self.server, token=token or None, namespace=namespace,
                                        verify_ssl=verify, session=_TimeoutSession(token_file))  # type: ignore[arg-type]

    def ui_link(self, name: str) -> str:
        """The workflow's page in the Argo UI."""
        return f"{self.server}/workflows/{self.namespace}/{name}"

    def _call(self, what: str, fn: Callable, *args, **kwargs):
        """Runs one API call; every failure becomes an ArgoError naming the server and the call."""
        try:
            return fn(*args, **kwargs)
        except requests.exceptions.SSLError:
            raise ArgoError(f"the Argo server at {self.server} presented a TLS certificate this machine does not trust "
                            f"({what}); give the CA that signed it with argo_ca_bundle=PATH or env ARGO_CA_BUNDLE, "
                            f"or accept any certificate with --argo-insecure") from None
        except requests.exceptions.RequestException as exc:
            raise ArgoError(f"cannot reach the Argo server at {self.server} ({what}): {type(exc).__name__}") from None
        except Unauthorized:
            raise ArgoError(f"the Argo server at {self.server} refused the token ({what}); set ARGO_TOKEN "
                            f"to a valid token (`argo auth token`)") from None
        except (AlreadyExists, NotFound):
            raise
        except HeraException as exc:
            raise ArgoError(f"the Argo server at {self.server} rejected {what}: {exc}") from None

    def lint(self, workflow: Workflow) -> None:
        """Asks the server to validate the workflow (checks it is reachable, too); creates nothing."""
        req = WorkflowLintRequest(namespace=self.namespace, workflow=workflow.build())
        self._call(f"linting {workflow.name}", self.service.lint_workflow, req)

    def create(self, workflow: Workflow) -> str:
        """Submits the workflow; returns its name. One of that name that already exists is followed as it is if it
        belongs to the same run (a resumed driver); one of another run is an ArgoError naming that run."""
        req = WorkflowCreateRequest(namespace=self.namespace, workflow=workflow.build())
        try:
            created = self._call(f"creating {workflow.name}", self.service.create_workflow, req)
        except AlreadyExists:  # the server's 409, grpc-gateway's ALREADY_EXISTS (code 6)
            self.check_owner(str(workflow.name), (workflow.annotations or {}).get(RUN_NAME_ANNOTATION))
            return str(workflow.name)
        return created.metadata.name

    def read(self, name: str, fields: str) -> dict:
        """The workflow `name` as JSON with only `fields` (comma-separated dotted paths) in it; NotFound when there is
        none. Not through Hera's `get_workflow`, whose model refuses a Workflow without its spec."""
        def get() -> dict:
            response = self.service._request("get", url=f"{self.server}/api/v1/workflows/{self.namespace}/{name}",
                                             params={"fields": fields}, headers={"Authorization": self.service.token},
                                             verify=self.service.verify_ssl)
            if not response.ok:
                raise exception_from_server_response(response)
            return response.json()
        return self._call(f"reading {name}", get)

    def check_owner(self, name: str, run: str | None) -> None:
        """An ArgoError unless the existing workflow `name` belongs to run `run` (its `RUN_NAME_ANNOTATION`)."""
        try:
            existing = self.read(name, "metadata.annotations")
        except NotFound:  # deleted since the create was refused
            raise ArgoError(f"workflow {name} was deleted while it was being created; submit again") from None
        owner = (existing.get("metadata", {}).get("annotations") or {}).get(RUN_NAME_ANNOTATION)
        if owner != run:
            whose = f"run {owner!r}" if owner is not None else "no OpenForge run"
            raise ArgoError(f"workflow {name} already exists in namespace {self.namespace} and belongs to {whose}, "
                            f"not to run {run!r}; give this run another name (run=...) or delete that workflow")

    def phase_if_any(self, name: str) -> str | None:
        """The workflow's phase ("" right after creation), or None when there is no workflow of that name."""
        try:
            wf = self.read(name, "status.phase")
        except NotFound:
            return None
        return wf.get("status", {}).get("phase") or ""

    def delete(self, name: str) -> None:
        """Deletes the workflow (its pods and the objects it owns go with it); one already gone is fine."""
        try:
            self._call(f"deleting {name}", self.service.delete_workflow, name)
        except NotFound:
            pass

    def progress(self, name: str) -> Progress:
        """The workflow's phase ("" right after creation), its pods' progress and its collect DAG's phase
        (`poll_fields`); once it has ended, its rollout pods' counts too, from one read of its nodes."""
        try:
            status = self.read(name, poll_fields(name)).get("status", {})
        except NotFound:
            raise ArgoError(f"workflow {name} does not exist in namespace {self.namespace} on {self.server}") from None
        collect = status.get("nodes", {}).get(node_id(name, f"{name}.collect"), {})
        progress = Progress(phase=status.get("phase") or "", collect=collect.get("phase") or "",
                            pods=status.get("progress") or "")
        if progress.phase not in DONE:
            return progress
        nodes = [n for n in self.read(name, "status.nodes").get("status", {}).get("nodes", {}).values()
                 if n.get("templateName") in ROLLOUT_TEMPLATES and n.get("type") == "Pod"]
        causes = [retry_cause((n.get("outputs") or {}).get("exitCode"), n.get("phase"), n.get("message"))
                  for n in nodes if n.get("phase") in ("Failed", "Error")]
        return dataclasses.replace(progress, rollouts_done=sum(n.get("phase") == "Succeeded" for n in nodes),
                                   rollouts_failed=sum(n.get("phase") in ("Failed", "Error") for n in nodes),
                                   infra_ends=dict(sorted(Counter(c for c in causes if c).items())))

    def wait(self, name: str, poll_s: float = 10.0, report: Callable[[Progress], None] = lambda p: None,
             collected: bool = False) -> str:
        """Polls until the workflow is Succeeded, Failed or Error (with `collected`: until its collect DAG has
        succeeded, or the workflow ended); returns its phase; calls `report` on every change."""
        last = None
        while True:
            progress = self.progress(name)
            if progress != last:
                report(progress)
                last = progress
            if progress.phase in DONE or (collected and progress.collect == "Succeeded"):
                return progress.phase
            time.sleep(poll_s)

    def failure(self, name: str) -> str:
        """Why the ended workflow failed, in one sentence (`failure_reason`); "" when it says nothing."""
        wf = self._call(f"reading {name}", self.service.get_workflow, name)
        return failure_reason(wf.status.message if wf.status else None,
                              list((wf.status.nodes or {}).values()) if wf.status else [])

    def collect_phase(self, name: str) -> str:
        """The phase of the workflow's `collect` DAG node ("" before it started)."""
        collect = node_id(name, f"{name}.collect")
        return self.read(name, f"status.nodes.{collect}.phase").get("status", {}).get("nodes", {}).get(
            collect, {}).get("phase") or ""

    def retry_failed(self, name: str) -> None:
        """Retries a failed workflow's failed steps; succeeded rollouts keep their results. Where its collect DAG did
        not succeed, the serve daemon starts again too: Argo resets a Failed or Error step on any retry, and a step
        its `nodeFieldSelector` names only with `restartSuccessful` (argo-workflows workflow/util/util.go
        `getNodeIDsToReset`: no selector at all without it), and a serve that its DAG's end stopped is Succeeded
        (workflow/controller/exec_control.go `killDaemonedChildren`), so it would stay stopped. Resetting it deletes
        its node and the nodes of the steps that depend on it (`resetPath`), which is why no step depends on it:
        the rollouts reach it at its Service's address, where the new serve answers once it is ready."""
        restart_serve = self.collect_phase(name) != "Succeeded"
        req = WorkflowRetryRequest(name=name, namespace=self.namespace, restart_successful=restart_serve,
                                   node_field_selector=RESTART_SERVE if restart_serve else None)
        self._call(f"retrying {name}", self.service.retry_workflow, name, req)

    def resubmit(self, name: str, memoized: bool) -> str:
        """Submits a copy of the workflow (reusing succeeded steps' outputs when memoized); returns its name. A
        memoized copy of one whose collect DAG did not succeed is refused: Argo copies every succeeded pod step into
        it as Skipped (workflow/util/util.go `FormulateResubmitWorkflow`), the serve that its DAG's end stopped
        included, so its rollouts would find no serve."""
        if memoized and self.collect_phase(name) != "Succeeded":
            raise ArgoError(f"workflow {name} did not finish its rollouts, and a memoized resubmit would not start "
                            f"its serve again; use `retry` (which does), or resubmit without --memoized")
        req = WorkflowResubmitRequest(name=name, namespace=self.namespace, memoized=memoized)
        created = self._call(f"resubmitting {name}", self.service.resubmit_workflow, name, req)
        return created.metadata.name


def failure_reason(message: str | None, nodes: list) -> str:
    """One sentence on why a workflow failed, from its status `message` and its `nodes` (Argo's NodeStatus): the
    Workflow's own deadline when Argo stopped steps at it, else the first failed step's message, a pod's deadline
    named with the key that set it. A DAG's failure leaves the Workflow's message empty (`executeDAG` in
    workflow/controller/dag.go sets its node's phase alone, and the Workflow takes the entry node's message), so
    the steps say why."""
    failed = sorted((n for n in nodes if n.phase in ("Failed", "Error") and n.message and n.type == "Pod"),
                    key=lambda n: (n.finished_at is None, str(n.finished_at)))  # undated ones last
    stopped = [n.display_name for n in failed if n.message == WORKFLOW_DEADLINE]
    if stopped:
        more = f" and {len(stopped) - 1} more" if len(stopped) > 1 else ""
        return (f"the Workflow passed its deadline (workflow_timeout_s, spec.activeDeadlineSeconds) and Argo "
                f"stopped {stopped[0]}{more}")
    if not failed:
        return message or ""
    first, more = failed[0], f" ({len(failed) - 1} more steps failed)" if len(failed) > 1 else ""
    if first.message.startswith(POD_DEADLINE):
        key = TEMPLATE_DEADLINES.get(first.template_name or "", "step_timeout_s")
        return f"{first.display_name} passed its own deadline ({key}, the pod's activeDeadlineSeconds){more}"
    return f"{first.display_name} failed: {first.message}{more}"
