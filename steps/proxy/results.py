"""Rollout results through the proxy: a rollout pod's runner hands its `result.json` to the proxy, which writes
it to the store, so that a rollout pod needs no store credentials and no route to the store (docs/workflows.md,
"Network isolation").

    PUT /rollouts/{rollout_id}/result?retry=R[&evaluation=true]   (admin key; the body: result.json)
    PUT /rollouts/{rollout_id}/phase?retry=R&phase=P[&evaluation=true]   (admin key; P: setup or agent)

The proxy writes it to `layout.result_url` (or `eval_result_url`) of its `--run-url` and `--iteration`, in the
folder of the attempt id the rollout ran under (`ID`, `ID-a2`, ...: `steps.plan.attempt_id`), which the proxy gives
out once (a rerun takes the next free one), so no attempt's result ever replaces another's, not even when a
`submit.py retry` makes Argo count `{{retries}}` from 0 again (it deletes the failed pods' nodes). Only a rollout this proxy opened may be written, only by its own id, and only a result
that names that id. Beside it goes `layout.PHASE_RECORD`, the phase the runner reported (`store_phase`): setup once it
registered, agent just before the agent starts; a pod that died without a result is then the agent's end or the
cluster's by it (`steps.ends`). Only the runner holds the admin key these routes take, never the agent.
"""

import asyncio

import fsspec

import json

from steps.contracts import layout
from steps.contracts.rollout import RecordError, parse_result
from steps.plan import attempt_of
from steps.proxy.config import ProxyConfig
from steps.proxy.errors import ProxyError

PHASES = ("setup", "agent")  # what a runner reports: registered, then its agent about to start
RESULT_MAX_BYTES = 1024 * 1024  # one result.json; its logs stay in the pod, so 1 MiB is far more than one needs


def result_url(config: ProxyConfig, rollout_id: str, retry: int, evaluation: bool) -> str:
    """Where the result of rollout `rollout_id` (an attempt id, `ID-aK`) at Argo's retry number `retry` goes: the
    attempt's own folder.

    Attempt K of a planned rollout runs at retry K-1 or earlier (a rerun step takes the next free attempt), so a
    retry number past that is refused.

    >>> result_url(ProxyConfig("u", "s", "k", run_url="s3://b/runs/r", iteration=2), "it2-t-s0-a2", 1, False)
    's3://b/runs/r/results/iteration-2/it2-t-s0-a2/result.json'
    """
    if not config.run_url or config.iteration is None:
        raise ProxyError(409, "this proxy stores no results: it was started without --run-url and --iteration")
    _, attempt = attempt_of(rollout_id)
    if not 0 <= retry < attempt:
        raise ProxyError(400, f"retry must be 0 to {attempt - 1} for rollout {rollout_id!r} (attempt {attempt}), "
                              f"got {retry}", param="retry")
    where = layout.eval_result_url if evaluation else layout.result_url
    return where(config.run_url, config.iteration, rollout_id)


def checked_result(rollout_id: str, body: bytes) -> bytes:
    """The body, if it is a result.json that names `rollout_id`; else a 400 naming what is wrong."""
    try:
        result = parse_result(body, "the result")
    except RecordError as exc:
        raise ProxyError(400, str(exc)) from None
    if result.rollout_id != rollout_id:
        raise ProxyError(400, f"the result names rollout {result.rollout_id!r}, not {rollout_id!r} of this route",
                         param="rollout_id")
    return body


def write_file(url: str, data: bytes) -> None:
    """Writes one small file whole at `url` (a local path or an fsspec URL such as s3://)."""
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)  # a local store's folders; nothing on S3
    fs.pipe_file(path, data)


async def store_result(config: ProxyConfig, rollout_id: str, body: bytes, retry: int, evaluation: bool) -> str:
    """Writes a checked result.json of rollout `rollout_id` to its store URL (`result_url`); returns that URL."""
    url = result_url(config, rollout_id, retry, evaluation)
    await asyncio.to_thread(write_file, url, checked_result(rollout_id, body))
    return url


async def store_phase(config: ProxyConfig, rollout_id: str, phase: str, retry: int, evaluation: bool,
                      metadata: dict) -> str:
    """Writes the phase record of rollout `rollout_id` (an attempt id) at retry `retry` beside its result's URL
    (`result_url`): {"rollout_id", "retry", "phase"} and the task, harness and sample its runner registered it with
    (`metadata`), what a result written for it lacking one names; returns its URL."""
    if phase not in PHASES:
        raise ProxyError(400, f"phase must be one of {', '.join(PHASES)}, got {phase[:40]!r}", param="phase")
    url = layout.beside_result(result_url(config, rollout_id, retry, evaluation), layout.PHASE_RECORD)
    named = {key: metadata.get(key) for key in ("task", "harness", "sample")}
    record = json.dumps({"rollout_id": rollout_id, "retry": retry, "phase": phase, **named}).encode()
    await asyncio.to_thread(write_file, url, record)
    return url
