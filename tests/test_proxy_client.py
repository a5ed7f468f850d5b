"""The proxy's admin client (`steps.proxy.client`) against the real proxy, and against sockets that do not
answer: one exception type with the proxy's status and sentence, retries only of idempotent requests."""

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from proxy_process import ProxyProcess, serve_proxy

from steps.proxy.client import ProxyClient, ProxyClientError
from steps.net import free_port

ADMIN = "client-admin-key"


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """A real proxy with nothing behind its upstream port (the admin API needs no model)."""
    with serve_proxy(f"http://127.0.0.1:{free_port()}", str(tmp_path_factory.mktemp("store")), ADMIN,
                     extra=["--model", "tiny"]) as served:
        yield served


def test_the_admin_routes_round_trip(proxy: ProxyProcess) -> None:
    client = ProxyClient(proxy.url, ADMIN)
    rollout = client.register("c-0", {"sample": 2})
    assert rollout["rollout_id"] == "c-0" and rollout["openai_base_url"] == f"{proxy.url}/rollouts/c-0/v1"
    assert "c-0" in client.rollouts()
    assert client.calls("c-0").calls == [] and client.calls("c-0").skipped == []
    closed = client.close("c-0")
    assert closed["num_calls"] == 0 and client.close("c-0") == closed
    assert client.health()["status"] == "ok" and "c-0" not in repr(client) and ADMIN not in repr(client)


def test_errors_carry_the_proxys_status_and_sentence(proxy: ProxyProcess) -> None:
    client = ProxyClient(proxy.url, ADMIN)
    client.register("c-taken")
    with pytest.raises(ProxyClientError) as taken:
        client.register("c-taken")
    assert taken.value.status == 409 and "c-taken" in taken.value.message and "{" not in taken.value.message
    assert str(taken.value).startswith("proxy answered 409 to POST /rollouts: ")
    with pytest.raises(ProxyClientError) as refused:
        ProxyClient(proxy.url, "wrong").rollouts()
    assert refused.value.status == 401 and refused.value.message == "this route needs the proxy's admin key"
    with pytest.raises(ProxyClientError) as unknown:
        client.calls("never-registered")
    assert unknown.value.status == 404


class Silent:
    """A TCP port that accepts connections and either closes them at once or never answers; counts them."""

    def __init__(self, answer: str):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url, self.connections, self.held = f"http://127.0.0.1:{self.sock.getsockname()[1]}", 0, []
        self.answer = answer
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            if self.answer == "close":
                conn.close()
            else:
                self.held.append(conn)

    def stop(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_only_idempotent_requests_are_sent_again_when_nothing_answers() -> None:
    silent = Silent("close")
    try:
        client = ProxyClient(silent.url, ADMIN, retries=2)
        with pytest.raises(ProxyClientError) as health:
            client.health()
        assert health.value.status is None and silent.url in str(health.value) and silent.connections == 3
        with pytest.raises(ProxyClientError):
            client.register("r")  # registering again might register twice: one try
        assert silent.connections == 4
    finally:
        silent.stop()


def test_a_proxy_that_never_answers_times_out() -> None:
    silent = Silent("hold")
    try:
        started = time.monotonic()
        with pytest.raises(ProxyClientError) as timed_out:
            ProxyClient(silent.url, ADMIN, timeout_s=0.5, retries=0).health()
        assert timed_out.value.status is None and "timed out" in str(timed_out.value)
        assert time.monotonic() - started < 5
    finally:
        silent.stop()
