"""How a run reaches its store and its Argo server: the credentials mode, the region, the driver's endpoint, TLS.

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q -n 0 tests/test_credentials.py

Real parts where they run here: the moto S3 server on loopback (the driver writes its manifest there), the
`FakeArgoServer` of tests/test_workflows.py served over real HTTPS with a certificate made at test time by the
`openssl` CLI. The Kubernetes API cannot run here: the preflight reads service accounts from a small double.
"""

import os
import re
import ssl
import subprocess
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from test_workflows import NO_CLUSTER_EGRESS, FakeArgoServer, cluster_config, fake_argo, s3_store  # noqa: F401 - fixtures
from steps import manifest
from workflows import submit
from workflows.config import ConfigError, validate_for_argo
from workflows.iteration import iteration_workflow

pytestmark = pytest.mark.filterwarnings("ignore::pydantic.PydanticDeprecatedSince20")
POD_IDENTITY = ("s3_credentials=pod-identity", "rollout_service_account=openforge-rollout", "s3_endpoint=",
                "s3_region=us-west-2")
ROLLOUTS = ("rollout", "rollout-app")


@pytest.fixture(autouse=True)
def restored_store_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """`submit.use_store` sets the driver's store env in this process: each test ends with the env it started with."""
    for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION"):
        if key in os.environ:
            monkeypatch.setenv(key, os.environ[key])
        else:
            monkeypatch.delenv(key, raising=False)


def templates(*overrides: str) -> dict[str, dict]:
    """Iteration 0's Workflow of configs/cluster-example.yaml with `overrides`, its templates by name."""
    spec = iteration_workflow(cluster_config("run=creds", *overrides), 0).to_dict()["spec"]
    return {t["name"]: t for t in spec["templates"]}


def store_envs(template: dict) -> dict[str, dict]:
    """The AWS_* env of a template's container (or, for the update across nodes, none here), by name."""
    return {e["name"]: e for e in (template.get("container") or {}).get("env", []) if e["name"].startswith("AWS_")}


# ---- the config ----

@pytest.mark.parametrize("overrides, field", [
    (["s3_credentials=irsa"], "'s3_credentials' must be one of secret, pod-identity"),
    (["s3_region=US West 2"], "'s3_region' must be a region code"),
    (["s3_endpoint=minio:9000"], "'s3_endpoint' must be an http:// or https:// URL"),
    (["argo_ca_bundle=/nonexistent/ca.pem"], "'argo_ca_bundle' (or env ARGO_CA_BUNDLE) must be a PEM file"),
    (["argo_ca_bundle=configs/default.yaml", "argo_insecure_tls=true"], "contradict each other"),
])
def test_bad_access_keys_are_one_sentence(overrides: list[str], field: str) -> None:
    """Each bad value of the access keys is refused at load, naming the key and what it accepts."""
    with pytest.raises(ConfigError) as caught:
        cluster_config(*overrides)
    assert field in str(caught.value) and "\n" not in str(caught.value)


def test_pod_identity_needs_a_rollout_service_account_of_its_own() -> None:
    """Pod identity with the rollout pods under the identity's service account is refused (empty, or the same name);
    control: a separate one passes."""
    for rollouts in ("", "openforge"):
        config = cluster_config("s3_credentials=pod-identity", f"rollout_service_account={rollouts}")
        with pytest.raises(ConfigError, match="'rollout_service_account' must name a service account other than"):
            validate_for_argo(config)
    validate_for_argo(cluster_config(*POD_IDENTITY))


# ---- what the Workflow says ----

def test_pod_identity_references_no_s3_secret() -> None:
    """With pod identity no pod's env holds S3 keys (the SDK takes the service account's identity) and no Secret of
    the store is named anywhere; the rollout pods run under the rollout service account (their results go through
    the proxy: they hold no store access at all), their executor under the Workflow's. Control: the same templates
    in `secret` mode carry the keys."""
    identity, secret = templates(*POD_IDENTITY), templates("s3_region=us-west-2")
    for name, template in identity.items():
        assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(store_envs(template)), name
        if name in ROLLOUTS:
            assert template["serviceAccountName"] == "openforge-rollout"
            assert template["executor"]["serviceAccountName"] == "openforge"
            assert template["automountServiceAccountToken"] is False
        else:
            assert "serviceAccountName" not in template, name  # the Workflow's: the identity's
    keyed = [n for n, t in secret.items() if "AWS_SECRET_ACCESS_KEY" in store_envs(t)]
    assert {"serve", "trajectories", "update", "record", "report"} <= set(keyed)
    assert all("serviceAccountName" not in secret[n] for n in ROLLOUTS)  # secret mode, none set: as before
    assert "name: openforge-s3" not in iteration_workflow(cluster_config("run=creds", *POD_IDENTITY), 0).to_yaml()
    assert "name: openforge-s3" in iteration_workflow(cluster_config("run=creds"), 0).to_yaml()  # the control


def test_the_region_reaches_every_pod_that_reads_the_store() -> None:
    """`s3_region` is AWS_REGION and AWS_DEFAULT_REGION in every pod that reads the store; without `s3_endpoint`
    no endpoint is set (the SDK's regional one). Control: with an endpoint, that endpoint. The rollout pods read
    no store (their results go through the proxy): no store env at all."""
    workflow = templates(*POD_IDENTITY)
    readers = {name: t for name, t in workflow.items() if store_envs(t)}
    assert {"serve", "trajectories", "update", "record", "report"} <= set(readers)
    for template in readers.values():
        envs = store_envs(template)
        assert envs["AWS_REGION"]["value"] == envs["AWS_DEFAULT_REGION"]["value"] == "us-west-2"
        assert "AWS_ENDPOINT_URL" not in envs
    assert not set(readers) & set(ROLLOUTS) and "artifacts" not in workflow["rollout"].get("outputs", {})
    minio = templates("s3_region=us-east-1")  # cluster-example.yaml's MinIO endpoint
    assert store_envs(minio["serve"])["AWS_ENDPOINT_URL"]["value"] == "http://minio.openforge.svc:9000"


def test_no_secret_value_in_yaml_or_logs_with_pod_identity(monkeypatch, capsys) -> None:
    """The dry run of a pod-identity run prints no secret of the driver's environment: no credential env has a
    literal value. Control: the check finds a planted key in the same text."""
    secrets = {"ARGO_TOKEN": "argo-token-do-not-leak", "AWS_SECRET_ACCESS_KEY": "aws-secret-do-not-leak",
               "AWS_ACCESS_KEY_ID": "AKIAEXAMPLEDONOTLEAK", "AWS_SESSION_TOKEN": "session-do-not-leak"}
    for key, value in secrets.items():
        monkeypatch.setenv(key, value)
    args = ["--config", "configs/cluster-example.yaml", "--dry-run", "run=creds", *POD_IDENTITY]
    assert submit.main(args) == 0
    out = capsys.readouterr()
    text = out.out + out.err

    def leaks(text: str) -> bool:
        return any(v in text for v in secrets.values()) or bool(re.search(r"AKIA[0-9A-Z]{12,}", text))

    assert not leaks(text) and leaks(text + secrets["AWS_ACCESS_KEY_ID"])
    envs = [e for doc in yaml.safe_load_all(out.out) if doc for t in doc["spec"]["templates"]
            for e in (t.get("container") or {}).get("env", [])]
    credentials = [e for e in envs if re.search(r"KEY|SECRET|TOKEN|PASSWORD", e["name"])]
    assert credentials and all("secretKeyRef" in e.get("valueFrom", {}) and "value" not in e for e in credentials)
    assert not any(e["name"].startswith("AWS_") and "valueFrom" in e for e in envs)


# ---- the preflight ----

class FakeServiceAccounts:
    """The CoreV1Api calls preflight makes, with service accounts (a double: no Kubernetes API server runs here)."""

    def __init__(self, accounts: dict[str, dict[str, str]]) -> None:
        self.accounts = accounts  # name -> annotations

    def read_namespace(self, name, **_):
        return {}

    def read_namespaced_secret(self, name, namespace, **_):
        return {}

    def read_namespaced_service_account(self, name, namespace, **_):
        from kubernetes.client.exceptions import ApiException

        if name not in self.accounts:
            raise ApiException(status=404)
        return SimpleNamespace(metadata=SimpleNamespace(annotations=self.accounts[name]))

    def list_node(self, **_):
        gpus = SimpleNamespace(status=SimpleNamespace(allocatable={"nvidia.com/gpu": "8"}))
        return SimpleNamespace(items=[gpus])

    def read_namespaced_endpoints(self, name, namespace, **_):
        return SimpleNamespace(subsets=[])


IRSA = {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/openforge"}
GKE = {"iam.gke.io/gcp-service-account": "openforge@project.iam.gserviceaccount.com"}


def test_preflight_checks_the_identities_of_the_service_accounts() -> None:
    """Pod identity: the Workflow's service account must carry an identity (EKS or GKE), the rollout one must exist
    and carry none; each problem one sentence with the fix. Control: a correct cluster has no such problem."""
    from workflows.preflight import check_cluster

    # network_policy off: the rollout egress checks of the same preflight are tests/test_rollout_network.py's
    config = cluster_config("run=t", *POD_IDENTITY, "network_policy=false")
    for accounts in ({"openforge": IRSA, "openforge-rollout": {}}, {"openforge": GKE, "openforge-rollout": {}}):
        assert check_cluster(FakeServiceAccounts(accounts), config)[1] == []
    cases = [({"openforge": {}, "openforge-rollout": {}}, "service account 'openforge' carries no cloud identity"),
             ({"openforge": IRSA}, "service account 'openforge-rollout' is missing in namespace 'openforge'"),
             ({"openforge": IRSA, "openforge-rollout": GKE}, "runs the rollout pods (the agents) but carries")]
    for accounts, problem in cases:
        (found,) = check_cluster(FakeServiceAccounts(accounts), config)[1]
        assert problem in found and "kubectl -n openforge" in found
    # secret mode: the rollout pods' account, `service_account` unless rollout_service_account names another, too
    secret = cluster_config("run=t", "network_policy=false")
    (found,) = check_cluster(FakeServiceAccounts({"openforge": IRSA}), secret)[1]
    assert "service account 'openforge' runs the rollout pods (the agents) but carries" in found
    assert not check_cluster(FakeServiceAccounts({"openforge": {}}), secret)[1]
    separate = cluster_config("run=t", "rollout_service_account=openforge-rollout", "network_policy=false")
    assert not check_cluster(FakeServiceAccounts({"openforge": IRSA, "openforge-rollout": {}}), separate)[1]
    assert check_cluster(FakeServiceAccounts({"openforge": {}, "openforge-rollout": GKE}), separate)[1]


# ---- the driver's store ----

@pytest.mark.parametrize("shell_endpoint", ["", "http://127.0.0.1:9"])  # none; the discard port (nothing answers)
def test_the_driver_writes_the_manifest_at_the_configs_endpoint(s3_server: dict, fake_argo, monkeypatch,
                                                               shell_endpoint: str) -> None:
    """submit.py with the store's endpoint only in the config writes the run manifest to that store, whether the
    shell names no endpoint or another one (a laptop with other profiles), and sets the config's region. Control:
    without applying the config's endpoint (the old behaviour) the driver does not reach the store and stops with
    one sentence (run where the shell's endpoint answers nothing; with none it would try AWS itself)."""
    import s3fs

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(key, s3_server["env"][key])
    for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(key, raising=False)
    if shell_endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", shell_endpoint)
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", shell_endpoint)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    store = f"s3://{s3_server['bucket']}/driver-endpoint{len(shell_endpoint)}"
    args = ["--config", "configs/cluster-example.yaml", "--argo-server", fake_argo.url, "--poll", "0.01",
            f"store={store}", f"s3_endpoint={s3_server['endpoint_url']}", "s3_region=us-east-1", "iterations=1",
            *NO_CLUSTER_EGRESS]

    def run(name: str) -> int:
        s3fs.S3FileSystem.clear_instance_cache()  # each run builds its client from the environment of now
        return submit.main([*args, f"run={name}"])

    if shell_endpoint:
        with monkeypatch.context() as old:
            old.setattr(submit, "use_store", lambda config: config)
            assert run("old") == 2
    assert run("new") == 0
    assert os.environ["AWS_ENDPOINT_URL"] == s3_server["endpoint_url"] and os.environ["AWS_REGION"] == "us-east-1"
    s3fs.S3FileSystem.clear_instance_cache()
    assert manifest.read_run_config(f"{store}/new")["s3_endpoint"] == s3_server["endpoint_url"]
    assert manifest.read_iterations(f"{store}/new")[0].status == "Succeeded"
    assert manifest.read_run_config(f"{store}/old") is None


# ---- the Argo server over TLS ----

def certificate(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, made with the openssl CLI (the certificate is its CA)."""
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


class HttpsFakeArgo(FakeArgoServer):
    """The FakeArgoServer of tests/test_workflows.py behind real TLS, as Argo's server serves by default."""

    def __init__(self, cert: Path, key: Path) -> None:  # noqa: D107 - FakeArgoServer's state, served over HTTPS
        self.workflows, self.script, self.requests, self.collect, self.sent = {}, {}, [], {}, []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def https_argo(fake_argo, tmp_path: Path):
    """An Argo server double over HTTPS with a self-signed certificate; yields (server, its CA, another CA)."""
    cert, key = certificate(tmp_path, "argo")
    other, _ = certificate(tmp_path, "other")
    server = HttpsFakeArgo(cert, key)
    yield server, cert, other
    server.server.shutdown()


def test_the_argo_servers_certificate_is_verified(https_argo, s3_server: dict, s3_store: str, monkeypatch,
                                                 capsys) -> None:
    """Verified by default: a self-signed server stops the driver with one sentence naming both fixes, as does
    another CA's bundle (the control: the bundle is what is trusted); with its CA bundle (config key, or env) the
    run goes through; with --argo-insecure too, and the driver warns once."""
    server, ca, other = https_argo
    monkeypatch.delenv("ARGO_CA_BUNDLE", raising=False)
    manifest.write_json(f"{s3_store}/tls-ca/checkpoints/iteration-1/metrics.json", {"loss": 0.5})

    def run(name: str, *extra: str) -> tuple[int, str]:
        code = submit.main(["--config", "configs/cluster-example.yaml", "--argo-server", server.url, "--poll", "0.01",
                            f"store={s3_store}", f"s3_endpoint={s3_server['endpoint_url']}", f"run={name}",
                            "iterations=1", *NO_CLUSTER_EGRESS, *extra])
        return code, capsys.readouterr().err

    for extra in ((), (f"argo_ca_bundle={other}",)):
        code, err = run("tls-refused", *extra)
        assert code == 2 and "presented a TLS certificate this machine does not trust" in err
        assert "argo_ca_bundle=PATH or env ARGO_CA_BUNDLE" in err and "--argo-insecure" in err
        assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1 and "warning" not in err
    assert not server.workflows
    code, err = run("tls-ca", f"argo_ca_bundle={ca}")
    assert code == 0 and "error" not in err and "warning" not in err
    monkeypatch.setenv("ARGO_CA_BUNDLE", str(ca))
    assert run("tls-env")[0] == 0
    monkeypatch.delenv("ARGO_CA_BUNDLE")
    code, err = run("tls-insecure", "--argo-insecure")
    assert code == 0 and err.count("warning: not verifying the TLS certificate of the Argo server") == 1
    assert "InsecureRequestWarning" not in err and "test-token" not in err
    assert set(server.workflows) == {"openforge-tls-ca-it0", "openforge-tls-env-it0", "openforge-tls-insecure-it0"}
