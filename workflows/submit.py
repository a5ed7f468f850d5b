"""Start, watch, retry and resume an OpenForge run: one Argo Workflow per iteration, or locally.

    python workflows/submit.py --harness codex [--config FILE] [key=value ...]     # start a run
    python workflows/submit.py --config configs/cluster-example.yaml --dry-run    # print every Workflow, submit nothing
    python workflows/submit.py status   --run NAME [--config FILE]                # each iteration's phase and UI link
    python workflows/submit.py retry    --run NAME [--iteration N]                # rerun a failed iteration's failed steps
    python workflows/submit.py resubmit --run NAME [--iteration N] [--memoized]   # a fresh copy, reusing succeeded steps
    python workflows/submit.py resume   --run NAME                                # continue after the driver stopped

The Argo server is `--argo-server URL`, else env ARGO_SERVER, else the config's `argo_server`; its
token comes from env ARGO_TOKEN. Without a server the run goes to the local runner
(`workflows.local.run_local`). With one, every iteration's Workflow is checked first (the config,
the cluster where one is reachable, the server's lint), then submitted one after the other: each
waits for the previous iteration's checkpoint. The run manifest in the store
(`<store>/<run>/manifest/`) records every iteration's workflow, checkpoint and phase, so `resume`
picks up where a stopped driver left off. A bad config, an unknown harness, an unreachable server or a
missing dataset stops everything with one sentence and exit code 2 before anything is submitted.
"""

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from hera.workflows import Workflow

if __package__ in (None, ""):  # run as `python workflows/submit.py`: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from steps import manifest, sampling  # noqa: E402
from steps.manifest import IterationRecord  # noqa: E402
from workflows import layout  # noqa: E402
from workflows.argo import ArgoClient, ArgoError, Progress  # noqa: E402
from workflows.config import ConfigError, RunConfig, from_dict, load_config, validate_for_argo  # noqa: E402
from workflows.iteration import iteration_workflow  # noqa: E402
from workflows.lint import semantic_problems  # noqa: E402
from workflows.preflight import preflight  # noqa: E402

ACTIONS = ("run", "status", "retry", "resubmit", "resume")


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
    p.add_argument("--dry-run", action="store_true", help="print every Workflow of the run as YAML; submit nothing")
    p.add_argument("--iteration", type=int, help="the iteration to retry or resubmit (default: the first failed)")
    p.add_argument("--memoized", action="store_true", help="resubmit reusing the outputs of succeeded steps")
    p.add_argument("--poll", type=float, default=10.0, help="seconds between status polls (default 10)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. iterations=3")
    args = p.parse_intermixed_args(rest)
    args.action = action
    return args


def build_config(args: argparse.Namespace) -> RunConfig:
    """Defaults, --config, key=value overrides, then the flags (which win)."""
    overrides = list(args.overrides)
    overrides += [f"harness={args.harness}"] if args.harness else []
    overrides += [f"run={args.run}"] if args.run else []
    server = args.argo_server or os.environ.get("ARGO_SERVER")
    overrides += [f"argo_server={server}"] if server else []
    return load_config(args.config, overrides)


def stored_config(config: RunConfig) -> RunConfig:
    """The config a run was started with (from its manifest); the Argo server and namespace of now win."""
    if not config.run:
        raise ConfigError("name the run with --run NAME (its folder under the store)")
    stored = manifest.read_run_config(config.run_url)
    if stored is None:
        raise ConfigError(f"no run named {config.run!r} in the store {config.store!r} (no {layout.run_config_url(config.run_url)})")
    return dataclasses.replace(from_dict(stored), argo_server=config.argo_server or stored.get("argo_server", ""))


def argo_client(config: RunConfig) -> ArgoClient:
    """The client for the configured server; a ConfigError when there is none."""
    if not config.argo_server:
        raise ConfigError("no Argo server configured: pass --argo-server URL or set ARGO_SERVER")
    return ArgoClient(config.argo_server, os.environ.get("ARGO_TOKEN"), config.namespace)


def build_workflows(config: RunConfig) -> list[Workflow]:
    """Every iteration's Workflow, checked offline (workflows/lint.py) before anyone sees or submits it."""
    validate_for_argo(config)
    workflows = [iteration_workflow(config, iteration) for iteration in range(config.iterations)]
    for workflow in workflows:
        problems = semantic_problems(workflow.to_dict())
        if problems:
            raise ConfigError(f"workflow {workflow.name} is inconsistent: {'; '.join(problems)}")
    return workflows


def print_workflows(config: RunConfig) -> None:
    """Every Workflow of the run as YAML documents on stdout."""
    for iteration, workflow in enumerate(build_workflows(config)):
        print(f"---\n# iteration {iteration} of run {config.run}")
        print(workflow.to_yaml(), end="")


def check_before_submit(config: RunConfig, client: ArgoClient) -> None:
    """The cluster preflight (where reachable) and the server's lint of every Workflow; creates nothing."""
    notes, problems = preflight(config)
    for note in notes:
        print(f"preflight: {note}", file=sys.stderr)
    if problems:
        raise ConfigError("; ".join(problems))
    for workflow in build_workflows(config):
        client.lint(workflow)


def start(config: RunConfig, args: argparse.Namespace) -> int:
    """A new run: print it (--dry-run), run it locally, or check, record and submit it to Argo."""
    config = config.with_run_name()
    if unmatched := sampling.unmatched(sampling.settings(config)):
        print(f"run {config.run}: samples at {sampling.describe(unmatched)}, which the update does not reproduce "
              f"(allow_unmatched_sampling: true); every update's metrics name them", file=sys.stderr)
    if args.dry_run:
        print_workflows(config)
        return 0
    if not config.argo_server:
        return run_locally(config)
    client = argo_client(config)
    check_before_submit(config, client)
    if manifest.read_run_config(config.run_url) is not None:
        raise ConfigError(f"run {config.run!r} already exists in {config.store}; continue it with "
                          f"`python workflows/submit.py resume --run {config.run}`")
    manifest.write_run_config(config.run_url, config.to_dict())
    print(f"run {config.run}: {config.iterations} iterations, manifest in {layout.manifest_url(config.run_url)}", flush=True)
    return drive(config, client, args.poll)


def run_locally(config: RunConfig) -> int:
    """The embedded default: the local runner (imported here so Argo runs never need it)."""
    from workflows.local import run_local

    try:
        return run_local(config)
    except NotImplementedError as exc:
        raise ConfigError(str(exc)) from None


def mark(config: RunConfig, iteration: int, workflow: str, status: str) -> None:
    """Records an iteration's workflow and phase in the run manifest, with the update's metrics once it succeeded."""
    next_checkpoint = config.checkpoint_url(iteration + 1)
    metrics = manifest.read_metrics(next_checkpoint) if status == "Succeeded" else None
    manifest.record(config.run_url, IterationRecord(
        iteration=iteration, workflow=workflow, status=status, checkpoint=config.checkpoint_url(iteration),
        next_checkpoint=next_checkpoint, metrics=metrics))


def follow(config: RunConfig, client: ArgoClient, iteration: int, name: str, poll_s: float) -> str:
    """Marks the iteration running, prints its UI link, polls it to the end, records the final phase."""
    mark(config, iteration, name, "Running")
    print(f"iteration {iteration}: {client.ui_link(name)}", flush=True)

    def report(p: Progress) -> None:
        """One line per change of phase or rollout counts."""
        print(f"iteration {iteration}: {p.phase or 'Pending'}, rollouts {p.rollouts_done} done, "
              f"{p.rollouts_failed} failed", flush=True)

    phase = client.wait(name, poll_s, report)
    mark(config, iteration, name, phase)
    return phase


def drive(config: RunConfig, client: ArgoClient, poll_s: float) -> int:
    """Runs the iterations the manifest has not seen succeed, one Workflow each, in order."""
    records = manifest.read_iterations(config.run_url)
    for iteration in range(config.iterations):
        entry = records.get(iteration)
        if entry and entry.status == "Succeeded":
            continue
        if entry and entry.done:
            return stopped(config, iteration, entry.workflow, entry.status)
        name = entry.workflow if entry and entry.workflow else client.create(iteration_workflow(config, iteration))
        phase = follow(config, client, iteration, name, poll_s)
        if phase != "Succeeded":
            return stopped(config, iteration, name, phase)
    print(f"run {config.run}: all {config.iterations} iterations succeeded; "
          f"final checkpoint {config.checkpoint_url(config.iterations)}")
    return 0


def stopped(config: RunConfig, iteration: int, workflow: str, phase: str) -> int:
    """Says which iteration stopped the run and how to continue it; returns exit code 1."""
    print(f"iteration {iteration} ended {phase} (workflow {workflow}); rerun its failed steps with "
          f"`python workflows/submit.py retry --run {config.run} --iteration {iteration}`", file=sys.stderr)
    return 1


def pick_iteration(config: RunConfig, records: dict[int, IterationRecord], iteration: int | None) -> IterationRecord:
    """The record of `iteration`, or of the first failed one; a ConfigError when there is none."""
    if iteration is None:
        failed = [r for r in records.values() if r.status in ("Failed", "Error")]
        if not failed:
            raise ConfigError(f"run {config.run!r} has no failed iteration; name one with --iteration N")
        return failed[0]
    entry = records.get(iteration)
    if entry is None or not entry.workflow:
        raise ConfigError(f"iteration {iteration} of run {config.run!r} was never submitted")
    return entry


def show_status(config: RunConfig) -> int:
    """One line per iteration: recorded phase, live phase from Argo where a server is set, UI link."""
    records = manifest.read_iterations(config.run_url)
    client = argo_client(config) if config.argo_server else None
    print(f"run {config.run} ({config.harness}, {config.iterations} iterations) in {config.run_url}")
    for iteration in range(config.iterations):
        entry = records.get(iteration) or IterationRecord(iteration=iteration)
        phase = entry.status
        if client and entry.workflow:
            try:
                phase = client.progress(entry.workflow).phase
            except ArgoError:  # deleted by its TTL or the server is down: the manifest's word stands
                phase = f"{entry.status} (recorded)"
        link = f"  {client.ui_link(entry.workflow)}" if client and entry.workflow else ""
        print(f"iteration {iteration}: {phase or 'Pending':<10} {entry.workflow or '-'}{link}")
    return 0


def act(config: RunConfig, args: argparse.Namespace) -> int:
    """status, retry, resubmit or resume an existing run."""
    config = stored_config(config)
    if args.action == "status":
        return show_status(config)
    if args.action == "resume" and not config.argo_server:
        return run_locally(config)
    client = argo_client(config)
    if args.action in ("retry", "resubmit"):
        entry = pick_iteration(config, manifest.read_iterations(config.run_url), args.iteration)
        if args.action == "retry":
            client.retry_failed(entry.workflow)
            name = entry.workflow
        else:
            name = client.resubmit(entry.workflow, memoized=args.memoized)
        mark(config, entry.iteration, name, "Running")
    return drive(config, client, args.poll)


def main(argv: list[str] | None = None) -> int:
    """Parses, checks, acts; one sentence and exit code 2 for anything wrong before a submission."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        config = build_config(args)
        return start(config, args) if args.action == "run" else act(config, args)
    except (ConfigError, ArgoError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the store (run manifest) cannot be read or written
        print(f"error: the store could not be used: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
