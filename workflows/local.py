"""The embedded default: the same iteration DAG as local processes on one machine (not written yet).

`workflows/submit.py` calls `run_local(config)` when no Argo server is configured. It is to run, per
iteration, the commands `workflows.commands` builds (serve, plan, rollout x N up to
`config.parallel_rollouts`, trajectories, update) as subprocesses, swapping the new weights into the
running vLLM, and to keep the same run manifest (`steps.manifest`) so `resume` works locally too.
"""

from workflows.config import RunConfig


def run_local(config: RunConfig) -> int:
    """Runs the whole run on this machine and returns the exit code. Not implemented yet."""
    raise NotImplementedError(
        "the local runner (workflows/local.py: run_local) is not written yet; "
        "submit to an Argo server with --argo-server URL (or ARGO_SERVER), or print the cluster workflows "
        "with `--config configs/cluster-example.yaml --dry-run`")
