"""The driver as a pod in the cluster: the Workflow `python workflows/submit.py --detach` creates, then returns.

    from workflows.config import load_config
    from workflows.driver import driver_workflow
    print(driver_workflow(load_config("configs/cluster-example.yaml", ["run=demo"])).to_yaml())

One container in the steps image runs `submit.py resume --run NAME` (`commands.resume`) against the Argo Server at
`argo_server_in_cluster`, with the run's service account, whose token (the projected file Kubernetes mounts, re-read
on every request: `ARGO_TOKEN_FILE`) is its Argo token, the S3 env every step gets (`iteration.s3_env`) and the
credentials of the run's trackers from the Secrets its config names (`tracker_env`). `resume` reads the run's config
and manifest from the store, so each attempt continues where the last one stopped: Argo retries the pod (up to
`DRIVER_RETRIES`) unless it exited 1 (an iteration failed: a person decides, with `retry`), and stops an attempt
after `driver_deadline_s`. What the service account needs: docs/workflows.md, "The
driver in the cluster".
"""

from hera.workflows import Container, Env, RetryStrategy, SecretEnv, SecretVolume, Workflow
from hera.workflows.models import Backoff, KeyToPath, TTLStrategy

from steps.contracts.config import RunConfig
from steps.tracking import CREDENTIALS
from workflows import commands
from workflows.iteration import (RUN_LABEL, RUN_NAME_ANNOTATION, ROLE, image, report_link, run_label, s3_env,
                                 step_pod)

# Kubernetes mounts the service account's token here in every pod that automounts it (the projected volume
# `kube-api-access-*`); the kubelet rewrites the file before the token expires, so the driver reads it per request.
TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
DRIVER_RETRIES = 20
# Exit code 1 is a run stopped at a failed iteration or evaluation (`submit.stopped`): resuming would stop there
# again. Anything else (the pod lost with its node, the Argo Server unreachable for a while) is retried; Argo
# gives `lastRetry.exitCode` as a string, "-1" when the container has none (docs/retries.md, conditional retries).
RETRY_UNLESS_STOPPED = "lastRetry.exitCode != '1'"
# Where the driver's pod finds the in-cluster Argo Server's CA (`argo_ca_secret`'s key `ca.crt`): Argo's server makes
# itself a self-signed certificate unless it is given one (argo-workflows docs/tls.md), which no system CA signed.
CA_FOLDER, CA_KEY = "/etc/openforge/argo-ca", "ca.crt"


def tls_overrides(config: RunConfig) -> list[str]:
    """How the driver's pod checks the in-cluster server's certificate, as config overrides of its `resume`: the CA
    of `argo_ca_secret` mounted at `CA_FOLDER`, else `argo_insecure_tls` as the run has it, else the system's CAs.

    >>> tls_overrides(RunConfig(argo_ca_secret="argo-ca")), tls_overrides(RunConfig(argo_insecure_tls=True))
    (['argo_ca_bundle=/etc/openforge/argo-ca/ca.crt'], ['argo_insecure_tls=true'])
    """
    if config.argo_ca_secret:
        return [f"argo_ca_bundle={CA_FOLDER}/{CA_KEY}"]
    return ["argo_insecure_tls=true"] if config.argo_insecure_tls else []


def tracker_env(config: RunConfig) -> list[SecretEnv]:
    """The credentials of each of the run's trackers that takes them (`steps.tracking.CREDENTIALS`: W&B's API key,
    MLflow's token or username and password), from the Secret its config key names (`wandb_secret`, `mlflow_secret`),
    never a value. Each key is optional: MLflow takes a token or a username and password, and a tracker that lacks
    what its server asks for fails to start, which the driver says, and the run goes on.

    >>> [e.name for e in tracker_env(RunConfig(trackers=("tensorboard", "wandb")))]
    ['WANDB_API_KEY']
    """
    return [SecretEnv(name=env, secret_name=getattr(config, f"{name}_secret"), secret_key=key, optional=True)
            for name in config.trackers for env, key in CREDENTIALS.get(name, ())]


def workflow_name(config: RunConfig) -> str:
    """The driver's Workflow name: one per run, so that a second one is found and refused (DNS-1123, <= 63)."""
    return f"openforge-{run_label(config)}-driver"


def driver_workflow(config: RunConfig) -> Workflow:
    """The Workflow whose one pod drives the run (`submit.py resume`) until it ends."""
    driver = Container(
        name="driver", image=image(config, "steps"), working_dir="/opt/openforge/app",
        command=commands.resume(config, config.argo_server_in_cluster) + tls_overrides(config),
        env=[*s3_env(config), Env(name="ARGO_TOKEN_FILE", value=TOKEN_FILE), *tracker_env(config)],
        volumes=[SecretVolume(name="argo-ca", secret_name=config.argo_ca_secret, mount_path=CA_FOLDER,
                              items=[KeyToPath(key=CA_KEY, path=CA_KEY)])] if config.argo_ca_secret else None,
        **{**step_pod(config, "250m", "512Mi", labels={ROLE: "driver"}),
           "active_deadline_seconds": config.driver_deadline_s},
        retry_strategy=RetryStrategy(limit=DRIVER_RETRIES, retry_policy="Always", expression=RETRY_UNLESS_STOPPED,
                                     # `cap` bounds each wait at an hour (Argo v3.7's Backoff.cap; v3.5/3.6
                                     # lack it and keep doubling). Not `maxDuration`: Argo counts that from the
                                     # first attempt's start (`processNodeRetries`), so a driver that had run an
                                     # hour, as every driver does, would never be retried.
                                     backoff=Backoff(duration="1m", factor=2, cap="1h")),
    )
    return Workflow(
        name=workflow_name(config), namespace=config.namespace, entrypoint="driver", templates=[driver],
        labels={RUN_LABEL: run_label(config), ROLE: "driver"},
        annotations={"workflows.argoproj.io/description": report_link(config), RUN_NAME_ANNOTATION: config.run},
        service_account_name=config.service_account,
        ttl_strategy=TTLStrategy(seconds_after_completion=7 * 24 * 3600),  # its log, a week, as the iterations'
    )
