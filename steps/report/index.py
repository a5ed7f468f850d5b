"""The report's front page: config, iteration plots, behaviour, evaluations, comparisons, the rollout table."""

import json

from steps.analytics import summarize_behaviour
from steps.metrics import harness_killed_warning, harness_kills
from steps.report import figures, series
from steps.report.assets import NO_STATUS
from steps.report.data import Run
from steps.report.html import esc, json_script, page, table

EVAL_KEYS = ["tries", "passes", "pass_at_1", "pass_at_k", "pass_hat_k", "mean_reward", "infra_errors", "harness_killed",
             "missing", "mean_calls", "mean_tokens", "mean_duration_s"]
ITERATION_COLUMNS = [("status", "status"), ("rollouts", "rollouts"), ("infra_errors", "infra errors"),
                     ("mean_reward", "mean reward"), ("k", "k"), ("pass_at_k", "pass@k"), ("pass_hat_k", "pass^k"),
                     ("calls", "calls / rollout"), ("tokens", "tokens / rollout"), ("logprob_gap", "logprob gap"),
                     ("groups_kept", "groups kept"), ("groups_dropped", "groups dropped"),
                     ("tokens_trained", "tokens trained"), ("update_skipped", "update skipped")]
# The staleness of what each iteration trained (the trajectories step's `_staleness.json`, in its manifest record).
STALENESS_COLUMNS = [("max_behind", "max versions behind"), ("mean_behind", "mean versions behind"),
                     ("dropped", "samples dropped")]
# The behaviour means plotted per iteration: the informative ones (the table shows every column).
BEHAVIOUR_PLOTS = ["pass_rate", "recovery_rate", "tool_coverage", "self_verified", "shell_share", "plan_completion",
                   "tokens_per_call"]


def summaries(run: Run, only: int | None = None) -> dict[int, dict]:
    """The run's numbers by iteration (`series.iteration_summary`), with the manifest's status."""
    out = {}
    for n, it in run.iterations.items():
        if only is None or n == only:
            record = it.record or {}
            out[n] = series.iteration_summary(it.rollouts, it.calls, it.update) | {"status": record.get("status")} \
                | {f"phase {name}": seconds for name, seconds in (record.get("timings_s") or {}).items()} \
                | {f"staleness {name}": (record.get("staleness") or {}).get(key) for key, name in STALENESS_COLUMNS
                   if record.get("staleness")} \
                | ({"adapter": record["adapter"]} if record.get("adapter") else {}) \
                | curriculum_cells(record.get("curriculum"))
    return out


def curriculum_cells(summary: dict | None) -> dict:
    """A curriculum's pool as the iteration's plan saw it (its manifest record's `curriculum`): tasks per state in
    the pool and among those chosen; nothing without a curriculum.

    >>> curriculum_cells({"learning": 1, "unseen": 0, "chosen": {"learning": 1, "unseen": 0}})["tasks chosen"]
    'learning 1, unseen 0, solved 0, unsolved 0'
    """
    if not summary:
        return {}
    pool = {state: number for state, number in summary.items() if state != "chosen"}
    return {"task pool": series.pool_counts(pool), "tasks chosen": series.pool_counts(summary.get("chosen") or {})}


def eval_numbers(run: Run) -> dict[int, dict]:
    """Each evaluation's overall numbers by iteration."""
    return {n: dict(s.get("overall") or {}) for n, s in run.evals.items()}


class Figures:
    """The figures of one page, each drawn into its own `<div>`; collected as one JSON element."""

    def __init__(self):
        self.items: list[dict] = []

    def div(self, figure: dict | None, empty: str = "") -> str:
        """The figure's `<div>` (or a note when there is nothing to plot)."""
        if figure is None:
            return f'<p class="note">{esc(empty)}</p>' if empty else ""
        element = f"figure-{len(self.items)}"
        self.items.append({"id": element, "figure": figure})
        return f'<div class="plot" id="{element}"></div>'


def pass_title(subjects: list[tuple[str, dict[int, dict]]]) -> str:
    """The pass@k plot's title, naming k (or saying it varies) and what a pass is.

    >>> pass_title([("a", {0: {"k": 4}, 1: {"k": 4}})]), pass_title([("a", {0: {"k": 4}, 1: {"k": 2}})])
    ('pass@4 and pass^4 (a pass: reward ≥ 1)', "pass@k and pass^k (k per iteration: the table's; a pass: reward ≥ 1)")
    """
    ks = {numbers.get("k") for _, by in subjects for numbers in by.values()}
    if len(ks) == 1 and None not in ks:
        k = ks.pop()
        return f"pass@{k} and pass^{k} (a pass: reward ≥ 1)"
    return "pass@k and pass^k (k per iteration: the table's; a pass: reward ≥ 1)"


def iteration_section(subjects: list[tuple[str, dict[int, dict]]], figs: Figures) -> str:
    """Plots per iteration, every subject's series overlaid."""
    plots = [
        figures.series_figure("Mean reward", subjects, [("mean_reward", "mean reward")], "reward"),
        figures.series_figure(pass_title(subjects), subjects, [("pass_at_k", "pass@k"), ("pass_hat_k", "pass^k")]),
        figures.series_figure("Continuity rate per harness", subjects, figures.prefixed_keys(subjects, "continuity "),
                              "share of calls"),
        figures.series_figure("Rollout vs trainer logprob gap", subjects, [("logprob_gap", "mean |gap|")], "nats"),
        figures.series_figure("Tokens and calls per rollout", subjects, [("tokens", "response tokens"), ("calls", "calls")]),
        figures.series_figure("Infra errors and harnesses killed by a limit", subjects,
                              [("infra_errors", "infra errors"), *figures.prefixed_keys(subjects, series.KILLED)],
                              "rollouts"),
        figures.series_figure("Time per phase of the iteration (s)", subjects, figures.prefixed_keys(subjects, "phase "),
                              "seconds"),
        figures.rollout_time_figure(subjects),
    ]
    empty = {2: "No continuity plot: no call could have continued a sample (one call per rollout, or no calls table).",
             7: "No phase times: the local runner records them in each iteration's manifest record (timings_s)."}
    return '<div class="plots">' + "".join(figs.div(f, empty.get(n, "")) for n, f in enumerate(plots)) + "</div>"


def config_section(run: Run) -> str:
    """The run's config as recorded when it started."""
    if run.config is None:
        return '<p class="note">No recorded config (manifest/run.json is missing).</p>'
    rows = [[k, v if isinstance(v, (str, int, float, bool)) or v is None else json.dumps(v)] for k, v in sorted(run.config.items())]
    evaluated = "" if run.evaluates is None else "<h3>What it evaluates</h3>" + table(
        ["what", "value"], [[k, v if v is None or isinstance(v, (str, int, float)) else json.dumps(v)]
                            for k, v in sorted(run.evaluates.items())])
    return f"{evaluated}<details><summary>{len(rows)} keys</summary>{table(['key', 'value'], rows)}</details>"


def iterations_table(numbers: dict[int, dict]) -> str:
    """One row per iteration: outcome, rewards, pass rates, sizes, the update."""
    harness_keys = sorted({k for n in numbers.values() for k in n if k.startswith("continuity ")})
    killed_keys = sorted({k for n in numbers.values() for k in n if k.startswith(series.KILLED)})
    stale_keys = [f"staleness {name}" for _, name in STALENESS_COLUMNS
                  if any(f"staleness {name}" in n for n in numbers.values())]
    after_infra = [key for key, _ in ITERATION_COLUMNS].index("infra_errors") + 1
    lora = ["adapter"] if any("adapter" in n for n in numbers.values()) else []  # which adapter each served
    pool = [k for k in ("task pool", "tasks chosen") if any(k in n for n in numbers.values())]  # a curriculum's
    columns = ITERATION_COLUMNS[:after_infra] + [(k, k) for k in killed_keys] + ITERATION_COLUMNS[after_infra:] + \
        [(k, k) for k in harness_keys + stale_keys + lora + pool]
    rows = [[n] + [numbers[n].get(k) for k, _ in columns] for n in sorted(numbers)]
    return table(["iteration"] + [name for _, name in columns], rows)


def behaviour_section(run: Run, figs: Figures) -> str:
    """The behaviour analytics per harness and iteration, from each partition's behaviour table."""
    rows = [r for it in run.iterations.values() if it.behaviour for r in it.behaviour]
    if not rows:
        return ('<p class="note">No behaviour table: the trajectory partitions hold no behaviour.parquet '
                "(written by the trajectories step with steps.analytics).</p>")
    means = summarize_behaviour(rows, ["harness", "iteration"])  # infra errors left out, iterations in number order
    if not means:
        return '<p class="note">Every rollout in the behaviour tables is an infra error: no behaviour to average.</p>'
    metrics = [c for c in means[0] if c not in ("harness", "iteration")]
    out = table(["harness", "iteration", *metrics], [[m.get("harness"), m.get("iteration"),
                                                      *[json.dumps(m[c]) if isinstance(m.get(c), dict) else m.get(c)
                                                        for c in metrics]] for m in means])
    by_harness: dict[str, dict[int, dict]] = {}
    for m in means:
        by_harness.setdefault(str(m["harness"]), {})[m["iteration"]] = m
    subjects = sorted(by_harness.items())
    plots = [figures.series_figure(metric, subjects, [(metric, "")]) for metric in BEHAVIOUR_PLOTS]
    return out + '<div class="plots">' + "".join(figs.div(p, f"No {m} plot: no rollout has a value.")
                                                 for m, p in zip(BEHAVIOUR_PLOTS, plots)) + "</div>"


def evals_section(runs: list[tuple[str, Run]], figs: Figures) -> str:
    """Every evaluation of the run (and of those compared): overall and per task, and plots per iteration."""
    if not any(run.evals for _, run in runs):
        return '<p class="note">No evaluations (no evals/iteration-N/summary.json).</p>'
    rows, tasks = [], {}
    for name, run in runs:
        for n, s in sorted(run.evals.items()):
            rows.append([name, n, s.get("harness"), s.get("dataset"), s.get("checkpoint") or s.get("model"), s.get("k"),
                         *[(s.get("overall") or {}).get(k) for k in EVAL_KEYS]])
            for task, numbers in (s.get("tasks") or {}).items():
                tasks.setdefault(task, {})[f"{name} it{n}"] = numbers
    out = table(["run", "iteration", "harness", "dataset", "checkpoint", "k", *EVAL_KEYS], rows)
    columns = sorted({c for by in tasks.values() for c in by})
    out += "<h3>Per task: pass@k / pass^k / mean reward</h3>" + table(
        ["task", *columns], [[task, *[" / ".join(f"{v:.3f}" if isinstance(v, (int, float)) else "" for v in
                                       (by.get(c, {}).get("pass_at_k"), by.get(c, {}).get("pass_hat_k"),
                                        by.get(c, {}).get("mean_reward"))) for c in columns]]
                             for task, by in sorted(tasks.items())])
    subjects = [(name, eval_numbers(run)) for name, run in runs if run.evals]
    plots = [figures.series_figure("Evaluations: pass@1, pass@k, pass^k", subjects,
                                   [("pass_at_1", "pass@1"), ("pass_at_k", "pass@k"), ("pass_hat_k", "pass^k")]),
             figures.series_figure("Evaluations: mean reward", subjects, [("mean_reward", "mean reward")], "reward")]
    return out + '<div class="plots">' + "".join(figs.div(p) for p in plots) + "</div>"


LABELS = dict(ITERATION_COLUMNS) | {"tries": "tries", "passes": "passes", "update_train_s": "update train (s)",
                                    "update_total_s": "update total (s)", "setup_s": "rollout setup (s)",
                                    "agent_s": "rollout agent (s)", "verifier_s": "rollout verifier (s)",
                                    "total_s": "rollout total (s)", "loss": "loss", "grad_norm": "grad norm", "entropy": "entropy",
                                    "pass_at_1": "pass@1", "mean_calls": "calls / rollout",
                                    "mean_tokens": "tokens / rollout", "mean_duration_s": "duration / rollout (s)"}


def compare_column(run: Run, only: int | None) -> dict:
    """One compared subject's numbers, labelled: which iteration they are of (the given one, else the run's
    last, whatever its status) and which evaluation (the given iteration's, else the run's last)."""
    per = summaries(run, only)
    n = only if only is not None else max(per, default=None)
    m = only if only is not None else max(run.evals, default=None)
    evaluation = (run.evals.get(m) or {}).get("overall") or {}
    return {"iteration": n, **{LABELS.get(k, k): v for k, v in per.get(n, {}).items()},
            "eval iteration": m if evaluation else None, **{f"eval {LABELS.get(k, k)}": v for k, v in evaluation.items()}}


def compare_section(compared: list[tuple[str, Run, int | None]]) -> str:
    """Side by side: one column per compared run, iteration or evaluation, one row per number; then the
    config keys whose values differ between the runs."""
    columns = [(name, compare_column(run, only)) for name, run, only in compared]
    keys = list(dict.fromkeys(k for _, numbers in columns for k in numbers))
    out = table(["", *[name for name, _ in columns]], [[k, *[numbers.get(k) for _, numbers in columns]] for k in keys])
    configs = [(name, run.config or {}) for name, run, _ in compared]
    differ = sorted(k for k in {k for _, c in configs for k in c}
                    if len({json.dumps(c.get(k), sort_keys=True, default=str) for _, c in configs}) > 1)
    if not differ:
        return out + '<p class="note">The compared runs\' configs are the same.</p>'
    return out + "<h3>Config keys that differ</h3>" + table(
        ["key", *[name for name, _ in configs]],
        [[k, *[c.get(k) if c.get(k) is None or isinstance(c.get(k), (str, int, float)) else json.dumps(c.get(k))
               for _, c in configs]] for k in differ])


ROLLOUT_COLUMNS = ["rollout", "kind", "iteration", "task", "sample", "harness", "status", "reward", "calls", "tokens",
                   "duration (s)", "harness killed by"]


def rollout_table(entries: list[dict]) -> str:
    """The sortable, filterable table of every rollout (drawn by the page's script from JSON)."""
    rows = [{"href": e["href"], "cells": [e["row"].get("rollout_id"), e["kind"], e["iteration"], e["row"].get("task"),
                                          e["row"].get("sample"), e["row"].get("harness"), e["row"].get("status"),
                                          e["row"].get("reward"), e["row"].get("num_calls"),
                                          e["row"].get("response_tokens"), e["row"].get("total_s"),
                                          e["row"].get("harness_killed")]} for e in entries]
    statuses = sorted({NO_STATUS if r["cells"][6] is None else str(r["cells"][6]) for r in rows})
    options = "".join(f'<option value="{esc(s)}">{esc(s)}</option>' for s in statuses)
    return (f'<p><input id="filter" placeholder="filter: task, rollout, status..."> <select id="status-filter">'
            f'<option value="">every status</option>{options}</select> <span id="rollout-count"></span></p>'
            f'<div id="rollout-table"></div>'
            + json_script("rollout-data", {"columns": ROLLOUT_COLUMNS, "rows": rows, "link": 0, "status": 6}))


def killed_warnings(run: Run) -> list[str]:
    """One line per iteration and per evaluation whose harness kills are more than a few percent of its rollouts
    (`steps.metrics.harness_killed_warning`): the scores there are of killed harnesses, not of the agent."""
    lines = [harness_killed_warning(harness_kills(r.get("harness_killed") for r in it.rollouts), len(it.rollouts),
                                    f"iteration {n}") for n, it in sorted(run.iterations.items())]
    lines += [harness_killed_warning(summary.get("harness_killed") or {}, (summary.get("overall") or {}).get("tries") or 0,
                                     f"evaluation {i}") for i, summary in sorted(run.evals.items())]
    return [line for line in lines if line]


def index_page(run: Run, entries: list[dict], compared: list[tuple[str, Run, int | None]]) -> str:
    """The whole front page."""
    figs = Figures()
    numbers = summaries(run)
    whole_runs = [(name, summaries(other)) for name, other, only in compared if only is None and other is not run]
    kind = "evaluation" if run.is_eval else "training run"
    notes = "".join(f'<p class="warning">{esc(w)}</p>' for w in killed_warnings(run)) + \
        "".join(f'<p class="note">{esc(n)}</p>' for n in run.notes)
    compare_link = '<a href="#compare">comparison</a> · ' if compared else ""
    body = (f"<h1>{esc(run.name)}: {kind} report</h1>{notes}"
            f'<p><a href="#config">config</a> · <a href="#iterations">iterations</a> · <a href="#behaviour">behaviour</a> · '
            f'<a href="#evals">evaluations</a> · {compare_link}'
            f'<a href="#rollouts">rollouts</a></p>'
            f'<h2 id="config">Config</h2>{config_section(run)}'
            f'<h2 id="iterations">Iterations</h2>{iterations_table(numbers) if numbers else "<p class=note>No iterations recorded.</p>"}'
            f'{iteration_section([(run.name, numbers)] + whole_runs, figs)}'
            f'<h2 id="behaviour">Behaviour</h2>{behaviour_section(run, figs)}'
            f'<h2 id="evals">Evaluations</h2>{evals_section([(run.name, run)] + [(n, r) for n, r, _ in compared if r is not run], figs)}')
    if compared:
        body += f'<h2 id="compare">Comparison</h2>{compare_section(compared)}'
    body += f'<h2 id="rollouts">Rollouts</h2>{rollout_table(entries)}{json_script("figure-data", figs.items)}'
    return page(f"{run.name}: report", body, "assets", ["plotly.min.js", "report.js"])
