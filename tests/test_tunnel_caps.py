"""One rollout cannot starve another of the proxy's connections (docs/proxy.md, "Limits").

A local rollout reaches the proxy through its `ProxyTunnel` (steps/sandbox/network.py), which connects from a
loopback address of its own, so the proxy's cap per client address (`--max-connections-per-client`) caps each
rollout on its own. The proxy is the real process and the tunnels are real network namespaces (root); model
calls go to benchmarks/fake_vllm.py, as in test_proxy_limits.py. A "greedy" rollout holds every connection it
can (each with a request head it never finishes, so none is idle and none is shed); another rollout's call
is still answered. Control: with every tunnel connecting from 127.0.0.1, as before, the same greedy rollout
starves the other.
"""

import doctest
import json
import os
import socket
import time

import pytest

from proxy_process import serve_proxy
from steps.sandbox import network
from steps.sandbox.network import ProxyTunnel, inside, loopback_source
from test_proxy_limits import ADMIN, CHAT, FakeModel, answer, closed_by_proxy

PER_CLIENT = 8  # the proxy's cap per client address in these tests (the default is 1024)
GREEDY = 2 * PER_CLIENT  # connections the greedy rollout opens through its tunnel (its cap is 64)


@pytest.fixture(scope="module")
def model():
    with FakeModel() as server:
        yield server


def connect_inside(tunnel: ProxyTunnel) -> socket.socket:
    """A connection to the tunnel's listener, made from inside its namespace, as the harness makes one."""
    return inside(tunnel.netns, lambda: socket.create_connection(("127.0.0.1", tunnel.listen_port), timeout=10))


def chat_inside(tunnel: ProxyTunnel, rollout: dict) -> tuple[int, dict]:
    """(status, body) of one model call of `rollout` through its tunnel."""
    body = json.dumps(CHAT).encode()
    conn = connect_inside(tunnel)
    with conn:
        conn.sendall(b"POST /rollouts/%s/v1/chat/completions HTTP/1.1\r\nhost: proxy\r\nauthorization: Bearer %s\r\n"
                     b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                     % (rollout["rollout_id"].encode(), rollout["api_key"].encode(), len(body), body))
        status, data = answer(conn)
    return status, json.loads(data) if data else {}


@pytest.mark.parametrize("host, own_addresses", [("127.0.0.1", True), ("0.0.0.0", True), ("127.0.0.1", False)],
                         ids=["loopback", "any", "one-address-control"])
def test_a_greedy_rollout_cannot_take_another_rollouts_connections(model, tmp_path, host, own_addresses):
    extra = ["--model-name", "fake", "--host", host, "--max-connections-per-client", str(PER_CLIENT)]
    shared = None if own_addresses else "127.0.0.1"  # the control: every tunnel from one address
    with serve_proxy(model.url, str(tmp_path / "store"), ADMIN, extra=extra, log_path=tmp_path / "proxy.log") as proxy:
        greedy_rollout, other_rollout = proxy.register("greedy"), proxy.register("other")
        with ProxyTunnel(f"of-{os.getpid()}-greedy", "127.0.0.1", proxy.port, source=shared) as greedy, \
                ProxyTunnel(f"of-{os.getpid()}-other", "127.0.0.1", proxy.port, source=shared) as other:
            assert chat_inside(other, other_rollout)[0] == 200  # before the greedy one starts: answered
            held = []
            try:
                for _ in range(GREEDY):  # each with a head that never ends: never idle, so never shed
                    held.append(connect_inside(greedy))
                    held[-1].sendall(b"POST /rollouts/greedy/v1/chat/completions HTTP/1.1\r\nx-slow: ")
                    time.sleep(0.05)
                time.sleep(0.5)
                status, body = chat_inside(other, other_rollout)
                log, kept = proxy.log_tail(100), sum(not closed_by_proxy(conn, wait_s=0.05) for conn in held)
            finally:
                for conn in held:
                    conn.close()
            time.sleep(0.5)
            assert chat_inside(other, other_rollout)[0] == 200  # the greedy one let go: answered again
        assert kept == PER_CLIENT  # the greedy rollout holds the cap's worth of connections, either way
        if own_addresses:  # its own cap: past it, it is refused under its own address
            assert status == 200, (body, log)
            assert f"too many connections from {greedy.source} (at most {PER_CLIENT})" in log
            assert greedy.source == loopback_source(greedy.name) != other.source
        else:
            message = body["error"]["message"]
            assert status == 503 and f"too many connections from 127.0.0.1 (at most {PER_CLIENT})" in message
        assert [call["status"] for call in proxy.calls("other")] == ["ok"] * (3 if own_addresses else 2)
        assert proxy.calls(greedy_rollout["rollout_id"]) == []


def test_only_a_proxy_on_loopback_is_reached_from_the_tunnels_own_address():
    """The source address is the tunnel's own only toward a proxy on loopback (a name that resolves there
    included); toward another host the kernel picks it, as before."""
    name = f"of-{os.getpid()}-where"
    for target, expected in (("127.0.0.1", loopback_source(name)), ("localhost", loopback_source(name)),
                             ("192.0.2.7", None)):
        with ProxyTunnel(name, target, 8100) as tunnel:
            assert tunnel.source == expected, target


def test_doctests():
    failures, tried = doctest.testmod(network)
    assert tried > 0 and failures == 0
