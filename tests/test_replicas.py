"""Two real vLLM servers on CPU behind one recording proxy: rollout affinity, a weight swap on both, a replica killed.

    .venv/bin/python -m pytest -q tests/test_replicas.py      # ~3 min on 2 cores: two vLLM starts, side by side

One module fixture starts both vLLMs at once (each on its own core: `steps.vllm_server.replica_env`) and
every test here shares them; the proxies in front of them are cheap and started per test. The test that
kills a replica runs last.
"""

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conftest import ADMIN_KEY, MODEL_NAME
from steps.net import free_port
from steps.tiny_model import build_tiny_model
from steps.vllm_server import VllmServer, replica_env, spawn, stop_vllm, vllm_command, wait_healthy
from vllm_process import warm_up_call

pytestmark = pytest.mark.vllm
REPLICAS = 2


@pytest.fixture(scope="module")
def replicas(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[VllmServer]]:
    """Two vLLM servers on `tiny_model`, started side by side as `steps.serve --replicas 2` starts them."""
    folder = tmp_path_factory.mktemp("replicas")
    servers: list[VllmServer] = []
    try:
        for index in range(REPLICAS):
            port = free_port()
            servers.append(spawn(vllm_command(tiny_model, MODEL_NAME, port), tiny_model, MODEL_NAME, port,
                                 folder / f"vllm-{index}.log", env=replica_env(index, REPLICAS, "cpu")))
        for server in servers:
            wait_healthy(server, 600)
            warm_up_call(server)
        yield servers
    finally:
        for server in servers:
            stop_vllm(server)


def served(proxy, replicas: list[VllmServer], policy: str = "affinity"):
    """A proxy in front of every replica (no --sampling: the tests' temperature 0 reaches vLLM)."""
    extra = [word for server in replicas[1:] for word in ("--upstream", server.base_url)]
    return proxy(replicas[0].base_url, extra=[*extra, "--replica-policy", policy])


def chat(rollout: dict, messages: list[dict], max_tokens: int = 8, headers: dict | None = None, **fields) -> httpx.Response:
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


def test_each_rollouts_calls_stay_on_one_replica_and_rollouts_spread_over_both(replicas, proxy):
    front = served(proxy, replicas)
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


def test_nothing_in_a_request_chooses_or_names_the_replica(replicas, proxy):
    front = served(proxy, replicas)
    first, second = front.register("pinned-0"), front.register("pinned-1")  # replicas 0 and 1
    messages = [{"role": "user", "content": "which replica?"}]
    for rollout, other in ((first, 1), (second, 0)):
        asked = {"x-openforge-replica": str(other), "x-replica": str(other), "x-upstream": replicas[other].base_url}
        answer = chat(rollout, messages, headers=asked, replica=other, upstream=replicas[other].base_url)
        assert answer.status_code == 200, answer.text
        assert "replica" not in answer.json() and replicas[other].base_url not in answer.text
    # Control: the two rollouts are on different replicas, so a request that could choose would have moved one.
    assert replicas_of(front, ["pinned-0", "pinned-1"]) == {"pinned-0": [0], "pinned-1": [1]}


def test_a_weight_swap_reaches_both_replicas_before_any_call_resumes(replicas, proxy, tmp_path):
    other = build_tiny_model(tmp_path / "tiny-seed-1", seed=1)
    front = served(proxy, replicas)
    on = [front.register(f"swap-{i}") for i in range(2)]  # one on each replica
    prompt = [{"role": "user", "content": "name a colour"}]
    before = [chat(rollout, prompt).json()["choices"][0]["message"]["content"] for rollout in on]
    assert before[0] == before[1]  # the same weights on both: the same greedy answer
    front.client.update_weights(str(other), "1")
    after = [chat(rollout, prompt).json()["choices"][0]["message"]["content"] for rollout in on]
    assert after[0] == after[1] and after[0] != before[0], (before, after)
    calls = [front.calls(f"swap-{i}") for i in range(2)]
    assert [[(c["replica"], c["weight_version"]) for c in rollout] for rollout in calls] == \
        [[(0, "default"), (0, "1")], [(1, "default"), (1, "1")]]
    assert [r["weight_version"] for r in front.client.request("GET", "/replicas")["replicas"]] == ["1", "1"]


def test_a_replica_killed_mid_run_moves_its_rollouts_and_every_call_is_recorded(replicas, proxy):
    """Runs last: it kills replica 1."""
    front = served(proxy, replicas)
    rollouts = [front.register(f"survive-{i}") for i in range(4)]  # 0 and 2 on replica 0, 1 and 3 on replica 1
    for index, rollout in enumerate(rollouts):
        multi_turn(rollout, 1, f"survive-{index}")
    outcome = {}
    long_call = threading.Thread(target=lambda: outcome.update(answer=chat(
        rollouts[1], [{"role": "user", "content": "go on"}], max_tokens=3000, ignore_eos=True)))
    long_call.start()
    time.sleep(3)  # generating: 3000 tokens take the tiny model many seconds on one core
    os.killpg(replicas[1].process.pid, signal.SIGKILL)
    long_call.join(120)
    in_flight = outcome["answer"]
    assert in_flight.status_code == 502 and in_flight.json()["error"]["type"] == "server_error"
    # The run goes on: every rollout's next calls are answered, those of replica 1's rollouts by replica 0.
    for index, rollout in enumerate(rollouts):
        multi_turn(rollout, 2, f"survive-{index}")
    seen = replicas_of(front, [rollout["rollout_id"] for rollout in rollouts])
    assert seen == {"survive-0": [0, 0, 0], "survive-1": [1, 1, 0, 0], "survive-2": [0, 0, 0], "survive-3": [1, 0, 0]}
    recorded = [(c["call_index"], c["status"]) for c in front.calls("survive-1")]
    assert recorded == [(0, "ok"), (1, "error"), (2, "ok"), (3, "ok")]  # the failed call too: nothing is lost
    state = {r["replica"]: r["state"] for r in front.client.request("GET", "/replicas")["replicas"]}
    assert state == {0: "live", 1: "dead"} and front.client.health()["replicas_live"] == 1
