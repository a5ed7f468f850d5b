"""Warm-start supervised fine-tuning on this machine: `python workflows/submit.py sft --from RUN ...` (docs/training.md).

Two steps, each the `python -m steps.X` line `workflows.commands` builds: `steps.sft.samples` (the serving
environment's Python) reads the recorded run's rollouts and writes the SFT run's samples table; `steps.sft` (the
train environment's, `workflows.local.train_python`) fine-tunes the student on them and writes the checkpoint the
SFT run's iteration 1 would serve, `<store>/<run>/checkpoints/iteration-1`, which a training run starts from with
`model=<that folder>`. The SFT run is a run in the store: `manifest/run.json` holds its config and what it learned
from (`sft`), `logs/` each step's log.
"""

import json
import sys
from pathlib import Path

from steps import manifest
from steps.contracts import layout
from steps.contracts.config import RunConfig
from workflows import commands
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
    try:
        student = base_model(config)
        say(f"sft {config.run}: samples from {source} (reward >= {config.sft_min_reward:g}) for {student}")
        built = json.loads(run_step("sft-samples", commands.sft_samples(config, source_url, student, sys.executable),
                                    env, logs / "sft-samples.log").splitlines()[-1])
        say(f"sft {config.run}: {built['samples']} samples ({built['mode']}: {built['why']}); training")
        metrics = json.loads(run_step("sft", commands.sft(config, student, train_python()), env,
                                      logs / "sft.log").splitlines()[-1])
    except StepFailed as exc:
        print(f"error: sft {config.run}: {exc}", file=sys.stderr)
        return 1
    checkpoint = layout.checkpoint_url(config.run_url, 1, config.model)
    say(f"sft {config.run}: wrote {checkpoint}; start a run from it with model={checkpoint}")
    print(json.dumps({"run": config.run, "from": source, "samples": built, "checkpoint": checkpoint,
                      "metrics": metrics}), flush=True)
    return 0
