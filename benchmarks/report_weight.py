"""Report weight: how large and how slow the run report is for a run of many rollouts.

    python benchmarks/report_weight.py [--rollouts 1000] [--iterations 2] [--calls 3] [--tokens 400]

Builds a synthetic run in a temporary folder through the real writers: the proxy's store (`CallStore`)
with `--calls` Chat Completions calls per rollout (a shell tool call, its output, a rewritten history
that splits a sample), `result.json`, harness logs and verifier files per rollout, the trajectories step
(`python -m steps.trajectories --store`) for the tables, the update's `metrics.json`, an evaluation's
`summary.json` and a `behaviour.parquet`. Then writes the report (`steps.report.write_report`) and prints
the seconds it took, the size of the index page, of plotly.min.js and of the largest rollout page (with
`--browser`, the seconds headless chromium takes to draw the index), and one JSON line with every figure. `synthetic_run` is the tests' run too (`hostile=True` puts markup and
script-closing text where an agent could).
"""

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from steps import manifest  # noqa: E402
from steps.proxy.store import CallStore  # noqa: E402
from steps.trajectories.__main__ import main as trajectories_main  # noqa: E402
from steps.contracts import layout  # noqa: E402
from steps.contracts.table_files import write_table  # noqa: E402
from steps.contracts.tables import BEHAVIOUR  # noqa: E402
from steps.contracts.manifest import IterationRecord  # noqa: E402
from steps.contracts.rollout import RolloutResult  # noqa: E402

HOSTILE = '</script><script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"><!--'
HOSTILE_TASK = "<img src=x onerror=window.__pwned=3>task"  # a task's name is a folder's name: no slash
SYSTEM = "You are an autonomous agent working in a Linux shell. Use the `shell` tool."
TOOLS = [{"type": "function", "function": {"name": "shell", "description": "Run a bash command.",
                                           "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(300, 4000) for _ in range(n)]


def chat_calls(rollout_id: str, task: str, calls: int, tokens: int, version: str, rng: random.Random,
               tool_output: str) -> list[dict]:
    """A rollout's call records as the proxy stores them: a tool call, its output, then (third call on) a
    history rewritten without the tool output, which starts a new training sample."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Solve {task}."}]
    prompt, records = _ids(rng, tokens), []
    for index in range(calls):
        last = index == calls - 1
        response = _ids(rng, max(4, tokens // 10))
        message = {"role": "assistant", "content": "done" if last else None}
        if not last:
            message["tool_calls"] = [{"id": f"c{index}", "type": "function",
                                      "function": {"name": "shell", "arguments": json.dumps({"command": f"cat step{index}.txt"})}}]
        records.append({"rollout_id": rollout_id, "call_index": index, "dialect": "chat_completions", "stream": False,
                        "status": "ok", "weight_version": version, "prompt_token_ids": prompt, "prompt_shared": None,
                        "response_token_ids": response, "response_logprobs": [-rng.random() * 3 for _ in response],
                        "finish_reason": "stop" if last else "tool_calls", "sampling": {"temperature": 1.0},
                        "sampling_requested": {}, "timings": {"received_at": 0.0, "total_s": 0.1, "upstream_s": 0.1},
                        "request": {"model": "tiny", "messages": list(messages), "tools": TOOLS}, "request_shared": None,
                        "response": {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}, "error": None})
        if index == 1:  # the harness compacts: the tool output goes, the prompt no longer extends the sample
            messages = messages[:2] + [{"role": "user", "content": "(earlier steps summarised)"}]
            prompt = prompt[:tokens // 2] + _ids(rng, tokens // 2 + 20)
        else:
            messages = messages + [message, {"role": "tool", "tool_call_id": f"c{index}", "content": tool_output}]
            prompt = prompt + response + _ids(rng, 12)
    return records


def write_rollout(run_url: str, iteration: int, rollout_id: str, task: str, sample: int, reward: float,
                  num_calls: int, log: str) -> None:
    """A rollout's folder as the rollout step leaves it: result.json, harness.log, verifier/."""
    folder = Path(layout.rollout_url(run_url, iteration, rollout_id))
    (folder / "verifier").mkdir(parents=True, exist_ok=True)
    (folder / "harness.log").write_text(log)
    (folder / "verifier" / "reward.txt").write_text(f"{reward}\n")
    (folder / "verifier" / "test-stdout.txt").write_text(f"checked {task}: reward {reward}\n")
    result = RolloutResult(rollout_id=rollout_id, task=task, harness="direct", status="ok", reward=reward,
                           rewards={"reward": reward}, num_calls=num_calls, error=None, harness_exit_code=0,
                           durations={"setup_s": 0.1, "agent_s": 2.0 + reward, "verifier_s": 0.1, "total_s": 2.2 + reward},
                           weight_versions=[str(iteration)], response_tokens=40, sample=sample, metadata={},
                           paths={"harness_log": str(folder / "harness.log"), "verifier_output": str(folder / "verifier")})
    (folder / layout.RESULT_FILE).write_text(json.dumps(result.to_json()))


def synthetic_run(store: Path, name: str, rollouts: int = 8, iterations: int = 2, calls: int = 3, tokens: int = 60,
                  model: str = "", hostile: bool = False, seed: int = 0) -> str:
    """Writes a whole run under `store/name` (see the module docstring); returns its URL."""
    rng, run_url = random.Random(seed), layout.run_url(str(store), name)
    manifest.write_run_config(run_url, {"run": name, "harness": "direct", "model": model, "iterations": iterations,
                                        "store": str(store), "samples_per_task": 4})
    call_store = CallStore(layout.calls_url(run_url))
    tasks = [f"{HOSTILE_TASK}-{i}" if hostile and i == 0 else f"task-{i}" for i in range(max(1, rollouts // 4))]
    for iteration in range(iterations):
        for r in range(rollouts):
            task, sample = tasks[r % len(tasks)], r // len(tasks)
            rollout_id = f"it{iteration}-{task}-s{sample}"
            output = HOSTILE if hostile and r == 0 else f"contents of step {r}"
            records = chat_calls(rollout_id, task, calls, tokens, str(iteration), rng, output)
            asyncio.run(_store(call_store, rollout_id, records))
            reward = round(min(1.0, rng.random() * (0.4 + 0.5 * iteration)), 2)
            write_rollout(run_url, iteration, rollout_id, task, sample, reward, calls,
                          HOSTILE if hostile and r == 0 else f"step {r} ran\n")
        trajectories_main(["--store", layout.calls_url(run_url), "--results", layout.results_url(run_url, iteration),
                           "--out", layout.trajectories_url(run_url), "--run", name, "--iteration", str(iteration)])
        checkpoint = layout.checkpoint_url(run_url, iteration + 1, model)
        manifest.write_json(layout.metrics_url(checkpoint), {"logprob_gap": 0.03 + 0.01 * iteration, "loss": 0.1,
                                                             "tokens_trained": 100, "train_s": 1.5, "total_s": 2.0})
        manifest.record(run_url, IterationRecord(iteration, "local", status="Succeeded"))
        write_behaviour(run_url, name, iteration, rollouts, tasks, rng)
    manifest.write_json(layout.eval_summary_url(run_url, iterations - 1), eval_summary(tasks, iterations - 1))
    return run_url


async def _store(store: CallStore, rollout_id: str, records: list[dict]) -> None:
    await store.put_rollout({"rollout_id": rollout_id, "metadata": {}})
    for record in records:
        await store.put_call(record)


def write_behaviour(run_url: str, name: str, iteration: int, rollouts: int, tasks: list[str], rng: random.Random) -> None:
    """A behaviour table in the partition (the shape `steps.analytics` writes: keys, then one column per metric)."""
    rows = [{"run": name, "iteration": iteration, "rollout_id": f"it{iteration}-{tasks[r % len(tasks)]}-s{r // len(tasks)}",
             "task": tasks[r % len(tasks)], "sample": r // len(tasks), "harness": "direct", "tool_calls": 2,
             "tool_coverage": 1.0, "self_verified": rng.random() < 0.3 + 0.3 * iteration, "tokens_per_call": 20.0}
            for r in range(rollouts)]
    write_table(pa.Table.from_pylist(rows, schema=BEHAVIOUR), layout.run_partition_url(run_url, name, iteration), "behaviour")


def eval_summary(tasks: list[str], iteration: int) -> dict:
    """An evaluation's summary.json in `steps.evaluate`'s shape."""
    numbers = {"tries": 3, "passes": 2, "pass_at_1": 0.667, "pass_at_k": 1.0, "pass_hat_k": 0.0, "mean_reward": 0.7,
               "infra_errors": 0, "mean_calls": 3.0, "mean_tokens": 40.0, "mean_duration_s": 2.5}
    return {"k": 3, "harness": "direct", "dataset": "synthetic", "checkpoint": None, "model": None, "iteration": iteration,
            "tasks": {task: numbers for task in tasks}, "overall": numbers}


def load_seconds(index: Path) -> float:
    """Seconds from opening the index in headless chromium until its plots and rollout table are drawn."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True)
        page = browser.new_page()
        started = time.monotonic()
        page.goto(index.as_uri())
        page.wait_for_function("document.querySelectorAll('#rollout-table tbody tr').length > 0 && "
                               "Array.from(document.querySelectorAll('.plot')).every(d => d.data !== undefined)")
        seconds = time.monotonic() - started
        browser.close()
    return round(seconds, 2)


def main() -> int:
    """Builds the run, writes its report, prints the figures."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rollouts", type=int, default=1000, help="rollouts per iteration")
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--calls", type=int, default=3, help="calls per rollout")
    p.add_argument("--tokens", type=int, default=400, help="prompt tokens of a rollout's first call")
    p.add_argument("--model", default="", help="a checkpoint folder whose tokenizer decodes the tokens")
    p.add_argument("--browser", action="store_true", help="also time the index's load in headless chromium")
    args = p.parse_args()
    from steps.report import write_report

    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        run_url = synthetic_run(Path(tmp), "weight", args.rollouts, args.iterations, args.calls, args.tokens, args.model)
        built = time.monotonic() - started
        started = time.monotonic()
        index = Path(write_report(run_url))
        seconds = time.monotonic() - started
        pages = sorted((index.parent / "rollouts").rglob("*.html"), key=lambda p: p.stat().st_size)
        loaded_s = load_seconds(index) if args.browser else None
        figures = {"rollouts": args.rollouts * args.iterations, "calls_per_rollout": args.calls, "build_s": round(built, 1),
                   "report_s": round(seconds, 1), "index_bytes": index.stat().st_size,
                   "plotly_js_bytes": (index.parent / "assets" / "plotly.min.js").stat().st_size,
                   "rollout_page_bytes_max": pages[-1].stat().st_size, "rollout_pages": len(pages),
                   "index_load_s": loaded_s}
    print(f"report of {figures['rollouts']} rollouts written in {seconds:.1f} s; index {figures['index_bytes'] / 1e3:.0f} KB "
          f"(+ plotly.min.js {figures['plotly_js_bytes'] / 1e6:.1f} MB, cached), largest rollout page "
          f"{figures['rollout_page_bytes_max'] / 1e3:.0f} KB")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
