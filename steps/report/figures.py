"""The report's plots as plotly figures (plain JSON), one series per run compared and per metric.

Figures are built with plotly's Python objects (so a wrong field fails here, not in the browser) and
handed to the page as JSON; every text in them (a trace name, a task name) goes through `html.label`.
"""

import json

import plotly.graph_objects as go

from steps.report.html import label

# A layout without plotly's default template: the template would add ~8 KB to every figure. plotly.js draws its
# toolbar (the modebar) across the top right, over a centred title; upright, in a right margin of its own, it
# leaves the title (and the data) clear.
_LAYOUT = dict(template="none", margin=dict(l=55, r=40, t=40, b=45), height=330, width=570,
               legend=dict(orientation="h", y=-0.22), font=dict(size=12), hovermode="closest",
               modebar=dict(orientation="v"))


def _figure(title: str, traces: list, xaxis: str = "iteration", yaxis: str = "", **layout) -> dict:
    fig = go.Figure(traces, layout=dict(_LAYOUT, title=dict(text=label(title), font=dict(size=14)),
                                        xaxis=dict(title=dict(text=label(xaxis)), dtick=1, showgrid=True, gridcolor="#eee"),
                                        yaxis=dict(title=dict(text=label(yaxis)), showgrid=True, gridcolor="#eee", rangemode="tozero"), **layout))
    return json.loads(fig.to_json())


def series_figure(title: str, subjects: list[tuple[str, dict[int, dict]]], keys: list[tuple[str, str]],
                  yaxis: str = "") -> dict | None:
    """Lines over iterations: for each subject (a label, its numbers by iteration) and each (key, name) in
    `keys`, one trace of that number, named by the subject when `name` is empty. None when no subject has
    any value."""
    traces = []
    for subject, by_iteration in subjects:
        for key, name in keys:
            points = [(i, numbers.get(key)) for i, numbers in sorted(by_iteration.items())
                      if isinstance(numbers.get(key), (int, float))]
            if points:
                trace_name = subject if not name else name if len(subjects) == 1 else f"{subject}: {name}"
                traces.append(go.Scatter(x=[p[0] for p in points], y=[p[1] for p in points], mode="lines+markers",
                                         name=label(trace_name)))
    return _figure(title, traces, yaxis=yaxis) if traces else None


def prefixed_keys(subjects: list[tuple[str, dict[int, dict]]], prefix: str) -> list[tuple[str, str]]:
    """Every key starting with `prefix` in any subject's numbers, as (key, the rest of it): one per harness.

    >>> prefixed_keys([("a", {0: {"continuity codex": 1.0, "calls": 2}})], "continuity ")
    [('continuity codex', 'codex')]
    """
    keys = sorted({k for _, by in subjects for numbers in by.values() for k in numbers if k.startswith(prefix)})
    return [(k, k[len(prefix):]) for k in keys]


def rollout_time_figure(subjects: list[tuple[str, dict[int, dict]]]) -> dict | None:
    """Mean seconds per rollout in setup, agent and verifier, and the update's train and total, per iteration."""
    keys = [("setup_s", "rollout setup"), ("agent_s", "rollout agent"), ("verifier_s", "rollout verifier"),
            ("total_s", "rollout total"), ("update_train_s", "update train"), ("update_total_s", "update total")]
    return series_figure("Time per rollout and update (s)", subjects, keys, yaxis="seconds")
