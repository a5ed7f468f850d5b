"""The run report: a static site of a run (or an evaluation) that opens from a folder or an object store.

    python -m steps.report --run demo --store runs [--out DIR] [--compare other-run --compare demo:1]

`write_report` reads what the run kept (`steps.report.data`) and writes, under `layout.reports_url(run)`
unless told another place (a folder or an s3:// URL, through fsspec):

    index.html                         config, plots per iteration, behaviour, evaluations, comparison, rollouts
    assets/plotly.min.js, report.js    plotly.js from the plotly package (no network), the page script
    rollouts/<kind>-<N>/<name>.html    one page per rollout, loaded only when its link is followed

docs/report.md says what each part shows and how much a page weighs.
"""

import fsspec
from plotly.offline import get_plotlyjs

from steps.report.assets import JS
from steps.report.data import NoRunError, Run, calls_in_chunks, load_run, samples_by_rollout
from steps.report.html import file_name
from steps.report.index import index_page
from steps.report.rollout_page import Decoder, rollout_page
from workflows import layout


CONTENT_TYPES = {"html": "text/html; charset=utf-8", "js": "text/javascript; charset=utf-8"}


class Site:
    """Files written under the report's folder or URL."""

    def __init__(self, out: str):
        self.out = out.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.out)
        self.root = self.root.rstrip("/")
        protocols = (self.fs.protocol,) if isinstance(self.fs.protocol, str) else self.fs.protocol
        self.s3 = "s3" in protocols

    def write(self, relative: str, text: str) -> str:
        """Writes one file (folders made as needed); returns its URL or path. In S3 each object carries its
        content type, so that a browser shows a page served from the bucket instead of downloading it."""
        path = f"{self.root}/{relative}"
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        typed = {"ContentType": CONTENT_TYPES[relative.rsplit(".", 1)[-1]]} if self.s3 else {}
        self.fs.pipe_file(path, text.encode("utf-8"), **typed)
        return f"{self.out}/{relative}"


def load_tokenizer(checkpoint: str | None):
    """The checkpoint's tokenizer (`tokenizer.json`, local or in the store), or None."""
    if not checkpoint:
        return None
    from tokenizers import Tokenizer

    fs, path = fsspec.core.url_to_fs(f"{checkpoint.rstrip('/')}/tokenizer.json")
    try:
        return Tokenizer.from_str(fs.cat_file(path).decode())
    except Exception:  # a missing or foreign file (tokenizers raises its own kind): ids are shown
        return None


def parse_subject(spec: str) -> tuple[str, int | None]:
    """A `--compare` value as (run name or URL, "" for this run; iteration or None).

    >>> parse_subject("other"), parse_subject("other:2"), parse_subject(":1"), parse_subject("s3://b/runs/x")
    (('other', None), ('other', 2), ('', 1), ('s3://b/runs/x', None))
    """
    name, colon, iteration = spec.rpartition(":")
    return (name, int(iteration)) if colon and iteration.isdigit() else (spec, None)


def resolve_subject(spec: str, run: Run) -> tuple[str, Run, int | None]:
    """A `--compare` value: `RUN` (a run in the same store, or a run URL), `RUN:N` (its iteration N) or
    `:N` (this run's iteration N); as (label, run, iteration or None)."""
    name, iteration = parse_subject(spec)
    if name:
        url = name if "/" in name else layout.run_url(run.url.rsplit("/", 1)[0], name)
        other = load_run(url)
    else:
        spec, url, other = f"{run.name}:{iteration}", run.url, run
    if other.config is None and not other.iterations and not other.evals:
        raise NoRunError(f"--compare {spec}: no run at {url} (give a run name in the same store, a run URL, "
                         "RUN:ITERATION or :ITERATION)")
    if iteration is not None and iteration not in other.iterations and iteration not in other.evals:
        raise NoRunError(f"--compare {spec}: {other.name} has no iteration {iteration} (its iterations: "
                         f"{sorted(other.iterations) or 'none'}; its evaluations: {sorted(other.evals) or 'none'})")
    return spec, other, iteration


def rollout_pages(site: Site, run: Run) -> list[dict]:
    """Writes every rollout's page; returns the rollout table's entries (row, kind, iteration, link)."""
    entries = []
    groups = [("train", n, it, layout.checkpoint_url(run.url, n, (run.config or {}).get("model", "")))
              for n, it in run.iterations.items()]
    groups += [("eval", n, it, (run.evals.get(n) or {}).get("checkpoint") or (run.evals.get(n) or {}).get("model")
                or layout.checkpoint_url(run.url, n, (run.config or {}).get("model", "")))
               for n, it in run.eval_iterations.items()]
    for kind, n, it, checkpoint in groups:
        decoder = Decoder(load_tokenizer(checkpoint))
        samples = samples_by_rollout(it.partition)
        calls: dict[str, list[dict]] = {}
        for call in it.calls:
            calls.setdefault(call["rollout_id"], []).append(call)
        rows = {str(r.get("rollout_id")): r for r in it.rollouts}
        for rollout_id, records in calls_in_chunks(run.url, list(rows)):
            row = dict(rows[rollout_id], iteration=n)
            relative = f"rollouts/{kind}-{n}/{file_name(rollout_id)}.html"
            site.write(relative, rollout_page(row, it.results.get(rollout_id), records, calls.get(rollout_id, []),
                                              samples.get(rollout_id, []), decoder, kind))
            entries.append({"row": row, "kind": kind, "iteration": n, "href": relative})
    return entries


def write_report(run_url: str, out: str | None = None, compare: tuple[str, ...] | list[str] = ()) -> str:
    """Writes the report of the run at `run_url` (to `out`, else the run's reports folder); returns the path
    or URL of its index page. `compare`: runs, `RUN:N` or `:N` iterations, shown side by side."""
    run = load_run(run_url)
    if run.config is None and not run.iterations and not run.evals:
        raise NoRunError(f"no run at {run.url}: it has no manifest, results or evaluations (check --run and --store)")
    compared = [resolve_subject(spec, run) for spec in compare]
    if compared and not any(other is run for _, other, _ in compared):
        compared.insert(0, (run.name, run, None))
    site = Site(out or layout.reports_url(run.url))
    site.write("assets/plotly.min.js", get_plotlyjs())
    site.write("assets/report.js", JS)
    entries = rollout_pages(site, run)
    return site.write("index.html", index_page(run, entries, compared))

