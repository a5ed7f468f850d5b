"""Warm-start supervised fine-tuning: `python workflows/submit.py sft --from RUN ...` (docs/training.md), on this
machine (`run_local_sft`) or as one Argo Workflow (`sft_workflow`).

Two steps, each the `python -m steps.X` line `workflows.commands` builds: `steps.sft.samples` (the serving
environment's Python) reads the recorded run's rollouts and writes the SFT run's samples table; `steps.sft` (the
train environment's, `workflows.local.train_python`) fine-tunes the student on them and writes the checkpoint the
SFT run's iteration 1 would serve, `<store>/<run>/checkpoints/iteration-1`, which a training run starts from with
`model=<that folder>`. The SFT run is a run in the store: `manifest/run.json` holds its config and what it learned
from (`sft`), `manifest/iteration-0.json` the SFT as its iteration 0 (so `submit.py eval --checkpoint <run>:1`
evaluates the checkpoint), `logs/` each step's log.

On Argo the same two commands are the Workflow `openforge-<run>-sft`: `sft-samples` in the steps image, `sft` in the
train image with the update pod's GPU and placement, then the iteration's exit handler (`record`: iteration 0's
phase and the checkpoint's metrics into the manifest; `report`).
"""

import json
import sys
from functools import partial
from pathlib import Path

from steps import manifest
from steps.contracts import layout
from steps.contracts.config import RunConfig
from steps.contracts.manifest import IterationRecord
from hera.workflows import Container, Workflow

from workflows import commands, shape
from workflows.iteration import (ITERATION_LABEL, dag, exit_dag, fetch_model_template, image, record_template,
                                 report_template, run_label, run_workflow, s3_env, step_pod, train_container)
from workflows.local import StepFailed, absolute, base_model, local_store_problem, run_step, say, step_env, train_python

def run_local_sft(config: RunConfig, source: str) -> int:
    """Builds the samples from the run `source` (a run's name in the same store), fine-tunes the student
    (`model`) on them and prints one JSON line: the samples' report, the checkpoint and its metrics."""
    if problem := local_store_problem(config):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    config = absolute(config)
    source_url = layout.run_url(config.store, source)
    if manifest.read_run_config(source_url) is None:
        print(f"error: --from {source}: no run named {source!r} in the store {config.store!r} "
              f"(no {layout.run_config_url(source_url)})", file=sys.stderr)
        return 2
    logs = Path(layout.logs_url(config.run_url))
    logs.mkdir(parents=True, exist_ok=True)
    manifest.write_run_config(config.run_url, config.to_dict(),
                              sft={"from": source, "min_reward": config.sft_min_reward})
    env = step_env("")
    checkpoint = layout.checkpoint_url(config.run_url, 1, config.model)
    record = partial(IterationRecord, iteration=0, workflow="local", checkpoint=config.model,
                     next_checkpoint=checkpoint)
    manifest.record(config.run_url, record(status="Running"))
    try:
        student = base_model(config)
        say(f"sft {config.run}: samples from {source} (reward >= {config.sft_min_reward:g}) for {student}")
        built = json.loads(run_step("sft-samples", commands.sft_samples(config, source_url, student, sys.executable),
                                    env, logs / "sft-samples.log").splitlines()[-1])
        say(f"sft {config.run}: {built['samples']} samples ({built['mode']}: {built['why']}); training")
        metrics = json.loads(run_step("sft", commands.sft(config, student, train_python()), env,
                                      logs / "sft.log").splitlines()[-1])
    except StepFailed as exc:
        manifest.record(config.run_url, record(status="Failed", reason=str(exc).splitlines()[0]))
        print(f"error: sft {config.run}: {exc}", file=sys.stderr)
        return 1
    # the SFT is its run's iteration 0: `eval --checkpoint <run>:1` evaluates what it wrote
    manifest.record(config.run_url, record(status="Succeeded", metrics=metrics))
    say(f"sft {config.run}: wrote {checkpoint}; start a run from it with model={checkpoint}")
    print(json.dumps({"run": config.run, "from": source, "samples": built, "checkpoint": checkpoint,
                      "metrics": metrics}), flush=True)
    return 0


def workflow_name(config: RunConfig) -> str:
    """The SFT run's Workflow name: fixed, so that `status` and `retry` find it (DNS-1123)."""
    return f"openforge-{run_label(config)}-sft"


def sft_workflow(config: RunConfig, source: str) -> Workflow:
    """The SFT run as one Workflow (`shape.sft`): the samples of the run `source` (its name in the store) for the
    student, the run's iteration-0 checkpoint (`model`, or the hub model fetched into the run), then the training."""
    student, source_url = config.checkpoint_url(0), layout.run_url(config.store, source)
    samples = Container(name="sft-samples", image=image(config, "steps"), working_dir="/opt/openforge/app",
                        command=commands.sft_samples(config, source_url, student), env=s3_env(config),
                        **step_pod(config, "2", "8Gi"))
    train = train_container(config, "sft", commands.sft(config, student))
    templates = [dag("sft-run", shape.sft(config)), samples, train, exit_dag(), record_template(config, 0),
                 report_template(config), *([fetch_model_template(config)] if shape.fetches_model(config, 0) else [])]
    return run_workflow(config, workflow_name(config), templates, {ITERATION_LABEL: "0"})
