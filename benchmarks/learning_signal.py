"""Learning signal: does the whole local loop make the tiny model better at a task it can partly solve?

    .venv/bin/python benchmarks/learning_signal.py [--factor 2] [--window 3] [--baseline] [--staleness S] [--signal]
        [--repeat N] [--config FILE] [key=value ...]

Runs `python workflows/submit.py --config configs/learning-signal.yaml [key=value ...]`: the embedded
default with the `direct` harness on the toy `target-word` task (reward = longest prefix of "hello" in the
reply, / 5), so every iteration is the real loop: vLLM on CPU serving the tiny model, the recording proxy,
rollouts, grading, Parquet, the veRL update (skipped when all 8 rollouts earned the same reward: no
gradient), the new weights reloaded into the running vLLM. The config's model, when missing, is built
first: the tiny model without its whitespace bias (`steps.tiny_model --whitespace-penalty 0`). Prints each
iteration's mean reward and seconds per phase (rollouts, trajectories, update, reload) as they come, then
the curve as a text plot, the phase table, and a verdict: the mean reward of the first `--window`
iterations against the last `--window`. Exit code 0 when the last window is at least `--factor` times the
first, 1 when not, 2 when the run failed. `--baseline` then runs the same settings with
`learning_rate=0` (same sampling, no learning) and compares the last windows, which shows the rise
comes from the update. `--staleness S` then runs the same settings with `max_staleness=S` (the next
iteration's rollouts overlap the update) and prints both side by side: seconds per iteration, the seconds in
each phase (they overlap with S >= 1, so their sum is more than the iteration's), the seconds rollouts waited
for the update, and whether each met the goal. `--signal` then runs the same settings with each of `SIGNAL_VARIANTS`
(flat groups kept, `fill_batch`, `curriculum: pass_rate`, both) and prints them beside the first run: the
mean reward's rise, groups kept and dropped, updates skipped, rollouts and seconds per iteration; it is meant for
`--config configs/learning-signal-tasks.yaml` (six toy words, two tasks an iteration: the learning-signal keys need
more than one task to choose from). `--repeat N` runs every side N times, interleaved, and prints each side's
median (min-max) instead; with `eval_every` in the overrides each run's held-out evaluations (every task of the
dataset, `eval_k` tries each: the same tasks for every side, whatever its curriculum trained on) are among its
figures. Every figure goes to `<store>/<run>/learning-signal.json`; last,
the run's report (`steps.report`, with the baseline's, the overlapped and the signal runs beside it) is written under
`<store>/<run>/reports/` and its path printed.

    .venv/bin/python benchmarks/learning_signal.py --config configs/learning-signal-tasks.yaml --signal
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from steps.report import write_report  # noqa: E402
from steps.tiny_model import build_tiny_model  # noqa: E402
from steps.contracts import layout  # noqa: E402
from steps.contracts.config import RunConfig  # noqa: E402
from steps.contracts.rollout import read_result  # noqa: E402
from steps import settings  # noqa: E402
from workflows.config import DEFAULT_CONFIG, ConfigError, load_config  # noqa: E402

PHASES = ("rollouts", "trajectories", "update", "reload")
OVERLAP = "waited"  # with max_staleness >= 1: seconds an iteration's rollouts waited for an earlier update
PLOT_WIDTH = 40
# `--signal`: the runs beside the first one (drop_flat_groups on, no fill, no curriculum), by name and overrides
SIGNAL_VARIANTS = {"keep-flat": ["drop_flat_groups=false"], "fill": ["fill_batch=true"],
                   "curriculum": ["curriculum=pass_rate"], "fill-curriculum": ["fill_batch=true", "curriculum=pass_rate"]}


def run_loop(config_path: str, overrides: list[str]) -> tuple[list[dict], int, float]:
    """Runs the loop through submit.py; returns its per-iteration summaries, its exit code and its seconds.

    submit.py's progress lines (stderr) pass through; its stdout is one JSON summary per iteration.
    """
    argv = [sys.executable, "workflows/submit.py", "--config", config_path, *overrides]
    print(f"$ {' '.join(argv[1:])}", flush=True)
    started = time.monotonic()
    summaries = []
    with subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True) as driver:
        for line in driver.stdout:
            summary = json.loads(line)
            if "iteration" not in summary:  # the final checkpoint's evaluation (`eval_every`), after the last one
                print(f"evaluation of checkpoint {summary['eval']}: mean reward {summary.get('mean_reward')}", flush=True)
                continue
            summaries.append(summary)
            print(f"iteration {summary['iteration']}: mean reward {summary['metrics']['mean_reward']:.3f}; "
                  + ", ".join(f"{p} {summary['timings_s'].get(p + '_s', 0.0):.1f} s" for p in PHASES)
                  + (f"; update skipped ({summary['update']['skipped']})" if skipped(summary) else ""), flush=True)
    return summaries, driver.returncode, time.monotonic() - started


def skipped(summary: dict) -> bool:
    """True when the iteration's update took no step (every advantage was 0)."""
    return bool((summary.get("update") or {}).get("skipped"))


def served_versions(run_url: str, iteration: int) -> set[str]:
    """The weight versions that served an iteration's rollouts (from their result.json files)."""
    versions: set[str] = set()
    for result in Path(layout.results_url(run_url, iteration)).glob(f"*/{layout.RESULT_FILE}"):
        versions.update(read_result(result).weight_versions)
    return versions


def figures(config: RunConfig, summaries: list[dict], wall_s: float, window: int) -> dict:
    """The run's curve, phase seconds, served weight versions and first/last window means."""
    rewards = [s["metrics"]["mean_reward"] for s in summaries]
    first, last = mean(rewards[:window]), mean(rewards[-window:])
    return {
        "run": config.run, "learning_rate": config.learning_rate, "iterations": len(summaries),
        "samples_per_task": config.samples_per_task, "max_tokens_cap": config.max_tokens_cap,
        "mean_reward": rewards,
        "max_staleness": config.max_staleness,
        "phases_s": {p: [s["timings_s"][p + "_s"] for s in summaries if p + "_s" in s["timings_s"]]  # the last: no reload
                     for p in (*PHASES, OVERLAP)},
        "seconds_per_iteration": seconds_per_iteration(summaries),
        "staleness": [s.get("staleness") for s in summaries],
        "updates_skipped": [s["iteration"] for s in summaries if skipped(s)],
        "drop_flat_groups": config.drop_flat_groups, "fill_batch": config.fill_batch, "curriculum": config.curriculum,
        "rollouts": [s["rollouts"] for s in summaries],
        "groups_kept": [(s.get("update") or {}).get("groups_kept") for s in summaries],
        "groups_dropped": [(s.get("update") or {}).get("groups_dropped") for s in summaries],
        "weight_versions_ok": all(served_versions(config.run_url, s["iteration"]) <=
                                  {str(v) for v in range(s["iteration"] - config.max_staleness, s["iteration"] + 1)}
                                  for s in summaries),
        "window": window, "first_window_mean": first, "last_window_mean": last,
        "ratio": last / first if first else float("inf") if last else 0.0,  # 0 -> 0 learned nothing
        "eval_mean_reward": held_out(config),
        "wall_s": round(wall_s, 1),
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def held_out(config: RunConfig) -> dict[str, float]:
    """With `eval_every`: each evaluated checkpoint's mean reward over every task of the evaluation's dataset (each
    tried `eval_k` times), by iteration: the same tasks for every run, whatever its curriculum chose to train on."""
    found = {}
    for n in range(config.iterations + 1):
        summary = Path(layout.eval_summary_url(config.run_url, n))
        if config.evaluates_at(n) and summary.exists():
            found[str(n)] = json.loads(summary.read_text())["overall"]["mean_reward"]
    return found


def seconds_per_iteration(summaries: list[dict]) -> float:
    """From the first iteration's start to the last one's end (its update: nothing serves its weights after it, so
    it swaps nothing), per iteration: vLLM's start left out.

    >>> seconds_per_iteration([{"phase_times": {"rollouts": [10, 20], "reload": [30, 31]}},
    ...                        {"phase_times": {"rollouts": [25, 40], "reload": [50, 51]}}])
    20.5
    """
    starts = [min(span[0] for span in s["phase_times"].values()) for s in summaries]
    ends = [max(span[1] for span in s["phase_times"].values()) for s in summaries]
    return round((max(ends) - min(starts)) / len(summaries), 1) if summaries else 0.0


def side_by_side(runs: list[dict], factor: float) -> None:
    """The synchronous run and the overlapped one: seconds per iteration, per phase, and the verdicts."""
    print(f"\n{'':<26}" + "".join(f"{'max_staleness ' + str(r['max_staleness']):>18}" for r in runs))
    rows = [("seconds per iteration", lambda r: f"{r['seconds_per_iteration']:.1f}")]
    rows += [(f"{p} s (mean)", lambda r, p=p: f"{mean(r['phases_s'][p]):.1f}") for p in (*PHASES, OVERLAP)]
    rows += [("last / first window", lambda r: f"{r['ratio']:.1f}x"),
             (f"goal {factor:g}x", lambda r: "PASS" if r["ratio"] >= factor else "FAIL"),
             ("samples dropped", lambda r: str(sum((s or {}).get("dropped", 0) for s in r["staleness"]))),
             ("max versions behind", lambda r: str(max(((s or {}).get("max_behind") or 0 for s in r["staleness"]),
                                                       default=0)))]
    for label, cell in rows:
        print(f"{label:<26}" + "".join(f"{cell(r):>18}" for r in runs))
    print(f"overlapped / synchronous seconds per iteration: "
          f"{runs[1]['seconds_per_iteration'] / max(runs[0]['seconds_per_iteration'], 1e-9):.2f}")


def signal_side_by_side(runs: dict[str, dict], factor: float) -> None:
    """The first run and the `--signal` variants: the reward's rise, groups kept and dropped, updates skipped,
    rollouts and seconds per iteration."""
    print(f"\n{'':<26}" + "".join(f"{name:>17}" for name in runs))
    rows = [("last / first window", lambda r: f"{r['ratio']:.1f}x"),
            (f"goal {factor:g}x", lambda r: "PASS" if r["ratio"] >= factor else "FAIL"),
            ("last window mean reward", lambda r: f"{r['last_window_mean']:.3f}"),
            ("groups kept, all iterations", lambda r: str(sum(n or 0 for n in r["groups_kept"]))),
            ("groups dropped, all iterations", lambda r: str(sum(n or 0 for n in r["groups_dropped"]))),
            ("updates skipped", lambda r: str(len(r["updates_skipped"]))),
            ("rollouts per iteration", lambda r: f"{mean(r['rollouts']):.1f}"),
            ("seconds per iteration", lambda r: f"{r['seconds_per_iteration']:.1f}")]
    for label, cell in rows:
        print(f"{label:<26}" + "".join(f"{cell(r):>17}" for r in runs.values()))


def median_spread(values: list[float], digits: int = 3) -> str:
    """The median and (min-max) of one figure over repeated runs.

    >>> median_spread([0.2, 0.1, 0.4]), median_spread([12.0, 14.5], 1)
    ('0.200 (0.100-0.400)', '13.2 (12.0-14.5)')
    """
    ordered = sorted(values)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return f"{median:.{digits}f} ({ordered[0]:.{digits}f}-{ordered[-1]:.{digits}f})"


def repeated_table(sides: dict[str, list[dict]]) -> None:
    """`--repeat`: per side, the median (min-max) over its runs of the reward's rise, the held-out evaluation's mean
    reward at the first and last evaluated checkpoints, updates skipped, rollouts and time."""
    rows = [("first → last window", lambda r: r["first_window_mean"], 3), ("last / first", lambda r: r["ratio"], 2),
            ("held-out, base", lambda r: first_eval(r), 3), ("held-out, last", lambda r: last_eval(r), 3),
            ("updates skipped", lambda r: len(r["updates_skipped"]), 0), ("rollouts", lambda r: sum(r["rollouts"]), 0),
            ("s per iteration", lambda r: r["seconds_per_iteration"], 1), ("whole run s", lambda r: r["wall_s"], 0)]
    print(f"\n{'median (min-max)':<22}" + "".join(f"{name:>26}" for name in sides))
    for label, value, digits in rows:
        cells = []
        for runs in sides.values():
            values = [value(r) for r in runs]
            cells.append("-" if None in values else median_spread(values, digits))
        print(f"{label:<22}" + "".join(f"{cell:>26}" for cell in cells))
        if label.startswith("first"):
            print(f"{'':<22}" + "".join(f"{'→ ' + median_spread([r['last_window_mean'] for r in runs]):>26}"
                                        for runs in sides.values()))


def first_eval(result: dict) -> float | None:
    evals = result.get("eval_mean_reward") or {}
    return evals[min(evals, key=int)] if evals else None


def last_eval(result: dict) -> float | None:
    evals = result.get("eval_mean_reward") or {}
    return evals[max(evals, key=int)] if evals else None


def mean(values: list[float]) -> float:
    """Arithmetic mean; 0 for no values.

    >>> mean([0.1, 0.3]), mean([])
    (0.2, 0.0)
    """
    return sum(values) / len(values) if values else 0.0


def plot(rewards: list[float]) -> str:
    """The curve as text: one bar per iteration, full width = reward 1.

    >>> print(plot([0.0, 0.5]))
     0 0.000 |
     1 0.500 |####################
    """
    return "\n".join(f"{i:>2} {r:.3f} |{'#' * round(r * PLOT_WIDTH)}" for i, r in enumerate(rewards))


def report(result: dict, factor: float, baseline: dict | None) -> bool:
    """Prints the plot, the phase table and the verdict; returns whether the reward rose by `factor`."""
    print(f"\nmean reward per iteration (run {result['run']}, learning_rate {result['learning_rate']}):")
    print(plot(result["mean_reward"]))
    print(f"\n{'phase':<14}{'mean s':>8}{'min s':>8}{'max s':>8}")
    for phase, seconds in result["phases_s"].items():
        if seconds:  # `waited` only with max_staleness >= 1
            print(f"{phase:<14}{mean(seconds):>8.1f}{min(seconds):>8.1f}{max(seconds):>8.1f}")
    per_iteration = sum(mean(seconds) for seconds in result["phases_s"].values())
    print(f"{'iteration':<14}{per_iteration:>8.1f}   (whole run {result['wall_s']:.0f} s, with vLLM's start)")
    if result.get("eval_mean_reward"):
        print("held-out evaluation, mean reward over every task by checkpoint: "
              + ", ".join(f"{n}: {r:.3f}" for n, r in result["eval_mean_reward"].items()))
    if result["updates_skipped"]:
        print(f"updates skipped (no advantage) in iterations {result['updates_skipped']}")
    if not result["weight_versions_ok"]:
        print("WARNING: some rollouts were not served the weights their iteration should have")
    window, rose = result["window"], result["ratio"] >= factor
    print(f"\nmean reward first {window} its {result['first_window_mean']:.3f} -> last {window} its "
          f"{result['last_window_mean']:.3f} ({result['ratio']:.1f}x; goal {factor:g}x): {'PASS' if rose else 'FAIL'}")
    if baseline:
        print(f"baseline learning_rate 0, mean reward per iteration: "
              f"{' '.join(f'{r:.2f}' for r in baseline['mean_reward'])} (mean {mean(baseline['mean_reward']):.3f})")
        print(f"baseline learning_rate 0: first {window} its {baseline['first_window_mean']:.3f} -> last {window} its "
              f"{baseline['last_window_mean']:.3f} ({baseline['ratio']:.1f}x); last {window} its trained / baseline: "
              f"{result['last_window_mean'] / max(baseline['last_window_mean'], 1e-9):.1f}x")
    return rose


def plain_model(config_path: str, overrides: list[str]) -> None:
    """Builds the config's model when it is missing: the tiny model without its whitespace bias, which a
    large learning rate flips (`steps.tiny_model.build_tiny_model`). Before the config is loaded: `load_config`
    reads a missing folder spelt like `org/name` (`runs/tiny-model-plain`) as a hub model."""
    config = settings.load(RunConfig, [DEFAULT_CONFIG, config_path], overrides)
    path = Path(config.model) if Path(config.model).is_absolute() else REPO / config.model
    if not path.exists():
        print(f"building the tiny model without whitespace bias in {path}", flush=True)
        build_tiny_model(path, seed=config.seed, whitespace_penalty=0)


def measure(config_path: str, overrides: list[str], window: int) -> dict | None:
    """One run start to end; its figures, written next to it, or None when it failed."""
    plain_model(config_path, overrides)
    config = load_config(config_path, overrides)
    summaries, code, wall_s = run_loop(config_path, overrides)
    if code != 0 or len(summaries) < config.iterations:
        print(f"error: run {config.run} failed (exit code {code}) after {len(summaries)} iterations; "
              f"see {layout.logs_url(config.run_url)}", file=sys.stderr)
        return None
    result = figures(config, summaries, wall_s, window)
    Path(config.run_url, "learning-signal.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> int:
    """Parse, run (and the baseline), report; exit code 0 when the reward rose by the factor."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/learning-signal.yaml", help="the run config (flat YAML)")
    p.add_argument("--factor", type=float, default=2.0, help="last window / first window needed to pass")
    p.add_argument("--window", type=int, default=3, help="iterations averaged at each end of the curve")
    p.add_argument("--baseline", action="store_true", help="also run with learning_rate=0 and compare")
    p.add_argument("--staleness", type=int, default=0, metavar="S",
                   help="also run with max_staleness=S (rollouts overlapping the update) and compare")
    p.add_argument("--signal", action="store_true", help="also run each of SIGNAL_VARIANTS (flat groups kept, "
                   "fill_batch, curriculum, both) and compare; meant for configs/learning-signal-tasks.yaml")
    p.add_argument("--repeat", type=int, default=1, metavar="N", help="run everything N times (names -r1...) and "
                   "print each side's median (min-max); with eval_every, the held-out evaluation's too")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="run config overrides, e.g. iterations=20")
    args = p.parse_args()
    names = [item.partition("=")[2] for item in args.overrides if item.startswith("run=")]
    name = names[-1] if names else f"learning-signal-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    overrides = [item for item in args.overrides if not item.startswith("run=")]
    if args.repeat < 1:
        print("error: --repeat must be at least 1", file=sys.stderr)
        return 2
    if args.repeat > 1:
        return repeat(args, name, overrides)
    try:
        if load_config(args.config, overrides).iterations < 2 * args.window:
            raise ConfigError(f"iterations must be at least 2 x --window ({2 * args.window})")
        result = measure(args.config, [f"run={name}", *overrides], args.window)
        baseline = measure(args.config, [f"run={name}-lr0", *overrides, "learning_rate=0"], args.window) \
            if result and args.baseline else None
        overlapped = measure(args.config, [f"run={name}-s{args.staleness}", *overrides,
                                           f"max_staleness={args.staleness}"], args.window) \
            if result and args.staleness else None
        signal = {variant: measure(args.config, [f"run={name}-{variant}", *overrides, *settings], args.window)
                  for variant, settings in SIGNAL_VARIANTS.items()} if result and args.signal else {}
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if result is None or (args.baseline and baseline is None) or (args.staleness and overlapped is None) \
            or None in signal.values():
        return 2
    rose = report(result, args.factor, baseline)
    if overlapped:
        rose = report(overlapped, args.factor, None) and rose
        side_by_side([result, overlapped], args.factor)
    if signal:
        signal_side_by_side({"drop (default)": result, **signal}, args.factor)
    run_url = load_config(args.config, [f"run={name}", *overrides]).run_url
    compare = [r["run"] for r in (baseline, overlapped, *signal.values()) if r]
    print(f"\nrun report (the mean reward per iteration, beside the baseline's and the overlapped run's): "
          f"{write_report(run_url, compare=compare)}")
    return 0 if rose else 1


def repeat(args: argparse.Namespace, name: str, overrides: list[str]) -> int:
    """`--repeat N`: each side (the run, `--baseline`, `--staleness`, `--signal`'s variants) N times, interleaved
    (run 1 of every side, then run 2...) so the machine's drift falls on every side alike; then the medians."""
    sides = {"first": []}
    extra = {"learning_rate 0": ["learning_rate=0"]} if args.baseline else {}
    if args.staleness:
        extra[f"max_staleness {args.staleness}"] = [f"max_staleness={args.staleness}"]
    if args.signal:
        extra |= SIGNAL_VARIANTS
    try:
        if load_config(args.config, overrides).iterations < 2 * args.window:
            raise ConfigError(f"iterations must be at least 2 x --window ({2 * args.window})")
        for r in range(1, args.repeat + 1):
            for side, overriding in {"first": [], **extra}.items():
                tag = "" if side == "first" else "-" + "".join(c if c.isalnum() else "-" for c in side)
                result = measure(args.config, [f"run={name}{tag}-r{r}", *overrides, *overriding], args.window)
                if result is None:
                    return 2
                sides.setdefault(side, []).append(result)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    repeated_table(sides)
    return 0


if __name__ == "__main__":
    sys.exit(main())
