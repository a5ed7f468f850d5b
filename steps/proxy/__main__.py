"""The recording proxy between agent harnesses and vLLM.

    python -m steps.proxy --upstream http://127.0.0.1:8000 --port 8100 --store ./runs/calls \
        [--admin-key KEY | env OPENFORGE_ADMIN_KEY] [--model-name tiny] [--sampling temperature=1.0 ...] \
        [--max-tokens-cap 512]

`--upstream` is vLLM's root URL (no /v1), given once per replica when several vLLM servers serve the run
(each rollout stays on one: steps/proxy/replicas.py); `--store` a local folder or an s3:// URL. With any `--sampling`,
every key of `steps.sampling.KEYS` is forced on every call (those not given at their neutral value); without,
the harness's own settings reach vLLM (a plain recorder: what the serve step never runs).
`--external-upstream` marks a server the serve step did not start (a vLLM elsewhere or any OpenAI-compatible
endpoint, named `--upstream-model` there, with OPENFORGE_UPSTREAM_API_KEY as its key if it needs one): calls it
answers without token ids are recorded as untrainable instead of failing (docs/proxy.md).
`--judge-upstream URL --judge-model NAME` opens the judge route a task's verifier may ask (any OpenAI-compatible
endpoint, OPENFORGE_JUDGE_UPSTREAM_API_KEY as its key if it needs one: steps/proxy/judge.py).
"""

import argparse
import gc
import os
import sys

import uvicorn
import yaml

from steps import logs, sampling
from steps.proxy.app import create_app
from steps.proxy.weights import Restart
from steps.proxy.config import JUDGE_KEY_ENV, ROLLOUT_LIMITS, ProxyConfig, limit_flag
from steps.proxy.connections import connection_cap, raise_open_file_limit
from steps.proxy.http_server import protocol_factory
from steps.proxy.replicas import AFFINITY, POLICIES


def command_line(upstream: str | list[str], store: str, port: int, host: str | None = None,
                 model_name: str | None = None, max_tokens_cap: int | None = None, weight_version: str | None = None,
                 sampling: list[str] | tuple[str, ...] = (), extra: list[str] | tuple[str, ...] = (),
                 upstream_model: str | None = None, external: bool = False, image_limit: int | None = None,
                 tool_images: bool = True, limits: dict[str, int] | None = None, judge_upstream: str | None = None,
                 judge_model: str | None = None) -> list[str]:
    """The proxy's flags, as `parse_args` reads them: what the serve step runs in-process and the tests'
    launcher runs as `python -m steps.proxy`; `upstream` is one URL or each replica's; `sampling` holds `KEY=VALUE`
    items (`steps.sampling`). The admin key travels in the environment, never here; so does an external upstream's
    key (`external`: `--external-upstream`). `image_limit` is the run's; `tool_images` whether the served model's chat
template renders images in tool turns (`steps.proxy.images.renders_tool_images`); `limits` the run's values of
`ROLLOUT_LIMITS` (a key left out: the proxy's default, which is the run's); `judge_upstream` and `judge_model` the
run's judge (its key, too, travels in the environment).

    >>> command_line("http://127.0.0.1:8000", "runs/calls", 8100, model_name="tiny")
    ['--upstream', 'http://127.0.0.1:8000', '--port', '8100', '--store', 'runs/calls', '--model-name', 'tiny']
    >>> command_line("http://127.0.0.1:8000", "runs/calls", 8100, image_limit=4, tool_images=False)[-4:]
    ['--image-limit', '4', '--tool-images', 'user']
    >>> command_line(["http://127.0.0.1:8000", "http://127.0.0.1:8001"], "runs/calls", 8100)[:4]
    ['--upstream', 'http://127.0.0.1:8000', '--upstream', 'http://127.0.0.1:8001']
    >>> command_line("http://127.0.0.1:8000", "runs/calls", 8100, limits={"store_quota_mb": 64})[-2:]
    ['--store-quota-mb', '64']
    >>> command_line("http://127.0.0.1:8000", "runs/calls", 8100, judge_upstream="http://j/v1", judge_model="j")[-4:]
    ['--judge-upstream', 'http://j/v1', '--judge-model', 'j']
    """
    argv = [word for url in ([upstream] if isinstance(upstream, str) else upstream) for word in ("--upstream", url)]
    argv += ["--port", str(port), "--store", store]
    for flag, value in (("--host", host), ("--model-name", model_name), ("--max-tokens-cap", max_tokens_cap),
                        ("--weight-version", weight_version), ("--upstream-model", upstream_model),
                        ("--image-limit", image_limit), ("--judge-upstream", judge_upstream or None),
                        ("--judge-model", judge_model or None)):
        if value is not None:
            argv += [flag, str(value)]
    if external:
        argv.append("--external-upstream")
    if not tool_images:
        argv += ["--tool-images", "user"]
    argv += [word for key, value in (limits or {}).items() for word in (limit_flag(key), str(value))]
    return argv + [word for item in sampling for word in ("--sampling", item)] + list(extra)


def add_rollout_limits(parser: argparse.ArgumentParser) -> None:
    """The flags of `ROLLOUT_LIMITS` (0 turns one off), defaulting to the run's; the serve step passes them on."""
    group = parser.add_argument_group("what one rollout may take", "the run config's keys of the same names "
                                      "(docs/proxy.md, Limits); 0 turns one off")
    for key, meaning in ROLLOUT_LIMITS.items():
        group.add_argument(limit_flag(key), dest=key, type=int, default=getattr(ProxyConfig, key),
                           help=f"{meaning} (default {getattr(ProxyConfig, key)})")


def check_rollout_limits(p: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, int]:
    """The values of `ROLLOUT_LIMITS` given; exits with one sentence on a negative one."""
    for key in ROLLOUT_LIMITS:
        if getattr(args, key) < 0:
            p.error(f"{limit_flag(key)} takes a number >= 0 (0 turns the limit off), got {getattr(args, key)}")
    return {key: getattr(args, key) for key in ROLLOUT_LIMITS}


def parse_args(argv: list[str] | None = None) -> ProxyConfig:
    """Reads the command line into a ProxyConfig; exits with one sentence on a bad flag."""
    p = argparse.ArgumentParser(prog="python -m steps.proxy", description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", required=True, action="append",
                   help="vLLM root URL, e.g. http://127.0.0.1:8000; once per replica (repeatable)")
    p.add_argument("--replica-policy", choices=POLICIES, default=AFFINITY,
                   help="affinity: each rollout stays on the replica it was given (a run's); round-robin: each call "
                        "to the next replica, only to measure what affinity is worth (benchmarks/replica_affinity.py)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--store", required=True, help="local folder or s3:// URL for recorded calls")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--tasks", default="", help="the run's dataset snapshots (local folder or s3:// URL), served to "
                   "rollout pods by GET /tasks/{dataset}/{task} (admin key)")
    p.add_argument("--admin-key", default=os.environ.get("OPENFORGE_ADMIN_KEY"))
    p.add_argument("--public-url", help="base URL harnesses reach the proxy at (default: the request's host)")
    p.add_argument("--run-url", help="the run's folder in the store: PUT /rollouts/{id}/result writes rollout "
                                     "results there (with --iteration; default: no results are stored)")
    p.add_argument("--iteration", type=int, help="the iteration whose rollout results PUT /rollouts/{id}/result writes")
    p.add_argument("--model-name", dest="model", help="served model name (default: the first of upstream /v1/models)")
    p.add_argument("--upstream-model", help="the model name sent upstream (default: --model-name)")
    p.add_argument("--external-upstream", action="store_true",
                   help="the upstream is a server the serve step did not start: calls without token ids are "
                        "recorded as untrainable, vLLM-only sampling keys at neutral are not sent")
    p.add_argument("--judge-upstream", help="the judge a task's verifier may ask through POST /judge/{id}/v1/chat/"
                   "completions: an OpenAI-compatible server's base URL (its key from "
                   "OPENFORGE_JUDGE_UPSTREAM_API_KEY; default: no judge route)")
    p.add_argument("--judge-model", help="the model name the judge upstream is asked for (with --judge-upstream)")
    p.add_argument("--weight-version", help="version of the weights vLLM starts with (default: ask vLLM, else 0)")
    p.add_argument("--adapter", help="a LoRA adapter folder every replica loads before the proxy listens, served as "
                                     "--weight-version (steps.proxy.weights; default: none, the model alone)")
    p.add_argument("--sampling", action="append", default=[], metavar="KEY=VALUE",
                   help=f"the run's sampling, forced on every call (repeatable; keys {', '.join(sampling.KEYS)}; "
                        f"those not given are forced to their neutral value)")
    p.add_argument("--max-tokens-cap", type=int, help="upper bound on response tokens per call")
    p.add_argument("--image-limit", type=int,
                   help="images per request (the run's image_limit; 0: the served model takes no images); "
                        "more is a 400 (default: no limit of the proxy's own)")
    p.add_argument("--tool-images", choices=("tool", "user"), default="tool",
                   help="where a tool result's images go: in the tool message (the model's chat template renders "
                        "images in tool turns: steps.proxy.images.renders_tool_images) or a user message after it")
    p.add_argument("--max-body-bytes", type=int, default=64 * 1024 * 1024)
    p.add_argument("--upstream-timeout", type=float, default=1800.0, help="seconds for one upstream call")
    p.add_argument("--fsync", action="store_true", help="fsync each stored call (survives a machine crash)")
    p.add_argument("--log-level", default="warning")
    p.add_argument("--http-server", choices=("openforge", "uvicorn"), default="openforge",
                   help="the proxy's own HTTP/1.1 server (fast), or uvicorn's httptools protocol")
    limits = p.add_argument_group("limits", "of the proxy's own HTTP server (docs/proxy.md, Limits); 0 turns one off")
    limits.add_argument("--max-head-bytes", type=int, default=64 * 1024, help="request line and headers (431)")
    limits.add_argument("--max-headers", type=int, default=128, help="headers in one request (431)")
    limits.add_argument("--head-timeout", type=float, default=30.0,
                        help="seconds for a request head to arrive, and for a new connection's first (408)")
    limits.add_argument("--body-timeout", type=float, default=60.0, help="seconds for a request body to arrive (408)")
    limits.add_argument("--keep-alive-timeout", type=float, default=75.0, help="seconds an idle connection stays open")
    limits.add_argument("--max-connections", type=int,
                        help="open client connections (503); default: half the open files the process may have")
    limits.add_argument("--max-connections-per-client", type=int, default=1024,
                        help="open connections from one client address (503)")
    add_rollout_limits(p)
    args = p.parse_args(argv)
    rollout_limits = check_rollout_limits(p, args)
    for name in ("max_head_bytes", "max_headers", "head_timeout", "body_timeout", "keep_alive_timeout",
                 "max_connections", "max_connections_per_client"):
        if (value := getattr(args, name) or 0) < 0:
            p.error(f"--{name.replace('_', '-')} takes a number >= 0 (0 turns the limit off), got {value}")
    if args.image_limit is not None and args.image_limit < 0:
        p.error(f"--image-limit takes a number >= 0 (0: the served model takes no images), got {args.image_limit}")
    if args.external_upstream and len(args.upstream) > 1:
        p.error("--external-upstream takes one --upstream: replicas are vLLM servers the serve step started")
    if len(set(args.upstream)) < len(args.upstream):
        p.error("each --upstream must be a different server: a replica named twice would count its load twice")
    if (args.run_url is None) != (args.iteration is None) or (args.iteration or 0) < 0:
        p.error("--run-url and --iteration go together (results are written under both), --iteration 0 or more")
    if not args.admin_key:
        p.error("an admin key is required: pass --admin-key or set OPENFORGE_ADMIN_KEY")
    upstream_key = os.environ.get("OPENFORGE_UPSTREAM_API_KEY") or None
    if upstream_key is not None and not upstream_key.isprintable():
        p.error("OPENFORGE_UPSTREAM_API_KEY holds a line break or another control character; give the key alone")
    judge_key = os.environ.get(JUDGE_KEY_ENV) or None
    if judge_key is not None and not judge_key.isprintable():
        p.error(f"{JUDGE_KEY_ENV} holds a line break or another control character; give the key alone")
    if bool(args.judge_upstream) != bool(args.judge_model):
        p.error("--judge-upstream and --judge-model go together: the judge's URL and the model it is asked for")
    return ProxyConfig(
        upstream=args.upstream[0], replicas=tuple(args.upstream[1:]), replica_policy=args.replica_policy,
        store=args.store, admin_key=args.admin_key, tasks=args.tasks, host=args.host, port=args.port,
        public_url=args.public_url, run_url=args.run_url, iteration=args.iteration, model=args.model,
        weight_version=args.weight_version, adapter=args.adapter,
        upstream_model=args.upstream_model, external_upstream=args.external_upstream,
        upstream_api_key=upstream_key,
        judge_upstream=args.judge_upstream or None, judge_model=args.judge_model or None, judge_api_key=judge_key,
        forced_sampling=forced_sampling(p, args.sampling),
        max_tokens_cap=args.max_tokens_cap, image_limit=args.image_limit, tool_images=args.tool_images == "tool",
        max_body_bytes=args.max_body_bytes,
        upstream_timeout_s=args.upstream_timeout, fsync=args.fsync, log_level=args.log_level,
        http_server=args.http_server, max_head_bytes=args.max_head_bytes, max_headers=args.max_headers,
        head_timeout_s=args.head_timeout, body_timeout_s=args.body_timeout, keep_alive_s=args.keep_alive_timeout,
        max_connections=args.max_connections, max_connections_per_client=args.max_connections_per_client,
        **rollout_limits,
    )


def forced_sampling(p: argparse.ArgumentParser, items: list[str]) -> dict:
    """`--sampling KEY=VALUE` flags as every sampling key's forced value ({} when none was given); exits with one
    sentence on an unknown key or a value out of range."""
    given = {}
    for item in items:
        key, sep, text = item.partition("=")
        if key not in sampling.KEYS or not sep:
            p.error(f"--sampling takes KEY=VALUE with KEY one of {', '.join(sampling.KEYS)}, got {item!r}")
        value = yaml.safe_load(text)
        if not isinstance(value, int | float) or isinstance(value, bool):
            p.error(f"--sampling {key} must be a number, got {text!r}")
        if why := sampling.problem(key, value):
            p.error(f"--sampling {key} {why}")
        given[key] = int(value) if key == "top_k" else float(value)  # vLLM takes only an integer top_k
    return {**sampling.NEUTRAL, **given} if given else {}


def main(argv: list[str] | None = None) -> int:
    """Starts the proxy and serves until interrupted; exit code 0 once it has shut down."""
    return serve(argv)


def serve(argv: list[str] | None = None, restart: Restart | None = None) -> int:
    """`main`, with the `restart` the serve step gives when its replicas are restarted on new weights rather than
    reloaded in place (steps.proxy.weights)."""
    config = parse_args(argv)
    logs.setup(config.log_level)
    app = create_app(config, restart)
    # Each call allocates thousands of short-lived JSON containers; with CPython's default thresholds the
    # collector ran several times per call and re-scanned every module object, 0.5-2 ms of CPU per call at
    # 64 sessions (benchmarks/proxy_overhead.py). Freeze what startup made and collect young objects rarely.
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    # Stored calls complete on worker threads that need the GIL back from the busy event loop; a 1 ms
    # switch interval instead of CPython's 5 ms roughly halved the latency the proxy adds at 64 paced sessions.
    sys.setswitchinterval(0.001)
    # uvicorn binds, runs the lifespan and shuts down gracefully; the proxy's own protocol serves the
    # requests (http_server.py) within its limits (connections.py). uvicorn's own protocol keeps only the
    # keep-alive timeout and, as a 503 per request, the connection cap. No proxy-headers middleware:
    # nothing in front rewrites client addresses.
    open_files = raise_open_file_limit()
    if config.http_server == "openforge":
        http, concurrency = protocol_factory(config, open_files), None
    else:
        http, concurrency = "httptools", connection_cap(config.max_connections, open_files) or None
    uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level, access_log=False,
                loop="auto", http=http, timeout_keep_alive=config.keep_alive_s or 10**9, limit_concurrency=concurrency,
                log_config=None, proxy_headers=False, server_header=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
