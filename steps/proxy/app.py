"""The recording proxy's HTTP app: admin routes, per-rollout dialect routes, one error handler.

Admin routes (admin key): POST /rollouts, GET /rollouts, GET /rollouts/{id}/calls (and the records skipped),
POST /rollouts/{id}/close, POST /rollouts/{id}/judge and /judge/close (the verifier's judge: `judge`),
PUT /rollouts/{id}/result and /phase (`results`), POST /weights/pause|resume|update, GET /replicas,
GET /tasks/{dataset}/{task} (one task folder of the run's dataset as a tar, for a rollout pod's init container:
`steps.datasets`).
Rollout routes (that rollout's key): /rollouts/{id}/v1/chat/completions, /v1/responses,
/v1/messages, /v1/models.
Judge route (that rollout's judge key, handed to its verifier only): /judge/{id}/v1/chat/completions.
"""

import asyncio
import contextlib
import hmac
import logging
import re
from contextlib import asynccontextmanager
from types import ModuleType

import orjson
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field, ValidationError
from starlette.exceptions import HTTPException

from steps import datasets
from steps.contracts import layout
from steps.proxy import chat, judge, messages, responses, results
from steps.proxy.config import ProxyConfig
from steps.proxy.errors import (
    ProxyError,
    anthropic_error_body,
    openai_error_body,
    validation_message,
)
from steps.proxy.serving import (
    GONE,
    ClientGone,
    api_key,
    json_answer,
    read_headers,
    read_body,
    read_json,
    receive_body,
    serve_call,
    until_disconnect,
)
from steps.proxy.replicas import Replicas
from steps.proxy.sessions import Sessions, StoreQuota, WeightGate
from steps.proxy.store import CallStore, judge_store_url
from steps.proxy.upstream import Upstream
from steps.proxy.weights import Restart, initial_version, swap_weights

log = logging.getLogger("openforge.proxy")


class NewRollout(BaseModel):
    rollout_id: str
    metadata: dict = Field(default_factory=dict)


class WeightUpdate(BaseModel):
    weights_path: str
    weight_version: str


def require_admin(request: Request) -> None:
    """Admin routes accept only the proxy's admin key."""
    key = api_key(request) or ""
    if not hmac.compare_digest(key.encode(), request.app.state.config.admin_key.encode()):
        raise ProxyError(401, "this route needs the proxy's admin key")


async def admin_body(request: Request, model: type[BaseModel]) -> BaseModel:
    """An admin route's JSON body, checked against `model`."""
    raw = await read_json(request, 1 << 20)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        message, field = validation_message(exc)
        raise ProxyError(400, message, param=field) from None


admin = APIRouter()
rollout_api = APIRouter(prefix="/rollouts/{rollout_id}")


@admin.get("/health")
async def health(request: Request) -> dict:
    gate, replicas = request.app.state.gate, request.app.state.replicas
    # Keyless, so only counts: which replica is which, and how loaded, is the admin's (`GET /replicas`).
    return {"status": "ok", "weight_version": gate.version, "paused": gate.paused, "in_flight": gate.in_flight,
            "held": gate.held, "replicas": len(replicas.all), "replicas_live": len(replicas.live())}


@admin.get("/replicas")
async def list_replicas(request: Request) -> dict:
    """Each replica's state, weight version and load."""
    require_admin(request)
    return {"policy": request.app.state.replicas.policy, "replicas": request.app.state.replicas.info()}


@admin.post("/rollouts")
async def register(request: Request) -> dict:
    require_admin(request)
    new = await admin_body(request, NewRollout)
    rollout, key = await request.app.state.sessions.register(new.rollout_id, new.metadata)
    request.app.state.replicas.assign(rollout, request.app.state.gate.version)
    base = (request.app.state.config.public_url or str(request.base_url)).rstrip("/")
    root = f"{base}/rollouts/{rollout.rollout_id}"
    return {"rollout_id": rollout.rollout_id, "api_key": key, "openai_base_url": f"{root}/v1",
            "anthropic_base_url": root}


@admin.get("/tasks/{dataset}/{task}")
async def task_folder(request: Request, dataset: str, task: str) -> Response:
    """One task folder of the run's dataset `dataset` (train or eval) as a tar: what a rollout pod, which has no
    S3 access, unpacks into its root-only folder before the agent starts."""
    require_admin(request)
    if not request.app.state.config.tasks:
        raise ProxyError(404, "this proxy serves no tasks (it was started without --tasks)")
    if dataset not in layout.DATASETS:
        raise ProxyError(404, f"dataset must be one of {', '.join(layout.DATASETS)}, got {dataset[:40]!r}")
    url = layout.dataset_url(request.app.state.config.tasks, dataset)
    try:
        data = await asyncio.to_thread(datasets.task_tar, url, task)
    except datasets.TaskArchiveError as exc:
        raise ProxyError(404, str(exc)) from None
    return Response(content=data, media_type="application/x-tar")


@admin.get("/rollouts")
async def list_rollouts(request: Request) -> dict:
    require_admin(request)
    return {"rollouts": request.app.state.store.list_rollouts()}


@admin.get("/rollouts/{rollout_id}/calls")
async def list_calls(request: Request, rollout_id: str) -> dict:
    """The rollout's readable calls, and the stored records skipped by the store's reading rule."""
    require_admin(request)
    await request.app.state.sessions.get(rollout_id)
    stored = await request.app.state.store.read_calls(rollout_id)
    for skipped in stored.skipped:
        log.warning("stored record skipped", extra={"rollout_id": rollout_id, **skipped})
    return {"calls": stored.calls, "skipped": stored.skipped}


@admin.post("/rollouts/{rollout_id}/close")
async def close(request: Request, rollout_id: str) -> dict:
    require_admin(request)
    request.app.state.replicas.release(await request.app.state.sessions.get(rollout_id))
    rollout = await request.app.state.sessions.close(rollout_id)
    return {"rollout_id": rollout_id, "closed_at": rollout.closed_at, "num_calls": rollout.next_index}


@admin.put("/rollouts/{rollout_id}/result")
async def put_result(request: Request, rollout_id: str, retry: int, evaluation: bool = False) -> dict:
    """Writes a rollout pod's result.json to the store (`results.store_result`): only for a rollout this proxy
    opened, by its own id, at most `results.RESULT_MAX_BYTES`."""
    require_admin(request)
    await request.app.state.sessions.get(rollout_id)  # 404 for a rollout this proxy never opened
    body = await read_body(request, results.RESULT_MAX_BYTES)
    url = await results.store_result(request.app.state.config, rollout_id, body, retry, evaluation)
    return {"rollout_id": rollout_id, "url": url}


@admin.put("/rollouts/{rollout_id}/phase")
async def put_phase(request: Request, rollout_id: str, retry: int, phase: str, evaluation: bool = False) -> dict:
    """Writes the phase a rollout pod's runner reports (`results.store_phase`) beside where its result goes: only for
    a rollout this proxy opened."""
    require_admin(request)
    rollout = await request.app.state.sessions.get(rollout_id)  # 404 for a rollout this proxy never opened
    url = await results.store_phase(request.app.state.config, rollout_id, phase, retry, evaluation, rollout.metadata)
    return {"rollout_id": rollout_id, "url": url}


@admin.post("/rollouts/{rollout_id}/judge")
async def open_judge(request: Request, rollout_id: str) -> dict:
    """Opens the rollout's judge session for its verifier, once the agent's session is closed (`judge.Judges.open`):
    its key and the base URL of its judge route."""
    require_admin(request)
    if request.app.state.judges is None:
        raise ProxyError(409, "this proxy has no judge: set the run's judge_upstream and judge_model")
    rollout = await request.app.state.sessions.get(rollout_id)
    session, key = request.app.state.judges.open(rollout)
    base = (request.app.state.config.public_url or str(request.base_url)).rstrip("/")
    return {"rollout_id": session.rollout_id, "api_key": key, "openai_base_url": f"{base}/judge/{rollout_id}/v1",
            "model": request.app.state.config.judge_model}


@admin.post("/rollouts/{rollout_id}/judge/close")
async def close_judge(request: Request, rollout_id: str) -> dict:
    """Ends the rollout's judge session: {"rollout_id", "calls", "failed"} (the calls that failed on the judge's or
    the proxy's side)."""
    require_admin(request)
    if request.app.state.judges is None:
        raise ProxyError(409, "this proxy has no judge: set the run's judge_upstream and judge_model")
    return request.app.state.judges.close(rollout_id).summary()


@admin.post("/weights/pause")
async def pause(request: Request) -> dict:
    require_admin(request)
    await request.app.state.gate.pause()
    return await health(request)


@admin.post("/weights/resume")
async def resume(request: Request) -> dict:
    require_admin(request)
    raw = await read_json(request, 1 << 20)
    version, replicas = raw.get("weight_version"), request.app.state.replicas
    if version is not None and len(replicas.all) > 1:
        raise ProxyError(400, "weight_version in /weights/resume relabels the weights of one server only; with "
                              "several replicas swap them with POST /weights/update", param="weight_version")
    if version is not None:  # one server, reloaded by its owner: it holds `version` now
        replicas.serve(replicas.all[0], str(version))
    await request.app.state.gate.resume(None if version is None else str(version))
    return await health(request)


@admin.post("/weights/update")
async def update(request: Request) -> dict:
    require_admin(request)
    body = await admin_body(request, WeightUpdate)
    failures = await swap_weights(request.app.state.gate, request.app.state.replicas, body.weights_path,
                                  body.weight_version, request.app.state.restart)
    return {**await health(request), "failed": [failure.info() for failure in failures]}


@rollout_api.get("/v1/models")
async def models(request: Request, rollout_id: str) -> dict:
    await request.app.state.sessions.authorize(rollout_id, api_key(request))
    replicas = request.app.state.replicas
    asked = (replicas.live() or replicas.all)[0].upstream  # only a name is asked: any replica that answers will do
    name = request.app.state.config.model or await asked.served_model()  # the harness's name
    return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "openforge"}]}


MODEL_ROUTES = {"chat/completions": chat, "responses": responses, "messages": messages}
MODEL_ROUTE = re.compile(r"/rollouts/([^/]+)/v1/(chat/completions|responses|messages)")


class ModelCalls:
    """The model-call routes in front of FastAPI, which serves every other route.

    The proxy's own HTTP server (`http_server.py`) hands model calls to `answer` straight from the
    socket; under any ASGI server they arrive as bare ASGI. Either way a call is answered with the same
    error bodies the framework would use, without its four middleware layers, route scan, per-request
    dependency solving and request and response objects (benchmarks/proxy_overhead.py measures what the
    proxy costs per call).
    """

    def __init__(self, app: FastAPI):
        self.app = app

    @staticmethod
    def route(method: str, path: str) -> tuple[str, ModuleType] | None:
        """(rollout id, dialect) if `method path` is a model call, else None."""
        match = MODEL_ROUTE.fullmatch(path) if method == "POST" else None
        return None if match is None else (match[1], MODEL_ROUTES[match[2]])

    async def __call__(self, scope, receive, send) -> None:
        call = self.route(scope["method"], scope["path"]) if scope["type"] == "http" else None
        if call is None:
            return await self.app(scope, receive, send)
        key, declared = read_headers(scope["headers"])
        limit = self.app.state.config.max_body_bytes
        status, headers, body = await self.answer(*call, key, lambda: receive_body(receive, declared, limit),
                                                  lambda work: until_disconnect(receive, work))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def answer(self, rollout_id: str, dialect: ModuleType, key: str | None, read, guard) -> tuple[int, list, bytes]:
        """(status, headers, body) for one model call (see `serving.serve_call`); never raises."""
        try:
            return await serve_call(self.app.state, rollout_id, dialect, key, read, guard)
        except ProxyError as err:
            _log_failure(f"/rollouts/{rollout_id}/v1 ({dialect.NAME})", err)
            return json_answer(err.status, orjson.dumps(dialect.error_body(err)))
        except ClientGone:  # hung up while sending its request: nothing was recorded, nobody hears the answer
            return GONE
        except Exception as exc:  # the client gets the dialect's error shape, the log gets the traceback
            err = _unexpected(f"/rollouts/{rollout_id}/v1 ({dialect.NAME})", exc)
            return json_answer(err.status, orjson.dumps(dialect.error_body(err)))


def _error_body(path: str, err: ProxyError) -> dict:
    """The error in the shape of the dialect called at `path`."""
    return anthropic_error_body(err) if "/v1/messages" in path else openai_error_body(err)


def _log_failure(path: str, err: ProxyError) -> None:
    if err.status >= 500:  # the proxy's or the upstream's fault, not the caller's
        log.warning("call failed", extra={"path": path, "status": err.status, "error": err.message})


def _unexpected(path: str, exc: Exception) -> ProxyError:
    log.error("unexpected error", exc_info=exc, extra={"path": path})
    return ProxyError(500, f"internal proxy error ({type(exc).__name__}); see the proxy log")


def _error_response(request: Request, err: ProxyError) -> JSONResponse:
    return JSONResponse(_error_body(request.url.path, err), status_code=err.status)


async def _on_proxy_error(request: Request, err: ProxyError) -> JSONResponse:
    _log_failure(request.url.path, err)
    return _error_response(request, err)


async def _on_http_error(request: Request, exc: HTTPException) -> JSONResponse:
    detail = exc.detail if isinstance(exc.detail, str) else "request refused"
    if exc.status_code == 404:
        detail = f"no route {request.method} {request.url.path}"
    return _error_response(request, ProxyError(exc.status_code, detail))


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    return _error_response(request, _unexpected(request.url.path, exc))


def create_app(config: ProxyConfig, restart: Restart | None = None) -> ModelCalls:
    """Builds the proxy app; store, sessions, upstream client and weight gate live for its lifespan. `restart`:
    how the serve step that started the replicas restarts one on new weights, where they cannot reload in place
    (steps.proxy.weights)."""
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.config, app.state.restart = config, restart
        app.state.store = CallStore(config.store, fsync=config.fsync)
        app.state.sessions = Sessions(app.state.store, StoreQuota(config.store_quota_mb, config.store_quota_calls))
        upstreams = [Upstream(url, timeout_s=config.upstream_timeout_s, model=config.upstream_model or config.model,
                              external=config.external_upstream, api_key=config.upstream_api_key)
                     for url in config.upstreams]
        for upstream in upstreams:
            await upstream.start()
            await upstream.probe()  # an external upstream's refusals, before any harness's call
        app.state.judges = app.state.judge_upstream = None
        if config.judge_upstream:  # the verifier's judge: another upstream, another store (steps.proxy.judge)
            app.state.judges, app.state.judge_store = judge.Judges(), CallStore(judge_store_url(config.store),
                                                                               fsync=config.fsync)
            app.state.judge_upstream = Upstream(judge.judge_root(config.judge_upstream),
                                                timeout_s=config.upstream_timeout_s, model=config.judge_model,
                                                external=True, api_key=config.judge_api_key)
            await app.state.judge_upstream.start()
        app.state.gate = WeightGate(await initial_version(upstreams, config.weight_version))
        app.state.replicas = Replicas(upstreams, app.state.gate.version, config.replica_policy)
        if config.adapter:  # a LoRA iteration's serve: its adapter on every replica before any call
            await swap_weights(app.state.gate, app.state.replicas, config.adapter, app.state.gate.version)
        watch = asyncio.create_task(app.state.replicas.watch()) if len(upstreams) > 1 else None
        yield
        if watch is not None:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        for upstream in upstreams + ([app.state.judge_upstream] if app.state.judge_upstream else []):
            await upstream.close()

    app = FastAPI(title="OpenForge recording proxy", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.include_router(admin)
    app.include_router(rollout_api)
    app.include_router(judge.judge_api)
    app.add_exception_handler(ProxyError, _on_proxy_error)
    app.add_exception_handler(HTTPException, _on_http_error)
    app.add_exception_handler(RequestValidationError, lambda r, e: _error_response(r, ProxyError(400, str(e))))
    app.add_exception_handler(Exception, _on_unexpected)
    return ModelCalls(app)
