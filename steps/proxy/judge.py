"""The judge route: a task's verifier asks the run's judge model for its reward (`[verifier] judge = true`).

    POST /rollouts/{id}/judge                 admin key: opens the rollout's judge session, only once its agent's
                                              session is closed -> {"rollout_id", "api_key", "openai_base_url", "model"}
    POST /judge/{id}/v1/chat/completions      that session's judge key: one chat completion of the judge model
    POST /rollouts/{id}/judge/close           admin key: ends it -> {"rollout_id", "calls", "failed"}

The judge is another upstream than the policy's (`--judge-upstream`: any OpenAI-compatible endpoint, asked for
`--judge-model`, its key from OPENFORGE_JUDGE_UPSTREAM_API_KEY), reached only through this route: a rollout's own
routes go to the policy's replicas whatever they are sent, and this route takes no rollout key, only the judge key the
runner hands to the verifier's environment after the agent is gone. Each judge call is recorded apart from the
policy's calls, in the store's `judge/` folder (`steps.proxy.store.judge_store_url`), marked `untrainable`: the
trajectories step reads `rollouts/` alone, so a judge's answer never becomes a training sample. A judge call that
fails for the judge's side (unreachable, 5xx, too slow) or the proxy's (its store) is named in the close's
`failed`, and the runner makes the rollout an infra error: a reward resting on a judge that was down is never
scored.
"""

import hmac
import logging
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from steps.contracts.calls import CallRecord
from steps.logs import now
from steps.proxy.errors import ProxyError
from steps.proxy.protocol import one_line
from steps.proxy.serving import api_key, parse_object, read_body
from steps.proxy.sessions import ROLLOUT_ID, Rollout, key_digest
from steps.proxy.store import StoreWriteFailed

log = logging.getLogger("openforge.proxy")
JUDGE_CALL = "a judge's call, made by the task's verifier: never a training sample"
MAX_CALLS = 64  # judge calls one rollout's grading may make: a verifier asks a few, a loop in what it runs no more
CLOSED_KEPT = 1024  # closed judge sessions kept, so that their key gets its 403
# What the verifier may not set: the proxy sends the judge non-streaming calls of the run's judge model.
_NOT_FORWARDED = ("stream", "stream_options", "model")


def judge_root(url: str) -> str:
    """The judge upstream's root, as `steps.proxy.upstream.Upstream` takes it: its base URL without a final `/v1`.

    >>> judge_root("https://api.example.com/v1/"), judge_root("http://127.0.0.1:8001")
    ('https://api.example.com', 'http://127.0.0.1:8001')
    """
    return url.rstrip("/").removesuffix("/v1")


@dataclass
class JudgeSession:
    """One rollout's judge: its key's digest, when it opened and closed, its calls and those that failed."""

    rollout_id: str
    key_sha256: str
    opened_at: float
    closed_at: float | None = None
    calls: int = 0
    failed: list[dict] = field(default_factory=list)  # {"call_index", "status", "message"}: the judge's or the proxy's

    def summary(self) -> dict:
        """What the close answers."""
        return {"rollout_id": self.rollout_id, "calls": self.calls, "failed": list(self.failed)}


@dataclass
class Judges:
    """The judge sessions: at most one per rollout, opened after its agent's session closed, closed after grading."""

    open_ones: dict[str, JudgeSession] = field(default_factory=dict)
    closed: OrderedDict[str, JudgeSession] = field(default_factory=OrderedDict)

    def open(self, rollout: Rollout) -> tuple[JudgeSession, str]:
        """A new judge session of `rollout` and its key; 409 while the agent's session is open, or when the rollout
        had its judge already (a rerun is another attempt, with an id of its own)."""
        if rollout.closed_at is None:
            raise ProxyError(409, f"rollout {rollout.rollout_id!r} is still open: its judge opens only once its "
                                  "agent's session is closed (POST /rollouts/{id}/close)")
        if rollout.rollout_id in self.open_ones or rollout.rollout_id in self.closed:
            raise ProxyError(409, f"rollout {rollout.rollout_id!r} has had its judge already")
        key = "ofj-" + secrets.token_urlsafe(32)
        session = JudgeSession(rollout.rollout_id, key_digest(key), opened_at=now())
        self.open_ones[rollout.rollout_id] = session
        return session, key

    def find(self, rollout_id: str) -> JudgeSession:
        """The judge session of this rollout, open or closed; 404 if it has none."""
        session = self.open_ones.get(rollout_id) or self.closed.get(rollout_id)
        if session is None:
            raise ProxyError(404, f"rollout {rollout_id[:128]!r} has no judge: its runner opens one only for a task "
                                  "whose verifier asks a judge, once the agent is done")
        return session

    def authorize(self, rollout_id: str, key: str | None) -> JudgeSession:
        """The open judge session this key belongs to; 404 if none, 401 on a wrong key, 403 once it closed."""
        session = self.find(rollout_id)
        if not key or not hmac.compare_digest(key_digest(key), session.key_sha256):
            raise ProxyError(401, f"missing or wrong judge key for rollout {rollout_id!r}")
        if session.closed_at is not None:
            raise ProxyError(403, f"the judge of rollout {rollout_id!r} is closed: grading has ended")
        return session

    def close(self, rollout_id: str) -> JudgeSession:
        """Ends a judge session (its key gets 403 from now on); closing again changes nothing."""
        session = self.find(rollout_id)
        if session.closed_at is None:
            session.closed_at = now()
            del self.open_ones[rollout_id]
            self.closed[rollout_id] = session
            while len(self.closed) > CLOSED_KEPT:
                self.closed.popitem(last=False)
        return session


judge_api = APIRouter()


@judge_api.post("/judge/{rollout_id}/v1/chat/completions")
async def judge_call(request: Request, rollout_id: str) -> Response:
    """One chat completion of the judge model for the verifier of `rollout_id`, recorded in the judge store."""
    state = request.app.state
    if state.judges is None or not ROLLOUT_ID.match(rollout_id):
        raise ProxyError(404, "this proxy has no judge (the run sets no judge_upstream)" if state.judges is None
                         else f"rollout {rollout_id[:128]!r} has no judge")
    session = state.judges.authorize(rollout_id, api_key(request))
    data = await read_body(request, state.config.max_body_bytes)
    body = parse_object(data)
    if body.get("stream"):
        raise ProxyError(400, "the judge route answers non-streaming calls only: send stream false", param="stream")
    if not isinstance(body.get("messages"), list):
        raise ProxyError(400, "invalid request field 'messages': a list of chat messages is required", param="messages")
    if session.calls >= MAX_CALLS:
        raise ProxyError(400, f"the judge of rollout {rollout_id!r} has answered {MAX_CALLS} calls, the most one "
                              "grading may make")
    record = CallRecord(rollout_id=rollout_id, call_index=session.calls, dialect="chat_completions", stream=False,
                        timings={"received_at": now()}, request=orjson.Fragment(one_line(data)),
                        untrainable=JUDGE_CALL)
    session.calls += 1
    upstream_body = {key: value for key, value in body.items() if key not in _NOT_FORWARDED}
    upstream_body["model"] = state.config.judge_model
    record.timings["upstream_started_at"] = now()
    try:
        answer = await state.judge_upstream.send("POST", "/v1/chat/completions", upstream_body)
        orjson.loads(answer)
    except ProxyError as err:
        await _finish(state, session, record, "error", error={"status": err.status, "message": err.message})
        raise
    except orjson.JSONDecodeError:
        err = ProxyError(502, f"the judge upstream answered malformed JSON: {answer[:200]!r}")
        await _finish(state, session, record, "error", error={"status": err.status, "message": err.message})
        raise err from None
    # Stored on one line, whatever the judge's JSON looks like: a local store keeps one record per line.
    await _finish(state, session, record, "ok", response=orjson.Fragment(one_line(answer)))
    return Response(answer, media_type="application/json")


async def _finish(state, session: JudgeSession, record: CallRecord, status: str, response=None,
                  error: dict | None = None) -> None:
    """Stores a judge call with its outcome; a failure on the judge's side (5xx) or the store's is the session's
    `failed` (the runner's infra error), the verifier's own bad request (4xx) is not."""
    record.timings["upstream_ended_at"] = record.timings["responded_at"] = now()
    record.status, record.response, record.error = status, response, error
    if error is not None and error["status"] >= 500:
        session.failed.append({"call_index": record.call_index, **error})
    try:
        await state.judge_store.put_call(record.to_json())
    except StoreWriteFailed as exc:
        session.failed.append({"call_index": record.call_index, "status": 503, "message": f"not stored: {exc}"})
        raise ProxyError(503, f"the proxy could not store this judge call, so it was not answered ({exc})") from None
