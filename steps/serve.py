"""vLLM on a checkpoint plus the recording proxy in front of it: the `serve` step of an iteration.

    OPENFORGE_ADMIN_KEY=... python -m steps.serve --model s3://openforge/runs/demo/checkpoints/iteration-1 \
        --model-dir /models/current --model-name qwen3-4b --port 8100 --store s3://openforge/runs/demo/calls \
        [--device gpu --gpus 1] [--replicas 1] [--max-tokens-cap 4096] [--weight-version 0] \
        [--tool-call-parser hermes] [--reasoning-parser qwen3] [--max-model-len 32768] \
        [--gpu-memory-utilization 0.9] [--image-limit 4] [--max-pixels 0] [--chat-template FILE] \
        [--vllm-arg=--enable-prefix-caching ...] \
        [--sampling temperature=1.0 ...] [--store-quota-mb 128] [--store-quota-calls 2048] \
        [--image-pixel-limit 40000000] [--request-image-mb 32] \
        [--lora-rank 8 --base-model s3://openforge/runs/demo/checkpoints/iteration-0 [--model-cache /model-cache]]

`--model` is a checkpoint folder, a hub name (then name its `--tool-call-parser`) or an `s3://` URL; a URL
is fetched to `--model-dir` first, without what only training reads (`optimizer/`, AdamW's state: twice
the weights). Starts vLLM on the loopback interface (its command line: `steps.vllm_server.vllm_command`,
with the tool-call parser of the checkpoint's family unless `--tool-call-parser` names one; a family
without one is one line and exit code 1), waits until it answers `/health`, then runs the proxy on
`--host` (0.0.0.0 in a pod) until stopped. The proxy only listens once vLLM is ready, so a readiness
probe on the proxy's `/health` means the whole server is ready; that is what the Argo daemon step waits
for before any rollout starts. vLLM is stopped when the proxy exits. What one rollout may take (`--store-quota-mb`,
`--store-quota-calls`, `--image-pixel-limit`, `--request-image-mb`: the run config's keys) is passed on to the proxy.

A LoRA run (`--lora-rank R` > 0) serves its base model with vLLM's LoRA flags (`steps.vllm_server.lora_flags`).
When `--model` is an adapter (a checkpoint folder with `adapter_config.json`: every iteration after 0), only the
adapter is fetched from it, the base from `--base-model` (iteration 0's checkpoint, fetched once per pod into
`base/` beside `--model-dir`, or with `--model-cache DIR` once into that cache, which every iteration's serve pod
mounts: `steps.model_cache`); vLLM starts on the base and the proxy loads the adapter before it listens
(`--adapter`, docs/serving.md "LoRA").

`--replicas R` starts R vLLM servers on loopback (each `--gpus` GPUs of the pod, or on CPU its share of the
cores: `steps.vllm_server.replica_env`; logs `vllm.log`, `vllm-1.log`, ...) and one proxy in front of them all,
which keeps each rollout on one replica (steps/proxy/replicas.py). A replica that dies is left out by the proxy
and not restarted: its rollouts go on on the others.

Where vLLM cannot reload the checkpoint in place (a mixture-of-experts model on CPU:
`steps.vllm_server.reloads_in_place`), the proxy's weight swap (`POST /weights/update`) restarts each replica on the
new checkpoint instead, through this step, which owns the processes (`Replicas.restart`); calls wait at the gate
meanwhile, as during a reload.

    OPENFORGE_ADMIN_KEY=... [OPENFORGE_UPSTREAM_API_KEY=...] python -m steps.serve \
        --upstream http://10.0.0.5:8000 --upstream-model Qwen/Qwen3-8B --model-name qwen3-8b --port 8100 \
        --store s3://openforge/runs/demo/calls [--sampling temperature=1.0 ...]

With `--upstream` no vLLM is started: the proxy runs in front of a server that is already running (a vLLM
elsewhere, or any OpenAI-compatible endpoint; its base URL, a trailing /v1 is dropped), harnesses ask for
`--model-name` and the upstream is sent `--upstream-model` (default: the same). Its `/v1/models` must answer and
list that model, else one line and exit code 1. Calls it answers without token ids are recorded as untrainable
(docs/serving.md, "Serving an existing endpoint").
"""

import argparse
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from steps import net, sampling
from steps.checkpoint import TRAINING_ONLY, fetch
from steps.follow import start_follower
from steps.model_cache import fetch_base
from steps.net import HOST, free_port
from steps.proxy.__main__ import add_rollout_limits, check_rollout_limits, forced_sampling
from steps.proxy.__main__ import command_line as proxy_command_line
from steps.proxy.__main__ import serve as proxy_main
from steps.proxy.images import renders_tool_images
from steps.proxy.weights import is_adapter
from steps.vllm_parsers import UnknownFamily
from steps.vllm_server import (
    CHECKPOINT_TEMPLATE,
    ServingOptions,
    VllmServer,
    check_vllm_args,
    is_vision,
    reloads_in_place,
    replica_env,
    signal_group,
    spawn,
    vllm_command,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; a `--vllm-arg` that sets what the builder sets is refused (exit code 2)."""
    p = argparse.ArgumentParser(prog="python -m steps.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="checkpoint vLLM loads: a folder, a hub name or an s3:// URL")
    p.add_argument("--upstream", help="instead of --model: the base URL of an OpenAI-compatible server already "
                                      "running, which the proxy is put in front of (no vLLM is started)")
    p.add_argument("--upstream-model", default="", help="the model name that upstream serves (default: --model-name)")
    p.add_argument("--model-dir", type=Path, default=Path("models/current"),
                   help="where a --model URL is fetched to (default: ./models/current)")
    p.add_argument("--model-name", required=True, help="the model name vLLM serves")
    p.add_argument("--port", type=int, required=True, help="the proxy's port")
    p.add_argument("--store", required=True, help="local folder or s3:// URL for recorded calls")
    p.add_argument("--host", default="127.0.0.1", help="the proxy's interface (0.0.0.0 in a pod)")
    p.add_argument("--tasks", default="", help="the run's dataset snapshots, which the proxy serves to rollout pods")
    p.add_argument("--run-url", help="the run's folder in the store, where the proxy writes the rollout results "
                                     "rollout pods send it (with --iteration; steps/proxy/results.py)")
    p.add_argument("--iteration", type=int, help="the iteration whose rollout results the proxy writes")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--gpus", type=int, default=1, help="GPUs of each replica (vLLM's tensor parallelism)")
    p.add_argument("--replicas", type=int, default=1, help="vLLM servers behind the one proxy")
    p.add_argument("--max-tokens-cap", type=int)
    p.add_argument("--weight-version")
    vllm = p.add_argument_group("vLLM", "serving options (docs/serving.md)")
    # Shown in every serve step (the DAG, a dry run) though its one value is the builder's own: sampling defaults
    # are vLLM's, never the checkpoint's generation_config.json; the run's sampling is forced by the proxy.
    vllm.add_argument("--generation-config", choices=("vllm",), default="vllm",
                      help="where vLLM's sampling defaults come from: vllm (never the checkpoint)")
    vllm.add_argument("--tool-call-parser", default="", help="default: the one of the checkpoint's family")
    vllm.add_argument("--reasoning-parser", default="", help="default: none")
    vllm.add_argument("--max-model-len", type=int, default=0, help="0: vLLM's default on GPU, 32768 on CPU")
    vllm.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    vllm.add_argument("--image-limit", type=int, default=4, help="images per prompt (a vision checkpoint only)")
    vllm.add_argument("--max-pixels", type=int, default=0,
                      help="the image processor's pixel cap (a vision checkpoint only); 0: the checkpoint's")
    vllm.add_argument("--chat-template", default="",
                      help="a chat template file for vLLM (a vision checkpoint only); default: the checkpoint's")
    vllm.add_argument("--vllm-arg", action="append", default=[], metavar="ARG",
                      help="one more argument for vLLM, written --vllm-arg=ARG (repeatable)")
    p.add_argument("--sampling", action="append", default=[], metavar="KEY=VALUE",
                   help="the run's sampling, forced by the proxy on every call (repeatable; steps/sampling.py; "
                        "keys not given, or none at all, are forced to their neutral values)")
    p.add_argument("--lora-rank", type=int, default=0, help="a LoRA run's adapter rank: vLLM serves the base "
                                                             "with adapters up to it (default 0: full weights)")
    p.add_argument("--base-model", default="", help="a LoRA run's base model (iteration 0's checkpoint), served "
                                                    "under --model when that is an adapter")
    p.add_argument("--model-cache", type=Path, help="a folder kept from pod to pod (a volume) where the base model of "
                                                    "a LoRA run is fetched once (steps.model_cache)")
    p.add_argument("--follow-run-url", help="swap in each checkpoint of this run, up to --follow-until, as its "
                                            "update publishes it (steps.follow; max_staleness >= 1 on Argo)")
    p.add_argument("--follow-until", type=int, help="the last checkpoint to follow")
    p.add_argument("--log", type=Path, default=Path("vllm.log"), help="vLLM's log file")
    p.add_argument("--start-timeout", type=float, default=1800.0, help="seconds vLLM may take to start")
    p.add_argument("--judge-upstream", default="", help="the judge a task's verifier may ask, through the proxy's "
                   "judge route: an OpenAI-compatible base URL (its key from OPENFORGE_JUDGE_UPSTREAM_API_KEY)")
    p.add_argument("--judge-model", default="", help="the model name the judge upstream is asked for")
    add_rollout_limits(p)  # passed on to the proxy
    args = p.parse_args(argv)
    args.limits = check_rollout_limits(p, args)
    if args.replicas < 1 or (args.upstream is not None and args.replicas != 1):
        p.error("--replicas takes a number >= 1 of vLLM servers to start (with --upstream: 1, none is started)")
    if (args.model is None) == (args.upstream is None):
        p.error("give either --model (a checkpoint to serve with vLLM) or --upstream (a server already running), "
                "not both or neither")
    if (args.run_url is None) != (args.iteration is None):
        p.error("--run-url and --iteration go together: the proxy writes rollout results under both")
    if args.upstream is not None and not net.is_upstream_url(args.upstream):
        p.error(f"--upstream must be {net.UPSTREAM_URL}")
    try:
        check_vllm_args(args.vllm_arg, where="--vllm-arg")
    except ValueError as exc:
        p.error(str(exc))
    # Checked now, not once vLLM has loaded; and never a plain recorder: the harness does not choose sampling.
    args.sampling = sampling.as_flags(forced_sampling(p, args.sampling) or sampling.NEUTRAL)[1::2]
    return args


def serving_options(args: argparse.Namespace) -> ServingOptions:
    """The vLLM options of the command line."""
    return ServingOptions(tool_call_parser=args.tool_call_parser, reasoning_parser=args.reasoning_parser,
                          max_model_len=args.max_model_len, gpu_memory_utilization=args.gpu_memory_utilization,
                          gpus=args.gpus, image_limit=args.image_limit, max_pixels=args.max_pixels,
                          chat_template=args.chat_template, vllm_args=tuple(args.vllm_arg),
                          lora_rank=args.lora_rank)


def proxy_argv(args: argparse.Namespace, vllm_ports: int | list[int], model: str | None = None,
               adapter: str | None = None) -> list[str]:
    """The proxy's flags: its upstreams are the vLLM servers this step started (one port, or each replica's).
    The served checkpoint `model` decides the images: `--image-limit` for a vision checkpoint (0, every image
    refused, for a text one), and where tool results' images go, by whether its chat template renders them.
    A LoRA iteration's `adapter` folder is loaded by the proxy before it listens."""
    ports = [vllm_ports] if isinstance(vllm_ports, int) else vllm_ports
    vision = model is not None and is_vision(Path(model))
    template = Path(args.chat_template) if args.chat_template else Path(model or ".") / CHECKPOINT_TEMPLATE
    return proxy_command_line([f"http://{HOST}:{port}" for port in ports], args.store, args.port, host=args.host,
                              model_name=args.model_name, max_tokens_cap=args.max_tokens_cap or None,
                              weight_version=args.weight_version, sampling=args.sampling,
                              image_limit=args.image_limit if vision else 0, limits=args.limits,
                              judge_upstream=args.judge_upstream, judge_model=args.judge_model,
                              tool_images=vision and template.is_file() and renders_tool_images(template.read_text()),
                              extra=[*(["--tasks", args.tasks] if args.tasks else []), *results_flags(args),
                                     *(["--adapter", adapter] if adapter else [])])


def fetch_served(args: argparse.Namespace) -> tuple[str, str | None]:
    """The folder vLLM starts on and a LoRA iteration's adapter folder (None: full weights, or the base alone).
    `--model` is fetched without what only training reads; when it is an adapter, the base is fetched from
    `--base-model` into `base/` beside `--model-dir`, once: a pod serving several iterations keeps it; with
    `--model-cache`, into that cache unless it holds the base already (`steps.model_cache.fetch_base`)."""
    model = str(fetch(args.model, args.model_dir, skip=TRAINING_ONLY, progress=_progress))
    if not is_adapter(model):
        return model, None
    if args.lora_rank <= 0 or not args.base_model:
        raise ValueError(f"{args.model} is a LoRA adapter; serve it with --lora-rank (the run's lora_rank) and "
                         "--base-model (iteration 0's checkpoint)")
    if args.model_cache is not None:
        return str(fetch_base(args.base_model, args.model_cache, skip=TRAINING_ONLY, progress=_progress)), model
    base = args.model_dir.parent / "base"
    return str(fetch(args.base_model, base, skip=TRAINING_ONLY, progress=_progress)), model


def results_flags(args: argparse.Namespace) -> list[str]:
    """The proxy's `--run-url` and `--iteration`, where it writes rollout results, when given."""
    return [] if args.run_url is None else ["--run-url", args.run_url, "--iteration", str(args.iteration)]


def upstream_base(url: str) -> str:
    """The upstream's base URL, as the proxy takes it: without a trailing `/v1` (the proxy adds its routes).

    >>> upstream_base("https://api.example.com/v1/"), upstream_base("http://10.0.0.5:8000")
    ('https://api.example.com', 'http://10.0.0.5:8000')
    """
    return url.rstrip("/").removesuffix("/v1")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Follows no redirect (a 3xx is then an HTTPError): the key goes to the upstream named, nowhere else."""

    def redirect_request(self, *args, **kwargs) -> None:
        return None


def upstream_problem(url: str, model: str, api_key: str | None = None, timeout_s: float = 10.0) -> str | None:
    """Why the upstream at `url` cannot be served (one sentence naming the URL: it does not answer its
    `/v1/models`, or does not list `model`, or redirects), or None when it lists `model`."""
    request = urllib.request.Request(f"{url}/v1/models", headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.build_opener(_NoRedirect).open(request, timeout=timeout_s) as answer:
            listed = [entry.get("id") for entry in json.loads(answer.read())["data"]]
    except urllib.error.HTTPError as exc:
        return f"the upstream {url} answered {exc.code} to GET /v1/models; is it an OpenAI-compatible server (and its key set)?"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"the upstream {url} does not answer GET /v1/models ({reason}); is it running?"
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"the upstream {url} answered GET /v1/models without a model list; is it an OpenAI-compatible server?"
    if model not in listed:
        names = ", ".join(repr(name) for name in listed[:10]) or "none"
        return f"the upstream {url} does not list the model {model!r} in its /v1/models (it lists {names}); set --upstream-model"
    return None


def upstream_proxy_argv(args: argparse.Namespace) -> list[str]:
    """The proxy's flags in front of `--upstream`: an external upstream, sent `--upstream-model`."""
    return proxy_command_line(upstream_base(args.upstream), args.store, args.port, host=args.host,
                              model_name=args.model_name, max_tokens_cap=args.max_tokens_cap or None,
                              weight_version=args.weight_version, sampling=args.sampling,
                              upstream_model=args.upstream_model or args.model_name, external=True, limits=args.limits,
                              judge_upstream=args.judge_upstream, judge_model=args.judge_model,
                              extra=[*(["--tasks", args.tasks] if args.tasks else []), *results_flags(args)])


def serve_upstream(args: argparse.Namespace) -> int:
    """The proxy in front of a server already running: checked first, then served in this process."""
    url, model = upstream_base(args.upstream), args.upstream_model or args.model_name
    problem = upstream_problem(url, model, os.environ.get("OPENFORGE_UPSTREAM_API_KEY") or None)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    print(f"serve: upstream {url} serves {model!r}; proxy on {args.host}:{args.port}", file=sys.stderr, flush=True)
    proxy_main(upstream_proxy_argv(args))
    return 0


def _progress(line: str) -> None:
    print(f"serve: {line}", file=sys.stderr, flush=True)


def _exit_on_signal(signum: int, frame: object) -> None:
    """SIGTERM as SystemExit, so that `finally` blocks (stopping vLLM) run."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Starts vLLM, waits for it, serves the proxy in this process, stops vLLM on the way out (with `--upstream`:
    only the proxy)."""
    args = parse_args(argv)
    if args.upstream is not None:
        return serve_upstream(args)
    try:
        model, adapter = fetch_served(args)
    except (OSError, ValueError) as exc:  # FileNotFoundError included: no checkpoint at the URL
        print(f"error: cannot fetch the checkpoint {args.model}: {exc}", file=sys.stderr)
        return 1
    shortage = gpu_shortage(args.replicas, args.gpus, visible_gpus()) if args.device == "gpu" else None
    if shortage is not None and args.replicas > 1:
        print(f"error: {shortage}", file=sys.stderr)
        return 1
    ports = [free_port() for _ in range(args.replicas)]
    try:
        commands = [vllm_command(model, args.model_name, port, serving_options(args), device=args.device)
                    for port in ports]
    except UnknownFamily as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    follower = None
    # uvicorn re-raises the SIGTERM it caught once the proxy has shut down; with the default handler the
    # process would die right there and leave vLLM (its own session) running, so turn it into SystemExit.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    servers = []
    try:
        # All at once: R replicas start in the time of one (each on its own GPUs or cores).
        for index, (command, port) in enumerate(zip(commands, ports)):
            servers.append(spawn(command, Path(model), args.model_name, port, replica_log(args.log, index),
                                 env=replica_env(index, args.replicas, args.device, args.gpus)))
        wait_all_healthy(servers, args.start_timeout)
        urls = ", ".join(server.base_url for server in servers)
        print(f"serve: vLLM ready on {urls}; proxy on {args.host}:{args.port}", file=sys.stderr, flush=True)
        if args.follow_run_url:
            follower = start_follower(args.follow_run_url, int(args.weight_version or 0), args.follow_until,
                                      f"http://127.0.0.1:{args.port}", args.model_dir.parent / "followed")
        restart = None if reloads_in_place(Path(model), args.device) else ReplicaRestart(servers, args).restart
        proxy_main(proxy_argv(args, ports, model, adapter), restart)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if follower is not None:
            follower.terminate()
        stop_all(servers)
    return 0


def gpu_shortage(replicas: int, gpus: int, visible: list[str]) -> str | None:
    """Why `replicas` replicas of `gpus` GPUs each cannot start on the `visible` devices, or None if they can.

    >>> print(gpu_shortage(2, 2, ["0", "1", "2"]))
    --replicas 2 x --gpus 2 needs 4 GPUs, but this pod sees 3 (0,1,2); lower --replicas or --gpus, or give the pod more
    >>> gpu_shortage(2, 1, ["0", "1"]) is None
    True
    """
    if len(visible) >= replicas * gpus:
        return None
    return (f"--replicas {replicas} x --gpus {gpus} needs {replicas * gpus} GPUs, but this pod sees {len(visible)} "
            f"({','.join(visible) or 'none'}); lower --replicas or --gpus, or give the pod more")


def visible_gpus() -> list[str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else the NVIDIA device files."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [device for device in listed.split(",") if device]
    return sorted(path.name.removeprefix("nvidia") for path in Path("/dev").glob("nvidia[0-9]*"))


def wait_all_healthy(servers: list[VllmServer], timeout_s: float) -> None:
    """Waits for every replica's `/health` under one deadline; raises at once, with its log tail, when any vLLM
    exits while starting (the others are stopped by the caller)."""
    deadline, waiting = time.monotonic() + timeout_s, list(servers)
    while waiting:
        for server in list(waiting):
            if server.process.poll() is not None:
                raise RuntimeError(f"vLLM replica {servers.index(server)} exited with code {server.process.returncode} "
                                   f"while starting; last lines of {server.log_path}:\n{server.log_tail()}")
            if _answers_health(server):
                waiting.remove(server)
        if waiting and time.monotonic() > deadline:
            raise RuntimeError(f"vLLM replica {servers.index(waiting[0])} did not become healthy within "
                               f"{timeout_s:.0f} s; last lines of {waiting[0].log_path}:\n{waiting[0].log_tail()}")
        if waiting:
            time.sleep(0.5)


def _answers_health(server: VllmServer) -> bool:
    try:
        with urllib.request.urlopen(f"{server.base_url}/health", timeout=2) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


class ReplicaRestart:
    """Restarts one replica on a new checkpoint, for the proxy's weight swap where vLLM cannot reload in place."""

    def __init__(self, servers: list[VllmServer], args: argparse.Namespace) -> None:
        self.servers, self.args = servers, args

    def restart(self, index: int, weights_path: str) -> None:
        """Stops replica `index` and starts it on the checkpoint folder `weights_path`, on its port, with its share
        of the machine; returns once it answers /health (RuntimeError with its log tail when it cannot)."""
        old, args = self.servers[index], self.args
        stop(old)
        started = time.monotonic()
        try:
            command = vllm_command(weights_path, args.model_name, old.port, serving_options(args), device=args.device)
        except UnknownFamily as exc:
            raise RuntimeError(str(exc)) from None
        self.servers[index] = spawn(command, Path(weights_path), args.model_name, old.port, old.log_path,
                                    env=replica_env(index, args.replicas, args.device, args.gpus))
        wait_all_healthy([self.servers[index]], args.start_timeout)
        _progress(f"vLLM replica {index} restarted on {weights_path} in {time.monotonic() - started:.0f} s")


def stop(server: VllmServer, grace_s: float = 20.0) -> None:
    """Stops one replica: SIGTERM to its process group, up to `grace_s`, then SIGKILL to what is left."""
    signal_group(server, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while server.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    signal_group(server, signal.SIGKILL)
    server.process.wait()


def stop_all(servers: list[VllmServer], grace_s: float = 20.0) -> None:
    """Stops every replica together: SIGTERM to each process group, one shared `grace_s`, then SIGKILL to what is
    left. A second SIGTERM meanwhile is ignored, so that no vLLM is left running (each is in its own session)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for server in servers:
        signal_group(server, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(server.process.poll() is None for server in servers) and time.monotonic() < deadline:
        time.sleep(0.1)
    for server in servers:
        signal_group(server, signal.SIGKILL)  # whatever is left: the engine cores, their workers
        server.process.wait()


def replica_log(log: Path, index: int) -> Path:
    """Replica `index`'s vLLM log: `log` itself for the first, `vllm-1.log`, ... beside it for the others.

    >>> replica_log(Path("logs/vllm.log"), 0), replica_log(Path("logs/vllm.log"), 2)
    (PosixPath('logs/vllm.log'), PosixPath('logs/vllm-2.log'))
    """
    return log if index == 0 else log.with_name(f"{log.stem}-{index}{log.suffix}")


if __name__ == "__main__":
    sys.exit(main())
