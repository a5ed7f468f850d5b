"""Distillation: does warm-start SFT on a stronger model's recordings make the tiny model better at a task?

    .venv/bin/python benchmarks/distillation.py [--k 8] [--epochs 10] [--learning-rate 1e-2] [--store runs]

Every step is a `python workflows/submit.py` command on the embedded default, with `configs/learning-signal.yaml`
(the `direct` harness on the toy target-word task, reward = the longest prefix of "hello" in the reply / 5, replies
of at most 8 tokens, the tiny model without its whitespace bias, built first when missing):

1. **teacher**: `eval --upstream` in front of the test suite's scripted model (tests/scripted_model.py), which
   replays the task's oracle as the `direct` harness gives it (the oracle writes "hello" as the harness's final
   answer: the scripted model replies "hello"), k tries, every call recorded by the proxy;
2. **before**: `eval` of the tiny model, k tries (vLLM on CPU);
3. **sft**: `sft --from <teacher> --min-reward 1` (the recordings rendered with the tiny model's chat template,
   veRL's `sft_loss`, `--epochs` passes at `--learning-rate`);
4. **after**: `eval --checkpoint <sft>:1`, k tries, the same settings as before.

Prints the three side by side (mean reward, pass@1, pass@k, the SFT's first and last loss) and writes them to
`<store>/<sft run>/distillation.json`. Exit code 0 when the mean reward after is above the one before, 1 when not,
2 when a step failed.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from scripted_model import ScriptedModel  # noqa: E402
from steps.contracts import layout  # noqa: E402
from steps.tiny_model import build_tiny_model  # noqa: E402
from workflows.config import load_config  # noqa: E402

CONFIG = "configs/learning-signal.yaml"
ORACLE_ANSWER = "hello"  # what steps/tasks/toy/target-word/solution/solve.sh leaves as the direct harness's answer


def submit(*argv: str) -> str:
    """One `submit.py` command with the benchmark's config; its stdout (progress lines pass through on stderr)."""
    command = [sys.executable, "workflows/submit.py", *argv[:1], "--config", CONFIG, *argv[1:]]
    print(f"$ {' '.join(command[1:])}", flush=True)
    done = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[1:3])} failed with exit code {done.returncode}")
    return done.stdout


def evaluation(stdout: str) -> dict:
    """An eval's overall numbers, from its summary (the last line it printed)."""
    overall = json.loads(stdout.splitlines()[-1])["overall"]
    return {key: overall[key] for key in ("tries", "mean_reward", "pass_at_1", "pass_at_k")}


def main(argv: list[str] | None = None) -> int:
    """Record, evaluate, fine-tune, evaluate again; print and write the comparison."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--k", type=int, default=8, help="tries per evaluation (default 8)")
    p.add_argument("--epochs", type=int, default=10, help="SFT passes over the recordings (default 10)")
    p.add_argument("--learning-rate", type=float, default=1e-2, help="SFT's AdamW step size (default 1e-2)")
    p.add_argument("--store", default="runs", help="where the four runs go (default runs)")
    args = p.parse_args(argv)
    # built before the config is read: a missing `org/name`-like folder would be read as a hub model
    model = REPO / yaml.safe_load((REPO / CONFIG).read_text())["model"]
    if not model.exists():
        print(f"building the tiny model without its whitespace bias in {model}", file=sys.stderr)
        build_tiny_model(model, whitespace_penalty=0.0)
    config = load_config(CONFIG)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    runs = {name: f"distill-{name}-{stamp}" for name in ("teacher", "before", "sft", "after")}
    common = [f"store={args.store}", "parallel_rollouts=2"]
    eval_flags = ["--harness", "direct", "--dataset", config.dataset, "--k", str(args.k)]
    try:
        with ScriptedModel(model="remote", final_answer=ORACLE_ANSWER) as teacher:
            teacher.set_commands([])  # no tool call: the oracle's answer is the reply
            recorded = evaluation(submit("eval", *eval_flags, "--upstream", teacher.url, "--upstream-model", "remote",
                                         f"run={runs['teacher']}", *common))
        before = evaluation(submit("eval", *eval_flags, f"run={runs['before']}", *common))
        trained = json.loads(submit("sft", "--from", runs["teacher"], "--min-reward", "1", f"run={runs['sft']}",
                                    f"learning_rate={args.learning_rate}", f"epochs={args.epochs}",
                                    *common).splitlines()[-1])
        after = evaluation(submit("eval", *eval_flags, "--checkpoint", f"{runs['sft']}:1", f"run={runs['after']}",
                                  *common))
    except RuntimeError as error:
        print(f"distillation: {error}", file=sys.stderr)
        return 2
    losses = trained["metrics"]["losses"]
    rows = [("teacher (recorded)", recorded), ("tiny model before", before), ("after SFT", after)]
    print(f"\n{'':<20}{'tries':>6}{'reward':>8}{'pass@1':>8}{'pass@k':>8}")
    for name, numbers in rows:
        print(f"{name:<20}{numbers['tries']:>6}{numbers['mean_reward']:>8.3f}{numbers['pass_at_1']:>8.3f}"
              f"{numbers['pass_at_k']:>8.3f}")
    print(f"SFT: {trained['samples']['samples']} samples ({trained['samples']['mode']}), "
          f"{trained['metrics']['optimizer_steps']} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    figures = {"runs": runs, "k": args.k, "epochs": args.epochs, "learning_rate": args.learning_rate,
               "teacher": recorded, "before": before, "after": after, "sft": trained}
    out = Path(layout.run_url(args.store, runs["sft"])) / "distillation.json"
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"figures: {out}")
    return 0 if after["mean_reward"] > before["mean_reward"] else 1


if __name__ == "__main__":
    sys.exit(main())
