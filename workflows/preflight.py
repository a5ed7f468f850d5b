"""Before submitting: does the cluster have the namespace, the Secrets and GPU nodes the run needs?

Runs only when a cluster is reachable (a kubeconfig or an in-cluster service account and an API
server that answers); otherwise it says it skipped. Each missing thing is one sentence with the
command that fixes it. It also notes what the rollout pods' NetworkPolicies need from the cluster
(a CNI that enforces them; the API server's addresses for Argo's executor), which it cannot check.
"""

from collections.abc import Callable

from workflows.config import RunConfig, egress_cidrs

SECRET_KEYS = {"s3_secret": ("access-key", "secret-key"), "admin_secret": ("admin-key",)}


def load_core_api() -> tuple[object | None, str]:
    """A kubernetes CoreV1Api, or None with the reason there is none (no kubeconfig, no in-cluster account)."""
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


def check_cluster(api, config: RunConfig) -> tuple[list[str], list[str]]:
    """(notes, problems) for the run's namespace, Secrets and GPU nodes, read through `api` (CoreV1Api)."""
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
    needed = max(config.serve_gpus * config.serve_replicas, config.update_gpus)  # the replicas share one serve pod
    if needed:
        try:
            nodes = api.list_node(_request_timeout=10).items
            most = max((int((n.status.allocatable or {}).get("nvidia.com/gpu", "0")) for n in nodes), default=0)
            if most < needed:
                problems.append(f"no node offers {needed} nvidia.com/gpu (the most any node has is {most}); "
                                f"lower serve_gpus/serve_replicas/update_gpus or add GPU nodes with the NVIDIA device plugin")
        except Exception as exc:  # noqa: BLE001 - listing nodes is often forbidden to users: not fatal
            notes.append(f"could not list nodes to check GPUs ({type(exc).__name__})")
    return notes + network_notes(api, config), problems


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
    return check_cluster(api, config)
