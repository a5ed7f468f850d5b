"""Two real vLLM servers on CPU behind one recording proxy: rollout affinity, a weight swap on both, a replica killed.

    .venv/bin/python -m pytest -q tests/test_replicas.py      # ~3 min on 2 cores: two vLLM starts, side by side

One module fixture runs the serve step itself, `python -m steps.serve --replicas 2` (both vLLMs started at
once, each on its own core), and every test here shares its two vLLM servers: through the serve step's own
proxy, or through further proxies in front of the same servers, which are cheap to start. The test that kills
a replica runs last. The offline tests (command lines, the Argo template) need no vLLM.
"""

import asyncio
import doctest
import importlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

ADMIN_KEY, MODEL_NAME = "test-admin-key", "tiny"  # as tests/conftest.py (a data folder has a conftest.py too)
from held_relay import HeldRelay
from proxy_process import ProxyProcess, stop_proxy
from steps import serve
from steps.net import free_port
from steps.proxy.__main__ import parse_args as proxy_args
from steps.proxy.client import ProxyClient, ProxyClientError
from steps.tiny_model import build_tiny_model
from workflows import commands
from steps.contracts.config import RunConfig
from workflows.iteration import serve_template

vllm = pytest.mark.vllm
LONG = 8000  # tokens of a call that is still generating seconds later (the tiny model makes ~600 a second)
LONG_HELD = 400  # tokens of a call whose answer a relay holds: it stays in flight until released
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Served:
    """The serve step running: its proxy (a `ProxyProcess` whose process is the serve step) and its replicas' URLs."""

    proxy: ProxyProcess
    replica_urls: list[str]


@pytest.fixture(scope="module")
def replicas(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`python -m steps.serve --replicas 2` on `tiny_model`, greedy (`top_k=1`), weight version 0."""
    folder = tmp_path_factory.mktemp("replicas")
    port, log = free_port(), folder / "serve.log"
    argv = [sys.executable, "-m", "steps.serve", "--model", str(tiny_model), "--model-name", MODEL_NAME,
            "--port", str(port), "--store", str(folder / "calls"), "--replicas", "2", "--weight-version", "0",
            "--log", str(folder / "vllm.log"), "--sampling", "top_k=1"]
    with open(log, "ab") as out:
        process = subprocess.Popen(argv, cwd=REPO, env={**os.environ, "OPENFORGE_ADMIN_KEY": ADMIN_KEY},
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    running = ProxyProcess(process, port, ADMIN_KEY, log, store=str(folder / "calls"))
    try:
        deadline = time.monotonic() + 900
        while not _answers(running):
            assert process.poll() is None and time.monotonic() < deadline, f"serve did not start:\n{running.log_tail()}"
            time.sleep(1)
        urls = re.search(r"serve: vLLM ready on (\S+), (\S+); proxy", log.read_text())
        assert (folder / "vllm.log").exists() and (folder / "vllm-1.log").exists()  # one log per replica
        yield Served(running, [urls[1], urls[2]])
    finally:
        stop_proxy(running, grace_s=60)  # SIGTERM: the serve step stops both vLLMs


def _answers(proxy: ProxyProcess) -> bool:
    try:
        ProxyClient(proxy.url, ADMIN_KEY, timeout_s=2, retries=0).health()
        return True
    except ProxyClientError:
        return False


def served(proxy, replicas: Served, policy: str = "affinity", urls: list[str] | None = None) -> ProxyProcess:
    """A further proxy in front of both replicas (no --sampling: the tests' temperature 0 reaches vLLM); `urls`
    reach them another way (through a relay)."""
    first, *others = urls or replicas.replica_urls
    return proxy(first, extra=[*(w for url in others for w in ("--upstream", url)), "--replica-policy", policy])


def until(proxy: ProxyProcess, seen, timeout_s: float = 60.0) -> None:
    """Waits until the proxy's /health satisfies `seen`."""
    deadline = time.monotonic() + timeout_s
    while not seen(proxy.client.health()):
        assert time.monotonic() < deadline, proxy.client.health()
        time.sleep(0.05)


def kill_replica(replicas: Served, index: int) -> None:
    """SIGKILLs replica `index`'s vLLM (its API server's process group: the engine core too)."""
    port = replicas.replica_urls[index].rsplit(":", 1)[1]
    for child in psutil.Process(replicas.proxy.process.pid).children():
        if "vllm.entrypoints.openai.api_server" in child.cmdline() and port in child.cmdline():
            os.killpg(child.pid, signal.SIGKILL)
            return
    raise AssertionError(f"no vLLM on port {port} under the serve step")


def chat(rollout: dict, messages: list[dict], max_tokens: int = 8, headers: dict | None = None,
         **fields) -> httpx.Response:
    """One greedy chat call of `rollout` through the proxy."""
    body = {"model": MODEL_NAME, "messages": messages, "max_tokens": max_tokens, "temperature": 0, **fields}
    return httpx.post(f"{rollout['openai_base_url']}/chat/completions", json=body, timeout=300,
                      headers={"authorization": f"Bearer {rollout['api_key']}", **(headers or {})})


def multi_turn(rollout: dict, turns: int, task: str) -> list[str]:
    """A rollout of `turns` calls whose context grows by appending, as an agent's does; its answers."""
    messages, answers = [{"role": "user", "content": f"{task}: read the file and fix the failing test"}], []
    for turn in range(turns):
        answer = chat(rollout, messages)
        assert answer.status_code == 200, answer.text
        answers.append(answer.json()["choices"][0]["message"]["content"] or "")
        messages += [{"role": "assistant", "content": answers[-1]}, {"role": "user", "content": f"go on ({turn})"}]
    return answers


def replicas_of(proxy, rollout_ids: list[str]) -> dict[str, list[int]]:
    """Each rollout's recorded calls' replicas, in call order."""
    return {rollout_id: [call["replica"] for call in proxy.calls(rollout_id)] for rollout_id in rollout_ids}


@vllm
def test_each_rollouts_calls_stay_on_one_replica_and_rollouts_spread_over_both(replicas, proxy):
    front = replicas.proxy  # the serve step's own
    ids = [f"affine-{i}" for i in range(4)]
    for rollout_id in ids:
        multi_turn(front.register(rollout_id), 3, rollout_id)
    seen = replicas_of(front, ids)
    assert all(len(set(used)) == 1 and len(used) == 3 for used in seen.values()), seen
    assert sorted(used[0] for used in seen.values()) == [0, 0, 1, 1], seen  # the least loaded: 2 rollouts each
    assert [(r["replica"], r["state"], r["rollouts"]) for r in front.client.request("GET", "/replicas")["replicas"]] \
        == [(0, "live", 2), (1, "live", 2)]
    health = front.client.health()
    assert (health["replicas"], health["replicas_live"]) == (2, 2) and "rollouts" not in str(health)
    for rollout_id in ids:  # a closed rollout counts no more: the next one goes where it left room
        front.client.close(rollout_id)
    assert [r["rollouts"] for r in front.client.request("GET", "/replicas")["replicas"]] == [0, 0]
    # Control: round robin, the benchmark's baseline, scatters each rollout's calls over both replicas.
    scattered = served(proxy, replicas, policy="round-robin")
    for rollout_id in ids:
        multi_turn(scattered.register(rollout_id), 3, rollout_id)
    assert any(len(set(used)) > 1 for used in replicas_of(scattered, ids).values())


@vllm
def test_nothing_in_a_request_chooses_or_names_the_replica(replicas, proxy):
    front = served(proxy, replicas)
    first, second = front.register("pinned-0"), front.register("pinned-1")  # replicas 0 and 1
    messages = [{"role": "user", "content": "which replica?"}]
    for rollout, other in ((first, 1), (second, 0)):
        url = replicas.replica_urls[other]
        asked = {"x-openforge-replica": str(other), "x-replica": str(other), "x-upstream": url}
        answer = chat(rollout, messages, headers=asked, replica=other, upstream=url)
        assert answer.status_code == 200, answer.text
        assert "replica" not in answer.json() and url not in answer.text
    # Control: the two rollouts are on different replicas, so a request that could choose would have moved one.
    assert replicas_of(front, ["pinned-0", "pinned-1"]) == {"pinned-0": [0], "pinned-1": [1]}


@vllm
def test_a_weight_swap_reaches_both_replicas_before_any_call_resumes(replicas, tmp_path):
    other = build_tiny_model(tmp_path / "tiny-seed-1", seed=1)
    front = replicas.proxy  # the serve step's own: greedy through its forced top_k=1
    on = [front.register(f"swap-{i}") for i in range(2)]  # one on each replica
    prompt = [{"role": "user", "content": "name a colour"}]
    before = [chat(rollout, prompt).json()["choices"][0]["message"]["content"] for rollout in on]
    assert before[0] == before[1]  # the same weights on both: the same greedy answer
    front.client.update_weights(str(other), "1")
    after = [chat(rollout, prompt).json()["choices"][0]["message"]["content"] for rollout in on]
    assert after[0] == after[1] and after[0] != before[0], (before, after)
    calls = [front.calls(f"swap-{i}") for i in range(2)]
    assert [[(c["replica"], c["weight_version"]) for c in rollout] for rollout in calls] == \
        [[(0, "0"), (0, "1")], [(1, "0"), (1, "1")]]
    assert [r["weight_version"] for r in front.client.request("GET", "/replicas")["replicas"]] == ["1", "1"]
    for rollout in on:
        front.client.close(rollout["rollout_id"])


@vllm
def test_a_call_held_by_a_swap_is_served_only_once_every_replica_has_the_new_weights(replicas, proxy, tiny_model):
    """Replica 1's answer is held in a relay until the held call has reached the proxy: the long call is still in
    flight then however fast the tiny model generates (it once ended 4 ms before the held call came in)."""
    outcome: dict = {}
    with HeldRelay(replicas.replica_urls[1]) as relay:
        front = served(proxy, replicas, urls=[replicas.replica_urls[0], relay.url])  # after the swap above: "1"
        held_on, long_on = front.register("held-0"), front.register("held-1")  # replicas 0 and 1
        relay.hold()
        long_call = threading.Thread(target=lambda: outcome.update(long=chat(
            long_on, [{"role": "user", "content": "go on"}], max_tokens=LONG_HELD, ignore_eos=True)))
        long_call.start()
        until(front, lambda health: health["in_flight"] == 1)  # generating on replica 1, its answer held
        swap = threading.Thread(target=lambda: outcome.update(swap=front.client.update_weights(str(tiny_model), "2")))
        swap.start()
        until(front, lambda health: health["paused"])  # replica 1 still answers the long call, replica 0 is idle
        held_call = threading.Thread(target=lambda: outcome.update(held=chat(
            held_on, [{"role": "user", "content": "name a colour"}])))
        held_call.start()
        until(front, lambda health: health["held"] == 1 and health["in_flight"] == 1)  # waiting at the gate
        relay.release()
        for thread in (held_call, swap, long_call):
            thread.join(300)
    assert outcome["held"].status_code == outcome["long"].status_code == 200
    assert outcome["swap"]["weight_version"] == "2"
    (long,), (waited,) = front.calls("held-1"), front.calls("held-0")
    assert (long["replica"], long["weight_version"], waited["replica"], waited["weight_version"]) == (1, "1", 0, "2")
    # The held call reached replica 0 only after the call in flight on replica 1 ended and both had reloaded.
    held_at, ended_at = waited["timings"], long["timings"]["upstream_ended_at"]
    assert held_at["received_at"] < ended_at <= held_at["upstream_started_at"]


@vllm
def test_a_replica_killed_mid_run_moves_its_rollouts_and_every_call_is_recorded(replicas, proxy):
    """Runs last: it kills replica 1."""
    front = served(proxy, replicas)
    rollouts = [front.register(f"survive-{i}") for i in range(4)]  # 0 and 2 on replica 0, 1 and 3 on replica 1
    for index, rollout in enumerate(rollouts):
        multi_turn(rollout, 1, f"survive-{index}")
    outcome = {}
    long_call = threading.Thread(target=lambda: outcome.update(answer=chat(
        rollouts[1], [{"role": "user", "content": "go on"}], max_tokens=LONG, ignore_eos=True)))
    long_call.start()
    until(front, lambda health: health["in_flight"] == 1)
    time.sleep(0.5)  # generating on replica 1
    kill_replica(replicas, 1)
    long_call.join(120)
    in_flight = outcome["answer"]
    assert in_flight.status_code == 502 and in_flight.json()["error"]["type"] == "server_error"
    assert replicas.replica_urls[1] not in in_flight.text  # never where vLLM listens (`replicas.unnamed`)
    # The run goes on: every rollout's next calls are answered, those of replica 1's rollouts by replica 0.
    for index, rollout in enumerate(rollouts):
        multi_turn(rollout, 2, f"survive-{index}")
    seen = replicas_of(front, [rollout["rollout_id"] for rollout in rollouts])
    assert seen == {"survive-0": [0, 0, 0], "survive-1": [1, 1, 0, 0], "survive-2": [0, 0, 0], "survive-3": [1, 0, 0]}
    recorded = [(c["call_index"], c["status"]) for c in front.calls("survive-1")]
    assert recorded == [(0, "ok"), (1, "error"), (2, "ok"), (3, "ok")]  # the failed call too: nothing is lost
    state = {r["replica"]: r["state"] for r in front.client.request("GET", "/replicas")["replicas"]}
    assert state == {0: "live", 1: "dead"} and front.client.health()["replicas_live"] == 1


def test_the_run_config_serves_r_replicas_in_one_pod_with_their_gpus():
    config = RunConfig(serve_replicas=2, serve_gpus=2)
    argv = commands.serve(config, "s3://b/ckpt", "s3://b/calls", 0)
    args = serve.parse_args(argv[3:])
    assert (args.replicas, args.gpus) == (2, 2)
    proxy = proxy_args([*serve.proxy_argv(args, [8001, 8002]), "--admin-key", "k"])
    assert proxy.upstreams == ("http://127.0.0.1:8001", "http://127.0.0.1:8002") and proxy.replica_policy == "affinity"
    assert "--replicas" not in commands.serve(RunConfig(), "m", "c", 0)  # one replica: the command as before
    requests = serve_template(config, 0).resources.requests
    # 2 replicas x 2 GPUs, all in the one serve pod
    assert (requests["nvidia.com/gpu"].root, requests["cpu"].root) == ("4", "8")


@pytest.mark.parametrize("argv, said", [
    (["--replicas", "0"], "--replicas takes a number >= 1"),
    (["--replicas", "2", "--upstream", "http://10.0.0.5:8000"], "--replicas takes a number >= 1"),
])
def test_a_bad_replica_count_is_one_sentence(argv, said, capsys):
    base = ["--model-name", "m", "--port", "1", "--store", "s"]
    with pytest.raises(SystemExit) as exited:
        serve.parse_args([*base, *(["--model", "m"] if "--upstream" not in argv else []), *argv])
    assert exited.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize("extra, said", [
    (["--upstream", "http://127.0.0.1:1"], "each --upstream must be a different server"),
    (["--upstream", "http://127.0.0.1:2", "--external-upstream"], "--external-upstream takes one --upstream"),
    (["--replica-policy", "random"], "--replica-policy"),
])
def test_the_proxy_refuses_replicas_it_could_not_serve_in_one_sentence(extra, said, capsys):
    with pytest.raises(SystemExit):
        proxy_args(["--upstream", "http://127.0.0.1:1", "--port", "1", "--store", "s", "--admin-key", "k", *extra])
    assert said in capsys.readouterr().err


def test_the_least_loaded_replica_is_given_and_a_dead_ones_rollouts_move_but_the_last_live_one_stays():
    """Two replicas on ports where nothing listens: what `/health` finds of a dead vLLM."""
    from steps.proxy.replicas import ROUND_ROBIN, Replicas
    from steps.proxy.sessions import Rollout
    from steps.proxy.upstream import Upstream

    async def check() -> None:
        upstreams = [Upstream(f"http://127.0.0.1:{free_port()}") for _ in range(2)]
        for upstream in upstreams:
            await upstream.start()
        chosen = Replicas(upstreams, "0")
        rollouts = [Rollout(f"r-{i}", "digest", {}, created_at=0.0) for i in range(3)]
        assert [chosen.assign(rollout, "0").index for rollout in rollouts] == [0, 1, 0]
        chosen.release(rollouts[0])
        chosen.release(rollouts[0])  # again: nothing more
        assert [r.rollouts for r in chosen.all] == [1, 1] and chosen.pick(rollouts[1], "0").index == 1
        assert await chosen.leave_out_if_dead(chosen.all[1])  # no /health answer, and replica 0 is live
        assert chosen.pick(rollouts[1], "0").index == 0 and [r.rollouts for r in chosen.all] == [2, 0]  # moved
        assert not await chosen.leave_out_if_dead(chosen.all[0])  # the last live one is never left out
        assert [r.state for r in chosen.all] == ["live", "dead"]
        turns = Replicas(upstreams, "0", policy=ROUND_ROBIN)
        assert [turns.pick(rollouts[2], "0").index for _ in range(4)] == [0, 1, 0, 1]  # the control: no affinity
        for upstream in upstreams:
            await upstream.close()

    asyncio.run(check())


@pytest.mark.parametrize("module", ["steps.proxy.replicas", "steps.serve"])
def test_doctests(module):
    failures, tried = doctest.testmod(importlib.import_module(module))
    assert tried > 0 and failures == 0


# Offline: the proxy's own replica rule and swap against `FakeVllm` servers (tests/fake_vllm.py says why a double).

def _offline(check, count: int = 2, **upstream) -> None:
    """Runs `check(fakes, replicas, gate)` on `count` started fake vLLMs behind a `Replicas` at version "0"."""
    from fake_vllm import FakeVllm
    from steps.proxy.replicas import Replicas
    from steps.proxy.sessions import WeightGate
    from steps.proxy.upstream import Upstream

    async def run() -> None:
        fakes = [FakeVllm() for _ in range(count)]
        upstreams = [Upstream(fake.url, connect_retries=0, **upstream) for fake in fakes]
        for fake, client in zip(fakes, upstreams):
            await fake.start()
            await client.start()
        try:
            await check(fakes, Replicas(upstreams, "0"), WeightGate("0"))
        finally:
            for fake, client in zip(fakes, upstreams):
                await client.close()
                await fake.stop()

    asyncio.run(run())


def _rollout(name: str):
    from steps.proxy.sessions import Rollout
    return Rollout(name, "digest", {}, created_at=0.0)


async def _call(replicas, gate, rollout) -> tuple[dict, str]:
    """One call as `serving._complete` makes it: (its record, the weights that answered)."""
    record: dict = {}
    async with gate.call() as version:
        answer = await replicas.complete(rollout, {"messages": [{"role": "user", "content": "hi"}]}, record, version)
    return record, answer.content


def test_a_replica_left_out_during_a_swap_never_serves_the_old_weights_stamped_as_the_new():
    """The swap in which replica 0 reloads and is then found dead, while replica 1's reload fails: with nothing
    holding the new weights, a call gets a 503 naming the version, never replica 1's old weights stamped new."""
    from steps.proxy.errors import ProxyError
    from steps.proxy.weights import swap_weights

    async def check(fakes, replicas, gate) -> None:
        first, second = _rollout("r-0"), _rollout("r-1")
        replicas.assign(first, "0"), replicas.assign(second, "0")
        fakes[1].fail_at = "reload_weights"
        died = asyncio.Event()
        fakes[0].on_stage = lambda stage: died.set() if stage == "update_weight_version" else None

        async def die() -> None:  # what the watch does when replica 0 dies once it has reloaded
            await died.wait()
            await fakes[0].stop()
            assert await replicas.leave_out_if_dead(replicas.all[0])

        with pytest.raises(ProxyError) as failed:
            await asyncio.gather(swap_weights(gate, replicas, "ckpt-1", "1"), die())
        assert failed.value.status == 502 and "replica 1 at reload_weights" in failed.value.message
        assert [(r.state, r.weight_version) for r in replicas.all] == [("dead", "1"), ("failed", None)]
        for rollout in (first, second):
            with pytest.raises(ProxyError) as refused:
                await _call(replicas, gate, rollout)
            assert refused.value.status == 503 and "no replica serves weight version '0'" in refused.value.message
        assert "/v1/chat/completions" not in fakes[1].seen

    _offline(check)


def test_a_swap_stage_that_fails_after_the_load_leaves_that_replica_out_and_says_where():
    """Replica 0 loads the new weights and then fails to reset its prefix cache; replica 2's reload times out
    (vLLM may finish it later). Both are left out with their stage named, the call goes to replica 1 on the new
    weights, stamped with them; the next swap reloads both again and they serve."""
    from steps.proxy.weights import swap_weights

    async def check(fakes, replicas, gate) -> None:
        rollouts = [_rollout(f"r-{i}") for i in range(3)]
        assert [replicas.assign(rollout, "0").index for rollout in rollouts] == [0, 1, 2]
        fakes[0].fail_at, fakes[2].stage_delay_s = "reset_prefix_cache", {"reload_weights": 2.0}
        failures = [failure.info() for failure in await swap_weights(gate, replicas, "ckpt-1", "1")]
        assert [(f["replica"], f["stage"]) for f in failures] == [(0, "reset_prefix_cache"), (2, "reload_weights")]
        assert "127.0.0.1" not in str(failures) and gate.version == "1"
        states = [(r.state, r.weight_version) for r in replicas.all]
        assert states == [("failed", None), ("live", "1"), ("failed", None)]
        record, weights = await _call(replicas, gate, rollouts[0])
        assert (record["replica"], record["weight_version"], weights) == (1, "1", "weights ckpt-1")
        fakes[0].fail_at, fakes[2].stage_delay_s = None, {}
        assert await swap_weights(gate, replicas, "ckpt-2", "2") == []  # the failed ones are tried again
        assert [(r.state, r.weight_version) for r in replicas.all] == [("live", "2")] * 3
        record, weights = await _call(replicas, gate, rollouts[2])
        assert (record["replica"], record["weight_version"], weights) == (2, "2", "weights ckpt-2")

    _offline(check, count=3, timeout_s=0.5)


def test_a_swap_failing_on_every_replica_after_the_load_serves_nothing_stamped_old():
    """Both replicas load, then fail their version update: the swap's 502 names both, and no call is answered by
    weights that may be the new ones under the old version."""
    from steps.proxy.errors import ProxyError
    from steps.proxy.weights import swap_weights

    async def check(fakes, replicas, gate) -> None:
        for fake in fakes:
            fake.fail_at = "update_weight_version"
        with pytest.raises(ProxyError) as failed:
            await swap_weights(gate, replicas, "ckpt-1", "1")
        said = failed.value.message
        assert "replica 0 at update_weight_version" in said and "replica 1 at update_weight_version" in said
        with pytest.raises(ProxyError) as refused:
            await _call(replicas, gate, _rollout("r"))
        assert refused.value.status == 503 and gate.version == "0"

    _offline(check)


def test_a_swap_with_one_replica_dead_reloads_the_others_and_the_dead_one_stays_out():
    async def check(fakes, replicas, gate) -> None:
        from steps.proxy.weights import swap_weights
        await fakes[1].stop()
        assert await replicas.leave_out_if_dead(replicas.all[1])  # refused: dead at once
        assert await swap_weights(gate, replicas, "ckpt-1", "1") == []
        assert (replicas.all[0].state, replicas.all[0].weight_version, replicas.all[1].state) == ("live", "1", "dead")
        record, weights = await _call(replicas, gate, _rollout("r"))
        assert (record["replica"], weights) == (0, "weights ckpt-1")

    _offline(check)


def test_a_call_that_never_reached_a_dead_replica_is_served_by_another_at_once():
    """The rollout's replica refuses the connection: the call is not the harness's 502, it moves to replica 0."""
    async def check(fakes, replicas, gate) -> None:
        rollouts = [_rollout("r-0"), _rollout("r-1")]
        assert [replicas.assign(rollout, "0").index for rollout in rollouts] == [0, 1]
        await fakes[1].stop()
        record, weights = await _call(replicas, gate, rollouts[1])
        assert (record["replica"], weights) == (0, "weights 0") and replicas.all[1].state == "dead"
        assert rollouts[1].replica == 0 and [r.rollouts for r in replicas.all] == [2, 0]

    _offline(check)


def test_the_last_live_replica_is_kept_when_it_dies_and_served_again_when_it_answers():
    from steps.proxy.errors import ProxyError

    async def check(fakes, replicas, gate) -> None:
        await fakes[1].stop()
        assert await replicas.leave_out_if_dead(replicas.all[1])
        await fakes[0].stop()
        with pytest.raises(ProxyError) as failed:
            await _call(replicas, gate, _rollout("r"))
        assert failed.value.status == 502 and "replica 0" in failed.value.message
        assert fakes[0].url not in failed.value.message and replicas.all[0].state == "live"
        await fakes[0].start()  # a vLLM answering on its port again
        assert (await _call(replicas, gate, _rollout("s")))[0]["replica"] == 0

    _offline(check)


def test_the_health_poller_leaves_out_a_replica_only_after_failures_over_a_span(monkeypatch):
    """One slow /health is not a death; several in a row over DEAD_SPAN_S are, and the watch finds them."""
    from steps.proxy import replicas as rule
    monkeypatch.setattr(rule, "HEALTH_TIMEOUT_S", 0.1)
    monkeypatch.setattr(rule, "WATCH_S", 0.05)
    monkeypatch.setattr(rule, "DEAD_SPAN_S", 0.4)

    async def check(fakes, replicas, gate) -> None:
        fakes[1].health_delay_s = 0.3
        assert not await replicas.leave_out_if_dead(replicas.all[1]) and replicas.all[1].state == "live"
        fakes[1].health_delay_s = 0.0
        assert not await replicas.leave_out_if_dead(replicas.all[1]) and replicas.all[1].health_failures == []
        fakes[1].health_delay_s = 0.3
        watch = asyncio.create_task(replicas.watch())
        started = time.monotonic()
        while replicas.all[1].state == "live" and time.monotonic() - started < 10:
            await asyncio.sleep(0.05)
        watch.cancel()
        assert replicas.all[1].state == "dead" and re.search(r"failed \d+ times in a row", replicas.all[1].reason)
        assert time.monotonic() - started >= 0.4 and replicas.all[0].state == "live"

    _offline(check)


def test_a_rollout_closed_or_idle_stops_counting_on_its_replica(monkeypatch):
    """Closing releases at once; a rollout whose runner died without closing stops counting after IDLE_S (and
    counts again at its next call, on the same replica)."""
    from steps.proxy import replicas as rule

    async def check(fakes, replicas, gate) -> None:
        closed, idle = _rollout("closed"), _rollout("idle")
        assert [replicas.assign(r, "0").index for r in (closed, idle)] == [0, 1]
        replicas.release(closed)
        assert [r.rollouts for r in replicas.all] == [0, 1]
        monkeypatch.setattr(rule, "IDLE_S", 0.05)
        await asyncio.sleep(0.1)
        assert replicas.assign(_rollout("new"), "0").index == 0 and [r.rollouts for r in replicas.all] == [1, 0]
        assert replicas.assign(_rollout("next"), "0").index == 1  # idle's replica holds none now: counted nowhere
        monkeypatch.setattr(rule, "IDLE_S", 900.0)
        assert (await _call(replicas, gate, idle))[0]["replica"] == 1 and replicas.all[1].rollouts == 2

    _offline(check)


def _process(code: str, tmp_path: Path, index: int):
    """A process in its own session standing in for a vLLM replica (only its start and stop are tested here)."""
    from steps.vllm_server import VllmServer
    process = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    return VllmServer(process, tmp_path, MODEL_NAME, free_port(), tmp_path / f"vllm-{index}.log")


def test_a_replica_crashing_at_start_up_is_noticed_while_the_others_still_start(tmp_path):
    """Replica 1 exits at once while replica 0 never answers: the wait ends in seconds, naming replica 1."""
    slow = _process("import time; time.sleep(60)", tmp_path, 0)
    crashed = _process("raise SystemExit(3)", tmp_path, 1)
    started = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match="vLLM replica 1 exited with code 3 while starting"):
            serve.wait_all_healthy([slow, crashed], timeout_s=120)
        assert time.monotonic() - started < 10
    finally:
        serve.stop_all([slow, crashed], grace_s=1)


def test_the_replicas_stop_together_and_a_second_sigterm_orphans_none(tmp_path):
    """Two replicas that ignore SIGTERM take one grace period together, not one each; a SIGTERM to the serve
    step during the stop does not end it before every replica is gone."""
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    servers = [_process(stubborn, tmp_path, index) for index in range(2)]
    time.sleep(0.5)  # both have set their handler
    before = signal.getsignal(signal.SIGTERM)
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    signal.signal(signal.SIGTERM, serve._exit_on_signal)
    started = time.monotonic()
    try:
        serve.stop_all(servers, grace_s=2)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert 2 <= time.monotonic() - started < 3.5
    assert all(server.process.returncode is not None for server in servers)


def test_fewer_gpus_than_the_replicas_need_is_refused_in_one_sentence(monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    monkeypatch.setattr(serve, "fetch", lambda *args, **kwargs: "model")
    code = serve.main(["--model", "m", "--model-name", "m", "--port", "1", "--store", "s", "--device", "gpu",
                       "--replicas", "2", "--gpus", "2"])
    err = capsys.readouterr().err
    assert code == 1 and "needs 4 GPUs, but this pod sees 3 (0,1,2)" in err and err.count("\n") == 1


def test_replicas_with_an_upstream_are_refused_in_one_sentence():
    from steps.settings import ConfigError
    from workflows.config import validate
    with pytest.raises(ConfigError, match="config key 'serve_replicas' starts vLLM servers, but 'upstream'"):
        validate(RunConfig(serve_replicas=2, upstream="http://10.0.0.5:8000"), check_dataset=False)
    validate(RunConfig(serve_replicas=1, upstream="http://10.0.0.5:8000"), check_dataset=False)  # the control


def test_a_call_held_by_a_swap_starts_only_once_the_slowest_replica_has_reloaded():
    """Replica 1 reloads slowly: the call of its rollout that arrives during the swap starts after that reload
    (and replica 0's) has ended, and is answered by the new weights."""
    from steps.proxy.weights import swap_weights

    async def check(fakes, replicas, gate) -> None:
        rollouts = [_rollout("r-0"), _rollout("r-1")]
        assert [replicas.assign(rollout, "0").index for rollout in rollouts] == [0, 1]
        done: dict[tuple[int, str], float] = {}
        for index, fake in enumerate(fakes):
            fake.on_stage = lambda stage, index=index: done.setdefault((index, stage), time.monotonic())
        fakes[1].stage_delay_s = {"reload_weights": 0.5}
        swap = asyncio.create_task(swap_weights(gate, replicas, "ckpt-1", "1"))
        while not gate.paused:
            await asyncio.sleep(0.01)
        record, weights = await _call(replicas, gate, rollouts[1])
        await swap
        assert (record["replica"], record["weight_version"], weights) == (1, "1", "weights ckpt-1")
        assert max(done[(i, "update_weight_version")] for i in (0, 1)) <= fakes[1].called_at[0]
        assert done[(1, "reload_weights")] - done[(0, "reload_weights")] >= 0.4  # the control: replica 1 was slow

    _offline(check)


def test_calls_running_to_the_timeout_in_a_row_leave_a_hung_replica_out():
    """Replica 1's engine hangs while its /health answers: after 3 calls in a row end in 504 it is out, and the
    rollout's next call is answered by replica 0; two 504s and an answer (the control) leave it live."""
    from steps.proxy.errors import ProxyError

    async def check(fakes, replicas, gate) -> None:
        rollouts = [_rollout("r-0"), _rollout("r-1")]
        assert [replicas.assign(rollout, "0").index for rollout in rollouts] == [0, 1]
        fakes[1].call_delay_s = 1.0
        for expected in (504, 504):
            with pytest.raises(ProxyError) as failed:
                await _call(replicas, gate, rollouts[1])
            assert failed.value.status == expected
        fakes[1].call_delay_s = 0.0
        assert (await _call(replicas, gate, rollouts[1]))[0]["replica"] == 1 and replicas.all[1].timeouts == 0
        fakes[1].call_delay_s = 1.0
        for _ in range(3):
            with pytest.raises(ProxyError):
                await _call(replicas, gate, rollouts[1])
        assert replicas.all[1].state == "dead" and "3 calls in a row" in replicas.all[1].reason
        assert (await _call(replicas, gate, rollouts[1]))[0]["replica"] == 0

    _offline(check, timeout_s=0.3)


def test_replicas_on_different_weight_versions_are_refused_at_start_up():
    from steps.proxy.weights import initial_version

    async def check(fakes, replicas, gate) -> None:
        upstreams = [replica.upstream for replica in replicas.all]
        assert await initial_version(upstreams, None) == "0"  # the control: they agree
        fakes[1].version = "7"
        with pytest.raises(ValueError, match=r"the replicas serve different weight versions \(0, 7\)"):
            await initial_version(upstreams, None)
        assert await initial_version(upstreams, "3") == "3"

    _offline(check)


def test_the_model_list_asks_a_live_replica_and_resume_never_relabels_several(tmp_path):
    """The proxy app in process in front of two fake vLLMs (tests/fake_vllm.py): replica 0 dead, `/v1/models`
    still answers from replica 1; `/weights/resume` with a version is refused with several replicas."""
    from fake_vllm import FakeVllm
    from steps.proxy.app import create_app
    from steps.proxy.config import ProxyConfig

    async def check() -> None:
        fakes = [FakeVllm(), FakeVllm()]
        for fake in fakes:
            await fake.start()
        app = create_app(ProxyConfig(upstream=fakes[0].url, replicas=(fakes[1].url,), store=str(tmp_path / "calls"),
                                     admin_key=ADMIN_KEY, weight_version="0"))
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        async with app.app.router.lifespan_context(app.app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://proxy") as client:
            rollout = (await client.post("/rollouts", json={"rollout_id": "r"}, headers=admin)).json()
            await fakes[0].stop()
            assert await app.app.state.replicas.leave_out_if_dead(app.app.state.replicas.all[0])
            key = {"authorization": f"Bearer {rollout['api_key']}"}
            models = await client.get("/rollouts/r/v1/models", headers=key)
            assert models.status_code == 200 and models.json()["data"][0]["id"] == "tiny"
            refused = await client.post("/weights/resume", json={"weight_version": "5"}, headers=admin)
            assert refused.status_code == 400 and "POST /weights/update" in refused.text
            assert (await client.get("/health")).json()["weight_version"] == "0"
        await fakes[1].stop()

    asyncio.run(check())
