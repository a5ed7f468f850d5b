"""A rollout pod reaches nothing but its proxy and the Kubernetes API server (docs/workflows.md, "Network isolation").

- Results go through the proxy: the runner hands `result.json` to `PUT /rollouts/{id}/result` (admin key), and the
  proxy writes it to the store URL the rollout step's S3 artifact had; only for a rollout it opened, under that
  rollout's own id, bounded in size. Checked on a real proxy writing to a real S3 endpoint (moto, on loopback).
- The rendered rollout pod has no S3 Secret and no artifact; the serve pod's proxy is told where results go.
- `rollout_egress_cidrs: auto` renders the API server's endpoint addresses read at submit; the preflight refuses
  a config whose rollout pods could not reach them. No API server runs here, so those tests use doubles of the
  kubernetes client's CoreV1Api and DiscoveryV1Api (the calls and the object shapes the real client returns).
"""

import json
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import fsspec
import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from proxy_process import ADMIN_KEY
from steps.contracts import layout
from steps.contracts.rollout import RolloutResult
from steps.proxy.client import ProxyClientError
from steps.proxy.results import RESULT_MAX_BYTES
from steps.rollout import RolloutSpec, run_rollout
from steps.settings import ConfigError
from steps.tasks import BUILTIN_DATASET
from test_workflows import (CLUSTER, cluster_config, fake_argo, policies, s3_store, schema_errors,  # noqa: F401
                            template, workflow_validator)
from workflows import submit
from workflows.config import egress_cidrs
from workflows.iteration import iteration_workflow
from workflows.lint import semantic_problems
from workflows.preflight import check_cluster, preflight, with_api_server

ENDPOINTS = ["10.0.0.5", "10.0.0.6"]  # the API server's real addresses (the control plane's)
CLUSTER_IP = "10.96.0.1"  # the `kubernetes` Service's ClusterIP


# ---- the proxy's result route ----

@pytest.fixture
def results_proxy(proxy, scripted, s3_server: dict, s3_store: str):
    """A real proxy whose call store and results are on the moto S3 server, serving iteration 3 of run `s3_store`."""
    return proxy(scripted.url, store=f"{s3_store}/calls", env=s3_server["env"],
                 extra=["--run-url", s3_store, "--iteration", "3"])


def result_of(rollout_id: str, **fields) -> dict:
    """A result.json as the rollout step writes it."""
    return RolloutResult(rollout_id=rollout_id, task="hello-file", harness="direct", status="ok", reward=1.0,
                         **fields).to_json()


def put(proxy, path: str, body: bytes, key: str = ADMIN_KEY) -> tuple[int, dict]:
    """One raw PUT to the proxy: (status, JSON answer)."""
    request = urllib.request.Request(proxy.url + path, data=body, method="PUT",
                                     headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def stored(url: str) -> dict | None:
    """The JSON file at `url` in the store, or None."""
    fs, path = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    return json.loads(fs.cat_file(path)) if fs.exists(path) else None


def test_the_proxy_writes_a_rollouts_result_where_its_artifact_went(results_proxy, s3_store: str) -> None:
    """Attempt 2 of a planned rollout, at Argo's retry 1, lands in that attempt's folder of iteration 3 (and an
    evaluation's in the evaluation's folder); the answer names the URL; the admin key is needed (control: the
    rollout's own key and a wrong one are refused, and nothing is written)."""
    client = results_proxy.client
    client.register("it3-hello-file-s0-a2")
    body = result_of("it3-hello-file-s0-a2")
    url = layout.result_url(s3_store, 3, "it3-hello-file-s0-a2")
    for key in (client.register("it3-hello-file-s0-a3")["api_key"], "wrong"):
        status, answer = put(results_proxy, "/rollouts/it3-hello-file-s0-a2/result?retry=1", json.dumps(body).encode(),
                             key=key)
        assert status == 401 and "admin key" in answer["error"]["message"]
        assert stored(url) is None
    assert client.send_result(body, retry=1) == {"rollout_id": "it3-hello-file-s0-a2", "url": url}
    assert stored(url) == body
    client.register("ev3-hello-file-s0")
    evaluated = result_of("ev3-hello-file-s0")
    client.send_result(evaluated, retry=0, evaluation=True)
    assert stored(layout.eval_result_url(s3_store, 3, "ev3-hello-file-s0")) == evaluated


def test_the_proxy_refuses_a_result_of_any_other_rollout(results_proxy, s3_store: str) -> None:
    """Refused, each with one sentence and nothing written: a rollout the proxy never opened (404), a result that
    names another rollout than its route, a retry number later than the attempt's (400). The control: the same
    rollout's own result at its own retry is written."""
    client = results_proxy.client
    client.register("it3-csv-stats-s1")
    refusals = [("it3-never-opened-s0", result_of("it3-never-opened-s0"), 0, 404, "unknown rollout 'it3-never-opened-s0'"),
                ("it3-csv-stats-s1", result_of("it3-other-s0"), 0, 400, "not 'it3-csv-stats-s1'"),
                ("it3-csv-stats-s1", result_of("it3-csv-stats-s1"), 1, 400,
                 "retry must be 0 to 0 for rollout 'it3-csv-stats-s1'")]
    for route, body, retry, status, message in refusals:
        code, answer = put(results_proxy, f"/rollouts/{route}/result?retry={retry}", json.dumps(body).encode())
        assert (code, message in answer["error"]["message"]) == (status, True), answer
    fs, root = fsspec.core.url_to_fs(layout.results_url(s3_store, 3))
    fs.invalidate_cache()
    assert not fs.exists(root)
    client.send_result(result_of("it3-csv-stats-s1"), retry=0)
    assert stored(layout.result_url(s3_store, 3, "it3-csv-stats-s1"))["rollout_id"] == "it3-csv-stats-s1"


def test_a_result_past_the_size_bound_is_refused(results_proxy, s3_store: str) -> None:
    """A result.json of more than RESULT_MAX_BYTES is refused (413) and not written; one just under it is taken
    (the control)."""
    client = results_proxy.client
    client.register("it3-big-s0")
    url = layout.result_url(s3_store, 3, "it3-big-s0")
    big = result_of("it3-big-s0", notes=["x" * RESULT_MAX_BYTES])
    with pytest.raises(ProxyClientError) as refused:
        client.send_result(big, retry=0)
    assert refused.value.status == 413 and stored(url) is None
    under = result_of("it3-big-s0", notes=["x" * (RESULT_MAX_BYTES - 4096)])
    client.send_result(under, retry=0)
    assert stored(url) == under


def test_a_proxy_without_a_run_stores_no_result(proxy, scripted, tmp_path: Path) -> None:
    """A proxy started without --run-url (a local run's: the local runner writes results itself) refuses results
    in one sentence (the control: the fixture's proxies, which have one, take them)."""
    bare = proxy(scripted.url, extra=["--run-url", "", "--iteration", "0"])
    bare.client.register("it0-hello-file-s0")
    with pytest.raises(ProxyClientError, match="started without --run-url"):
        bare.client.send_result(result_of("it0-hello-file-s0"), retry=0)


# ---- the runner sends its result ----

def test_the_runner_sends_its_result_through_the_proxy(results_proxy, scripted, s3_store: str, tmp_path: Path) -> None:
    """A rollout with `send_result` (as the rollout template runs it) writes OUT/result.json and the proxy puts the
    same file at its store URL. Against a proxy that refuses it (it never opened the rollout's id: no run of its
    own here), the rollout is an infra_error saying so: retried, never scored as if the result were stored."""
    from test_rollout import oracle

    scripted.set_commands([oracle("hello-file")])
    spec = RolloutSpec(task=BUILTIN_DATASET / "hello-file", harness="direct", proxy_url=results_proxy.url,
                       rollout_id="it3-hello-file-s0", out=tmp_path / "out", admin_key=ADMIN_KEY, attempt=1,
                       send_result="iteration")
    result = run_rollout(spec)
    assert (result.status, result.reward) == ("ok", 1.0), result
    written = json.loads((spec.out / "result.json").read_text())
    assert stored(layout.result_url(s3_store, 3, "it3-hello-file-s0")) == written
    assert (spec.out / "status").read_text() == "ok"


def test_an_infra_error_result_reaches_the_store_too(results_proxy, s3_store: str, tmp_path: Path) -> None:
    """A rollout whose task cannot be read (attempt 2, Argo's retry 1) is an infra_error whose result the proxy
    stores all the same, in its attempt's folder: the evaluation and the tables count it, as they did the S3
    artifact's. (The runner registers before reading the task, so the proxy has opened its rollout.)"""
    spec = RolloutSpec(task=tmp_path / "no-such-task", harness="direct", proxy_url=results_proxy.url,
                       rollout_id="it3-no-such-task-s0", out=tmp_path / "out", admin_key=ADMIN_KEY, attempt=2,
                       send_result="iteration")
    result = run_rollout(spec)
    assert result.status == "infra_error" and result.rollout_id == "it3-no-such-task-s0-a2"
    kept = stored(layout.result_url(s3_store, 3, "it3-no-such-task-s0-a2"))
    assert kept == json.loads((spec.out / "result.json").read_text()) and kept["status"] == "infra_error"


def test_a_result_the_proxy_refuses_makes_an_infra_error(proxy, scripted, tmp_path: Path) -> None:
    """The proxy has no run to write into: neither the rollout's phase (so its agent never starts) nor its result can
    reach the store, so it is an infra_error (exit code 3: retried) and OUT says why."""
    from test_rollout import oracle

    bare = proxy(scripted.url, extra=["--run-url", "", "--iteration", "0"])
    scripted.set_commands([oracle("hello-file")])
    spec = RolloutSpec(task=BUILTIN_DATASET / "hello-file", harness="direct", proxy_url=bare.url,
                       rollout_id="it0-hello-file-s0", out=tmp_path / "out", admin_key=ADMIN_KEY,
                       send_result="iteration")
    result = run_rollout(spec)
    assert (result.status, result.reward) == ("infra_error", None) and "could not be sent to the proxy" in result.error
    assert json.loads((spec.out / "result.json").read_text())["status"] == "infra_error"
    assert (spec.out / "status").read_text() == "infra_error"


@pytest.mark.slow  # builds a simulated rollout pod (tests/test_pod_rollout.py): a few seconds
def test_the_rollout_pod_sends_its_result_through_the_proxy(results_proxy, scripted, s3_store: str,
                                                            tmp_path: Path) -> None:
    """The rollout template's own command and environment, run in a simulated pod (no S3 credentials in it): the
    result lands at its retry folder's store URL, the same file as the pod's OUT/result.json."""
    import os
    import shutil

    from test_pod_rollout import run_in_pod
    from test_rollout import oracle

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("the simulated pod needs root and util-linux unshare")
    scripted.set_commands([oracle("hello-file")])
    done, result, rollout_id = run_in_pod(results_proxy, BUILTIN_DATASET / "hello-file", "direct", tmp_path)
    assert done.returncode == 0 and (result["status"], result["reward"]) == ("ok", 1.0), done.stderr[-2000:]
    assert stored(layout.result_url(s3_store, 3, result["rollout_id"])) == result


# ---- the rendered pods ----

def store_credentials(pod: dict, config) -> list[str]:
    """Where a template gives its pod the store: an S3 artifact, an env var of the S3 Secret, the S3 endpoint."""
    found = [f"artifact {a['name']}" for a in pod.get("outputs", {}).get("artifacts", []) + pod.get("inputs", {}).get("artifacts", [])]
    text = json.dumps({k: v for k, v in pod.items() if k != "outputs"})
    found += [f"secret {config.s3_secret}"] * (f'"name": "{config.s3_secret}"' in text)
    found += ["AWS_ENDPOINT_URL"] * ("AWS_ENDPOINT_URL" in text)
    return found


def test_the_rollout_pod_has_no_store_credentials_and_sends_its_result(workflow_validator) -> None:
    """Neither rollout template (nor the evaluation's) has an S3 artifact, the S3 Secret or the S3 endpoint; each
    sends its result through the proxy as its iteration's or evaluation's, and keeps its status and reward outputs.
    The serve pod's proxy writes results for this iteration of this run. Controls: the update pod, which writes
    the store, is found holding the Secret, and so is a rollout template with the S3 artifact it used to have."""
    config = cluster_config("run=t", "eval_every=1", "rollout_egress_cidrs=10.0.0.5/32")
    workflow = iteration_workflow(config, 1).to_dict()
    spec = workflow["spec"]
    for name in ("rollout", "rollout-app", "eval-rollout", "eval-rollout-app"):
        pod = template(spec, name)
        assert store_credentials(pod, config) == [], name
        command = pod["container"]["command"]
        assert command[command.index("--send-result") + 1] == ("evaluation" if name.startswith("eval") else "iteration")
        assert [p["name"] for p in pod["outputs"]["parameters"]] == ["status", "reward"]
    serve = template(spec, "serve")["container"]["command"]
    assert serve[serve.index("--run-url") + 1] == config.run_url and serve[serve.index("--iteration") + 1] == "1"
    assert "secret openforge-s3" in store_credentials(template(spec, "update"), config)
    old = {**template(spec, "rollout"), "outputs": {"artifacts": [{
        "name": "result", "path": "/tmp/rollout/result.json",
        "s3": {"bucket": "openforge", "key": "runs/t/results/iteration-1/x/result.json",
               "accessKeySecret": {"name": config.s3_secret, "key": "access-key"}}}]}}
    assert store_credentials(old, config) == ["artifact result"]
    assert schema_errors(workflow_validator, yaml.safe_load(iteration_workflow(config, 1).to_yaml())) == []


# ---- the API server's addresses: auto, and the preflight ----

class FakeCoreApi:
    """A double of the kubernetes client's CoreV1Api (no API server runs here): everything the run needs is
    there, the `kubernetes` Endpoints list `endpoints` (an ApiException(403) for None: not allowed to read)."""

    api_client = None

    def __init__(self, endpoints: list[str] | None = ENDPOINTS, cluster_ip: str = CLUSTER_IP) -> None:
        self.endpoints, self.cluster_ip = endpoints, cluster_ip

    def read_namespace(self, name, **_):
        return {}

    def read_namespaced_secret(self, name, namespace, **_):
        return {}

    def read_namespaced_service_account(self, name, namespace, **_):
        return SimpleNamespace(metadata=SimpleNamespace(annotations={}))  # no cloud identity (secret mode)

    def list_node(self, **_):
        return SimpleNamespace(items=[SimpleNamespace(status=SimpleNamespace(allocatable={"nvidia.com/gpu": "8"}))])

    def read_namespaced_endpoints(self, name, namespace, **_):
        assert (name, namespace) == ("kubernetes", "default")
        if self.endpoints is None:
            raise ApiException(status=403)
        return SimpleNamespace(subsets=[SimpleNamespace(addresses=[SimpleNamespace(ip=ip) for ip in self.endpoints])])

    def read_namespaced_service(self, name, namespace, **_):
        assert (name, namespace) == ("kubernetes", "default")
        return SimpleNamespace(spec=SimpleNamespace(cluster_ip=self.cluster_ip))


class FakeDiscoveryApi:
    """A double of DiscoveryV1Api's list of EndpointSlices: the `kubernetes` Service's, one endpoint per address of
    `ready`, and one that is not ready (which must not count)."""

    def __init__(self, ready: list[str]) -> None:
        self.ready = ready

    def list_namespaced_endpoint_slice(self, namespace, label_selector, **_):
        assert (namespace, label_selector) == ("default", "kubernetes.io/service-name=kubernetes")
        endpoints = [SimpleNamespace(addresses=[ip], conditions=SimpleNamespace(ready=True)) for ip in self.ready]
        endpoints.append(SimpleNamespace(addresses=["10.0.0.99"], conditions=SimpleNamespace(ready=False)))
        return SimpleNamespace(items=[SimpleNamespace(endpoints=endpoints)])


def egress_ip_blocks(config) -> list[str]:
    """The CIDRs the rendered rollout pods' NetworkPolicy lets them reach."""
    egress = policies(iteration_workflow(config, 0).to_dict()["spec"])["isolate-rollouts"]["spec"]["egress"]
    return [peer["ipBlock"]["cidr"] for rule in egress for peer in rule["to"] if "ipBlock" in peer]


def test_auto_renders_the_api_servers_endpoint_addresses(workflow_validator) -> None:
    """`auto` (the shipped example's) becomes the EndpointSlices' ready addresses as /32s, then the ClusterIP, in
    the rollout pods' policy, which passes the strict schema; without slices, the Endpoints' addresses. Explicit
    CIDRs and `network_policy: false` are left as they are. Unresolved (a dry run), `auto` renders no CIDR."""
    config = cluster_config("run=t")
    assert config.rollout_egress_cidrs == "auto" and egress_ip_blocks(config) == []
    resolved = with_api_server(config, FakeCoreApi(["192.168.0.7"]), FakeDiscoveryApi(ENDPOINTS))
    assert egress_ip_blocks(resolved) == ["10.0.0.5/32", "10.0.0.6/32", "10.96.0.1/32"]
    workflow = yaml.safe_load(iteration_workflow(resolved, 0).to_yaml())
    assert schema_errors(workflow_validator, workflow) == [] and semantic_problems(workflow) == []
    assert egress_cidrs(with_api_server(config, FakeCoreApi(["192.168.0.7"]), None)) == ["192.168.0.7/32",
                                                                                      "10.96.0.1/32"]
    explicit = cluster_config("run=t", "rollout_egress_cidrs=10.0.0.0/24")
    assert with_api_server(explicit, FakeCoreApi(None)) is explicit
    off = cluster_config("run=t", "network_policy=false")
    assert with_api_server(off, FakeCoreApi(None)) is off
    with pytest.raises(ConfigError, match="rollout_egress_cidrs is auto, but the Kubernetes API server's addresses"):
        with_api_server(config, FakeCoreApi(None), None)


def test_the_preflight_refuses_egress_that_misses_the_api_server() -> None:
    """With network_policy, a list that leaves out an endpoint address, an empty list, and `auto` with the
    addresses unreadable are each one problem naming rollout_egress_cidrs. Controls: a list covering them
    (exactly or by a wider CIDR), `auto` with them readable, and `network_policy: false` pass; the CNI note stays."""
    def problems(api, *overrides: str) -> list[str]:
        return check_cluster(api, cluster_config("run=t", *overrides), discovery=FakeDiscoveryApi(ENDPOINTS)
                             if api.endpoints is not None else None)[1]

    missing = problems(FakeCoreApi(), "rollout_egress_cidrs=10.0.0.5/32,10.96.0.1/32")
    assert len(missing) == 1 and missing[0].startswith("rollout_egress_cidrs does not cover the Kubernetes API "
                                                       "server's addresses 10.0.0.6 ")
    assert problems(FakeCoreApi(), "rollout_egress_cidrs=") == [
        "rollout_egress_cidrs is empty, so Argo's executor in each rollout pod cannot reach the Kubernetes API server "
        "to report the rollout's outputs: set it to auto or to the API server's addresses"]
    unreadable = problems(FakeCoreApi(None))
    assert len(unreadable) == 1 and "rollout_egress_cidrs is auto, but" in unreadable[0]
    assert "set rollout_egress_cidrs to the API server's addresses" in unreadable[0]
    assert problems(FakeCoreApi(), "rollout_egress_cidrs=10.0.0.5/32,10.0.0.6/32") == []
    assert problems(FakeCoreApi(), "rollout_egress_cidrs=10.0.0.0/24") == []
    assert problems(FakeCoreApi()) == []
    assert problems(FakeCoreApi(None), "network_policy=false") == []
    notes, _ = check_cluster(FakeCoreApi(), cluster_config("run=t"), discovery=FakeDiscoveryApi(ENDPOINTS))
    assert "only a CNI that enforces them applies" in notes[0]
    assert "may reach the Kubernetes API server at 10.0.0.5/32, 10.0.0.6/32, 10.96.0.1/32" in notes[1]


def test_with_no_cluster_auto_is_refused_and_says_which_key_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """No kubeconfig and no in-cluster account: `auto` (and an empty list) is a problem naming the key; explicit
    CIDRs are not (the control), nor is `network_policy: false`."""
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    _, problems = preflight(cluster_config("run=t"))
    assert problems == ["rollout_egress_cidrs is auto, but no cluster is reachable from here (no kubeconfig or "
                        "in-cluster service account) to read the Kubernetes API server's addresses from: set "
                        "rollout_egress_cidrs to the API server's addresses (kubectl get endpointslices -n default "
                        "-l kubernetes.io/service-name=kubernetes) or let this account read them"]
    assert "rollout_egress_cidrs is empty" in preflight(cluster_config("run=t", "rollout_egress_cidrs="))[1][0]
    assert preflight(cluster_config("run=t", "rollout_egress_cidrs=10.0.0.5/32"))[1] == []
    assert preflight(cluster_config("run=t", "network_policy=false"))[1] == []
    with pytest.raises(ConfigError, match="rollout_egress_cidrs is auto, but no cluster is reachable"):
        with_api_server(cluster_config("run=t"))


def test_the_shipped_example_submits_with_the_api_servers_addresses(fake_argo, s3_store: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """configs/cluster-example.yaml as shipped (`auto`), against a cluster that answers: the Workflow submitted
    lets rollout pods reach the API server's endpoints, while the run's manifest keeps `auto` (a resumed run reads
    them anew). The control: with no cluster, the same command is refused before anything is submitted."""
    argv = ["--config", str(CLUSTER), "--argo-server", fake_argo.url, "--poll", "0.01", f"store={s3_store}",
            "run=net", "iterations=1"]
    assert submit.main(argv) == 2 and fake_argo.requests == []
    monkeypatch.setattr("workflows.preflight.load_core_api", lambda: (FakeCoreApi(["192.168.0.7"]), ""))
    monkeypatch.setattr("kubernetes.client.DiscoveryV1Api", lambda api_client: FakeDiscoveryApi(ENDPOINTS))
    assert submit.main(argv) == 0
    applied = yaml.safe_load(template(fake_argo.workflows["openforge-net-it0"]["spec"], "isolate-rollouts")
                             ["resource"]["manifest"])
    assert [peer["ipBlock"]["cidr"] for rule in applied["spec"]["egress"] for peer in rule["to"] if "ipBlock" in peer] \
        == ["10.0.0.5/32", "10.0.0.6/32", "10.96.0.1/32"]
    from steps import manifest
    assert manifest.read_run_config(f"{s3_store}/net")["rollout_egress_cidrs"] == "auto"


def test_the_dry_run_of_the_shipped_example_needs_no_cluster(monkeypatch: pytest.MonkeyPatch, capsys,
                                                             workflow_validator) -> None:
    """`--dry-run` of configs/cluster-example.yaml works with no cluster: it says on stderr that `auto` is resolved
    at submit, and what it prints passes the strict schema."""
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert submit.main(["--config", str(CLUSTER), "--dry-run", "run=dry", "iterations=1"]) == 0
    out, err = capsys.readouterr()
    assert "rollout_egress_cidrs is auto" in err and "read from the cluster at submit" in err
    workflow, = [d for d in yaml.safe_load_all(out) if d]
    assert schema_errors(workflow_validator, workflow) == []
