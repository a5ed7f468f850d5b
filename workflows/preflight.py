"""Before submitting: does the cluster have the namespace, the Secrets, the service accounts' cloud identities and
the GPU nodes the run needs (and, with `update_nodes` > 1, JobSet)?

Runs only when a cluster is reachable (a kubeconfig or an in-cluster service account and an API
server that answers); otherwise it says it skipped. Each missing thing is one sentence with the
command that fixes it. It also notes what the rollout pods' NetworkPolicies need from the cluster
(a CNI that enforces them; the API server's addresses for Argo's executor), which it cannot check.
"""

import json
from collections.abc import Callable

import urllib3
import yaml

from workflows import jobset
from steps.contracts.config import RunConfig

from workflows.config import egress_cidrs

SECRET_KEYS = {"s3_secret": ("access-key", "secret-key"), "admin_secret": ("admin-key",)}
# The annotations that give a service account's pods a cloud identity: EKS IRSA's role
# (docs.aws.amazon.com/eks/latest/userguide/associate-service-account-role.html) and GKE Workload Identity's Google
# service account (cloud.google.com/kubernetes-engine/docs/how-to/workload-identity).
IDENTITY_ANNOTATIONS = ("eks.amazonaws.com/role-arn", "iam.gke.io/gcp-service-account")


def load_core_api() -> tuple[object | None, str]:
    """A kubernetes CoreV1Api, or None with the reason there is none (no kubeconfig, no in-cluster account);
    `api.api_client` serves the other APIs."""
    from kubernetes import client, config as kube_config

    try:
        kube_config.load_kube_config()
    except Exception:  # noqa: BLE001 - any kubeconfig problem means "no cluster configured here"
        try:
            kube_config.load_incluster_config()
        except Exception:  # noqa: BLE001
            return None, "no kubeconfig or in-cluster service account"
    return client.CoreV1Api(), ""


def _status(call: Callable[[], object]) -> int | None:
    """Runs one API call: None on success, else its HTTP status (0 when the API server did not answer)."""
    from kubernetes.client.exceptions import ApiException

    try:
        call()
        return None
    except ApiException as exc:
        return int(exc.status or 0)
    except Exception:  # noqa: BLE001 - connection refused, DNS, timeout: the cluster is not reachable
        return 0


def check_cluster(api, config: RunConfig, custom=None) -> tuple[list[str], list[str]]:
    """(notes, problems) for the run's namespace, Secrets and GPU nodes, read through `api` (CoreV1Api); with
    `update_nodes` > 1, JobSet too, through `custom` (CustomObjectsApi)."""
    ns = config.namespace
    status = _status(lambda: api.read_namespace(ns, _request_timeout=10))
    if status == 0:
        return ["the cluster's API server did not answer; skipped the cluster preflight"], []
    if status == 404:
        return [], [f"namespace {ns!r} does not exist (kubectl create namespace {ns})"]
    notes, problems = [], []
    for field, keys in SECRET_KEYS.items():
        name = getattr(config, field)
        status = _status(lambda name=name: api.read_namespaced_secret(name, ns, _request_timeout=10))
        if status == 404:
            literals = " ".join(f"--from-literal={k}=..." for k in keys)
            problems.append(f"secret {name!r} is missing in namespace {ns!r} "
                            f"(kubectl -n {ns} create secret generic {name} {literals})")
        elif status:
            notes.append(f"could not check secret {name!r} (HTTP {status})")
    more_notes, more_problems = check_identities(api, config)
    notes, problems = notes + more_notes, problems + more_problems
    needed = max(config.serve_gpus * config.serve_replicas, config.update_gpus)  # the replicas share one serve pod
    if needed:
        try:
            nodes = api.list_node(_request_timeout=10).items
            gpus = [int((n.status.allocatable or {}).get("nvidia.com/gpu", "0")) for n in nodes]
            most = max(gpus, default=0)
            # The scheduler may put several update pods on one node: count the pods the nodes can hold.
            slots = sum(g // config.update_gpus for g in gpus) if config.update_gpus else len(gpus)
            if most < needed:
                problems.append(f"no node offers {needed} nvidia.com/gpu (the most any node has is {most}); "
                                f"lower serve_gpus/serve_replicas/update_gpus or add GPU nodes with the NVIDIA device plugin")
            elif slots < config.update_nodes:
                problems.append(f"update_nodes is {config.update_nodes}, but the nodes offer only {slots} slot(s) of "
                                f"update_gpus={config.update_gpus} nvidia.com/gpu; lower update_nodes or add GPU nodes")
        except Exception as exc:  # noqa: BLE001 - listing nodes is often forbidden to users: not fatal
            notes.append(f"could not list nodes to check GPUs ({type(exc).__name__})")
    if config.update_nodes > 1:
        more_notes, more_problems = check_jobset(custom, config)
        notes, problems = notes + more_notes, problems + more_problems
    return notes + network_notes(api, config), problems


def check_identities(api, config: RunConfig) -> tuple[list[str], list[str]]:
    """(notes, problems) for the service accounts' cloud identities (docs/workflows.md, "Credentials"): with
    `s3_credentials: pod-identity`, `service_account` carries one; the rollout pods' (the agents'), which is
    `rollout_service_account` or else `service_account`, exists and carries none."""
    from kubernetes.client.exceptions import ApiException

    ns, notes, problems = config.namespace, [], []
    rollouts = config.rollout_service_account or config.service_account
    pod_identity = config.s3_credentials == "pod-identity"
    wanted = [(config.service_account, True)] if pod_identity else []
    # the same account both ways is refused by the config's own check, with its fix
    wanted += [(rollouts, False)] if not (pod_identity and rollouts == config.service_account) else []
    for name, needs_identity in wanted:
        try:
            annotations = api.read_namespaced_service_account(name, ns, _request_timeout=10).metadata.annotations or {}
        except ApiException as exc:
            if exc.status == 404:
                problems.append(f"service account {name!r} is missing in namespace {ns!r} (kubectl -n {ns} create "
                                f"serviceaccount {name})")
            else:
                notes.append(f"could not check service account {name!r} (HTTP {exc.status})")
            continue
        found = [key for key in IDENTITY_ANNOTATIONS if annotations.get(key)]
        if needs_identity and not found:
            problems.append(f"s3_credentials is pod-identity, but service account {name!r} carries no cloud identity; "
                            f"annotate it (kubectl -n {ns} annotate serviceaccount {name} "
                            f"{IDENTITY_ANNOTATIONS[0]}=arn:aws:iam::ACCOUNT:role/ROLE, or "
                            f"{IDENTITY_ANNOTATIONS[1]}=NAME@PROJECT.iam.gserviceaccount.com on GKE)")
        elif not needs_identity and found:
            problems.append(f"service account {name!r} runs the rollout pods (the agents) but carries the cloud "
                            f"identity {found[0]}, which every container of those pods would get; name one without "
                            f"it in rollout_service_account (kubectl -n {ns} create serviceaccount openforge-rollout)")
    return notes, problems


def check_jobset(custom, config: RunConfig) -> tuple[list[str], list[str]]:
    """(notes, problems) for the multi-node update: a server-side dry run of creating iteration 0's JobSet, which
    needs the JobSet API (its CRD) and is admitted only by JobSet's controller (it serves JobSet's webhook)."""
    from kubernetes.client.exceptions import ApiException

    from workflows.iteration import update_nodes_template, workflow_name

    name = workflow_name(config, 0)  # what Argo fills in for the Workflow's name
    manifest = (update_nodes_template(config, 0).manifest
                .replace(jobset.NAME, jobset.jobset_name(name)).replace("{{workflow.name}}", name))
    group, version = jobset.API_VERSION.split("/")
    nodes = f"update_nodes is {config.update_nodes}"
    try:
        custom.create_namespaced_custom_object(group, version, config.namespace, "jobsets", yaml.safe_load(manifest),
                                               dry_run="All", _request_timeout=10)
    except ApiException as exc:
        if exc.status == 409:  # iteration 0's JobSet exists (a resumed run): the API and its webhook admitted it
            return [], []
        if exc.status == 404:
            return [], [f"{nodes}, but the cluster has no JobSet API (CRD {jobset.CRD}); install JobSet "
                        f"({jobset.INSTALL})"]
        if exc.status and exc.status >= 500 and "webhook" in str(exc.body or ""):
            return [], [f"{nodes}, but JobSet's controller did not answer (its admission webhook failed); install "
                        f"or restart JobSet ({jobset.INSTALL}; kubectl -n jobset-system get pods)"]
        # JobSet's webhook refuses with 422 (field errors) or, as "denied the request", 403.
        if exc.status in (400, 422) or "denied the request" in str(exc.body or ""):
            return [], [f"{nodes}, but JobSet refuses the update's JobSet: {_message(exc)}"]
        return [f"could not check JobSet for update_nodes (HTTP {exc.status} on a dry-run create of a jobset in "
                f"namespace {config.namespace!r}); the workflow's service account needs create, get, list, watch and "
                f"delete on jobsets (docs/workflows.md, \"The update across nodes\")"], []
    except (OSError, urllib3.exceptions.HTTPError):  # connection refused, DNS, timeout; a bug here still raises
        return ["the cluster's API server did not answer the JobSet check for update_nodes"], []
    return [], []


def _message(exc) -> str:
    """The API server's own one-line message from an ApiException's JSON body (a Status), else its reason."""
    try:
        return " ".join(str(json.loads(exc.body).get("message") or exc.reason).split())
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)


def api_server_addresses(api) -> list[str]:
    """The Kubernetes API server's addresses (the `kubernetes` Endpoints in `default`), or [] if unreadable."""
    try:
        endpoints = api.read_namespaced_endpoints("kubernetes", "default", _request_timeout=10)
        return [address.ip for subset in endpoints.subsets or [] for address in subset.addresses or []]
    except Exception:  # noqa: BLE001 - often forbidden to users; the note then names no address
        return []


def network_notes(api, config: RunConfig) -> list[str]:
    """What the rollout pods' NetworkPolicies need that no API call can confirm (docs/workflows.md)."""
    if not config.network_policy:
        return ["network_policy is false: rollout pods (the agents) reach whatever the cluster's network lets them"]
    notes = ["rollout pods are isolated by NetworkPolicies, which only a CNI that enforces them applies (Calico, "
             "Cilium, ...; flannel alone does not); the workflow's service account must be allowed to apply "
             "networking.k8s.io networkpolicies"]
    if not egress_cidrs(config):
        found = ", ".join(f"{ip}/32" for ip in api_server_addresses(api)) or "its addresses"
        notes.append(f"rollout_egress_cidrs is empty, so Argo's executor in each rollout pod reaches neither the "
                     f"Kubernetes API server ({found}) nor the S3 endpoint: set rollout_egress_cidrs to both "
                     f"(and rollout_dns=true when S3 is reached by name)")
    return notes


def preflight(config: RunConfig) -> tuple[list[str], list[str]]:
    """(notes, problems) for the configured cluster; a note only when no cluster is reachable from here."""
    api, why = load_core_api()
    if api is None:
        return [f"{why}; skipped the cluster preflight"], []
    from kubernetes import client

    return check_cluster(api, config, client.CustomObjectsApi(api.api_client))
