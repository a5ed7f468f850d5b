"""The run report: a static site of a run (or an evaluation) that opens from a folder or an object store.

    python -m steps.report --run demo --store runs [--out DIR] [--compare other-run --compare demo:1]

`write_report` reads what the run kept (`steps.report.data`) and writes, under `layout.reports_url(run)`
unless told another place (a folder or an s3:// URL, through fsspec):

    index.html                         config, plots per iteration, behaviour, evaluations, comparison, rollouts
    assets/plotly.min.js, report.js    plotly.js from the plotly package (no network), the page script
    rollouts/<kind>-<N>/<name>.html    one page per rollout, loaded only when its link is followed
    assets/images/<sha256>.<ext>       each screenshot a rollout page shows, once (steps.report.images)

docs/report.md says what each part shows and how much a page weighs.
"""

import hashlib
import json

import fsspec
from plotly.offline import get_plotlyjs

from steps.report.assets import JS
from steps.report.data import Iteration, NoRunError, Run, calls_in_chunks, load_run, samples_by_rollout
from steps.report.html import file_name
from steps.report.images import ReportImages
from steps.report.index import index_page
from steps.report.rollout_page import Decoder, rollout_page
from steps.contracts import layout


CONTENT_TYPES = {"html": "text/html; charset=utf-8", "js": "text/javascript; charset=utf-8",
                 "json": "application/json"}
WRITTEN_FILE = "written.json"  # each page group's fingerprint when its pages were last written
PAGE_FORMAT = 5  # raised when rollout pages change shape: every page is written again


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
        return self.write_bytes(relative, text.encode("utf-8"), CONTENT_TYPES[relative.rsplit(".", 1)[-1]])

    def write_bytes(self, relative: str, data: bytes, content_type: str) -> str:
        """Writes one file of `content_type` (what S3 serves it as); returns its URL or path."""
        path = f"{self.root}/{relative}"
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        self.fs.pipe_file(path, data, **({"ContentType": content_type} if self.s3 else {}))
        return f"{self.out}/{relative}"

    def listing(self, folder: str) -> set[str]:
        """The files under `folder`, relative to the site (none when it is not there)."""
        prefix = f"{self.root}/"
        try:
            return {p[len(prefix):] for p in self.fs.find(f"{self.root}/{folder}") if p.startswith(prefix)}
        except FileNotFoundError:
            return set()

    def exists(self, relative: str) -> bool:
        """Whether the file is there."""
        return self.fs.exists(f"{self.root}/{relative}")

    def read_json(self, relative: str) -> dict | None:
        """A JSON file the report wrote, or None."""
        try:
            return json.loads(self.fs.cat_file(f"{self.root}/{relative}"))
        except (FileNotFoundError, ValueError):
            return None

    def remove_except(self, folder: str, keep: set[str]) -> None:
        """Removes every file under `folder` but those in `keep` (paths relative to the site)."""
        prefix = f"{self.root}/"
        found = [p for p in self.fs.find(f"{self.root}/{folder}") if p.startswith(prefix)]
        stale = [p for p in found if p[len(prefix):] not in keep]
        if stale:
            self.fs.rm(stale)


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


def checkpoint_of(run: Run, kind: str, n: int) -> str:
    """The checkpoint whose tokenizer decodes group (kind, n)'s tokens: an evaluation's summary names what it
    evaluated (a checkpoint, or an upstream model); otherwise the one iteration n served."""
    summary = (run.evals.get(n) or {}) if kind == "eval" else {}
    if summary.get("checkpoint"):
        return summary["checkpoint"]
    if summary.get("model"):
        return summary["model"]
    return layout.checkpoint_url(run.url, n, (run.config or {}).get("model", ""))


def fingerprint(it: Iteration, checkpoint: str) -> str:
    """What a group's pages are made of, in short: its tables' files (size and time or ETag), its results,
    its checkpoint, the page format. The same fingerprint: its pages need not be written again."""
    fs, _ = fsspec.core.url_to_fs(it.partition or it.results_url)
    files = {}
    for name in ("rollouts", "calls", "samples"):
        try:
            info = fs.info(layout.table_url(it.partition, name)) if it.partition else {}
        except FileNotFoundError:
            info = {}
        files[name] = [str(info.get(key)) for key in ("size", "mtime", "ETag", "LastModified")]
    results = {rollout_id: [stored.url, stored.result.to_json()] for rollout_id, stored in it.results.items()}
    made_of = {"format": PAGE_FORMAT, "checkpoint": checkpoint, "tables": files, "results": results}
    return hashlib.sha256(json.dumps(made_of, sort_keys=True, default=str).encode()).hexdigest()


def page_href(kind: str, n: int, rollout_id: str) -> str:
    """A rollout page's path in the site."""
    return f"rollouts/{kind}-{n}/{file_name(rollout_id)}.html"


def write_group(site: Site, run: Run, kind: str, n: int, it: Iteration, write: bool,
                images: ReportImages | None = None) -> list[dict]:
    """Group (kind, n)'s rollout table entries; with `write`, its pages written too (and the images they show)."""
    rows = {str(r.get("rollout_id")): dict(r, iteration=n) for r in it.rollouts}
    entries = [{"row": row, "kind": kind, "iteration": n, "href": page_href(kind, n, rollout_id)}
               for rollout_id, row in rows.items()]
    if not write:
        return entries
    decoder = Decoder(load_tokenizer(checkpoint_of(run, kind, n)))
    samples = samples_by_rollout(it.partition)
    calls: dict[str, list[dict]] = {}
    for call in it.calls:
        calls.setdefault(call["rollout_id"], []).append(call)
    # A run with a judge (`judge_upstream`) has its verifiers' judge calls beside the policy's, read in step.
    judged = bool((run.config or {}).get("judge_upstream"))
    judge_calls = calls_in_chunks(run.url, list(rows), judge=True) if judged else None
    for rollout_id, records in calls_in_chunks(run.url, list(rows)):
        judge_records = next(judge_calls)[1] if judge_calls else None
        site.write(page_href(kind, n, rollout_id),
                   rollout_page(rows[rollout_id], it.results.get(rollout_id), records, calls.get(rollout_id, []),
                                samples.get(rollout_id, []), decoder, kind, images, judge_records))
    return entries


def rollout_pages(site: Site, run: Run) -> list[dict]:
    """The rollout table's entries (row, kind, iteration, link); writes the pages of every group (an iteration
    or an evaluation) whose fingerprint changed since the last write (`written.json`), and removes pages no
    rollout has any more (a dead attempt's, a group gone)."""
    before = site.read_json(WRITTEN_FILE) or {}
    groups = [("train", n, it) for n, it in run.iterations.items()] + \
        [("eval", n, it) for n, it in run.eval_iterations.items()]
    written, entries, images = {}, [], ReportImages(site, layout.images_url(run.url))
    for kind, n, it in groups:
        key = f"{kind}-{n}"
        written[key] = fingerprint(it, checkpoint_of(run, kind, n))
        entries += write_group(site, run, kind, n, it, write=before.get(key) != written[key], images=images)
    site.remove_except("rollouts", {e["href"] for e in entries})
    site.write(WRITTEN_FILE, json.dumps(written, indent=1))
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
    if not site.exists("assets/plotly.min.js"):  # 4.8 MB, the same for every report of this plotly
        site.write("assets/plotly.min.js", get_plotlyjs())
    site.write("assets/report.js", JS)
    entries = rollout_pages(site, run)
    return site.write("index.html", index_page(run, entries, compared))

