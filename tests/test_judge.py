"""Judge rewards: a task's verifier asks the run's judge model through the proxy's judge route (steps/proxy/judge.py).

The policy and the judge are both `tests/scripted_model.py`: the policy plays shell commands, as in
test_rollout.py; the judge is a double for a model that can judge (none that can be trusted to grade runs here):
it answers a request holding the oracle's commit message with `SCORE: 10`, and anything else with a plain answer
(no score, so reward 0). Both serve on 127.0.0.1; the proxy is the real process (`tests/proxy_process.py`),
started with `--judge-upstream` at the scripted judge. Every adversary case has its control beside it.
"""

import dataclasses
import json
import os
import shutil
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import orjson
import pytest

from scripted_model import ScriptedModel
from steps.net import HOST, free_port
from steps.proxy.judge import JUDGE_CALL
from steps.proxy.store import judge_store_url
from steps.rollout import JUDGE_ENV, run_rollout
from steps.trajectories.collect import collect, fetch_calls_store
from test_rollout import ADMIN_KEY, spec_for

REPO = Path(__file__).resolve().parents[1]
TASK = REPO / "steps" / "tasks" / "judged" / "commit-message"
JUDGE_MODEL = "judge-model"
JUDGE_UPSTREAM_KEY = f"judge-upstream-key-{uuid.uuid4().hex}"  # the run's key to the judge: never in a log or file
GOOD = (TASK / "solution" / "solve.sh").read_text().split('"')[1]  # the oracle's message, which the judge passes
VERDICT = "Accurate, concise, imperative.\nSCORE: 10"
ASK = {"messages": [{"role": "user", "content": f"<message>{GOOD}</message>"}], "max_tokens": 64}


@pytest.fixture(scope="module")
def judge():
    with ScriptedModel(model=JUDGE_MODEL, replies={GOOD: VERDICT}) as server:
        yield server


@pytest.fixture(scope="module")
def judged_proxy(proxy, scripted, judge):
    """The policy's proxy with a judge route, the judge's key in its environment as the serve step passes it."""
    return proxy(scripted.url, extra=["--model-name", "tiny", "--judge-upstream", f"{judge.url}/v1",
                                      "--judge-model", JUDGE_MODEL],
                 env={"OPENFORGE_JUDGE_UPSTREAM_API_KEY": JUDGE_UPSTREAM_KEY})


@pytest.fixture(scope="module")
def down_judge_proxy(proxy, scripted):
    """A proxy whose judge upstream is down: nothing listens at its port."""
    return proxy(scripted.url, extra=["--judge-upstream", f"http://{HOST}:{free_port()}", "--judge-model", JUDGE_MODEL])


def post(url: str, key: str | None, body: dict) -> tuple[int, dict]:
    """POST a JSON body with a Bearer key (none: no header): the status and the JSON answer."""
    headers = {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def graded_rollout(proxy, name: str = "r") -> tuple[str, dict, dict]:
    """A rollout registered and closed (its agent done), then its judge opened: (id, registration, judge)."""
    rollout_id = f"{name}-{uuid.uuid4().hex[:8]}"
    rollout = proxy.register(rollout_id)
    proxy.client.close(rollout_id)
    return rollout_id, rollout, proxy.client.open_judge(rollout_id)


def judge_url(proxy, rollout_id: str) -> str:
    return f"{proxy.url}/judge/{rollout_id}/v1/chat/completions"


def test_the_verifier_asks_the_judge_and_the_call_is_recorded_apart(judged_proxy, judge):
    rollout_id, _, opened = graded_rollout(judged_proxy)
    assert opened["openai_base_url"] == f"{judged_proxy.url}/judge/{rollout_id}/v1" and opened["model"] == JUDGE_MODEL
    before = len(judge.exchanges)
    status, answer = post(opened["openai_base_url"] + "/chat/completions", opened["api_key"], {**ASK, "model": "x"})
    assert status == 200 and answer["choices"][0]["message"]["content"] == VERDICT
    sent = judge.exchanges[before:]
    assert len(sent) == 1 and sent[0]["request"]["model"] == JUDGE_MODEL  # the run's judge model, whatever was asked
    assert sent[0]["authorization"] == f"Bearer {JUDGE_UPSTREAM_KEY}"  # the run's key goes to the judge alone
    assert judged_proxy.client.close_judge(rollout_id) == {"rollout_id": rollout_id, "calls": 1, "failed": []}
    store = Path(judged_proxy.store)
    [record] = [orjson.loads(line) for line in (Path(judge_store_url(str(store))) / "rollouts" / rollout_id /
                                                "calls.jsonl").read_bytes().splitlines()]
    assert record["status"] == "ok" and record["untrainable"] == JUDGE_CALL and record["response"] == answer
    assert judged_proxy.calls(rollout_id) == []  # the rollout's own calls: the policy's only
    written = b"".join(path.read_bytes() for path in store.rglob("*") if path.is_file())
    assert JUDGE_UPSTREAM_KEY.encode() not in written and opened["api_key"].encode() not in written
    log = judged_proxy.log_path.read_text()
    assert JUDGE_UPSTREAM_KEY not in log and opened["api_key"] not in log
    assert JUDGE_UPSTREAM_KEY not in " ".join(judged_proxy.process.args)  # not on the command line either


def test_the_agents_key_cannot_reach_the_judge_route(judged_proxy):
    rollout_id = f"agent-{uuid.uuid4().hex[:8]}"
    agent_key = judged_proxy.register(rollout_id)["api_key"]
    assert post(judge_url(judged_proxy, rollout_id), agent_key, ASK)[0] == 404  # no judge while the agent runs
    with pytest.raises(Exception, match="still open"):
        judged_proxy.client.open_judge(rollout_id)  # nor can one be opened before the agent's session closes
    judged_proxy.client.close(rollout_id)
    opened = judged_proxy.client.open_judge(rollout_id)
    assert post(judge_url(judged_proxy, rollout_id), agent_key, ASK)[0] == 401
    assert post(judge_url(judged_proxy, rollout_id), None, ASK)[0] == 401
    assert post(judge_url(judged_proxy, rollout_id), ADMIN_KEY, ASK)[0] == 401  # not even the admin's
    assert post(judge_url(judged_proxy, rollout_id), opened["api_key"], ASK)[0] == 200  # control: the judge key


def test_the_agents_calls_never_go_to_the_judge_upstream(judged_proxy, scripted, judge):
    rollout_id = f"agent-{uuid.uuid4().hex[:8]}"
    rollout = judged_proxy.register(rollout_id)
    policy_before, judge_before = len(scripted.exchanges), len(judge.exchanges)
    lures = [{"model": JUDGE_MODEL}, {"model": f"{judge.url}/v1"}, {"model": "tiny", "extra_body": {"judge": True}}]
    for lure in lures:
        status, answer = post(rollout["openai_base_url"] + "/chat/completions", rollout["api_key"], {**ASK, **lure})
        assert status == 200 and answer["choices"][0]["message"]["content"] != VERDICT
    assert len(scripted.exchanges) - policy_before == len(lures) and len(judge.exchanges) == judge_before
    judged_proxy.client.close(rollout_id)
    opened = judged_proxy.client.open_judge(rollout_id)
    assert post(judge_url(judged_proxy, rollout_id), opened["api_key"], ASK)[0] == 200
    assert len(judge.exchanges) == judge_before + 1  # control: the judge route does reach it


def test_a_judge_key_opens_its_own_rollouts_judge_and_nothing_else(judged_proxy):
    mine, _, opened = graded_rollout(judged_proxy, "mine")
    other, other_rollout, _ = graded_rollout(judged_proxy, "other")
    key = opened["api_key"]
    assert post(judge_url(judged_proxy, other), key, ASK)[0] == 401  # another rollout's judge
    for rollout_id in (mine, other):  # either rollout's own routes
        assert post(f"{judged_proxy.url}/rollouts/{rollout_id}/v1/chat/completions", key, ASK)[0] == 401
    fresh = f"fresh-{uuid.uuid4().hex[:8]}"
    judged_proxy.register(fresh)  # an open rollout's session
    assert post(f"{judged_proxy.url}/rollouts/{fresh}/v1/chat/completions", key, ASK)[0] == 401
    assert post(f"{judged_proxy.url}/rollouts/{other}/judge", key, {})[0] == 401  # the admin routes
    assert post(judge_url(judged_proxy, mine), key, ASK)[0] == 200  # control: its own judge


def test_the_judge_route_closes_when_grading_ends(judged_proxy):
    rollout_id, _, opened = graded_rollout(judged_proxy)
    assert post(judge_url(judged_proxy, rollout_id), opened["api_key"], ASK)[0] == 200  # control: open, it answers
    judged_proxy.client.close_judge(rollout_id)
    assert post(judge_url(judged_proxy, rollout_id), opened["api_key"], ASK)[0] == 403
    with pytest.raises(Exception, match="had its judge already"):
        judged_proxy.client.open_judge(rollout_id)  # nor is it opened again


def test_a_judge_that_is_down_is_named_in_the_close(down_judge_proxy, judged_proxy):
    for proxy, status, failed in ((down_judge_proxy, 502, 1), (judged_proxy, 200, 0)):  # the second: the control
        rollout_id, _, opened = graded_rollout(proxy)
        assert post(judge_url(proxy, rollout_id), opened["api_key"], ASK)[0] == status
        summary = proxy.client.close_judge(rollout_id)
        assert len(summary["failed"]) == failed and summary["calls"] == 1, summary


def test_a_proxy_without_a_judge_opens_none(scripted_proxy):
    rollout_id = f"nojudge-{uuid.uuid4().hex[:8]}"
    scripted_proxy.register(rollout_id)
    scripted_proxy.client.close(rollout_id)
    with pytest.raises(Exception, match="judge_upstream"):
        scripted_proxy.client.open_judge(rollout_id)
    assert post(judge_url(scripted_proxy, rollout_id), "ofj-anything", ASK)[0] == 404


# What the agent's own command does in the judged rollout below: looks for a judge key in every environment it can
# read, and calls the judge route with the agent's key (the harness's, read from its process: the direct harness
# keeps it out of its commands' environment); it writes what it found as its "commit message", which the
# judge then receives, so the test reads it there.
PROBE = r"""python3 - <<'PY'
import glob, json, urllib.error, urllib.request
environs = []
for path in glob.glob("/proc/*/environ"):
    try:
        environs.append(dict(item.split("=", 1) for item in open(path).read().split("\0") if "=" in item))
    except OSError:
        pass
harness = next(env for env in environs if "OPENAI_API_KEY" in env)  # the harness's own: the agent's key
base = harness["OPENAI_BASE_URL"]
root, rollout = base.split("/rollouts/")[0], base.split("/rollouts/")[1].split("/")[0]
request = urllib.request.Request(f"{root}/judge/{rollout}/v1/chat/completions", method="POST",
                                 data=json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(),
                                 headers={"authorization": "Bearer " + harness["OPENAI_API_KEY"],
                                          "content-type": "application/json"})
try:
    status = urllib.request.urlopen(request, timeout=10).status
except urllib.error.HTTPError as err:
    status = err.code
found = sum(name.startswith("OPENFORGE_JUDGE") for env in environs for name in env)
open("/app/commit.txt", "w").write(f"probe: judge route {status}, judge variables {found}\n")
PY"""


def test_a_judged_task_earns_the_judges_score_and_the_agent_never_holds_the_judge(judged_proxy, scripted, judge,
                                                                                  tmp_path, monkeypatch):
    from steps.proxy.client import ProxyClient

    opened = []  # the judge keys the runner was given, caught to try them once grading has ended
    open_judge = ProxyClient.open_judge
    monkeypatch.setattr(ProxyClient, "open_judge", lambda client, rid: opened.append(open_judge(client, rid)) or
                        opened[-1])
    scripted.set_commands([f"echo '{GOOD}' > /app/commit.txt"])
    spec = spec_for(judged_proxy, TASK, "direct", tmp_path)
    before = len(judge.exchanges)
    result = run_rollout(spec)
    verifier_log = (spec.out / "verifier" / "test-stdout.txt").read_text()
    assert (result.status, result.reward) == ("ok", 1.0), (result, verifier_log)  # the verifier's key worked
    assert len(judge.exchanges) == before + 1 and GOOD in json.dumps(judge.exchanges[-1]["request"])
    assert post(judge_url(judged_proxy, result.rollout_id), opened[0]["api_key"], ASK)[0] == 403  # grading ended
    written = b"".join(path.read_bytes() for path in spec.out.rglob("*")  # but the sandbox's sparse disk images
                       if path.is_file() and not path.is_symlink() and path.name != "disk.img")
    assert opened[0]["api_key"].encode() not in written  # in no file the rollout left (result.json, logs)
    assert all(name.encode() not in written for name in JUDGE_ENV.values())

    # The agent: its own key on the judge route while it runs, and every environment it can read.
    scripted.set_commands([PROBE])
    spec = spec_for(judged_proxy, TASK, "direct", tmp_path)
    result = run_rollout(spec)
    asked = json.dumps(judge.exchanges[-1]["request"])
    assert "probe: judge route 404, judge variables 0" in asked, asked  # the verifier asked the judge: it had the key
    assert (result.status, result.reward) == ("ok", 0.0), result  # a message the judge gives no score


def test_a_judge_that_is_down_makes_the_rollout_an_infra_error_not_a_zero(down_judge_proxy, scripted, tmp_path):
    scripted.set_commands([f"echo '{GOOD}' > /app/commit.txt"])
    spec = spec_for(down_judge_proxy, TASK, "direct", tmp_path)
    result = run_rollout(spec)
    assert (result.status, result.reward) == ("infra_error", None), result
    assert "the judge failed while the verifier graded" in result.error and "502" in result.error, result.error
    # (The control, the same rollout with the judge up scoring 1, is the test above.)


def test_a_judges_call_never_becomes_a_training_sample(judged_proxy, scripted, tmp_path):
    scripted.set_commands([f"echo '{GOOD}' > /app/commit.txt"])
    spec = spec_for(judged_proxy, TASK, "direct", tmp_path)
    result = run_rollout(spec)
    assert (result.status, result.reward) == ("ok", 1.0), result
    rollout_id, store = result.rollout_id, judged_proxy.store
    calls, _ = fetch_calls_store(store, [rollout_id])
    rows, _ = collect([result], calls, "run", 0)
    tables = rows.tables()
    assert tables["calls"].num_rows == result.num_calls == len(calls[rollout_id]) >= 2
    assert tables["samples"].num_rows >= 1
    sampled = json.dumps(tables["samples"].to_pylist(), default=str)
    assert "SCORE" not in json.dumps(calls) and JUDGE_CALL not in sampled
    # Control: the judge's call is in the store, apart; read as a rollout's calls it would be one more call, and even
    # then no sample (it is marked untrainable and has no token ids).
    judge_calls, _ = fetch_calls_store(judge_store_url(store), [rollout_id])
    assert len(judge_calls[rollout_id]) == 1 and "SCORE: 10" in json.dumps(judge_calls)
    mixed = {rollout_id: calls[rollout_id] + [{**judge_calls[rollout_id][0], "call_index": result.num_calls}]}
    mixed_tables = collect([result], mixed, "run", 0)[0].tables()
    assert mixed_tables["calls"].num_rows == result.num_calls + 1
    assert mixed_tables["samples"].num_rows == tables["samples"].num_rows


def test_on_argo_only_the_serve_pod_holds_the_judges_key(tmp_path):
    """The judge upstream's key comes from `judge_secret` into the serve container alone; rollout pods (the agent's and
    its verifier's) get none, and no Workflow holds the key itself. Control: the serve pod of a run without a judge
    has no such variable, and a judged dataset without a judge is refused."""
    from workflows.config import ConfigError, load_config
    from workflows.iteration import iteration_workflow

    def judge_env(overrides: list[str]) -> dict[str, list]:
        config = load_config(REPO / "configs" / "cluster-example.yaml", ["run=j", *overrides])
        spec = iteration_workflow(config, 0).to_dict()["spec"]["templates"]
        return {t["name"]: [e for e in (t.get("container") or {}).get("env") or [] if "JUDGE" in e["name"]] +
                [arg for arg in (t.get("container") or {}).get("command") or [] if "judge" in arg]
                for t in spec}

    found = judge_env([f"dataset={TASK.parent}", "judge_upstream=https://judge.example/v1",
                       f"judge_model={JUDGE_MODEL}"])
    assert found.pop("serve") == [{"name": "OPENFORGE_JUDGE_UPSTREAM_API_KEY", "valueFrom": {"secretKeyRef": {
        "key": "api-key", "name": "openforge-judge", "optional": True}}},
        "--judge-upstream", "https://judge.example/v1", "--judge-model", JUDGE_MODEL]
    assert not any(found.values()), found
    assert judge_env([])["serve"] == []
    with pytest.raises(ConfigError, match="asks a judge model"):
        load_config(REPO / "configs" / "cluster-example.yaml", ["run=j", f"dataset={TASK.parent}"])


@pytest.mark.slow  # builds a simulated rollout pod (test_pod_rollout.py): a few seconds
def test_a_judged_task_in_a_pod_earns_the_judges_score(judged_proxy, scripted, judge, tmp_path):
    """Pod mode: the verifier runs as root in the pod once the agent uid's processes are gone, and reaches the judge
    route through the pod's own network with the key the runner gave its environment."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("the simulated pod needs root and util-linux unshare")
    from test_pod_rollout import run_in_pod

    scripted.set_commands([f"echo '{GOOD}' > /app/commit.txt"])
    before = len(judge.exchanges)
    done, result, rollout_id = run_in_pod(judged_proxy, TASK, "direct", tmp_path)
    assert done.returncode == 0 and (result["status"], result["reward"]) == ("ok", 1.0), (result, done.stderr[-2000:])
    assert len(judge.exchanges) == before + 1 and GOOD in json.dumps(judge.exchanges[-1]["request"])
    assert judged_proxy.client.close_judge(rollout_id)["calls"] == 1  # closed by the runner: again is a no-op
    scripted.set_commands([PROBE])  # the agent uid, in the pod: no judge route for its key, no judge variable to read
    done, result, rollout_id = run_in_pod(judged_proxy, TASK, "direct", tmp_path / "probe")
    asked = json.dumps(judge.exchanges[-1]["request"])
    assert "probe: judge route 404, judge variables 0" in asked and result["reward"] == 0.0, (asked, result)


def test_the_option_is_checked_and_check_skips_a_judged_task(tmp_path):
    """`[verifier] judge` takes true or false; `steps.tasks check` skips a judged task (no judge runs there), and
    checks the same task without the option (control: it then runs its verifier, which cannot ask a judge)."""
    from steps.grading.check import BROKEN, SKIPPED, check_task
    from steps.proxy.__main__ import parse_args
    from steps.tasks import load_task
    from steps.tasks.schema import check_config

    assert check_config({"verifier": {"judge": "yes"}}) == "[verifier] judge must be true or false, got 'yes'"
    assert check_config({"verifier": {"judged": True}}) == "unknown field [verifier] judged (did you mean judge?)"
    verdict = check_task(load_task(TASK), tmp_path / "check")
    assert verdict.status == SKIPPED and "judge" in verdict.reason
    plain = tmp_path / "plain"
    shutil.copytree(TASK, plain)
    (plain / "task.toml").write_text((TASK / "task.toml").read_text().replace("judge = true", "judge = false"))
    assert check_task(load_task(plain), tmp_path / "check-plain").status == BROKEN  # no judge to ask: no reward
    with pytest.raises(SystemExit):
        parse_args(["--upstream", "http://127.0.0.1:9", "--port", "1", "--store", str(tmp_path), "--admin-key", "k",
                    "--judge-upstream", "http://127.0.0.1:9"])  # without --judge-model


def test_the_rollout_page_shows_the_judges_calls_apart_from_the_agents(proxy, scripted, judge, tmp_path):
    """A judged rollout in a run's own folders (the proxy's store at the run's `calls`, the rollout in iteration 0's
    results): its report page shows what the verifier asked the judge and the verdict, under the verifier and marked
    never trained on, and the agent's exchange does not hold them. The control: the same run's config without a
    judge shows none."""
    from steps import manifest
    from steps.contracts import layout
    from steps.contracts.config import RunConfig
    from steps.report import write_report

    run = RunConfig(run="judged", store=str(tmp_path), harness="direct", judge_upstream=f"{judge.url}/v1",
                    judge_model=JUDGE_MODEL)
    manifest.write_run_config(run.run_url, run.to_dict())
    served = proxy(scripted.url, store=layout.calls_url(run.run_url),
                   extra=["--model-name", "tiny", "--judge-upstream", f"{judge.url}/v1", "--judge-model", JUDGE_MODEL],
                   env={"OPENFORGE_JUDGE_UPSTREAM_API_KEY": JUDGE_UPSTREAM_KEY})
    scripted.set_commands([f"echo '{GOOD}' > /app/commit.txt"])
    spec = spec_for(served, TASK, "direct", tmp_path)
    spec = dataclasses.replace(spec, out=Path(layout.rollout_url(run.run_url, 0, spec.rollout_id)))
    result = run_rollout(spec)
    assert (result.status, result.reward) == ("ok", 1.0), result

    def page() -> str:
        index = Path(write_report(run.run_url))
        (path,) = index.parent.glob(f"rollouts/train-0/*{spec.rollout_id}*.html")
        return path.read_text()

    shown = page()
    verifier = shown.split('<h2 id="verifier">')[1].split('<h2 id="log">')[0]
    judged = verifier.split('<div class="judge">')[1].split("</div></div>")[0]  # its one call's div, then its own
    exchange = shown.split('<h2 id="exchange">')[1].split('<h2 id="training">')[0]
    assert "Judge calls (1): asked by the verifier, never trained on" in judged
    assert VERDICT.split("\n")[1] in judged and GOOD in judged and "not trained on" in judged
    assert "SCORE: 10" not in exchange and 'class="judge"' not in exchange
    manifest.write_run_config(run.run_url, {**run.to_dict(), "judge_upstream": "", "judge_model": ""})
    (Path(run.run_url) / "reports" / "written.json").unlink()  # the pages are written again
    assert 'class="judge"' not in page()
