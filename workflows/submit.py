"""Start, watch, retry and resume an OpenForge run: one Argo Workflow per iteration, or locally.

    python workflows/submit.py --harness codex [--config FILE] [key=value ...]     # start a run
    python workflows/submit.py --config configs/cluster-example.yaml --dry-run    # print every Workflow, submit nothing
    python workflows/submit.py status   --run NAME [--config FILE]                # each iteration's phase and UI link
    python workflows/submit.py retry    --run NAME [--iteration N]                # rerun a failed iteration's failed steps
    python workflows/submit.py resubmit --run NAME [--iteration N] [--memoized]   # a fresh copy, reusing succeeded steps
    python workflows/submit.py resume   --run NAME                                # continue after the driver stopped
    python workflows/submit.py ... --detach        # run, eval, resume, retry, resubmit: the driver as a pod, then return
    python workflows/submit.py eval --harness H --dataset D --k 3 [--model M | --checkpoint RUN:ITERATION] \
        [--upstream URL --upstream-model NAME] [key=value ...]                    # evaluate: every task x k tries
    python workflows/submit.py sft --from RUN [--min-reward R] [--model M] [key=value ...]  # SFT on a run's recordings
    python workflows/submit.py images --registry R --tag T [--builder B] [--no-push] [--dry-run]  # OpenForge's images
    python workflows/submit.py images --dataset D [--config FILE] [--dry-run]      # the task images, in the cluster

The Argo server is `--argo-server URL`, else env ARGO_SERVER, else the config's `argo_server`; its
token comes from env ARGO_TOKEN; its certificate is checked against env ARGO_CA_BUNDLE, else the config's
`argo_ca_bundle`, else the system's CAs, or not at all with `--argo-insecure` (`argo_insecure_tls`). The driver
reaches the store at the config's `s3_endpoint` and `s3_region`, as the pods do (`use_store`). Without a server
the run goes to the local runner (`workflows.local.run_local`). With one, every iteration's Workflow is checked
first (the config, the cluster where one is reachable, the server's lint), then submitted one after the other: each
waits for the previous iteration's checkpoint; with `max_staleness` S >= 1 the next one as soon as the previous
one's collect DAG has succeeded, at most S ahead of the last ended (`drive_overlapped`). The run manifest in the store
(`<store>/<run>/manifest/`) records every iteration's workflow, checkpoint and phase, so `resume`
picks up where a stopped driver left off; each that succeeded is logged into the run's `trackers` (`steps.tracking`). A bad config, an unknown harness, an unreachable server or a
missing dataset stops everything with one sentence and exit code 2 before anything is submitted.

With `--detach` the driver itself runs in the cluster (`workflows.driver`: a Workflow whose one pod runs `resume`,
reaching the Argo server at `argo_server_in_cluster`), and this command returns once that Workflow is created; the
run's config is in the store first, so `status`, `retry` and `resume` work from any machine with the store and
the server. A second `--detach` while the run's driver is still running is refused.

`eval` starts an eval run (docs/eval.md): a run in the store whose run.json says what it evaluates, with one
evaluation (`workflows.evaluation`, or locally `workflows.local.run_local_eval`); `status`, `retry` and
`resume` take it like a training run. A training run's `eval_every` evaluations are in its iteration
Workflows; the driver submits the final checkpoint's evaluation after the last iteration.

`sft` fine-tunes the model on a recorded run's rollouts whose reward reaches `--min-reward`, locally or as one Argo
Workflow (`workflows.sft`, docs/training.md); it writes a checkpoint a training run starts from with
`model=<checkpoint>`, recorded as the SFT run's iteration 0.

`images` builds and pushes the images a cluster run pulls (`workflows.images`, docs/images.md): OpenForge's own with
the container builder of this machine, or with `--dataset` one image per task, built by a Workflow in the cluster.
"""

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import fsspec
import urllib3
from botocore.exceptions import BotoCoreError
from hera.workflows import Workflow

if __package__ in (None, ""):  # run as `python workflows/submit.py`: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from steps import checkpoint, manifest, sampling  # noqa: E402
from steps.evaluate import cell, format_table  # noqa: E402
from steps.contracts.manifest import DONE, EvalRecord, IterationRecord  # noqa: E402
from steps.metrics import harness_killed_warning  # noqa: E402
from steps.plan import MAX_EVAL_K  # noqa: E402
from steps.tracking import Trackers  # noqa: E402
from steps.contracts import layout  # noqa: E402
from workflows import commands, images, shape  # noqa: E402
from workflows.argo import DONE, ArgoClient, ArgoError, Progress  # noqa: E402
from steps.contracts.config import RunConfig  # noqa: E402
from workflows.config import (REPO_ROOT, ConfigError, check_workflow_size, egress_auto, from_dict,  # noqa: E402
                              load_config, validate_for_argo)
from workflows.datasets import stage_datasets, tasks_of  # noqa: E402
from workflows.driver import driver_workflow, workflow_name as driver_workflow_name  # noqa: E402
from workflows.evaluation import evaluation_workflow  # noqa: E402
from workflows.iteration import iteration_workflow  # noqa: E402
from workflows.lint import semantic_problems  # noqa: E402
from workflows.preflight import preflight, with_api_server  # noqa: E402
from workflows.sft import run_local_sft, sft_workflow  # noqa: E402

ACTIONS = ("run", "eval", "sft", "status", "retry", "resubmit", "resume", "images")
EVAL_FLAGS = ("dataset", "k", "model", "checkpoint", "upstream", "upstream_model")
SFT_FLAGS = ("from_run", "min_reward", "model")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The action (first word, default `run`), the flags and the key=value overrides."""
    action = argv[0] if argv and argv[0] in ACTIONS else "run"
    rest = argv[1:] if argv and argv[0] in ACTIONS else argv
    p = argparse.ArgumentParser(prog="python workflows/submit.py", description=__doc__.split("\n\n")[0],
                                epilog=f"actions: {', '.join(ACTIONS)} (default run)")
    p.add_argument("--harness", help="the agent harness (a config key; this flag wins)")
    p.add_argument("--config", help="a flat YAML run config; configs/default.yaml fills the rest")
    p.add_argument("--run", help="the run's name (status, retry, resubmit, resume)")
    p.add_argument("--argo-server", help="Argo Server URL (default: env ARGO_SERVER, then the config)")
    p.add_argument("--argo-insecure", action="store_true",
                   help="accept any TLS certificate from the Argo server (argo_insecure_tls); prints a warning")
    p.add_argument("--dry-run", action="store_true", help="print every Workflow of the run as YAML; submit nothing")
    p.add_argument("--iteration", type=int, help="the iteration to retry or resubmit (default: the first failed)")
    p.add_argument("--memoized", action="store_true", help="resubmit reusing the outputs of succeeded steps")
    p.add_argument("--detach", action="store_true", help="run the driver itself in the cluster (a Workflow) and return")
    p.add_argument("--poll", type=float, default=10.0, help="seconds between status polls (default 10)")
    p.add_argument("--dataset", help="eval: the tasks to evaluate on; images: the tasks whose images to build")
    p.add_argument("--k", help="eval: tries per task, the k of pass@k and pass^k (default: the config's eval_k)")
    p.add_argument("--model", help="eval: the checkpoint to evaluate (a folder or s3:// URL; default: the config's)")
    p.add_argument("--checkpoint", help="eval: RUN:ITERATION, the checkpoint that iteration of a run in the store serves")
    p.add_argument("--upstream", help="eval: an OpenAI-compatible server already running, evaluated behind the proxy")
    p.add_argument("--upstream-model", help="eval: the model name that upstream serves")
    p.add_argument("--from", dest="from_run", help="sft: the recorded run or eval run (its name in the store)")
    p.add_argument("--min-reward", help="sft: train on rollouts whose reward is at least this (sft_min_reward)")
    p.add_argument("--registry", help="images: where OpenForge's images are pushed, e.g. ghcr.io/me")
    p.add_argument("--tag", help="images: the tag of OpenForge's images, e.g. 0.1.0 (the config's image_tag)")
    p.add_argument("--builder", help=f"images: the container builder ({', '.join(images.BUILDERS)}; default: the "
                   f"first on PATH)")
    p.add_argument("--push", action=argparse.BooleanOptionalAction, default=True,
                   help="images: push after building (default: push)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. iterations=3")
    args = p.parse_intermixed_args(rest)
    args.action = action
    return args


def build_config(args: argparse.Namespace, flags: list[str] = ()) -> RunConfig:
    """Defaults, --config, key=value overrides, then the flags (which win)."""
    overrides = list(args.overrides) + list(flags)
    overrides += [f"harness={args.harness}"] if args.harness else []
    overrides += [f"run={args.run}"] if args.run else []
    server = args.argo_server or os.environ.get("ARGO_SERVER")
    overrides += [f"argo_server={server}"] if server else []
    ca_bundle = os.environ.get("ARGO_CA_BUNDLE")
    overrides += [f"argo_ca_bundle={ca_bundle}"] if ca_bundle else []
    overrides += ["argo_insecure_tls=true"] if args.argo_insecure else []
    return use_store(load_config(args.config, overrides))


def use_store(config: RunConfig) -> RunConfig:
    """The config, after pointing this process's s3fs/boto3 at its store (`RunConfig.store_env`: endpoint, region),
    which the config wins over the shell's environment for: the driver must write the manifest where the pods read
    it. AWS_ENDPOINT_URL_S3 would win over AWS_ENDPOINT_URL in botocore, so the config's endpoint drops it."""
    if config.s3_endpoint:
        os.environ.pop("AWS_ENDPOINT_URL_S3", None)
    os.environ.update(config.store_env())
    return config


def check_sft_flags(args: argparse.Namespace) -> None:
    """The sft flags belong to `sft` (`--model` to `eval` too), and `sft` needs `--from`; a ConfigError otherwise."""
    given = [f"--{flag.replace('_', '-')}".replace("from-run", "from") for flag in SFT_FLAGS if flag != "model"
             and getattr(args, flag) is not None]
    if args.action != "sft" and given:
        raise ConfigError(f"{given[0]} is a flag of `python workflows/submit.py sft`")
    if args.action == "sft" and not args.from_run:
        raise ConfigError("sft needs --from RUN, the recorded run or eval run (its name in the store) to learn from")


def check_eval_flags(args: argparse.Namespace) -> None:
    """The eval flags belong to `eval` (`--model` to `sft` too), and make sense together; a ConfigError otherwise."""
    given = [f"--{flag.replace('_', '-')}" for flag in EVAL_FLAGS if getattr(args, flag) is not None
             and not (args.action == "sft" and flag in SFT_FLAGS)]
    if args.action != "eval" and given:
        raise ConfigError(f"{given[0]} is a flag of `python workflows/submit.py eval`; a training run takes config "
                          f"keys (key=value), and an existing run keeps its own")
    if args.model is not None and args.checkpoint is not None:
        raise ConfigError("give the model to evaluate with --model PATH or with --checkpoint RUN:ITERATION, not both")
    if args.upstream is not None and (args.model is not None or args.checkpoint is not None):
        raise ConfigError("--upstream evaluates the model that server serves (--upstream-model); leave out "
                          "--model and --checkpoint")
    if args.k is not None and not (args.k.isdigit() and 1 <= int(args.k) <= MAX_EVAL_K):
        raise ConfigError(f"--k must be a whole number from 1 to {MAX_EVAL_K} (tries per task), got {args.k[:40]!r}")


def parse_checkpoint(value: str) -> tuple[str, int]:
    """`--checkpoint RUN:ITERATION` as (run, iteration).

    >>> parse_checkpoint("demo:2"), parse_checkpoint("a:b:0")
    (('demo', 2), ('a:b', 0))
    """
    run, colon, iteration = value.rpartition(":")
    if not colon or not run or not iteration.isdigit():
        raise ConfigError(f"--checkpoint must be RUN:ITERATION (a run in the store and an iteration number, "
                          f"e.g. demo:2), got {value!r}")
    return run, int(iteration)


def resolve_checkpoint(store: str, value: str) -> dict:
    """What `--checkpoint RUN:ITERATION` evaluates: `{"checkpoint", "run", "iteration"}`, the checkpoint's URL
    from the run's manifest (`layout.checkpoint_url`: iteration 0 serves its base model); a ConfigError when
    the run or that checkpoint is not in the store."""
    run, iteration = parse_checkpoint(value)
    run_url = layout.run_url(store, run)
    stored = manifest.read_run_config(run_url)
    if stored is None:
        raise ConfigError(f"--checkpoint {value}: no run named {run!r} in the store {store!r} "
                          f"(no {layout.run_config_url(run_url)})")
    if manifest.read_evaluates(run_url) is not None:
        raise ConfigError(f"--checkpoint {value}: run {run!r} is an eval run, which writes no checkpoint; name a "
                          f"training run")
    checkpoint = layout.checkpoint_url(run_url, iteration, stored["model"])
    fs, path = fsspec.core.url_to_fs(checkpoint)
    writer = manifest.read_iterations(run_url).get(iteration - 1)
    # The update that writes it must have succeeded: a folder alone may be half a checkpoint.
    if iteration > 0 and not (fs.exists(path) and writer and writer.status == "Succeeded"):
        raise ConfigError(f"--checkpoint {value}: run {run!r} has no checkpoint for iteration {iteration} "
                          f"(its iteration {iteration - 1} has not succeeded in writing {checkpoint})")
    return {"checkpoint": checkpoint, "run": run, "iteration": iteration}


def build_eval_config(args: argparse.Namespace) -> tuple[RunConfig, dict]:
    """An eval run's config (the eval flags as its keys: `dataset`, `eval_k`, `model`, `upstream`,
    `upstream_model`; `--checkpoint` sets `model`) and what it evaluates, for its run.json."""
    flags = [f"{key}={value}" for key, value in (
        ("dataset", args.dataset), ("eval_k", args.k), ("model", args.model), ("upstream", args.upstream),
        ("upstream_model", args.upstream_model)) if value is not None]
    config = build_config(args, flags)
    evaluates = {"run": "", "iteration": None, "upstream": config.upstream}
    if args.checkpoint is not None:
        evaluates = {**evaluates, **resolve_checkpoint(config.store, args.checkpoint)}
        config = dataclasses.replace(config, model=evaluates["checkpoint"])
    if not config.run:
        config = dataclasses.replace(config, run=f"eval-{config.with_run_name().run}")
    served, model_name = config.evaluated(0)
    return config, {**evaluates, "checkpoint": served, "model_name": model_name}


def start_sft(args: argparse.Namespace) -> int:
    """An SFT run (docs/training.md): `--model` is the student (the `model` key), `--min-reward` the
    `sft_min_reward` key; its name defaults to `sft-<from>-<UTC time>`. Its one step is its iteration 0, whose
    checkpoint is iteration 1's (`eval --checkpoint <run>:1`): locally, or as one Argo Workflow followed to its end."""
    flags = [f"{key}={value}" for key, value in (("model", args.model), ("sft_min_reward", args.min_reward))
             if value is not None]
    config = dataclasses.replace(build_config(args, flags), iterations=1)
    if not config.run:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        config = dataclasses.replace(config, run=f"sft-{args.from_run}-{stamp}")
    if config.update_nodes > 1:  # its one train pod: the update's JobSet across nodes is not built for it
        raise ConfigError(f"config key 'update_nodes' is {config.update_nodes}, but sft trains on one node (up to "
                          "update_gpus GPUs, under torchrun); set update_nodes=1")
    if args.dry_run:
        validate_for_argo(config, training=False)  # the samples' lengths are checked by the step itself
        print(f"---\n# the SFT run {config.run}")
        print(checked(sft_workflow(config, args.from_run)).to_yaml(), end="")
        return 0
    if manifest.read_run_config(config.run_url) is not None:
        raise ConfigError(f"run {config.run!r} already exists in {config.store}; name the SFT run with run=NAME")
    if not config.argo_server:
        return run_local_sft(config, args.from_run)
    if args.detach:
        raise ConfigError("--detach is not available for sft: its one Workflow is followed from here")
    source = layout.run_url(config.store, args.from_run)
    if manifest.read_run_config(source) is None:
        raise ConfigError(f"--from {args.from_run}: no run named {args.from_run!r} in the store {config.store!r} "
                          f"(no {layout.run_config_url(source)})")
    validate_for_argo(config, training=False)
    client = argo_client(config)
    workflow = checked(sft_workflow(config, args.from_run))
    client.lint(workflow)
    manifest.write_run_config(config.run_url, config.to_dict(),
                              sft={"from": args.from_run, "min_reward": config.sft_min_reward})
    name = client.create(workflow)
    phase = follow(config, client, 0, name, args.poll)
    return 0 if phase == "Succeeded" else stopped(config, 0, name, phase)


def stored_config(config: RunConfig) -> RunConfig:
    """The config a run was started with (from its manifest); the Argo server and its TLS settings of now win;
    the driver then uses the stored run's store settings (`use_store`)."""
    if not config.run:
        raise ConfigError("name the run with --run NAME (its folder under the store)")
    stored = manifest.read_run_config(config.run_url)
    if stored is None:
        raise ConfigError(f"no run named {config.run!r} in the store {config.store!r} (no {layout.run_config_url(config.run_url)})")
    now = {key: getattr(config, key) for key in ("argo_ca_bundle", "argo_insecure_tls")}  # this machine's, like the server
    return use_store(dataclasses.replace(from_dict(stored), **now,
                                         argo_server=config.argo_server or stored.get("argo_server", "")))


def argo_client(config: RunConfig) -> ArgoClient:
    """The client for the configured server; a ConfigError when there is none."""
    if not config.argo_server:
        raise ConfigError("no Argo server configured: pass --argo-server URL or set ARGO_SERVER")
    if config.argo_insecure_tls:
        print(f"warning: not verifying the TLS certificate of the Argo server at {config.argo_server} "
              f"(argo_insecure_tls); anyone on the path can read ARGO_TOKEN", file=sys.stderr)
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)  # the line above says it once
    verify = config.argo_ca_bundle or not config.argo_insecure_tls
    return ArgoClient(config.argo_server, os.environ.get("ARGO_TOKEN"), config.namespace, verify=verify,
                      token_file=os.environ.get("ARGO_TOKEN_FILE"))  # the detached driver's service account token


def checked(workflow: Workflow) -> Workflow:
    """The workflow, checked offline (workflows/lint.py) before anyone sees or submits it."""
    problems = semantic_problems(workflow.to_dict())
    if problems:
        raise ConfigError(f"workflow {workflow.name} is inconsistent: {'; '.join(problems)}")
    return workflow


def build_workflows(config: RunConfig, evaluation: bool = False) -> list[tuple[str, Workflow]]:
    """Every Workflow of the run, each with what it is: the iterations' and (with `eval_every`) the final
    checkpoint's evaluation; an eval run's (`evaluation`) one evaluation. Each is checked offline."""
    validate_for_argo(config, training=not evaluation)
    if evaluation:
        return [(f"the evaluation of eval run {config.run}", checked(evaluation_workflow(config, 0)))]
    workflows = [(f"iteration {i} of run {config.run}", checked(iteration_workflow(config, i)))
                 for i in range(config.iterations)]
    if config.evaluates_at(config.iterations):
        workflows.append((f"the evaluation of run {config.run}'s final checkpoint",
                          checked(evaluation_workflow(config, config.iterations))))
    return workflows


def print_workflows(config: RunConfig, evaluation: bool = False, detach: bool = False) -> None:
    """Every Workflow of the run as YAML documents on stdout (with `detach`, the driver's first). A dry run reads
    no cluster: with `rollout_egress_cidrs: auto` the rollout pods' policy lists no CIDR yet, and stderr says so."""
    driver = [(f"the driver of run {config.run}", checked(driver_workflow(config)))] if detach else []
    workflows = [*driver, *build_workflows(config, evaluation)]
    if config.network_policy and egress_auto(config):
        print("dry run: rollout_egress_cidrs is auto, so the rollout pods' NetworkPolicy lists the Kubernetes API "
              "server's addresses only once they are read from the cluster at submit; here it lists none",
              file=sys.stderr)
    for title, workflow in workflows:
        print(f"---\n# {title}")
        print(workflow.to_yaml(), end="")


def check_before_submit(config: RunConfig, client: ArgoClient, evaluation: bool = False,
                        detach: bool = False) -> RunConfig:
    """The cluster preflight (where reachable) and the server's lint of every Workflow (with `detach`, the driver's
    too); creates nothing. Returns the config to render the Workflows with (`rollout_egress_cidrs: auto` read from
    the cluster: `with_api_server`)."""
    notes, problems = preflight(config)
    for note in notes:
        print(f"preflight: {note}", file=sys.stderr)
    if problems:
        raise ConfigError("; ".join(problems))
    config = with_api_server(config)
    for _, workflow in build_workflows(config, evaluation):
        client.lint(workflow)
    if detach:
        client.lint(checked(driver_workflow(config)))
    return config


def start(config: RunConfig, args: argparse.Namespace) -> int:
    """A new run: print it (--dry-run), run it locally, or check, record and submit it to Argo."""
    config = config.with_run_name()
    if config.upstream:
        raise ConfigError("config key 'upstream' is for evaluations (`python workflows/submit.py eval --upstream "
                          "URL`); a training run serves its own checkpoints with vLLM")
    if unmatched := sampling.unmatched(sampling.settings(config)):
        print(f"run {config.run}: samples at {sampling.describe(unmatched)}, which the update does not reproduce "
              f"(allow_unmatched_sampling: true); every update's metrics name them", file=sys.stderr)
    if args.dry_run:
        print_workflows(config, detach=args.detach)
        return 0
    if not config.argo_server:
        return run_locally(config, detach=args.detach)
    client = argo_client(config)
    submitted = check_before_submit(config, client, detach=args.detach)
    if manifest.read_run_config(config.run_url) is not None:
        raise ConfigError(f"run {config.run!r} already exists in {config.store}; continue it with "
                          f"`python workflows/submit.py resume --run {config.run}`")
    stage(config)
    manifest.write_run_config(config.run_url, config.to_dict())
    print(f"run {config.run}: {config.iterations} iterations, manifest in {layout.manifest_url(config.run_url)}", flush=True)
    if args.detach:
        return detach(config, client)  # the driver in the cluster reads the addresses itself
    with tracked(submitted) as trackers:  # the manifest keeps `auto`: a resumed run reads the addresses anew
        return drive(submitted, client, args.poll, trackers)


def start_eval(config: RunConfig, evaluates: dict, args: argparse.Namespace) -> int:
    """A new eval run: print its Workflow (--dry-run), run it locally, or check, record and submit it."""
    if args.dry_run:
        print_workflows(config, evaluation=True, detach=args.detach)
        return 0
    if manifest.read_run_config(config.run_url) is not None:
        raise ConfigError(f"run {config.run!r} already exists in {config.store}; continue it with "
                          f"`python workflows/submit.py resume --run {config.run}`")
    if not config.argo_server:
        return run_locally(config, evaluates, detach=args.detach)
    client = argo_client(config)
    submitted = check_before_submit(config, client, evaluation=True, detach=args.detach)
    stage(config, evaluation=True)
    manifest.write_run_config(config.run_url, config.to_dict(), evaluates=evaluates)
    print(f"eval {config.run}: {evaluates['checkpoint']} with {config.harness} on {config.dataset}, "
          f"k={config.eval_k}; manifest in {layout.manifest_url(config.run_url)}", flush=True)
    if args.detach:
        return detach(config, client)
    with tracked(submitted) as trackers:
        return drive_evaluation(submitted, client, 0, args.poll, trackers) or show_summary(config, 0)


def stage(config: RunConfig, evaluation: bool = False) -> None:
    """Uploads the run's datasets into its store, where its pods read them, and pins them in the manifest
    (`workflows.datasets`); then, from their task counts, refuses a run whose Workflows Argo could not store
    (`check_workflow_size`; an eval run's with `evaluation`)."""
    record = stage_datasets(config, REPO_ROOT)
    for name, staged in record.items():
        print(f"run {config.run}: {len(staged['tasks'])} tasks of {staged['source']} uploaded to "
              f"{layout.dataset_url(layout.datasets_url(config.run_url), name)} (sha256 {staged['sha256'][:12]})",
              flush=True)
    counts = {name: len(staged["tasks"]) for name, staged in record.items()}
    tasks = counts.get(layout.TRAIN_DATASET, 0)
    check_workflow_size(config, tasks, counts.get(layout.EVAL_DATASET, tasks), evaluation)


def run_locally(config: RunConfig, evaluates: dict | None = None, detach: bool = False) -> int:
    """The embedded default: the local runner (imported here so Argo runs never need it); an eval run's when
    `evaluates` says what it evaluates. `detach` (a driver in a cluster) is a ConfigError: there is none."""
    from workflows.local import run_local, run_local_eval

    if detach:
        raise ConfigError("--detach runs the driver in the cluster; give the Argo server with --argo-server URL "
                          "or ARGO_SERVER")
    try:
        return run_local(config) if evaluates is None else run_local_eval(config, evaluates)
    except NotImplementedError as exc:
        raise ConfigError(str(exc)) from None


def mark(config: RunConfig, iteration: int, workflow: str, status: str, reason: str | None = None) -> None:
    """Records an iteration's workflow and phase in the run manifest, with the update's metrics once it
    succeeded, `reason` once it failed and, where it evaluated its checkpoint, the evaluation's numbers (and its own
    record)."""
    next_checkpoint = config.checkpoint_url(iteration + 1)
    metrics = manifest.read_metrics(next_checkpoint) if status == "Succeeded" else None
    evaluated = config.evaluates_at(iteration) and status in DONE
    numbers = manifest.eval_numbers(layout.eval_summary_url(config.run_url, iteration)) if evaluated else None
    manifest.record(config.run_url, IterationRecord(
        iteration=iteration, workflow=workflow, status=status, checkpoint=config.checkpoint_url(iteration),
        next_checkpoint=next_checkpoint, metrics=metrics, eval=numbers, reason=reason or None,
        staleness=manifest.read_staleness(config.run_url, iteration),
        curriculum=manifest.read_curriculum(config.run_url, iteration)))
    if evaluated:
        mark_eval(config, iteration, workflow, "Succeeded" if numbers else "Failed")
    if status == "Succeeded":
        checkpoint.retire(config, iteration + 1, manifest.read_evals(config.run_url))


def mark_eval(config: RunConfig, iteration: int, workflow: str, status: str) -> None:
    """Records an evaluation's workflow and phase in the run manifest, with its overall numbers once it succeeded."""
    manifest.record_eval(config.run_url, manifest.eval_record(
        iteration, workflow, config.evaluated(iteration)[0], status,
        layout.eval_summary_url(config.run_url, iteration)))


def follow(config: RunConfig, client: ArgoClient, iteration: int, name: str, poll_s: float,
           evaluation: bool = False, collected: bool = False, started: bool = False,
           trackers: Trackers | None = None) -> str:
    """Marks the iteration (or evaluation) running and prints its UI link (unless `started` did), polls it to the
    end (with `collected`, only until its collect DAG has succeeded), records the final phase once it has one and,
    once it succeeded, logs its numbers into the run's `trackers`."""
    record, label = (mark_eval, f"eval {iteration}") if evaluation else (mark, f"iteration {iteration}")
    if not started:
        record(config, iteration, name, "Running")
        print(f"{label}: {client.ui_link(name)}", flush=True)

    def report(p: Progress) -> None:
        """One line per change of phase or pods' progress; the rollouts' counts (and the pods the cluster ended, by
        cause) once it ended."""
        ends = ", ".join(f"{cause} {n}" for cause, n in p.infra_ends.items())
        counts = (f"rollouts {p.rollouts_done} done, {p.rollouts_failed} failed"
                  f"{f' (retried for the cluster: {ends})' if ends else ''}" if p.phase in DONE
                  else f"pods {p.pods or '0/0'} ended")
        print(f"{label}: {p.phase or 'Pending'}, {counts}", flush=True)

    phase = client.wait(name, poll_s, report, collected=collected)
    if phase in DONE:
        reason = client.failure(name) if phase != "Succeeded" else ""
        if reason:  # a deadline, or the step that failed (workflows.argo.failure_reason)
            print(f"{label}: {reason}", file=sys.stderr, flush=True)
        if evaluation:
            mark_eval(config, iteration, name, phase)
        else:
            mark(config, iteration, name, phase, reason)
        if trackers and phase == "Succeeded":
            (trackers.log_evaluation if evaluation else trackers.log_iteration)(iteration)
    return phase


def drain(config: RunConfig, client: ArgoClient, running: dict[int, str], below: int, poll_s: float,
          trackers: Trackers | None = None) -> int:
    """Follows the iterations in `running` below `below` to their end, in order (removed from it); exit code 1
    (said) at the first that did not succeed, else 0."""
    for earlier in sorted(i for i in running if i < below):
        name = running.pop(earlier)
        if (phase := follow(config, client, earlier, name, poll_s, started=True, trackers=trackers)) != "Succeeded":
            return stopped(config, earlier, name, phase)
    return 0


def already_succeeded(config: RunConfig, entry: IterationRecord | None, evaluations: dict) -> bool:
    """Whether the manifest has seen this iteration succeed; if so, an evaluation due on it that the driver died
    before recording is recorded now."""
    if not entry or entry.status != "Succeeded":
        return False
    recorded = entry.iteration in evaluations and evaluations[entry.iteration].done
    if config.evaluates_at(entry.iteration) and not recorded:
        mark(config, entry.iteration, entry.workflow, entry.status)  # the driver died before recording it
    return True


def drive_overlapped(config: RunConfig, client: ArgoClient, poll_s: float, trackers: Trackers | None = None) -> int:
    """`max_staleness` S >= 1: iteration n+1's Workflow is submitted once iteration n's collect DAG has succeeded
    (its update runs beside n+1's rollouts; n+1's serve swaps its checkpoint in, n+1's update waits for it);
    iteration n+S+1's only once iteration n has ended (never more than S versions ahead of what is trained). A
    failed iteration stops the run: the next one's update then fails waiting for the checkpoint it never wrote."""
    records, evaluations, running = manifest.read_iterations(config.run_url), manifest.read_evals(config.run_url), {}
    for iteration in range(config.iterations):
        entry = records.get(iteration)
        if already_succeeded(config, entry, evaluations):
            continue
        if code := drain(config, client, running, shape.last_update_before(config, iteration) + 1, poll_s, trackers):
            return code
        if entry and entry.done:  # the ones before it (a retried one) are followed to their end first
            return drain(config, client, running, iteration, poll_s, trackers) or \
                stopped(config, iteration, entry.workflow, entry.status)
        name = entry.workflow if entry and entry.workflow else client.create(iteration_workflow(config, iteration))
        phase = follow(config, client, iteration, name, poll_s, collected=True, trackers=trackers)
        if phase in DONE and phase != "Succeeded":
            return stopped(config, iteration, name, phase)
        if phase not in DONE:
            running[iteration] = name
    return drain(config, client, running, config.iterations, poll_s, trackers)


def refuse_rewrite_under_later_updates(config: RunConfig, entry: IterationRecord | EvalRecord) -> None:
    """A ConfigError when resubmitting iteration n would rewrite checkpoint n+1 after iteration n+1 (with
    `max_staleness` >= 1, already running or done) may have trained on it: that update would not be redone."""
    if not config.max_staleness or isinstance(entry, EvalRecord):
        return
    later = manifest.read_iterations(config.run_url).get(entry.iteration + 1)
    if later is not None and later.status in ("Running", "Succeeded"):
        raise ConfigError(f"iteration {entry.iteration + 1} is {later.status} and its update trains on checkpoint "
                          f"{entry.iteration + 1}, which resubmitting iteration {entry.iteration} would rewrite: "
                          f"use `retry --iteration {entry.iteration}` (its failed steps only), or start a new run")


def retry_stopped_behind(config: RunConfig, client: ArgoClient, retried: IterationRecord) -> None:
    """With `max_staleness` S >= 1, the iterations after a retried one (up to S) that ended Failed or Error are
    retried with it: their update's wait-checkpoint stopped when the retried one failed, so they cannot
    succeed without a retry, and the retried iteration's new checkpoint is what they now wait for."""
    records = manifest.read_iterations(config.run_url)
    for later in range(retried.iteration + 1, retried.iteration + config.max_staleness + 1):
        record = records.get(later)
        if record is not None and record.workflow and record.status in ("Failed", "Error"):
            client.retry_failed(record.workflow)
            mark(config, later, record.workflow, "Running")
            print(f"iteration {later}: retried with iteration {retried.iteration} (it waited for its checkpoint)",
                  flush=True)


def drive(config: RunConfig, client: ArgoClient, poll_s: float, trackers: Trackers | None = None) -> int:
    """Runs the iterations the manifest has not seen succeed, one Workflow each, in order; then, with
    `eval_every`, the final checkpoint's evaluation. Each that succeeded is logged into `trackers`."""
    code = (drive_overlapped if config.max_staleness else drive_synchronous)(config, client, poll_s, trackers)
    if code:
        return code
    if config.evaluates_at(config.iterations) and drive_evaluation(config, client, config.iterations, poll_s, trackers):
        return 1
    print(f"run {config.run}: all {config.iterations} iterations succeeded; "
          f"final checkpoint {config.checkpoint_url(config.iterations)}")
    return 0


def drive_synchronous(config: RunConfig, client: ArgoClient, poll_s: float, trackers: Trackers | None = None) -> int:
    """`max_staleness` 0: one iteration's Workflow after the other, each followed to its end."""
    records, evaluations = manifest.read_iterations(config.run_url), manifest.read_evals(config.run_url)
    for iteration in range(config.iterations):
        entry = records.get(iteration)
        if already_succeeded(config, entry, evaluations):
            continue
        if entry and entry.done:
            return stopped(config, iteration, entry.workflow, entry.status)
        name = entry.workflow if entry and entry.workflow else client.create(iteration_workflow(config, iteration))
        phase = follow(config, client, iteration, name, poll_s, trackers=trackers)
        if phase != "Succeeded":
            return stopped(config, iteration, name, phase)
    return 0


def drive_evaluation(config: RunConfig, client: ArgoClient, iteration: int, poll_s: float,
                     trackers: Trackers | None = None) -> int:
    """Runs the evaluation of iteration `iteration`'s checkpoint as its own Workflow unless the manifest has
    seen it succeed; 0, or 1 when it did not succeed."""
    entry = manifest.read_evals(config.run_url).get(iteration)
    if entry and entry.status == "Succeeded":
        return 0
    if entry and entry.done:
        return stopped(config, iteration, entry.workflow, entry.status, evaluation=True)
    name = entry.workflow if entry and entry.workflow else client.create(evaluation_workflow(config, iteration))
    phase = follow(config, client, iteration, name, poll_s, evaluation=True, trackers=trackers)
    return 0 if phase == "Succeeded" else stopped(config, iteration, name, phase, evaluation=True)


def tracked(config: RunConfig) -> Trackers:
    """The run's trackers (`steps.tracking`), started for this driver; their lines go to stderr."""
    return Trackers.start(config, lambda line: print(line, file=sys.stderr, flush=True))


def show_summary(config: RunConfig, iteration: int) -> int:
    """An evaluation's table and its summary as one JSON line, on stdout."""
    summary = manifest.read_json(layout.eval_summary_url(config.run_url, iteration))
    if summary is None:
        raise ConfigError(f"eval {iteration} of run {config.run!r} succeeded but wrote no "
                          f"{layout.eval_summary_url(config.run_url, iteration)}")
    print(format_table(summary))
    print(json.dumps(summary), flush=True)
    return 0


def stopped(config: RunConfig, iteration: int, workflow: str, phase: str, evaluation: bool = False) -> int:
    """Says which iteration (or evaluation) stopped the run and how to continue it; returns exit code 1."""
    what = "eval" if evaluation else "iteration"
    print(f"{what} {iteration} ended {phase} (workflow {workflow}); rerun its failed steps with "
          f"`python workflows/submit.py retry --run {config.run} --iteration {iteration}`", file=sys.stderr)
    return 1


def pick(config: RunConfig, iteration: int | None, evaluation_run: bool) -> IterationRecord | EvalRecord:
    """The record to retry: of `iteration` (an eval run's evaluation; a training run's iteration, or its final
    checkpoint's evaluation at `iterations`), else the first failed one; a ConfigError when there is none."""
    iterations = {} if evaluation_run else manifest.read_iterations(config.run_url)
    evaluations = manifest.read_evals(config.run_url)
    if iteration is None:
        failed = [r for r in [*iterations.values(), *evaluations.values()] if r.status in ("Failed", "Error")]
        if not failed:
            raise ConfigError(f"run {config.run!r} has no failed iteration or evaluation; name one with --iteration N")
        return failed[0]
    evaluation = evaluation_run or iteration == config.iterations
    entry = (evaluations if evaluation else iterations).get(iteration)
    if entry is None or not entry.workflow:
        raise ConfigError(f"{'eval' if evaluation else 'iteration'} {iteration} of run {config.run!r} was never submitted")
    return entry


def phase_of(client: ArgoClient | None, entry: IterationRecord | EvalRecord) -> str:
    """The live phase from Argo where a server is set (its `status.phase` alone), else the manifest's word."""
    if client and entry.workflow:
        try:
            phase = client.phase_if_any(entry.workflow)
        except ArgoError:  # the server is down: the manifest's word stands
            phase = None
        return f"{entry.status} (recorded)" if phase is None else phase  # None: deleted by its TTL
    return entry.status


def killed_of(config: RunConfig, iteration: int) -> tuple[str, str | None]:
    """An iteration's rollouts and the harnesses a limit killed among them, from its rollouts table
    (`manifest.read_harness_killed`), as the status line's end; and the warning when more than a few percent
    were killed. ("", None) before the table is written."""
    found = manifest.read_harness_killed(config.run_url, iteration)
    if found is None:
        return "", None
    rollouts, kills = found
    causes = ", ".join(f"{cause} {n}" for cause, n in kills.items())
    return (f"  {rollouts} rollouts, {sum(kills.values())} harnesses killed ({causes})",
            harness_killed_warning(kills, rollouts, f"iteration {iteration}"))


def show_status(config: RunConfig, evaluates: dict | None) -> int:
    """One line per iteration and per evaluation: recorded phase, live phase from Argo where a server is set,
    UI link; an iteration's rollouts and harnesses killed by a limit once its trajectories are written (and a
    warning line when they are more than a few percent); an evaluation's overall numbers once it succeeded."""
    client = argo_client(config) if config.argo_server else None
    if evaluates is None:
        print(f"run {config.run} ({config.harness}, {config.iterations} iterations) in {config.run_url}")
        records = manifest.read_iterations(config.run_url)
        for iteration in range(config.iterations):
            entry = records.get(iteration) or IterationRecord(iteration=iteration)
            link = f"  {client.ui_link(entry.workflow)}" if client and entry.workflow else ""
            killed, warning = killed_of(config, iteration)
            print(f"iteration {iteration}: {phase_of(client, entry) or 'Pending':<10} {entry.workflow or '-'}{link}{killed}")
            if warning:
                print(warning)
            if entry.reason and entry.status in ("Failed", "Error"):
                print(f"  why: {entry.reason}")
    else:
        print(f"eval {config.run} ({evaluates['checkpoint']} with {config.harness} on {config.dataset}, "
              f"k={config.eval_k}) in {config.run_url}")
    evaluations = manifest.read_evals(config.run_url)
    for iteration in sorted({*evaluations, *([0] if evaluates else [])}):
        entry = evaluations.get(iteration) or EvalRecord(iteration=iteration)
        link = f"  {client.ui_link(entry.workflow)}" if client and entry.workflow else ""
        numbers = entry.overall or {}
        scores = (f"  pass@1 {cell(numbers.get('pass_at_1'))}, pass@{numbers.get('k')} {cell(numbers.get('pass_at_k'))}, "
                  f"pass^{numbers.get('k')} {cell(numbers.get('pass_hat_k'))}, {numbers.get('missing', 0)} missing, "
                  f"{numbers.get('infra_errors')} infra errors, {cell(numbers.get('harness_killed'))} harnesses killed"
                  if numbers else "")
        print(f"eval {iteration}: {phase_of(client, entry) or 'Pending':<10} {entry.workflow or '-'}{link}{scores}")
    if client:
        show_driver(config, client)
    return 0


def show_driver(config: RunConfig, client: ArgoClient) -> None:
    """The line of the run's detached driver (`--detach`), where it has one: its live phase and UI link."""
    name = driver_workflow_name(config)
    try:
        phase = client.phase_if_any(name)
    except ArgoError:  # the server is down: the lines above said what the manifest knows
        return
    if phase is not None:
        print(f"driver: {phase or 'Pending':<10} {name}  {client.ui_link(name)}")


def act(config: RunConfig, args: argparse.Namespace) -> int:
    """status, retry, resubmit or resume an existing run (a training run or an eval run)."""
    config = stored_config(config)
    evaluates = manifest.read_evaluates(config.run_url)
    if args.action == "status":
        return show_status(config, evaluates)
    sft = manifest.read_sft(config.run_url)
    followed = config.argo_server and 0 in manifest.read_iterations(config.run_url)  # its Workflow is on record
    if sft is not None and args.action == "resume" and not followed:
        raise ConfigError(f"run {config.run!r} is an SFT run, which resume does not start again; start a new one with "
                          f"`python workflows/submit.py sft --from {sft['from']} run=NEW_NAME`")
    if args.action == "resume" and not config.argo_server:
        return run_locally(config, evaluates, detach=args.detach)
    client = argo_client(config)
    config = with_api_server(config)  # the Workflows it submits from here render the API server's addresses of now
    if args.action in ("retry", "resubmit"):
        entry = pick(config, args.iteration, evaluates is not None)
        if args.action == "retry":
            client.retry_failed(entry.workflow)
            name = entry.workflow
        else:
            refuse_rewrite_under_later_updates(config, entry)
            name = client.resubmit(entry.workflow, memoized=args.memoized)
        (mark_eval if isinstance(entry, EvalRecord) else mark)(config, entry.iteration, name, "Running")
        if args.action == "retry" and config.max_staleness and isinstance(entry, IterationRecord):
            retry_stopped_behind(config, client, entry)  # after the mark: their wait reads it as running again
    if args.detach:
        client.lint(checked(driver_workflow(config)))
        return detach(config, client)
    with tracked(config) as trackers:
        if evaluates is not None:
            return drive_evaluation(config, client, 0, args.poll, trackers) or show_summary(config, 0)
        return drive(config, client, args.poll, trackers)


def build_images(args: argparse.Namespace) -> int:
    """`images`: OpenForge's images (--registry, --tag), or with --dataset the task images, in the cluster."""
    if args.dataset is None:
        return images.build_images(args.registry, args.tag, args.builder, args.push, args.dry_run)
    if args.registry or args.tag or args.builder:
        raise ConfigError("--registry, --tag and --builder build OpenForge's images; task images (--dataset) go to "
                          "the config's image_registry (image_registry=R) and are tagged with their content")
    return start_task_images(build_config(args, [f"dataset={args.dataset}"]), args)


def start_task_images(config: RunConfig, args: argparse.Namespace) -> int:
    """Builds the dataset's missing task images in the cluster: prints the Workflow (--dry-run), or uploads the
    build contexts to the store, submits it and waits for it."""
    if not config.store.startswith("s3://"):
        raise ConfigError(f"config key 'store' must be an s3:// URL to build task images in the cluster (each build "
                          f"reads its context from there), got {config.store!r}")
    with tasks_of(config, "dataset", REPO_ROOT) as (tasks, _):  # a copy here of an s3:// or Harbor dataset
        builds, notes = images.task_builds(tasks, config)
        for note in notes:
            print(note, file=sys.stderr)
        if not builds:
            print(f"every task image of {config.dataset} is in place; nothing to build")
            return 0
        workflow = checked(images.task_images_workflow(config, builds))
        if args.dry_run:
            for build in builds:
                print(f"# {build.task.environment_dir} -> {build.context}")
            print(workflow.to_yaml(), end="")
            return 0
        client = argo_client(config)
        client.lint(workflow)
        images.upload_contexts(builds)
        name = client.create(workflow)
        print(f"building {len(builds)} task images: {client.ui_link(name)}")
        phase = client.wait(name, args.poll)
        print(f"task images: {phase}")
        return 0 if phase == "Succeeded" else 1


def detach(config: RunConfig, client: ArgoClient, gone_s: float = 60.0) -> int:
    """Creates the run's driver Workflow (`workflows.driver`) and returns 0. One still running is a ConfigError;
    an ended one of this run is deleted first (its name is the run's one driver name). The run's config is already
    in the store, so `status`, `retry` and `resume` work from any machine with the store and the server."""
    workflow = driver_workflow(config)
    name = str(workflow.name)
    phase = client.phase_if_any(name)
    if phase is not None:
        client.check_owner(name, config.run)
        if phase not in DONE:
            raise ConfigError(f"run {config.run!r} already has a driver running in the cluster (workflow {name}, "
                              f"{phase or 'Pending'}); follow it with `python workflows/submit.py status --run "
                              f"{config.run}`, or stop that workflow first")
        client.delete(name)
        deadline = time.monotonic() + gone_s
        while client.phase_if_any(name) is not None:  # Kubernetes deletes asynchronously; the create needs the name
            if time.monotonic() > deadline:
                raise ConfigError(f"the run's ended driver workflow {name} was not deleted within {gone_s:.0f} s; "
                                  f"delete it (argo delete {name}) and detach again")
            time.sleep(1.0)
    client.create(workflow)
    print(f"run {config.run}: the driver runs in the cluster as workflow {name}: {client.ui_link(name)}; "
          f"follow it with `python workflows/submit.py status --run {config.run}`", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parses, checks, acts; one sentence and exit code 2 for anything wrong before a submission."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.action == "images":
            return build_images(args)
        if args.registry or args.tag or args.builder:
            raise ConfigError("--registry, --tag and --builder are flags of `python workflows/submit.py images`")
        check_eval_flags(args)
        check_sft_flags(args)
        if args.detach and args.action == "status":
            raise ConfigError("--detach starts the run's driver in the cluster; `status` only reads the run")
        if args.action == "eval":
            return start_eval(*build_eval_config(args), args)
        if args.action == "sft":
            return start_sft(args)
        config = build_config(args)
        return start(config, args) if args.action == "run" else act(config, args)
    except (ConfigError, ArgoError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (OSError, BotoCoreError) as exc:  # the store (run manifest) cannot be read or written, or reached
        print(f"error: the store could not be used: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
