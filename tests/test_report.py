"""The run report in a real headless browser: every page loads without console errors, plots carry data,
the rollout table sorts and filters, a rollout page shows its tool calls and exactly the samples table's
trained tokens, hostile agent text stays text (with a control that shows the check would catch it), and
the CLI reads and writes an S3 store (moto on loopback).

The run is `benchmarks/report_weight.py`'s synthetic one, written through the real proxy store and the
real trajectories step; a real harness (`direct`, against `tests/scripted_model.py`) adds real traffic.
A GUI run's screenshots are recorded by the real proxy in all three dialects (`gui_run`): each is shown where
its call sent it, at full size on a click, copied into the report once, and only when its bytes are an image.
The report of a real two-iteration local run is checked in tests/test_local_run.py.
"""

import asyncio
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import fsspec
import pytest
from report_browser import PLOT_POINTS, browser  # noqa: F401 (a fixture)

from benchmarks.report_weight import HOSTILE, HOSTILE_TASK, synthetic_run
from steps.report import __main__ as report_cli
from steps import manifest
from steps.report import html, write_report
from steps.rollout import RolloutSpec, run_rollout
from steps.tasks import BUILTIN_DATASET
from steps.contracts.table_files import read_table
from steps.contracts import layout
from steps.contracts.rollout import RolloutResult

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def hostile_run(tiny_model, tmp_path_factory) -> Path:
    """A two-iteration synthetic run with markup and script-closing text in a tool output, a harness log and
    a task name; its report written. Returns the run folder."""
    store = tmp_path_factory.mktemp("report-runs")
    run_url = synthetic_run(store, "hostile", rollouts=8, model=str(tiny_model), hostile=True)
    synthetic_run(store, "other", rollouts=4, model=str(tiny_model), seed=1)  # compared with it
    write_report(run_url)
    return Path(run_url)


def report_pages(run: Path) -> list[Path]:
    return [run / "reports" / "index.html", *sorted((run / "reports" / "rollouts").rglob("*.html"))]


def check_pages(browser, pages: list[Path], name: str, plots: int = 8) -> None:
    """Every page loads with no console error; the index has at least `plots` plots, each with a trace with
    points drawn."""
    for n, path in enumerate(pages):
        loaded = browser.open(path, screenshot=f"{name}-{n}" if n < 3 else None)
        assert loaded.errors == [], f"{path}: {loaded.errors}"
        if path.name == "index.html":
            points = loaded.page.evaluate(PLOT_POINTS)
            assert len(points) >= plots and all(plot and max(plot) >= 1 for plot in points), points
            assert loaded.page.evaluate("document.querySelectorAll('.plot .main-svg .trace').length") >= len(points)


def test_every_page_loads_without_console_errors_and_its_plots_have_data(hostile_run, browser):
    pages = report_pages(hostile_run)
    assert len(pages) == 1 + 16
    check_pages(browser, pages, "synthetic")


def test_the_rollout_table_sorts_and_filters(hostile_run, browser):
    page = browser.open(hostile_run / "reports" / "index.html").page
    rows = "Array.from(document.querySelectorAll('#rollout-table tbody tr')).map(r => Array.from(r.cells).map(c => c.textContent))"
    assert len(page.evaluate(rows)) == 16
    page.click("#rollout-table th:text-is('reward')")
    rewards = [float(r[7]) for r in page.evaluate(rows)]
    assert rewards == sorted(rewards) and rewards[0] < rewards[-1]
    page.click("#rollout-table th:text-is('reward')")
    assert [float(r[7]) for r in page.evaluate(rows)] == sorted(rewards, reverse=True)
    page.fill("#filter", "task-1")
    page.locator("#rollout-count", has_text=re.compile("^8 of 16 rollouts$")).wait_for()  # the filter runs once typing pauses
    shown = page.evaluate(rows)
    assert len(shown) == 8 and all("task-1" in r[3] for r in shown)
    assert page.inner_text("#rollout-count") == "8 of 16 rollouts"


def test_a_rollout_page_shows_its_tool_calls_and_the_samples_tables_trained_tokens(hostile_run, browser):
    samples = read_table(layout.run_partition_url(str(hostile_run), "hostile", 1), "samples").to_pylist()
    rollout_id = "it1-task-1-s0"
    page_path = hostile_run / "reports" / "rollouts" / "train-1" / f"{html.file_name(rollout_id)}.html"
    page = browser.open(page_path, screenshot="synthetic-rollout").page
    assert page.locator(".tool-call").count() == 2  # the two shell calls of the rollout's three
    assert "cat step0.txt" in page.locator(".tool-call").first.inner_text()
    expected = {s["sample_index"]: sum(s["response_mask"]) for s in samples if s["rollout_id"] == rollout_id}
    shown = page.evaluate("Object.fromEntries(Array.from(document.querySelectorAll('section.sample')).map(s => "
                          "[s.dataset.sampleIndex, [Number(s.dataset.trainedTokens), s.querySelectorAll('span.m1').length]]))")
    assert len(expected) == 2 and {int(k): v for k, v in shown.items()} == {k: [n, n] for k, n in expected.items()}
    assert "first differs from sample 0" in page.inner_text("section.sample[data-sample-index='1'] .split")


HOSTILE_ROLLOUT = f"it0-{HOSTILE_TASK}-0-s0"  # its tool output and harness log are HOSTILE too
PWNED = "window.__pwned === undefined && document.querySelector('img[src=\"x\"]') === null"


def test_hostile_agent_text_is_shown_as_text_on_every_page(hostile_run, browser):
    for path in report_pages(hostile_run):
        page = browser.open(path).page
        assert page.evaluate(PWNED), path
    page = browser.open(hostile_run / "reports" / "rollouts" / "train-0" / f"{html.file_name(HOSTILE_ROLLOUT)}.html").page
    assert page.locator(".tool-result pre").first.inner_text() == HOSTILE  # the tool output, shown whole
    assert HOSTILE in page.inner_text("#log ~ pre")


def test_the_hostile_text_check_catches_a_page_that_does_not_escape(hostile_run, browser, tmp_path, monkeypatch):
    """Control: the same run's report with escaping turned off puts the agent's markup into the page."""
    monkeypatch.setattr(sys.modules["steps.report.rollout_page"], "esc", lambda value: str(value))
    write_report(str(hostile_run), out=str(tmp_path / "unescaped"))
    rollout = tmp_path / "unescaped" / "rollouts" / "train-0" / f"{html.file_name(HOSTILE_ROLLOUT)}.html"
    assert not browser.open(rollout).page.evaluate(PWNED)


def test_the_hostile_text_check_catches_an_index_whose_tables_do_not_escape(hostile_run, browser, tmp_path, monkeypatch):
    """Control for the index: with `html.table`'s escaping off, the task named with markup (in the per-task
    evaluation table) becomes an element of the front page."""
    monkeypatch.setattr(html, "esc", lambda value: "" if value is None else str(value))
    index = write_report(str(hostile_run), out=str(tmp_path / "unescaped-index"))
    assert not browser.open(Path(index)).page.evaluate(PWNED)


@pytest.mark.parametrize("quoted", [True, False], ids=["json_text", "control-json.dumps"])
def test_json_in_a_page_cannot_close_its_script_element(quoted, browser, tmp_path, monkeypatch):
    if not quoted:
        monkeypatch.setattr(html, "json_text", lambda data: json.dumps(data))
    path = tmp_path / "page.html"
    path.write_text(html.page("json", html.json_script("data", {"out": HOSTILE}), "assets"))
    page = browser.open(path).page
    assert page.evaluate(PWNED) is quoted
    if quoted:
        assert page.evaluate("JSON.parse(document.getElementById('data').textContent).out") == HOSTILE


def test_report_files_stay_in_the_report_folder(hostile_run):
    reports = (hostile_run / "reports").resolve()
    written = [p.resolve() for p in reports.rglob("*") if p.is_file()]
    assert len(written) == 20 and all(p.is_relative_to(reports) for p in written)  # 17 pages, 2 assets, written.json
    for hostile in ("../../etc/passwd", "..", "/abs/path", "a\\..\\b", "<script>"):
        name = html.file_name(hostile)
        assert "/" not in name and "\\" not in name and not name.startswith(".") and name != html.file_name(hostile + "x")


def test_a_run_with_only_result_files_still_gets_a_report(hostile_run, browser, tmp_path):
    """No manifest, no tables, no calls store, no logs (a cluster run before its trajectories step)."""
    run = tmp_path / "bare"
    shutil.copytree(hostile_run / "results", run / "results")
    for result in (run / "results").rglob("result.json"):
        result.with_name("harness.log").unlink()
    index = Path(write_report(str(run)))
    loaded = browser.open(index)
    assert loaded.errors == [] and "config is unknown" in loaded.page.inner_text("body")
    rollout = browser.open(next((run / "reports" / "rollouts" / "train-0").glob("*.html")))
    assert rollout.errors == []
    text = rollout.page.inner_text("body")
    assert "holds no calls of this rollout" in text and "No harness log" in text and "No training samples" in text


def test_the_cli_names_a_missing_run_in_one_sentence(tmp_path, capsys):
    assert report_cli.main(["--run", "nothing", "--store", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no run at") and "\n" not in err
    assert report_cli.main(["--run", "../up", "--store", str(tmp_path)]) == 2


def test_compare_overlays_two_runs_and_sets_them_side_by_side(hostile_run, browser, tmp_path):
    out = tmp_path / "compared"
    index = write_report(str(hostile_run), out=str(out), compare=["other", ":0"])
    loaded = browser.open(Path(index), screenshot="compare")
    assert loaded.errors == []
    names = loaded.page.evaluate("Array.from(document.querySelectorAll('.plot')).flatMap(d => d.data.map(t => t.name))")
    assert "hostile: mean reward" in names and "other: mean reward" in names
    header = loaded.page.evaluate("Array.from(document.querySelectorAll('#compare + table th')).map(t => t.textContent)")
    assert header == ["", "other", "hostile:0"], header


def test_the_cli_reads_and_writes_an_s3_store(hostile_run, s3_server, monkeypatch):
    for key, value in s3_server["env"].items():
        monkeypatch.setenv(key, value)
    fsspec.config.conf.pop("s3", None)
    store = f"s3://{s3_server['bucket']}/report-runs"
    fs = fsspec.filesystem("s3")
    for path in hostile_run.rglob("*"):
        if path.name == "calls.jsonl":  # on S3 the proxy stores one object per call
            for line in path.read_text().splitlines():
                call = json.loads(line)
                fs.pipe_file(f"{store}/hostile/{path.parent.relative_to(hostile_run)}/calls/{call['call_index']:06d}.json",
                             line.encode())
        elif path.is_file() and "reports" not in path.parts:
            fs.put_file(str(path), f"{store}/hostile/{path.relative_to(hostile_run)}")
    assert report_cli.main(["--run", "hostile", "--store", store]) == 0
    index = f"{store}/hostile/reports/index.html"
    assert fs.exists(index) and "it1-task-1-s0" in fs.cat_file(index).decode()
    assert fs.info(index)["ContentType"] == "text/html; charset=utf-8"  # a browser shows it from the bucket
    assert fs.info(f"{store}/hostile/reports/assets/plotly.min.js")["ContentType"] == "text/javascript; charset=utf-8"
    pages = fs.glob(f"{store}/hostile/reports/rollouts/*/*.html")
    assert len(pages) == 16
    page = fs.cat_file(next(p for p in pages if "it1-task-1-s0" in p)).decode()
    assert page.count('class="turn role-assistant tool-call"') == 2 and "<h3>harness.log</h3>" in page


@pytest.fixture(scope="module")
def harness_run(scripted, proxy, tmp_path_factory) -> Path:
    """A one-rollout run of the real `direct` harness in the sandbox against the scripted model: its shell
    tool prints markup and script-closing text, then solves hello-file. Calls recorded by the real proxy
    into the run's store, tables by the trajectories step as the runner starts it; its report written."""
    run = tmp_path_factory.mktemp("harness-runs") / "direct-run"
    manifest.write_run_config(str(run), {"run": "direct-run", "harness": "direct", "model": ""})
    recording = proxy(scripted.url, store=layout.calls_url(str(run)))
    script = (BUILTIN_DATASET / "hello-file" / "solution" / "solve.sh").read_text()
    scripted.set_commands([f"printf '%s' '{HOSTILE}'", f"bash <<'ORACLE'\n{script}\nORACLE"])
    rollout_id = "it0-hello-file-s0"
    result = run_rollout(RolloutSpec(task=BUILTIN_DATASET / "hello-file", harness="direct", proxy_url=recording.url,
                                     rollout_id=rollout_id, out=Path(layout.rollout_url(str(run), 0, rollout_id)),
                                     admin_key="test-admin-key", sample=0))
    assert (result.status, result.reward) == ("ok", 1.0), result
    done = subprocess.run([sys.executable, "-m", "steps.trajectories", "--store", layout.calls_url(str(run)),
                           "--results", layout.results_url(str(run), 0), "--out", layout.trajectories_url(str(run)),
                           "--run", "direct-run", "--iteration", "0"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    write_report(str(run))
    return run


def test_a_real_harness_rollout_page_shows_its_exchange_tool_calls_and_samples(harness_run, browser):
    calls = read_table(layout.run_partition_url(str(harness_run), "direct-run", 0), "calls").to_pylist()
    samples = read_table(layout.run_partition_url(str(harness_run), "direct-run", 0), "samples").to_pylist()
    loaded = browser.open(harness_run / "reports" / "rollouts" / "train-0" / f"{html.file_name('it0-hello-file-s0')}.html",
                          screenshot="direct-rollout")
    page = loaded.page
    assert loaded.errors == [] and page.evaluate(PWNED)
    assert page.locator(".tool-call").count() == 2 and len(calls) == 3
    assert HOSTILE in page.locator(".tool-result pre").first.inner_text()
    assert "system · text" in page.inner_text("#call-0") and "hello" in page.inner_text("#call-0 .role-user")
    shown = page.evaluate("Array.from(document.querySelectorAll('section.sample')).map(s => s.querySelectorAll('span.m1').length)")
    assert shown == [sum(s["response_mask"]) for s in sorted(samples, key=lambda s: s["sample_index"])] and shown
    assert page.locator("h3", has_text="reward.txt").count() == 1 and page.locator("h3", has_text="harness.log").count() == 1
    check_pages(browser, report_pages(harness_run)[:1], "direct", plots=5)


def test_a_failing_report_is_one_line_and_never_fails_the_local_run(tmp_path, capsys):
    from workflows.local import refresh_report

    refresh_report(str(tmp_path / "no-such-run"))  # raises nothing
    err = capsys.readouterr().err.strip()
    assert "report not written: NoRunError: no run at" in err and "\n" not in err


DIALECT_REQUESTS = {  # a second call's request: the user's message, the model's tool call, the tool's output
    "chat_completions": {"model": "tiny", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                               "function": {"name": "shell", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "out"}],
        "tools": [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]},
    "responses": {"model": "tiny", "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"command": "ls"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "out"}],
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}]},
    "messages": {"model": "tiny", "max_tokens": 20, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "shell", "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "out"}]}],
        "tools": [{"name": "shell", "input_schema": {"type": "object"}}]},
}


@pytest.mark.parametrize("dialect", list(DIALECT_REQUESTS))
def test_the_exchange_reads_every_dialects_requests_and_responses_whole_and_streamed(dialect):
    """The proxy's own encoders make the responses (a JSON body, and the events it stores for a stream)."""
    import orjson

    from steps.proxy import chat, messages, responses
    from steps.proxy.protocol import decode
    from steps.proxy.serving import event_stream
    from steps.proxy.upstream import Completion, ToolCall
    from steps.report.exchange import request_turns, response_turns

    module = {m.NAME: m for m in (chat, responses, messages)}[dialect]
    request = DIALECT_REQUESTS[dialect]
    assert [(t["kind"], t["text"]) for t in request_turns(dialect, request)] == \
        [("text", "hi"), ("tool_call", '{"command": "ls"}'), ("tool_result", "out")]
    completion = Completion(content="checked", reasoning="thinking hard", finish_reason="tool_calls", stop_reason=None,
                            tool_calls=[ToolCall("c2", "shell", '{"command": "cat out"}')],
                            prompt_token_ids=[1, 2], response_token_ids=[3], response_logprobs=[-0.1])
    req, _ = decode(orjson.dumps(request), module.Request, fields=module.RAW_FIELDS)
    body = orjson.loads(orjson.dumps(module.to_body(completion, req, "id", 0)))
    stored = orjson.loads(orjson.dumps(event_stream(module.to_events(completion, req, "id", 0))[1]))
    for response in (body, stored):
        turns = response_turns(dialect, response)
        assert [(t["kind"], t["name"]) for t in turns] == [("reasoning", None), ("text", None), ("tool_call", "shell")]
        assert turns[0]["text"] == "thinking hard" and json.loads(turns[2]["text"]) == {"command": "cat out"}


def test_an_eval_run_gets_an_evaluation_report_with_its_rollouts(hostile_run, browser, tmp_path):
    """An eval run (`manifest/run.json` says what it evaluates; one evaluation at evals/iteration-0/), before
    its trajectories step: rollouts from result.json, calls from the store."""
    from benchmarks.report_weight import eval_summary

    run = tmp_path / "evalrun"
    manifest.write_run_config(str(run), {"run": "evalrun", "harness": "direct", "model": ""},
                              evaluates={"checkpoint": "base", "run": None, "iteration": None})
    shutil.copytree(hostile_run / "results" / "iteration-0", Path(layout.eval_results_url(str(run), 0)))
    shutil.copytree(hostile_run / "calls", run / "calls")
    manifest.write_json(layout.eval_summary_url(str(run), 0), eval_summary(["task-1"], 0))
    loaded = browser.open(Path(write_report(str(run))), screenshot="eval-run")
    assert loaded.errors == []
    assert loaded.page.inner_text("h1") == "evalrun: evaluation report"
    assert "no rollouts table (not written yet)" in loaded.page.inner_text("body")
    kinds = loaded.page.evaluate("Array.from(document.querySelectorAll('#rollout-table tbody tr')).map(r => r.cells[1].textContent)")
    assert kinds == ["eval"] * 8
    assert len(loaded.page.evaluate(PLOT_POINTS)) == 2  # the evaluation's two plots
    rollout = browser.open(next((run / "reports" / "rollouts" / "eval-0").glob("it0-task-1-s0-*.html")))
    assert rollout.errors == [] and rollout.page.locator(".tool-call").count() == 2


def test_the_cli_names_a_compare_run_that_does_not_exist(hostile_run, tmp_path, capsys):
    assert report_cli.main(["--run", "hostile", "--store", str(hostile_run.parent), "--out", str(tmp_path),
                            "--compare", "missing"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --compare missing: no run at") and "\n" not in err


def test_files_named_in_result_json_are_read_only_from_the_rollouts_folder_and_never_through_a_link(tmp_path):
    from steps.report.rollout_page import kept_files

    outside = tmp_path / "secret.txt"
    outside.write_text("do not show")
    folder = tmp_path / "results" / "iteration-0" / "r1"
    (folder / "verifier").mkdir(parents=True)
    (folder / "verifier" / "reward.txt").write_text("1\n")  # the control: a plain file is shown
    (folder / "verifier" / "leak.txt").symlink_to(outside)
    (folder / "harness.log").symlink_to(outside)
    result = {"_url": str(folder / "result.json"),
              "paths": {"verifier_output": str(folder / "verifier"), "harness_log": str(folder / "harness.log")}}
    assert kept_files(result["paths"], result["_url"], "verifier_output") == [("reward.txt", "1\n")]
    assert kept_files(result["paths"], result["_url"], "harness_log") == []
    assert kept_files({"harness_log": str(outside)}, result["_url"], "harness_log") == []  # not in its folder
    assert kept_files({"harness_log": "../../../secret.txt"}, result["_url"], "harness_log") == []


def report_run(iterations: dict | None = None, **fields):
    """A Run built in memory: what `load_run` would give, for the index's numbers alone (no files)."""
    from steps.report.data import Run

    return Run(fields.pop("name", "mem"), "/nowhere/mem", fields.pop("config", {"run": "mem"}), iterations or {},
               fields.pop("evals", {}), fields.pop("eval_iterations", {}), **fields)


def test_behaviour_means_are_the_analytics_owners_infra_errors_left_out_and_iterations_in_number_order():
    """Without `summarize_behaviour` (the report's own means) iteration 0's row read rollouts 2, calls 2.0,
    and iteration 10 came before 2."""
    from steps.report.data import Iteration
    from steps.report.index import Figures, behaviour_section

    def rows(n):
        return [{"harness": "direct", "iteration": n, "status": "ok", "reward": 1.0, "calls": 4, "tool_failures": 1},
                {"harness": "direct", "iteration": n, "status": "infra_error", "reward": None, "calls": 0}]
    run = report_run({n: Iteration(n, behaviour=rows(n)) for n in (0, 2, 10)})
    figs = Figures()
    section = behaviour_section(run, figs)
    body = section.split("<tbody>")[1].split("</tbody>")[0]
    cells = [[c.split("</td>")[0] for c in row.split("<td>")[1:]] for row in body.split("<tr>")[1:]]
    header = [h.split("</th>")[0] for h in section.split("<th>")[1:]]
    assert [c[1] for c in cells] == ["0", "2", "10"]
    first = dict(zip(header, cells[0]))
    assert (first["rollouts"], first["calls"], first["pass_rate"], first["recovery_rate"]) == ("1", "4.000", "1.000", "1.000")
    titles = [f["figure"]["layout"]["title"]["text"] for f in figs.items]
    assert titles == ["pass_rate", "recovery_rate"]  # the chosen plots that have values; the others say so
    assert "No tool_coverage plot: no rollout has a value." in section


def test_pass_at_k_uses_the_runners_k_and_one_broken_task_does_not_collapse_it(tmp_path):
    """Task a: four tries, two passing; task b: four infra errors. Before: the report took k = 1 (pass@k 0.5),
    the runner k = 4 counting infra errors as tries."""
    from steps.report.series import reward_metrics
    from workflows.local import summarize

    results = [{"task": "a", "status": "ok", "reward": r} for r in (1.0, 0.0, 1.0, 0.0)] + \
        [{"task": "b", "status": "infra_error", "reward": None}] * 4
    report = reward_metrics(results)
    runner = summarize(0, [RolloutResult(rollout_id="", harness="", **r) for r in results], str(tmp_path / "no-checkpoint"),
                       {})
    assert (report["k"], report["pass_at_k"], report["pass_hat_k"]) == (4, 1.0, 0.0)
    assert runner["k"] == 4 and runner["metrics"] == {key: report[key] for key in runner["metrics"]}


def test_a_failed_iteration_gets_a_report_too(tiny_model, tmp_path, monkeypatch, capsys):
    """The local runner's failure path, with serve and the iteration replaced: vLLM takes minutes to start and
    a real failing step would need a broken harness; what is checked is that the report is written anyway
    (before, `run_local` returned 1 before writing it)."""
    from workflows import local
    from steps.contracts.config import RunConfig

    class Stopped:
        def terminate(self):
            pass

        def wait(self, timeout):
            pass

    def fail(config, iteration, *args, **kwargs):
        raise local.StepFailed("step rollout failed with exit code 1")

    monkeypatch.setattr(local, "start_serve", lambda *args: (Stopped(), "http://127.0.0.1:9"))
    monkeypatch.setattr(local, "run_iteration", fail)
    config = RunConfig(store=str(tmp_path), run="broken", iterations=1, model=str(tiny_model))
    assert local.run_local(config) == 1
    index = tmp_path / "broken" / "reports" / "index.html"
    assert f"report: {index}" in capsys.readouterr().err
    assert "<td>0</td><td>Failed</td>" in index.read_text()


def test_a_huge_tool_output_and_a_huge_sample_give_a_bounded_rollout_page():
    """Four 10 MB tool outputs and a sample of 100,000 response tokens after a 200,000-token prompt: before the
    caps, a 40 MB page; now each turn shows its two ends and each sample its first and last 2,000 tokens."""
    from steps.report.rollout_page import Decoder, rollout_page

    big = "<b>" + "x" * 10_000_000 + "the end"
    messages, records = [{"role": "user", "content": "hi"}], []
    for n in range(4):
        call = {"id": f"c{n}", "type": "function", "function": {"name": "shell", "arguments": "{}"}}
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"c{n}", "content": big}]
        records.append({"call_index": n, "dialect": "chat_completions", "status": "ok",
                        "request": {"messages": list(messages)}, "response": None})
    sample = {"sample_index": 0, "call_indices": [0], "prompt_token_ids": [5] * 200_000,
              "response_token_ids": [7] * 100_000, "response_mask": [1] * 100_000, "response_logprobs": [-0.5] * 100_000}
    page = rollout_page({"rollout_id": "r"}, None, records, [], [sample], Decoder(), "train")
    assert len(page) < 1_500_000, len(page)
    assert page.count("the end") == 4 and "[9960010 characters left out]" in page and "&lt;b&gt;" in page
    assert page.count('class="m1"') == 4_000 and "[96000 tokens left out]" in page


def test_an_eval_run_is_told_by_its_manifest_before_its_summary_is_written(tmp_path):
    """Before: `read_run_config` drops the `eval` field, so an eval run without a summary yet was titled a
    training run, and what it evaluates was never shown."""
    run = tmp_path / "pending-eval"
    manifest.write_run_config(str(run), {"run": "pending-eval", "harness": "direct", "model": ""},
                              evaluates={"checkpoint": "/ckpt/iteration-3", "run": "train-a", "iteration": 3})
    text = Path(write_report(str(run))).read_text()
    assert "pending-eval: evaluation report" in text
    assert "<h3>What it evaluates</h3>" in text and "<td>/ckpt/iteration-3</td>" in text and "<td>train-a</td>" in text


def test_a_nan_in_a_run_gives_a_report_not_an_error(tmp_path, capsys):
    """A NaN reward and a NaN loss (a diverged update): before, the page's JSON refused them and the CLI said
    the run was missing."""
    run = tmp_path / "nan"
    manifest.write_run_config(str(run), {"run": "nan", "harness": "direct", "model": ""})
    folder = Path(layout.rollout_url(str(run), 0, "it0-t-s0"))
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps({"rollout_id": "it0-t-s0", "task": "t", "sample": 0, "status": "ok",
                                                    "reward": float("nan"), "durations": {"total_s": float("inf")}}))
    metrics = Path(layout.metrics_url(layout.checkpoint_url(str(run), 1, "")))
    metrics.parent.mkdir(parents=True)
    metrics.write_text(json.dumps({"loss": float("nan"), "logprob_gap": 0.1}))
    assert report_cli.main(["--run", "nan", "--store", str(tmp_path)]) == 0, capsys.readouterr().err
    index = (run / "reports" / "index.html").read_text()
    data = index.split('id="rollout-data">', 1)[1].split("</script>", 1)[0]

    def refuse(constant):
        raise AssertionError(f"{constant} in the page's JSON: a browser's JSON.parse rejects it")
    row = json.loads(data, parse_constant=refuse)["rows"][0]["cells"]
    assert row[0] == "it0-t-s0" and row[7] is None and row[10] is None


def test_a_comparison_says_which_iteration_each_column_is_and_which_config_keys_differ(hostile_run, tmp_path, capsys):
    """Before: no iteration rows, raw keys (pass_at_k), no config diff, and `RUN:9` (no such iteration) a blank
    column with no error."""
    index = Path(write_report(str(hostile_run), out=str(tmp_path / "c"), compare=["other", ":0"])).read_text()
    section = index.split('id="compare"', 1)[1].split('id="rollouts"', 1)[0]
    rows = {r.split("</td>")[0]: [c.split("</td>")[0] for c in r.split("<td>")[1:]]
            for r in section.split("<tr><td>")[1:]}
    assert rows["iteration"] == ["1", "0"] and rows["pass@k"] and "pass_at_k" not in rows
    assert "Config keys that differ" in section and "run" in rows and rows["run"] == ["other", "hostile"]
    assert report_cli.main(["--run", "hostile", "--store", str(hostile_run.parent), "--out", str(tmp_path / "d"),
                            "--compare", "other:9"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --compare other:9: other has no iteration 9") and "\n" not in err


def test_a_plot_with_nothing_to_draw_says_why():
    """Before: the continuity plot vanished without a word when every rollout made one call, and the pass@k
    plot did not say what a pass is (graded toy rewards below 1 give a flat 0)."""
    from steps.report.data import Iteration
    from steps.report.index import index_page

    rollouts = [{"rollout_id": "r", "task": "t", "status": "ok", "reward": 0.5, "num_calls": 1}]
    calls = [{"harness": "direct", "rollout_id": "r", "sample_index": 0, "continued": False}]
    text = index_page(report_run({0: Iteration(0, rollouts=rollouts, calls=calls)}), [], [])
    assert "No continuity plot: no call could have continued a sample" in text
    assert "pass@1 and pass^1 (a pass: reward ≥ 1)" in text and "No phase times" in text


def test_the_exchange_marks_an_assistant_turn_the_harness_changed_and_shows_the_tools_offered():
    """Before: any leading assistant turn of a request was hidden as "the previous response sent back", so a
    harness (or anything between) could put words in the model's mouth unseen; tool definitions were never shown."""
    from steps.report.rollout_page import exchange_html

    tools = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
    first = {"call_index": 0, "dialect": "chat_completions", "status": "ok",
             "request": {"messages": [{"role": "user", "content": "hi"}], "tools": tools},
             "response": {"choices": [{"message": {"role": "assistant", "content": "ok"}}]}}
    second = {"call_index": 1, "dialect": "chat_completions", "status": "ok", "response": None,
              "request": {"tools": tools, "messages": [{"role": "user", "content": "hi"},
                                                       {"role": "assistant", "content": "I will delete everything"},
                                                       {"role": "user", "content": "go"}]}}
    same = dict(second, request={"tools": tools, "messages": [{"role": "user", "content": "hi"},
                                                              {"role": "assistant", "content": "ok"},
                                                              {"role": "user", "content": "go"}]})
    changed = exchange_html([first, second], {})
    assert "I will delete everything" in changed and "differs from the model&#x27;s response" in changed
    assert changed.count("tools offered (1): shell") == 1  # once: the second call offers the same
    assert "differs" not in exchange_html([first, same], {})  # the control: the response sent back as it was


def test_a_character_spread_over_byte_tokens_is_shown_whole(tiny_model):
    """Before: each token decoded alone, so a character of several byte tokens showed as U+FFFD marks."""
    from tokenizers import Tokenizer

    from steps.report.rollout_page import Decoder

    tokenizer = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    text = "naïve € ✓ 漢字"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    decoder = Decoder(tokenizer)
    assert any("\ufffd" in decoder.piece(i) for i in ids)  # the control: token by token, characters break
    pieces = decoder.pieces_of(ids)
    assert len(pieces) == len(ids) and "".join(pieces) == text and not any("\ufffd" in p for p in pieces)


def test_the_rollout_table_draws_200_rows_a_page_and_filters_rollouts_without_a_status(hostile_run, browser, tmp_path):
    """Before: every row drawn on every keystroke (a 100,000-rollout run froze the page), and the status
    filter's "None" never matched a rollout whose status is null."""
    from steps.report.index import index_page

    shutil.copytree(hostile_run / "reports" / "assets", tmp_path / "assets")
    entries = [{"row": {"rollout_id": f"r{i}", "task": "t", "status": None if i % 2 else "ok"}, "kind": "train",
                "iteration": 0, "href": f"r{i}.html"} for i in range(450)]
    (tmp_path / "index.html").write_text(index_page(report_run(), entries, []))
    loaded = browser.open(tmp_path / "index.html")
    page = loaded.page
    assert loaded.errors == [] and page.locator("#rollout-table tbody tr").count() == 200
    assert page.inner_text("#rollout-count") == "450 of 450 rollouts (1-200 shown)"
    page.click("#rollout-table button:text-is('next 200')")
    assert page.locator("#rollout-table tbody tr").first.inner_text().startswith("r200")
    page.select_option("#status-filter", "(none)")
    assert page.inner_text("#rollout-count") == "225 of 450 rollouts (1-200 shown)"
    page.fill("#filter", "r44")
    page.locator("#rollout-count", has_text=re.compile("^5 of 450 rollouts$")).wait_for()
    assert page.inner_text("#rollout-count") == "5 of 450 rollouts"  # r441 ... r449, the odd ones


def test_the_pages_policy_forbids_a_base_url_and_form_submission():
    """Were markup ever to get through, a `<base href>` could point every relative link elsewhere and a form
    could send the page's data: the policy forbids both (it lacked them)."""
    policy = html.page("t", "", "assets").split('content="', 1)[1].split('"', 1)[0]
    assert {"default-src 'none'", "base-uri 'none'", "form-action 'none'", "script-src 'self'"} <= \
        {d.strip() for d in policy.split(";")}


def test_a_result_claiming_another_rollouts_id_does_not_take_over_its_page_and_extra_files_are_counted(tmp_path):
    """Before: the last result.json read won, whatever folder it was in; files past 20 vanished unnoted."""
    from steps.report.data import read_results
    from steps.report.rollout_page import kept_files

    results = tmp_path / "results" / "iteration-0"
    for folder, reward in (("it0-0-s0", 0.0), ("it0-a-s0", 1.0)):  # the impostor read first
        (results / folder).mkdir(parents=True)
        (results / folder / "result.json").write_text(json.dumps({"rollout_id": "it0-a-s0", "reward": reward}))
    (results / "it0-c-s0").mkdir()
    (results / "it0-c-s0" / "result.json").write_text(json.dumps({"rollout_id": "it0-c-s0-a2", "reward": 0.5}))
    notes = []
    found = read_results(str(results), notes)
    assert found["it0-a-s0"].result.reward == 1.0 and found["it0-c-s0-a2"].result.reward == 0.5  # a rerun's own id
    assert len(notes) == 1 and "it0-0-s0/result.json names rollout 'it0-a-s0'" in notes[0]
    verifier = results / "it0-a-s0" / "verifier"
    verifier.mkdir()
    for n in range(23):
        (verifier / f"f{n:02d}.txt").write_text(str(n))
    files = kept_files({"verifier_output": "verifier"}, str(results / "it0-a-s0" / "result.json"), "verifier_output")
    assert len(files) == 21 and files[-1] == ("[3 more files not shown]", "f20.txt, f21.txt, f22.txt")


def test_a_refresh_writes_only_the_pages_whose_tables_changed_and_removes_orphans(hostile_run, tmp_path, monkeypatch):
    """Before: every write rewrote every page of every iteration and plotly.js (minutes per refresh late in a
    long run), and pages of rollouts gone (a dead attempt's) stayed."""
    import steps.report as report

    run = tmp_path / "hostile"
    shutil.copytree(hostile_run, run, ignore=shutil.ignore_patterns("reports"))
    written = []
    real = report.rollout_page
    monkeypatch.setattr(report, "rollout_page", lambda row, *args: written.append(row["rollout_id"]) or real(row, *args))
    write_report(str(run))
    assert len(written) == 16
    plotly = run / "reports" / "assets" / "plotly.min.js"
    stamp = plotly.stat().st_mtime_ns
    stale = run / "reports" / "rollouts" / "train-0" / "gone-00000000.html"
    stale.write_text("a dead attempt's page")
    written.clear()
    write_report(str(run))
    assert written == [] and not stale.exists() and plotly.stat().st_mtime_ns == stamp
    result = next((run / "results" / "iteration-1").glob("*/result.json"))
    result.write_text(json.dumps(dict(json.loads(result.read_text()), notes="re-graded")))
    write_report(str(run))
    assert len(written) == 8 and all(rollout_id.startswith("it1-") for rollout_id in written)


def test_a_hostile_rollout_id_stays_in_the_report_folder(tmp_path):
    """A result.json naming its rollout `../../../outside` (a rerun's result may name another id than its
    folder): its page is written inside the report's folder, under a safe name."""
    run = tmp_path / "store" / "climb"
    folder = Path(layout.rollout_url(str(run), 0, "it0-t-s0"))
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps({"rollout_id": "../../../outside", "task": "../t", "status": "ok",
                                                    "reward": 1.0}))
    write_report(str(run))
    reports = (run / "reports").resolve()
    outside = [p for p in tmp_path.rglob("*") if p.is_file() and not p.resolve().is_relative_to(reports)
               and not p.resolve().is_relative_to((run / "results").resolve())]
    assert outside == []
    pages = list((reports / "rollouts").rglob("*.html"))
    assert [p.parent.name for p in pages] == ["train-0"] and pages[0].name == f"{html.file_name('../../../outside')}.html"


HOSTILE_LIMIT = '<img src=x onerror="window.__pwned=1">'


def killed_run(tmp_path: Path) -> Path:
    """A run with three iterations as result.json files: iteration 0's harnesses killed by memory (twice), by pids and
    by a limit with a hostile name, one whose agent (not its harness) was killed, one clean and one written before
    result.json had a `killed` list; iteration 1 only clean and older ones, its rollouts table written (the
    control); and an evaluation with a memory-killed try."""
    from steps import evaluate
    from steps.trajectories.collect import collect
    from steps.contracts.table_files import write_tables

    run = tmp_path / "store" / "killed"
    manifest.write_run_config(str(run), {"run": "killed", "harness": "openclaw", "model": ""})

    def result(rollout_id: str, by: str | None, process: str = "harness", reward: float = 0.0, **more) -> dict:
        killed = {} if by is None else {"killed": [{"process": process, "by": by, "count": 1}] if by else []}
        return {"rollout_id": rollout_id, "task": "t", "sample": 0, "harness": "openclaw", "status": "ok",
                "reward": reward, "num_calls": 1, **killed, **more}

    iterations = {0: [result("it0-t-s0", "memory"), result("it0-t-s1", "memory"), result("it0-t-s2", "pids"),
                      result("it0-t-s3", HOSTILE_LIMIT), result("it0-t-s4", "memory", process="agent"),
                      result("it0-t-s5", "", reward=1.0), result("it0-t-s6", None, reward=1.0)],
                  1: [result("it1-t-s0", "", reward=1.0), result("it1-t-s1", None, reward=1.0)]}
    for n, results in iterations.items():
        for r in results:
            folder = Path(layout.rollout_url(str(run), n, r["rollout_id"]))
            folder.mkdir(parents=True)
            (folder / "result.json").write_text(json.dumps(r))
    write_tables(collect([RolloutResult.from_json(r) for r in iterations[1]], {}, "killed", 1)[0].tables(),
                 layout.run_partition_url(str(run), "killed", 1))
    tries = [result("ev0-t-s0", "memory"), result("ev0-t-s1", "", reward=1.0)]
    for r in tries:
        folder = Path(layout.eval_results_url(str(run), 0)) / r["rollout_id"]
        folder.mkdir(parents=True)
        (folder / "result.json").write_text(json.dumps(r))
    summary = evaluate.summarize([RolloutResult.from_json(r) for r in tries], k=2)
    manifest.write_json(layout.eval_summary_url(str(run), 0), {"harness": "openclaw", **summary})
    return run


def html_table(text: str, after: str) -> list[list[str]]:
    """The cells of the first table after `after` in a page, header row first."""
    body = text.split(after, 1)[1].split("</table>", 1)[0]
    return [re.findall(r"<t[hd]>(.*?)</t[hd]>", row) for row in re.findall(r"<tr>(.*?)</tr>", body)]


def test_the_report_counts_killed_harnesses_per_iteration_and_names_the_limit_per_rollout(tmp_path):
    """Before: a rollout whose harness was killed read as a plain reward 0 everywhere in the report."""
    run = killed_run(tmp_path)
    index = Path(write_report(str(run))).read_text()
    header, *rows = html_table(index, 'id="iterations">')
    by_iteration = {row[0]: dict(zip(header, row)) for row in rows}
    assert (by_iteration["0"]["harness killed: memory"], by_iteration["0"]["harness killed: pids"]) == ("2", "1")
    assert (by_iteration["1"]["harness killed: memory"], by_iteration["1"]["harness killed: pids"]) == ("0", "0")
    assert by_iteration["0"][f"harness killed: {html.esc(HOSTILE_LIMIT)}"] == "1"  # a limit the runner may add later
    warnings = re.findall(r'<p class="warning">(.*?)</p>', index)
    assert len(warnings) == 2 and "warning: iteration 0: a limit killed the harness in 4 of 7 rollouts" in warnings[0]
    assert "raise harness_memory_mb" in warnings[0]
    assert "warning: evaluation 0: a limit killed the harness in 1 of 2 rollouts (memory 1, pids 0)" in warnings[1]
    header, *rows = html_table(index, 'id="evals">')
    assert dict(zip(header, rows[0]))["harness_killed"] == "1"
    data = json.loads(index.split('id="rollout-data">', 1)[1].split("</script>", 1)[0])
    column = data["columns"].index("harness killed by")
    killed = {row["cells"][0]: row["cells"][column] for row in data["rows"]}
    assert {k: v for k, v in killed.items() if v} == {"it0-t-s0": "memory", "it0-t-s1": "memory", "it0-t-s2": "pids",
                                                       "it0-t-s3": HOSTILE_LIMIT, "ev0-t-s0": "memory"}
    assert "<img" not in index
    page = (run / "reports" / "rollouts" / "train-0" / f"{html.file_name('it0-t-s0')}.html").read_text()
    assert dict(html_table(page, "<h1>")[1:])["harness killed by"] == "memory"
    agent = (run / "reports" / "rollouts" / "train-0" / f"{html.file_name('it0-t-s4')}.html").read_text()
    facts = dict(html_table(agent, "<h1>")[1:])
    assert facts["harness killed by"] == "" and "agent" in facts["killed by a limit"]
    hostile = (run / "reports" / "rollouts" / "train-0" / f"{html.file_name('it0-t-s3')}.html").read_text()
    assert "<img" not in hostile and dict(html_table(hostile, "<h1>")[1:])["harness killed by"] == html.esc(HOSTILE_LIMIT)


def test_a_run_without_a_killed_harness_counts_zero_and_warns_nothing(tmp_path):
    """Control: iteration 1 of the same run alone (clean and older results, its rollouts table written)."""
    run = killed_run(tmp_path)
    shutil.rmtree(layout.results_url(str(run), 0))
    shutil.rmtree(layout.eval_url(str(run), 0))
    index = Path(write_report(str(run))).read_text()
    header, *rows = html_table(index, 'id="iterations">')
    assert [dict(zip(header, row))["harness killed: memory"] for row in rows] == ["0"]
    assert 'class="warning"' not in index


# --- screenshots on a GUI rollout's page ---------------------------------------------------------------------
GUI_SIZE = (640, 360)
SVG = b'<svg xmlns="http://www.w3.org/2000/svg" width="40" height="40"><rect width="40" height="40" fill="red"/></svg>'
HTML_AS_PNG = b"<html><body><script>window.__pwned = 5</script>a page, not an image</body></html>"


def gui_requests(shots: dict[str, str]) -> dict[str, list[tuple[str, Callable[[dict | None], dict]]]]:
    """Per rollout, its calls (endpoint path, the body given the previous call's answer) in one dialect each; `shots`
    maps a, b, c to data URLs. Screenshot a is sent by every rollout, and again with the chat rollout's second call,
    which sends back the model's answer and its tool's output with screenshot b."""
    def b64(name: str) -> str:
        return shots[name].partition(",")[2]
    chat_first = [{"role": "system", "content": "You operate a browser."},
                  {"role": "user", "content": [{"type": "text", "text": "sign up"},
                                               {"type": "image_url", "image_url": {"url": shots["a"]}}]}]
    def chat_second(answer: dict) -> dict:
        said = answer["choices"][0]["message"]
        return {"model": "tiny", "max_tokens": 8, "messages": chat_first + [
            {key: said[key] for key in ("role", "content", "tool_calls")},
            {"role": "tool", "tool_call_id": said["tool_calls"][0]["id"],
             "content": [{"type": "text", "text": "the form"}, {"type": "image_url", "image_url": {"url": shots["b"]}}]}]}
    responses = {"model": "tiny", "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "borrow the book"},
                                                        {"type": "input_image", "image_url": shots["a"]}]},
        {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": '{"cmd": "shot"}'},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "zoomed"},
                                                                     {"type": "input_image", "image_url": shots["c"]}]}]}
    messages = {"model": "tiny", "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64("a")}},
                                     {"type": "text", "text": "click launch"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "computer", "input": {"action": "screenshot"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64("b")}}]}]}]}
    return {"it0-gui-chat-s0": [("/v1/chat/completions", lambda _: {"model": "tiny", "max_tokens": 8, "messages": chat_first}),
                                ("/v1/chat/completions", chat_second)],
            "it0-gui-responses-s0": [("/v1/responses", lambda _: responses)],
            "it0-gui-messages-s0": [("/v1/messages", lambda _: messages)]}


def gui_page(run: Path, rollout_id: str, out: Path | None = None) -> Path:
    return (out or run / "reports") / "rollouts" / "train-0" / f"{html.file_name(rollout_id)}.html"


@pytest.fixture(scope="module")
def gui_run(proxy, tmp_path_factory) -> dict:
    """A GUI run: three rollouts whose screenshots the real proxy recorded into the run's store (Chat `image_url`,
    Responses `input_image` in a message and a tool output, Messages `image` blocks in a turn and a tool_result),
    against an upstream that answers like vLLM (`tests/screenshots.py`: what a model says is not the point); and a
    fourth whose record names an SVG and an HTML file in the store, which the proxy never writes (it refuses both),
    put there by the store's own writer, as a store not written by this proxy could hold. Its report written."""
    import httpx
    import orjson

    from screenshots import CapturingUpstream, data_url, screenshot, sha
    from steps.proxy.images import REFERENCE_PREFIX, Image
    from steps.proxy.store import CallStore

    run = tmp_path_factory.mktemp("gui-runs") / "gui-run"
    manifest.write_run_config(str(run), {"run": "gui-run", "harness": "browser-use", "model": ""})
    pngs = {name: screenshot(seed, GUI_SIZE) for seed, name in enumerate("abc")}
    with CapturingUpstream() as upstream:
        recording = proxy(upstream.url, store=layout.calls_url(str(run)))
        for rollout_id, calls in gui_requests({name: data_url(png) for name, png in pngs.items()}).items():
            rollout = recording.register(rollout_id)
            answer = None
            for path, body in calls:
                answer = httpx.post(f"{rollout['anthropic_base_url']}{path}", json=body(answer and answer.json()), timeout=60,
                                    headers={"authorization": f"Bearer {rollout['api_key']}", "x-api-key": rollout["api_key"]})
                assert answer.status_code == 200, answer.text
    store = CallStore(layout.calls_url(str(run)))
    hostile = {"svg": SVG, "html": HTML_AS_PNG}
    store.images.put([Image(sha(data), "image/svg+xml" if name == "svg" else "image/png", data, 40, 40, name)
                      for name, data in hostile.items()])
    first = orjson.loads((Path(layout.calls_url(str(run))) / "rollouts" / "it0-gui-chat-s0" / "calls.jsonl").read_bytes().splitlines()[0])
    request = orjson.dumps(first["request"]).replace(f"{REFERENCE_PREFIX}{sha(pngs['a'])}".encode(),
                                                     f"{REFERENCE_PREFIX}{sha(SVG)}".encode())
    for data in (b"never stored", HTML_AS_PNG):
        request = request.replace(b'"sign up"}', b'"sign up"},{"type":"image_url","image_url":{"url":"'
                                  + f"{REFERENCE_PREFIX}{sha(data)}".encode() + b'"}}')
    record = dict(first, rollout_id="it0-gui-hostile-s0", request=orjson.loads(request),
                  images=[{"sha256": sha(data), "media_type": "image/png", "width": 40, "height": 40}
                          for data in (HTML_AS_PNG, b"never stored", SVG)])
    with ThreadPoolExecutor(max_workers=1) as thread:  # its own event loop: the browser's may be running in this one
        thread.submit(asyncio.run, store.put_rollout({"rollout_id": "it0-gui-hostile-s0", "metadata": {}})).result()
        thread.submit(asyncio.run, store.put_call(record)).result()
    for rollout_id in [*gui_requests({n: "" for n in "abc"}), "it0-gui-hostile-s0"]:
        folder = Path(layout.rollout_url(str(run), 0, rollout_id))
        folder.mkdir(parents=True)
        (folder / "result.json").write_text(json.dumps({"rollout_id": rollout_id, "task": "gui-signup-form", "sample": 0,
                                                        "harness": "browser-use", "status": "ok", "reward": 1.0}))
    write_report(str(run))
    return {"run": run, "sha": {name: sha(png) for name, png in pngs.items()} | {n: sha(d) for n, d in hostile.items()}
            | {"missing": sha(b"never stored")},
            "pngs": pngs}


SHOTS = "Array.from(document.querySelectorAll('#call-%d a.shot img')).map(i => i.getAttribute('src'))"


def test_a_gui_rollout_page_shows_each_screenshot_where_the_harness_sent_it_and_full_size_on_click(gui_run, browser):
    run, sha = gui_run["run"], gui_run["sha"]
    loaded = browser.open(gui_page(run, "it0-gui-chat-s0"), screenshot="gui-rollout")
    page = loaded.page
    assert loaded.errors == [] and page.evaluate(PWNED)
    # Call 0 sent screenshot a; call 1 sent a again (not shown twice: the exchange shows what a call added) and b,
    # in its tool's output.
    first, second = page.evaluate(SHOTS % 0), page.evaluate(SHOTS % 1)
    assert [s.rsplit("/", 1)[-1] for s in first + second] == [f"{sha['a']}.png", f"{sha['b']}.png"]
    assert page.locator("#call-0 .role-user.image a.shot").count() == 1  # in the user turn that sent it
    assert page.locator("#call-1 .role-tool.tool-result a.shot").count() == 1 and "differs" not in page.inner_text("#call-1")
    for img in page.locator("a.shot img").all():
        img.scroll_into_view_if_needed()
        img.evaluate("i => i.decode()")
        assert img.evaluate("i => [i.naturalWidth, i.naturalHeight]") == list(GUI_SIZE)
        assert img.evaluate("i => i.clientWidth") < GUI_SIZE[0]  # a thumbnail
    page.locator("#call-0 a.shot").click()
    full = page.locator(".overlay img")
    full.evaluate("i => i.decode()")
    assert full.evaluate("i => [i.clientWidth, i.naturalWidth]") == [GUI_SIZE[0]] * 2  # full size
    page.keyboard.press("Escape")
    assert page.locator(".overlay").count() == 0
    # Responses and Messages: the image in a message and in a tool's output, each where it was sent.
    responses = browser.open(gui_page(run, "it0-gui-responses-s0")).page
    assert responses.evaluate("Array.from(document.querySelectorAll('.turn')).flatMap(t => Array.from("
                              "t.querySelectorAll('a.shot img')).map(i => [t.className, i.getAttribute('src')]))") == [
        ["turn role-user text", f"../../assets/images/{sha['a']}.png"],
        ["turn role-tool tool-result", f"../../assets/images/{sha['c']}.png"]]
    messages = browser.open(gui_page(run, "it0-gui-messages-s0")).page
    assert messages.locator(".role-user.image a.shot").count() == 1 and messages.locator(".tool-result a.shot").count() == 1
    assert all(i.evaluate("i => i.decode().then(() => i.naturalWidth)") == GUI_SIZE[0]
               for i in messages.locator("a.shot img").all())


def test_a_screenshot_shown_on_many_calls_and_pages_is_copied_into_the_report_once(gui_run, tmp_path, monkeypatch):
    """Screenshot a is sent by four calls of three rollouts: one file, which every page names; a report written
    again (every page rewritten) writes no image again."""
    import steps.report as report

    run, sha, pngs = gui_run["run"], gui_run["sha"], gui_run["pngs"]
    copied = sorted(p.name for p in (run / "reports" / "assets" / "images").iterdir())
    assert copied == sorted(f"{sha[n]}.png" for n in "abc")
    assert all((run / "reports" / "assets" / "images" / f"{sha[n]}.png").read_bytes() == pngs[n] for n in "abc")
    pages = [gui_page(run, r).read_text() for r in ("it0-gui-chat-s0", "it0-gui-responses-s0", "it0-gui-messages-s0")]
    assert all(f'src="../../assets/images/{sha["a"]}.png"' in p for p in pages)
    writes = []
    real = report.Site.write_bytes
    monkeypatch.setattr(report.Site, "write_bytes", lambda site, relative, *args: writes.append(relative) or real(site, relative, *args))
    out = tmp_path / "fresh"
    write_report(str(run), out=str(out))
    assert sorted(w for w in writes if w.startswith("assets/images/")) == sorted(f"assets/images/{sha[n]}.png" for n in "abc")
    writes.clear()
    (out / "written.json").unlink()  # every page is written again
    write_report(str(run), out=str(out))
    assert [w for w in writes if w.startswith("assets/images/")] == []


@pytest.mark.parametrize("checked", [True, False], ids=["magic-bytes", "control-trusts-the-store"])
def test_an_svg_or_a_page_in_the_image_store_is_never_shown_as_an_image(gui_run, browser, tmp_path, monkeypatch, checked):
    """The record names an SVG and an HTML file (as image/png) that the store holds under their hashes, and an image
    the store lacks: none is copied, linked nor shown, each is named as text with why. Control: a report that
    takes any stored bytes for an image (here, as SVG) shows the SVG as one."""
    from steps.report import images

    run, sha = gui_run["run"], gui_run["sha"]
    out = tmp_path / "report"
    if not checked:
        monkeypatch.setattr(images, "image_format", lambda raw: ("svg", "image/svg+xml", 40, 40))
    write_report(str(run), out=str(out))
    loaded = browser.open(gui_page(run, "it0-gui-hostile-s0", out))
    page = loaded.page
    assert page.evaluate(PWNED)
    shown = page.evaluate("Promise.all(Array.from(document.querySelectorAll('img')).map(i => "
                          "i.decode().then(() => [i.getAttribute('src'), i.naturalWidth], () => [i.getAttribute('src'), 0])))")
    loaded_svg = [src for src, width in shown if sha["svg"] in src and width > 0]
    if checked:
        assert shown == [] and loaded.errors == []
        assert sorted(p.name for p in (out / "assets" / "images").iterdir()) == sorted(f"{sha[n]}.png" for n in "abc")
        notes = page.locator(".shot-missing").all_inner_texts()
        why = {n.split(" ")[1]: n.split(" ", 2)[2].split(" (")[0] for n in notes}
        assert why == {sha["html"]: "is not a PNG, JPEG, GIF or WebP image: not shown", sha["missing"]: "is not in the store",
                       sha["svg"]: "is not a PNG, JPEG, GIF or WebP image: not shown"}, notes
        assert sha["svg"] not in "".join(page.evaluate("Array.from(document.querySelectorAll('a')).map(a => a.href)"))
    else:
        assert loaded_svg, shown


def test_a_pages_screenshots_are_bounded_in_number_and_size(tmp_path):
    """60 distinct screenshots and two over a bound (2.1 MB; 5000 x 5000 pixels declared): 50 thumbnails, the rest
    links, each image copied once."""
    from screenshots import sha
    from steps.proxy.image_store import ImageStore
    from steps.proxy.images import REFERENCE_PREFIX, Image
    from steps.report import Site
    from steps.report.images import MAX_INLINE_IMAGES, ReportImages
    from steps.report.rollout_page import Decoder, rollout_page

    def png(width: int, height: int, tail: bytes = b"") -> bytes:
        return (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + width.to_bytes(4, "big") + height.to_bytes(4, "big")
                + b"\x08\x02\x00\x00\x00" + tail)
    shots = [png(10 + n, 10) for n in range(60)] + [png(20, 20, b"\0" * 2_100_000), png(5000, 5000)]
    ImageStore.reader(str(tmp_path / "calls" / "images")).put(
        [Image(sha(data), "image/png", data, 1, 1, "") for data in shots])
    parts = [{"type": "image_url", "image_url": {"url": f"{REFERENCE_PREFIX}{sha(data)}"}} for data in shots[::-1]]
    record = {"call_index": 0, "dialect": "chat_completions", "status": "ok", "response": None,
              "request": {"messages": [{"role": "user", "content": parts + parts[2:7]}]}}
    site = Site(str(tmp_path / "reports"))
    page = rollout_page({"rollout_id": "r"}, None, [record], [], [], Decoder(), "train",
                        ReportImages(site, str(tmp_path / "calls" / "images")))
    assert page.count('<a class="shot"') == MAX_INLINE_IMAGES + 5  # the five sent twice shown again
    links = re.findall(r'class="shot-link"[^>]*>([^<]*)</a> \(linked, not shown: ([^)]*)\)', page)
    assert [why.split(" ")[0] for _, why in links] == ["over", "over"] + ["past"] * 10
    assert len(list((tmp_path / "reports" / "assets" / "images").iterdir())) == 62


PLOT_BOXES = """Array.from(document.querySelectorAll('.plot')).map(d => {
  const box = e => { const b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; };
  return [d.querySelector('.gtitle').textContent, box(d.querySelector('.gtitle')), box(d.querySelector('.modebar'))];
})"""


@pytest.mark.parametrize("upright", [True, False], ids=["modebar-upright", "control-plotly-default"])
def test_a_plots_toolbar_does_not_cover_its_title(hostile_run, browser, tmp_path, monkeypatch, upright):
    """Before: plotly's toolbar lay across the top right, over every centred title wider than a third of the plot.
    Control: the layout without the upright toolbar and its margin."""
    from steps.report import figures

    if not upright:
        monkeypatch.setattr(figures, "_LAYOUT", {k: v for k, v in figures._LAYOUT.items() if k != "modebar"}
                            | {"margin": dict(figures._LAYOUT["margin"], r=15)})
    index = write_report(str(hostile_run), out=str(tmp_path / "report"))
    page = browser.open(Path(index)).page
    page.locator(".plot").first.hover()  # the toolbar is drawn on hover
    boxes = page.evaluate(PLOT_BOXES)
    overlaps = [title for title, t, m in boxes if t[0] < m[2] and m[0] < t[2] and t[1] < m[3] and m[1] < t[3]]
    assert len(boxes) >= 8
    assert (overlaps == []) is upright, overlaps


def test_the_exchange_names_the_stored_images_of_every_dialect_where_they_were_sent():
    """Every place a harness can send an image, as the store keeps it (a reference for the bytes); a data URL the
    store never replaced (a hand-written or older record) stays text, as before."""
    from steps.proxy.images import REFERENCE_PREFIX
    from steps.report.exchange import request_turns

    a, b, c = (f"{REFERENCE_PREFIX}{n * 64}" for n in "abc")
    chat = {"messages": [{"role": "user", "content": [{"type": "text", "text": "go"}, {"type": "image_url", "image_url": {"url": a}}]},
                         {"role": "tool", "tool_call_id": "t", "content": [{"type": "text", "text": "shot"},
                                                                           {"type": "image_url", "image_url": {"url": b}}]},
                         {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}]}]}
    responses = {"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"},
                                                                             {"type": "input_image", "image_url": a}]},
                           {"type": "function_call_output", "call_id": "t", "output": [{"type": "input_image", "image_url": b}]},
                           {"type": "computer_call_output", "call_id": "u", "output": {"type": "computer_screenshot", "image_url": c}}]}
    messages = {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": a}}]},
                             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
                                 {"type": "text", "text": "shot"}, {"type": "image", "source": {"type": "base64", "data": b}}]}]}]}

    def shown(dialect, request):
        return [(t["role"], t["kind"], t["text"][:20], t.get("images")) for t in request_turns(dialect, request)]
    assert shown("chat_completions", chat) == [
        ("user", "text", "go", None), ("user", "image", "", ["a" * 64]), ("tool", "tool_result", "shot", ["b" * 64]),
        ("user", "image", '{"type": "image_url"', None)]
    assert shown("responses", responses) == [("user", "text", "go", ["a" * 64]), ("tool", "tool_result", "", ["b" * 64]),
                                             ("tool", "tool_result", "", ["c" * 64])]
    assert shown("messages", messages) == [("user", "image", "", ["a" * 64]), ("tool", "tool_result", "shot", ["b" * 64])]


def test_screenshots_in_a_report_written_to_s3_are_served_as_images(gui_run, s3_server, monkeypatch):
    """Each image object carries the content type its magic bytes gave (a browser shows it from the bucket)."""
    for key, value in s3_server["env"].items():
        monkeypatch.setenv(key, value)
    fsspec.config.conf.pop("s3", None)
    out = f"s3://{s3_server['bucket']}/gui-report"
    write_report(str(gui_run["run"]), out=out)
    fs = fsspec.filesystem("s3")
    images = sorted(fs.find(f"{out}/assets/images"))
    assert [p.rsplit("/", 1)[-1] for p in images] == sorted(f"{gui_run['sha'][n]}.png" for n in "abc")
    fs.invalidate_cache()  # the listing holds no content types
    assert {fs.info(p)["ContentType"] for p in images} == {"image/png"}
