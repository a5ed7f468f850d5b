"""vLLM on a checkpoint plus the recording proxy in front of it: the `serve` step of an iteration.

    OPENFORGE_ADMIN_KEY=... python -m steps.serve --model s3://openforge/runs/demo/checkpoints/iteration-1 \
        --model-dir /models/current --name qwen3-4b --port 8100 --store s3://openforge/runs/demo/calls \
        [--device gpu --gpus 1] [--max-tokens-cap 4096] [--weight-version 0] [--sampling temperature=1.0 ...]

`--model` is a checkpoint folder, a hub name or an `s3://` URL; a URL is fetched to `--model-dir` first,
without what only training reads (`optimizer/`, AdamW's state: twice the weights). Starts vLLM on the
loopback interface, waits until it answers `/health`, then runs the proxy on `--host` (0.0.0.0 in a
pod) until stopped. The proxy only listens once vLLM is ready, so a readiness probe on the proxy's
`/health` means the whole server is ready; that is what the Argo daemon step waits for before any
rollout starts. vLLM is stopped when the proxy exits.
"""

import argparse
import signal
import subprocess
import sys
from pathlib import Path

from steps.checkpoint import TRAINING_ONLY, fetch
from steps.proxy.__main__ import main as proxy_main
from steps.vllm_server import HOST, VllmServer, free_port, stop_vllm, vllm_command, vllm_env, wait_healthy


def gpu_vllm_command(model: str, name: str, port: int, gpus: int) -> list[str]:
    """vLLM's command on GPUs: the CPU flags of `steps.vllm_server` minus eager mode and the one-process executor."""
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model, "--served-model-name", name, "--host", HOST, "--port", str(port),
        "--tensor-parallel-size", str(max(gpus, 1)), "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--max-logprobs", "20", "--logprobs-mode", "processed_logprobs",
        "--generation-config", "vllm",  # sampling defaults are vLLM's, never the checkpoint's
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; everything after the known flags is passed to the proxy unchanged."""
    p = argparse.ArgumentParser(prog="python -m steps.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="checkpoint vLLM loads: a folder, a hub name or an s3:// URL")
    p.add_argument("--model-dir", type=Path, default=Path("models/current"),
                   help="where a --model URL is fetched to (default: ./models/current)")
    p.add_argument("--name", required=True, help="the model name vLLM serves")
    p.add_argument("--port", type=int, required=True, help="the proxy's port")
    p.add_argument("--store", required=True, help="local folder or s3:// URL for recorded calls")
    p.add_argument("--host", default="127.0.0.1", help="the proxy's interface (0.0.0.0 in a pod)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--max-tokens-cap", type=int)
    p.add_argument("--weight-version")
    p.add_argument("--sampling", action="append", default=[], metavar="KEY=VALUE",
                   help="the run's sampling, forced by the proxy on every call (repeatable; steps/sampling.py)")
    p.add_argument("--log", type=Path, default=Path("vllm.log"), help="vLLM's log file")
    p.add_argument("--start-timeout", type=float, default=1800.0, help="seconds vLLM may take to start")
    return p.parse_args(argv)


def proxy_argv(args: argparse.Namespace, vllm_port: int) -> list[str]:
    """The proxy's flags: upstream is the vLLM this step started."""
    argv = ["--upstream", f"http://{HOST}:{vllm_port}", "--port", str(args.port), "--host", args.host,
            "--store", args.store, "--model", args.name]
    if args.max_tokens_cap:
        argv += ["--max-tokens-cap", str(args.max_tokens_cap)]
    if args.weight_version is not None:
        argv += ["--weight-version", args.weight_version]
    return argv + [word for item in args.sampling for word in ("--sampling", item)]


def _progress(line: str) -> None:
    print(f"serve: {line}", file=sys.stderr, flush=True)


def _exit_on_signal(signum: int, frame: object) -> None:
    """SIGTERM as SystemExit, so that `finally` blocks (stopping vLLM) run."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Starts vLLM, waits for it, serves the proxy in this process, stops vLLM on the way out."""
    args = parse_args(argv)
    try:
        model = str(fetch(args.model, args.model_dir, skip=TRAINING_ONLY, progress=_progress))
    except (OSError, ValueError) as exc:  # FileNotFoundError included: no checkpoint at the URL
        print(f"error: cannot fetch the checkpoint {args.model}: {exc}", file=sys.stderr)
        return 1
    port = free_port()
    command = (gpu_vllm_command(model, args.name, port, args.gpus) if args.device == "gpu"
               else vllm_command(Path(model), args.name, port))
    args.log.parent.mkdir(parents=True, exist_ok=True)
    with open(args.log, "ab") as log:
        process = subprocess.Popen(command, env=vllm_env(), stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    server = VllmServer(process, Path(model), args.name, port, args.log)
    # uvicorn re-raises the SIGTERM it caught once the proxy has shut down; with the default handler the
    # process would die right there and leave vLLM (its own session) running, so turn it into SystemExit.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        wait_healthy(server, args.start_timeout)
        print(f"serve: vLLM ready on {server.base_url}; proxy on {args.host}:{args.port}", file=sys.stderr, flush=True)
        proxy_main(proxy_argv(args, port))
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_vllm(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
