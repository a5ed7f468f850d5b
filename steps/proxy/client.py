"""The one client of the recording proxy's admin API, for the rollout step, the trajectories step, the local
runner and the tests. Standard library only: the rollout pod's Python has little else.

    client = ProxyClient("http://127.0.0.1:8100", admin_key)
    rollout = client.register("it0-hello-file-s0", {"sample": 0})  # {"rollout_id", "api_key", "openai_base_url", ...}
    client.close("it0-hello-file-s0")
    client.send_result(result.to_json(), retry=0)                   # a rollout pod's result.json, into the store
    recorded = client.calls("it0-hello-file-s0")                   # .calls, in order; .skipped: unreadable records

Every failure is a `ProxyClientError` carrying the HTTP status (None when the proxy did not answer) and
the proxy's own message. Only requests that change nothing when repeated (`health`, `rollouts`, `calls`,
`close`) are sent again when the proxy could not be reached; an answer, even an error, is never retried.
"""

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

TIMEOUT_S = 60.0  # one admin request; reading a long rollout's calls and swapping weights get longer
CALLS_TIMEOUT_S = 300.0
WEIGHTS_TIMEOUT_S = 600.0  # vLLM reloads a checkpoint in place meanwhile
RETRIES = 2  # further tries of an idempotent request the proxy did not answer
RETRY_DELAY_S = 0.5  # doubled after each try


class ProxyClientError(Exception):
    """An admin request that failed: `status` is the proxy's HTTP status, None when it did not answer."""

    def __init__(self, method: str, path: str, status: int | None, message: str, url: str = ""):
        self.method, self.path, self.status, self.message = method, path, status, message
        said = f"proxy answered {status} to {method} {path}" if status else f"proxy at {url} is unreachable ({method} {path})"
        super().__init__(f"{said}: {message}")


@dataclass(frozen=True)
class RecordedCalls:
    """A rollout's calls as the proxy's store gives them, and the stored records it could not read."""

    calls: list[dict]
    skipped: list[dict] = field(default_factory=list)  # {"record", "error"} each


def error_message(body: bytes) -> str:
    """The proxy's sentence from an error body (either dialect's shape), else the body's start.

    >>> error_message(b'{"error": {"message": "rollout r0 exists", "type": "conflict_error"}}')
    'rollout r0 exists'
    >>> error_message(b"<html>Bad Gateway</html>")
    '<html>Bad Gateway</html>'
    """
    try:
        message = json.loads(body)["error"]["message"]
        if isinstance(message, str):
            return message
    except (ValueError, KeyError, TypeError):
        pass
    return body[:300].decode(errors="replace").strip()


class ProxyClient:
    """The admin routes of the proxy at `url`, called with `admin_key`."""

    def __init__(self, url: str, admin_key: str, timeout_s: float = TIMEOUT_S, retries: int = RETRIES):
        self.url, self.timeout_s, self.retries = url.rstrip("/"), timeout_s, retries
        self._admin_key = admin_key

    def __repr__(self) -> str:  # never the key
        return f"ProxyClient({self.url!r})"

    def request(self, method: str, path: str, body: dict | None = None, timeout_s: float | None = None,
                idempotent: bool = False) -> dict:
        """One admin request; its JSON answer. Raises ProxyClientError; an idempotent request the proxy
        did not answer is sent again, `retries` times, with a doubling pause."""
        data = None if body is None else json.dumps(body).encode()
        tries = 1 + (self.retries if idempotent else 0)
        for attempt in range(1, tries + 1):
            try:
                return self._send(method, path, data, timeout_s or self.timeout_s)
            except ProxyClientError as err:
                if err.status is not None or attempt == tries:
                    raise
            time.sleep(RETRY_DELAY_S * 2 ** (attempt - 1))
        raise AssertionError("every try returns or raises")

    def _send(self, method: str, path: str, data: bytes | None, timeout_s: float) -> dict:
        headers = {"authorization": f"Bearer {self._admin_key}", "content-type": "application/json"}
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            raise ProxyClientError(method, path, err.code, error_message(err.read()), self.url) from None
        except (urllib.error.URLError, OSError) as err:  # no answer: refused, reset, timed out
            raise ProxyClientError(method, path, None, str(getattr(err, "reason", err)), self.url) from None
        try:
            return json.loads(raw)
        except ValueError:  # something answered that is not the proxy
            raise ProxyClientError(method, path, status, f"the answer is not JSON: {error_message(raw)}", self.url) from None

    def health(self) -> dict:
        """`GET /health`: {"status", "weight_version", "paused", "in_flight", "held", ...}."""
        return self.request("GET", "/health", idempotent=True)

    def register(self, rollout_id: str, metadata: dict | None = None) -> dict:
        """Registers a rollout: {"rollout_id", "api_key", "openai_base_url", "anthropic_base_url"}.
        An id the proxy's store already holds is refused with status 409."""
        return self.request("POST", "/rollouts", {"rollout_id": rollout_id, "metadata": metadata or {}})

    def rollouts(self) -> list[str]:
        """Every rollout id in the proxy's store."""
        return self.request("GET", "/rollouts", idempotent=True)["rollouts"]

    def close(self, rollout_id: str) -> dict:
        """Closes a rollout (its key stops working): {"rollout_id", "closed_at", "num_calls"}; again changes nothing."""
        return self.request("POST", f"/rollouts/{rollout_id}/close", idempotent=True)

    def calls(self, rollout_id: str) -> RecordedCalls:
        """The rollout's recorded calls, in order, and the stored records skipped. 404: never registered."""
        answer = self.request("GET", f"/rollouts/{rollout_id}/calls", timeout_s=CALLS_TIMEOUT_S, idempotent=True)
        return RecordedCalls(answer["calls"], answer.get("skipped") or [])

    def open_judge(self, rollout_id: str) -> dict:
        """Opens a closed rollout's judge session, for its verifier (`steps.proxy.judge`): {"rollout_id", "api_key",
        "openai_base_url", "model"}. 409 while the rollout is open, once it had one, or on a proxy without a judge."""
        return self.request("POST", f"/rollouts/{rollout_id}/judge")

    def close_judge(self, rollout_id: str) -> dict:
        """Ends the rollout's judge session (its key gets 403): {"rollout_id", "calls", "failed"}; closing again
        changes nothing."""
        return self.request("POST", f"/rollouts/{rollout_id}/judge/close", idempotent=True)

    def send_result(self, result: dict, retry: int, evaluation: bool = False) -> dict:
        """Hands a rollout pod's result.json (`RolloutResult.to_json()`) to the proxy, which writes it to the store
        for Argo's retry number `retry` (`steps.proxy.results`): {"rollout_id", "url"}. Writing it again changes
        nothing, so it is sent again when the proxy could not be reached."""
        query = f"retry={retry}" + ("&evaluation=true" if evaluation else "")
        return self.request("PUT", f"/rollouts/{result['rollout_id']}/result?{query}", result, idempotent=True)

    def send_phase(self, rollout_id: str, phase: str, retry: int, evaluation: bool = False) -> dict:
        """Tells the proxy the phase (setup, agent) a rollout pod's runner is in, which it writes to the store beside
        where the result of retry `retry` goes (`steps.proxy.results.store_phase`): {"rollout_id", "url"}."""
        query = f"retry={retry}&phase={phase}" + ("&evaluation=true" if evaluation else "")
        return self.request("PUT", f"/rollouts/{rollout_id}/phase?{query}", idempotent=True)

    def pause_weights(self) -> dict:
        """Holds new model calls and waits for those in flight; answers like `health`."""
        return self.request("POST", "/weights/pause")

    def resume_weights(self, weight_version: str | None = None) -> dict:
        """Lets held calls go on, stamped with `weight_version` when given; answers like `health`."""
        return self.request("POST", "/weights/resume", {} if weight_version is None else {"weight_version": weight_version})

    def update_weights(self, weights_path: str, weight_version: str) -> dict:
        """Serves the checkpoint at `weights_path` from now on (pause, vLLM reloads in place or restarts on it,
        resume) as `weight_version`; answers like `health`, with `failed`: the replicas that failed, and at which stage."""
        return self.request("POST", "/weights/update", {"weights_path": weights_path, "weight_version": weight_version},
                            timeout_s=WEIGHTS_TIMEOUT_S)
