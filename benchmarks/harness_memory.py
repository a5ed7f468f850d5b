"""How much memory each harness's own processes take, beside the agent's, on a built-in task.

    .venv/bin/python benchmarks/harness_memory.py [--harnesses codex,claude-code,...] [--runs 3] [--task hello-file]

Each run is a real rollout (`steps.rollout.run_rollout`): the harness CLI in a local sandbox, through the real
recording proxy, on the task with its oracle played by `tests/scripted_model.py` (a small random model cannot call
tools). The sandbox's cgroups count the most memory the harness's group and the task's group (the agent's
commands) held at once (`result.json` `peak_memory_mb`: cgroup v2 `memory.peak`, v1 `memory.max_usage_in_bytes`).
It prints one row per harness, median [min-max] over the runs, and the `MEMORY_MB` allowance each harness module
declares beside it: docs/rollouts.md quotes the table. Needs a root runner with cgroups (local mode).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from proxy_process import serve_proxy  # noqa: E402
from scripted_model import ScriptedModel, oracle_command  # noqa: E402

from steps.harnesses import HARNESSES, InstallError, default_prefix  # noqa: E402
from steps.rollout import RolloutSpec, run_rollout  # noqa: E402
from steps.tasks import BUILTIN_DATASET  # noqa: E402

ADMIN_KEY = "bench-admin-key"


def spread(values: list[int]) -> str:
    """median [min-max], in MiB."""
    return f"{statistics.median(values):.0f} [{min(values)}-{max(values)}]" if values else "-"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--harnesses", default=",".join(HARNESSES))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--task", default="hello-file", help="a built-in task")
    args = p.parse_args()
    task = BUILTIN_DATASET / args.task
    rows = []
    with tempfile.TemporaryDirectory() as scratch, ScriptedModel(model="tiny") as model, \
            serve_proxy(model.url, f"{scratch}/store", ADMIN_KEY) as proxy:
        for name in args.harnesses.split(","):
            harness = HARNESSES[name]
            try:
                harness.install(default_prefix(name, harness.VERSION))
            except InstallError:
                print(f"{name}: not installed (make harnesses); skipped", file=sys.stderr)
                continue
            peaks: dict[str, list[int]] = {"harness": [], "agent": []}
            for run in range(args.runs):
                model.set_commands([oracle_command(task)])
                rollout_id = f"{name}-{uuid.uuid4().hex[:6]}"
                result = run_rollout(RolloutSpec(task=task, harness=name, proxy_url=proxy.url, rollout_id=rollout_id,
                                                 out=Path(scratch) / rollout_id, admin_key=ADMIN_KEY))
                print(f"{name} run {run + 1}: {result.status} reward {result.reward} peaks {result.peak_memory_mb}",
                      file=sys.stderr)
                for group in peaks:
                    if group in result.peak_memory_mb and result.status == "ok":
                        peaks[group].append(result.peak_memory_mb[group])
            rows.append((name, spread(peaks["harness"]), spread(peaks["agent"]), harness.MEMORY_MB))
    print("| harness | harness's peak, MiB | agent's commands' peak, MiB | MEMORY_MB |")
    print("|---|---|---|---|")
    for name, harness_peak, agent_peak, allowance in rows:
        print(f"| {name} | {harness_peak} | {agent_peak} | {allowance} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
