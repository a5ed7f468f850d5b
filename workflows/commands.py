"""THE one place that builds each step's command line, and where each step's files go.

The Argo templates (`workflows/iteration.py`) and the local runner (`workflows/local.py`) both call
these functions: on Argo the arguments are partly `{{...}}` placeholders Argo fills in, locally they
are real values; the command is the same `python -m steps.X ...` line either way.

    from workflows.commands import rollout
    rollout(config, task="steps/tasks/builtin/hello-file", rollout_id="it0-hello-file-s0",
            proxy_url="http://127.0.0.1:8100", out="runs/demo/results/iteration-0/it0-hello-file-s0")
"""

from workflows.config import RunConfig

PROXY_PORT = 8100


# ---- where a run's files go (all under the run's URL in the store) ----

def calls_url(config: RunConfig) -> str:
    """The proxy's store: one file per recorded model call."""
    return f"{config.run_url}/calls"


def results_url(config: RunConfig, iteration: int) -> str:
    """The folder holding one `<rollout_id>/result.json` per rollout of an iteration."""
    return f"{config.run_url}/results/iteration-{iteration}"


def trajectories_url(config: RunConfig) -> str:
    """Where `steps.trajectories` writes; tables land in `run=<run>/iteration=<N>/` below it."""
    return f"{config.run_url}/trajectories"


def partition_url(config: RunConfig, iteration: int) -> str:
    """One iteration's trajectory tables (the partition `steps.trajectories` writes)."""
    from steps.trajectories.io import partition_url as layout  # the step owns its layout

    return layout(trajectories_url(config), config.run, iteration)


def update_overrides(config: RunConfig) -> list[str]:
    """The run's algorithm settings as `key=value` overrides of the update's own config file (same names)."""
    return [f"adv_estimator={config.adv_estimator}", f"learning_rate={config.learning_rate!r}",
            f"epochs={config.epochs}", f"seed={config.seed}"]


# ---- the commands ----

def serve(config: RunConfig, model: str, store: str, weight_version: str | int, host: str = "127.0.0.1",
          device: str = "cpu", port: int = PROXY_PORT, python: str = "python", model_dir: str | None = None) -> list[str]:
    """vLLM on `model` (a folder, or a URL fetched to `model_dir`) plus the recording proxy on
    `host:port` (`steps.serve`)."""
    return [python, "-m", "steps.serve", "--model", model, *(["--model-dir", model_dir] if model_dir else []),
            "--name", config.model_name, "--port", str(port), "--store", store, "--host", host, "--device", device,
            "--gpus", str(config.serve_gpus), "--max-tokens-cap", str(config.max_tokens_cap),
            "--weight-version", str(weight_version)]


def plan(config: RunConfig, iteration: int | str, python: str = "python") -> list[str]:
    """Prints the iteration's rollouts as a JSON list (`steps.plan`)."""
    return [python, "-m", "steps.plan", "--dataset", config.dataset, "--iteration", str(iteration),
            "--tasks-per-iteration", str(config.tasks_per_iteration),
            "--samples-per-task", str(config.samples_per_task), "--seed", str(config.seed),
            "--image-prefix", f"{config.image_registry}/task-", "--image-tag", config.image_tag]


def rollout(config: RunConfig, task: str, rollout_id: str, proxy_url: str, out: str,
            python: str = "python", isolation: str = "bwrap") -> list[str]:
    """One rollout of `task` through the proxy; exit code 3 means infra_error (`steps.rollout`).

    `isolation`: "bwrap" (a local bubblewrap sandbox) or "pod" (the Kubernetes rollout pod is the sandbox).
    """
    return [python, "-m", "steps.rollout", "--task", task, "--harness", config.harness, "--proxy-url", proxy_url,
            "--rollout-id", rollout_id, "--out", out, "--model", config.model_name,
            *(["--isolation", isolation] if isolation != "bwrap" else [])]


def trajectories(config: RunConfig, proxy_url: str, results: str, iteration: int | str,
                 python: str = "python") -> list[str]:
    """The iteration's Parquet tables from the rollout results and the proxy's calls (`steps.trajectories`)."""
    return [python, "-m", "steps.trajectories", "--proxy-url", proxy_url, "--results", results,
            "--out", trajectories_url(config), "--run", config.run, "--iteration", str(iteration)]


def update(config: RunConfig, trajectories: str, checkpoint: str, out: str, python: str = "python") -> list[str]:
    """The veRL update from `checkpoint` on `trajectories`, writing the next checkpoint to `out` (`steps.update`)."""
    return [python, "-m", "steps.update", "--trajectories", trajectories, "--checkpoint", checkpoint,
            "--out", out, "--config", config.update_config, *update_overrides(config)]


def record(config: RunConfig, iteration: int | str, workflow: str, status: str, checkpoint: str,
           next_checkpoint: str, python: str = "python") -> list[str]:
    """Writes one iteration's outcome into the run manifest (`steps.manifest record`)."""
    return [python, "-m", "steps.manifest", "record", "--run-url", config.run_url, "--iteration", str(iteration),
            "--workflow", workflow, "--status", status, "--checkpoint", checkpoint,
            "--next-checkpoint", next_checkpoint]
