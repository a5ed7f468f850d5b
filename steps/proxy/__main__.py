"""The recording proxy between agent harnesses and vLLM.

    python -m steps.proxy --upstream http://127.0.0.1:8000 --port 8100 --store ./runs/calls \
        [--admin-key KEY | env OPENFORGE_ADMIN_KEY] [--override temperature=1.0] [--max-tokens-cap 512]

`--upstream` is vLLM's root URL (no /v1); `--store` a local folder or an s3:// URL.
"""

import argparse
import gc
import os
import sys

import uvicorn
import yaml

from steps import logs
from steps.proxy.app import create_app
from steps.proxy.config import ProxyConfig
from steps.proxy.connections import connection_cap, raise_open_file_limit
from steps.proxy.http_server import protocol_factory


def parse_args(argv: list[str] | None = None) -> ProxyConfig:
    """Reads the command line into a ProxyConfig; exits with one sentence on a bad flag."""
    p = argparse.ArgumentParser(prog="python -m steps.proxy", description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", required=True, help="vLLM root URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--store", required=True, help="local folder or s3:// URL for recorded calls")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--admin-key", default=os.environ.get("OPENFORGE_ADMIN_KEY"))
    p.add_argument("--public-url", help="base URL harnesses reach the proxy at (default: the request's host)")
    p.add_argument("--model", help="served model name (default: the first of upstream /v1/models)")
    p.add_argument("--weight-version", help="version of the weights vLLM starts with (default: ask vLLM, else 0)")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="sampling setting forced on every call, e.g. temperature=1.0 (repeatable)")
    p.add_argument("--max-tokens-cap", type=int, help="upper bound on response tokens per call")
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
    args = p.parse_args(argv)
    for name in ("max_head_bytes", "max_headers", "head_timeout", "body_timeout", "keep_alive_timeout",
                 "max_connections", "max_connections_per_client"):
        if (value := getattr(args, name) or 0) < 0:
            p.error(f"--{name.replace('_', '-')} takes a number >= 0 (0 turns the limit off), got {value}")
    if not args.admin_key:
        p.error("an admin key is required: pass --admin-key or set OPENFORGE_ADMIN_KEY")
    overrides = {}
    for item in args.override:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--override takes KEY=VALUE, got {item!r}")
        overrides[key] = yaml.safe_load(value)
    return ProxyConfig(
        upstream=args.upstream, store=args.store, admin_key=args.admin_key, host=args.host, port=args.port,
        public_url=args.public_url, model=args.model, weight_version=args.weight_version, overrides=overrides,
        max_tokens_cap=args.max_tokens_cap, max_body_bytes=args.max_body_bytes,
        upstream_timeout_s=args.upstream_timeout, fsync=args.fsync, log_level=args.log_level,
        http_server=args.http_server, max_head_bytes=args.max_head_bytes, max_headers=args.max_headers,
        head_timeout_s=args.head_timeout, body_timeout_s=args.body_timeout, keep_alive_s=args.keep_alive_timeout,
        max_connections=args.max_connections, max_connections_per_client=args.max_connections_per_client,
    )


def main(argv: list[str] | None = None) -> int:
    """Starts the proxy and serves until interrupted; exit code 0 once it has shut down."""
    config = parse_args(argv)
    logs.setup(config.log_level)
    app = create_app(config)
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
