"""Before submitting: does the cluster have the namespace, the Secrets, the service accounts' cloud identities and
the GPU nodes the run needs (and, with `update_nodes` > 1, JobSet)?

Runs only when a cluster is reachable (a kubeconfig or an in-cluster service account and an API
server that answers); otherwise it says it skipped. Each missing thing is one sentence with the
command that fixes it. With `network_policy`, Argo's executor in each rollout pod must reach the API server's
endpoint addresses: `rollout_egress_cidrs` must cover them (`auto`: read them at submit, `with_api_server`), and a
config whose rollout pods could not reach them is refused, also with no cluster to read them from. It notes what
it cannot check: a CNI that enforces NetworkPolicies.
"""

import dataclasses
import ipaddress
import json
from collections.abc import Callable

import urllib3
import yaml

from workflows import jobset
from steps.contracts.config import RunConfig

from steps.settings import ConfigError
from workflows.config import egress_auto, egress_cidrs

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


def check_cluster(api, config: RunConfig, custom=None, discovery=None) -> tuple[list[str], list[str]]:
    """(notes, problems) for the run's namespace, Secrets and GPU nodes, read through `api` (CoreV1Api); with
    `update_nodes` > 1, JobSet too, through `custom` (CustomObjectsApi); the rollout pods' network
    (`network_checks`, the API server's EndpointSlices through `discovery`, a DiscoveryV1Api)."""
    ns = config.namespace
    status = _status(lambda: api.read_namespace(ns, _request_timeout=10))
    if status == 0:
        return (["the cluster's API server did not answer; skipped the cluster preflight"],
                unreachable_problems(config, "its API server did not answer"))
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
    network_notes, network_problems = network_checks(api, config, discovery)
    return notes + network_notes, problems + network_problems


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


def api_server_addresses(api, discovery=None) -> list[str]:
    """The Kubernetes API server's own addresses: those of the `kubernetes` Service's EndpointSlices in `default`
    (through `discovery`, a DiscoveryV1Api), else of its Endpoints (through `api`); [] if neither can be read.

    These, not the Service's ClusterIP, are what a NetworkPolicy must let through: Calico and Cilium apply policy
    after kube-proxy (or their own load balancer) has translated the ClusterIP to an endpoint (docs/workflows.md,
    "Network isolation")."""
    if discovery is not None:
        try:
            slices = discovery.list_namespaced_endpoint_slice(
                "default", label_selector="kubernetes.io/service-name=kubernetes", _request_timeout=10).items
            found = [address for piece in slices for endpoint in piece.endpoints or []
                     if endpoint.conditions is None or endpoint.conditions.ready is not False
                     for address in endpoint.addresses or []]
            if found:
                return sorted(set(found))
        except Exception:  # noqa: BLE001 - often forbidden to users; the Endpoints may still be readable
            pass
    try:
        endpoints = api.read_namespaced_endpoints("kubernetes", "default", _request_timeout=10)
        return sorted({address.ip for subset in endpoints.subsets or [] for address in subset.addresses or []})
    except Exception:  # noqa: BLE001 - often forbidden to users: the caller says what to set instead
        return []


def host_cidr(ip: str) -> str:
    """One address as a CIDR of itself.

    >>> host_cidr("10.0.0.5"), host_cidr("fd00::1")
    ('10.0.0.5/32', 'fd00::1/128')
    """
    return ipaddress.ip_network(ip).with_prefixlen


def api_server_cidrs(api, discovery=None) -> list[str]:
    """What `rollout_egress_cidrs: auto` renders: the API server's endpoint addresses (`api_server_addresses`),
    then the `kubernetes` Service's ClusterIP, each as a /32 (/128). The ClusterIP is for a network plugin that
    applies policy before the address is translated, which Kubernetes leaves undefined (NetworkPolicy docs,
    "ipBlock"); [] when the endpoints cannot be read."""
    addresses = api_server_addresses(api, discovery)
    if not addresses:
        return []
    try:
        cluster_ip = api.read_namespaced_service("kubernetes", "default", _request_timeout=10).spec.cluster_ip
    except Exception:  # noqa: BLE001 - the endpoints are what Calico and Cilium match; the ClusterIP is extra
        cluster_ip = None
    extra = [cluster_ip] if cluster_ip and cluster_ip not in addresses else []
    return [host_cidr(ip) for ip in addresses + extra]


UNREADABLE = ("set rollout_egress_cidrs to the API server's addresses (kubectl get endpointslices -n default "
              "-l kubernetes.io/service-name=kubernetes) or let this account read them")
AUTO_UNREADABLE = ("rollout_egress_cidrs is auto, but the Kubernetes API server's addresses (the `kubernetes` "
                   f"EndpointSlices or Endpoints in namespace default) could not be read: {UNREADABLE}")


EMPTY = ("rollout_egress_cidrs is empty, so Argo's executor in each rollout pod cannot reach the Kubernetes API server "
         "to report the rollout's outputs: set it to auto or to the API server's addresses")


def unreachable_problems(config: RunConfig, why: str) -> list[str]:
    """What the rollout pods' policy cannot do without a cluster to read (`why` none is reachable): `auto` has no
    addresses to render, and an empty list lets Argo's executor reach no API server."""
    if not config.network_policy:
        return []
    if egress_auto(config):
        return [f"rollout_egress_cidrs is auto, but no cluster is reachable from here ({why}) to read the "
                f"Kubernetes API server's addresses from: {UNREADABLE}"]
    if not egress_cidrs(config):
        return [EMPTY]
    return []


def network_checks(api, config: RunConfig, discovery=None) -> tuple[list[str], list[str]]:
    """(notes, problems) of the rollout pods' NetworkPolicy: Argo's executor there must reach the API server's
    endpoint addresses, which `rollout_egress_cidrs` must cover (explicitly or as `auto`); that a CNI enforces
    NetworkPolicy at all no API call can confirm (docs/workflows.md)."""
    if not config.network_policy:
        return ["network_policy is false: rollout pods (the agents) reach whatever the cluster's network lets them"], []
    notes = ["rollout pods are isolated by NetworkPolicies, which only a CNI that enforces them applies (Calico, "
             "Cilium, ...; flannel alone does not); the workflow's service account must be allowed to apply "
             "networking.k8s.io networkpolicies"]
    addresses = api_server_addresses(api, discovery)
    if egress_auto(config):
        if not addresses:
            return notes, [AUTO_UNREADABLE]
        cidrs = ", ".join(api_server_cidrs(api, discovery))
        return notes + [f"rollout pods may reach the Kubernetes API server at {cidrs} (rollout_egress_cidrs: auto)"], []
    if not egress_cidrs(config):
        return notes, [EMPTY]
    allowed = [ipaddress.ip_network(cidr, strict=False) for cidr in egress_cidrs(config)]
    missing = [ip for ip in addresses if not any(ipaddress.ip_address(ip) in net for net in allowed)]
    if missing:
        return notes, [f"rollout_egress_cidrs does not cover the Kubernetes API server's addresses "
                       f"{', '.join(missing)} (the `kubernetes` endpoints in namespace default), which Argo's executor "
                       f"in each rollout pod must reach: add them, or set rollout_egress_cidrs to auto"]
    if not addresses:
        notes.append("could not read the Kubernetes API server's addresses to check that rollout_egress_cidrs covers "
                     "them (the `kubernetes` endpoints in namespace default)")
    return notes, []


def preflight(config: RunConfig) -> tuple[list[str], list[str]]:
    """(notes, problems) for the configured cluster. With no cluster reachable from here, a note that it was skipped,
    and the problems of a rollout network that needs one (`unreachable_problems`)."""
    api, why = load_core_api()
    if api is None:
        return [f"{why}; skipped the cluster preflight"], unreachable_problems(config, why)
    from kubernetes import client

    return check_cluster(api, config, client.CustomObjectsApi(api.api_client), client.DiscoveryV1Api(api.api_client))


def with_api_server(config: RunConfig, api=None, discovery=None) -> RunConfig:
    """The config to render at submit: with `rollout_egress_cidrs: auto` (and `network_policy`), the API server's
    addresses read from the cluster now (`api_server_cidrs`, through `api` and `discovery`, by default the
    configured cluster's), so that each submission renders those of the moment; any other config as it is.
    A ConfigError when they cannot be read."""
    if not (config.network_policy and egress_auto(config)):
        return config
    if api is None:
        api, why = load_core_api()
        if api is None:
            raise ConfigError(unreachable_problems(config, why)[0])
        from kubernetes import client

        discovery = client.DiscoveryV1Api(api.api_client)
    cidrs = api_server_cidrs(api, discovery)
    if not cidrs:
        raise ConfigError(AUTO_UNREADABLE)
    return dataclasses.replace(config, rollout_egress_cidrs=",".join(cidrs))
