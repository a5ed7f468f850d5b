"""What rollout affinity is worth: vLLM's prefix-cache hit rate and calls/s, affinity against round robin, side by side.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/replica_affinity.py [--replicas 2] [--rollouts 8] [--turns 6] \\
        [--context-chars 8000] [--max-tokens 16] [--repeats 3] [--model DIR]
    PYTHONPATH=$PWD .venv/bin/python benchmarks/replica_affinity.py --device gpu --replicas 4 --model DIR

Starts `--replicas` real vLLM servers as `steps.serve --replicas R` does (on CPU each on its share of the
cores; on GPU each on its own GPUs) serving the tiny model (or `--model`), and runs the same multi-turn
rollouts through the real proxy `--repeats` times per policy, alternated (ABBA...: neither always runs first),
with each policy's median and range printed after the table: each rollout starts from its own `--context-chars` of text
(an agent's system prompt and first file) and grows by appending, `--rollouts` at once. Before each phase
every replica's prefix cache is dropped; the hit rate is the phase's `vllm:prefix_cache_hits` over
`vllm:prefix_cache_queries` (prompt tokens found in / asked of the cache), summed over the replicas, read
from vLLM's own `/metrics`. Round robin (`--replica-policy round-robin`) exists in the proxy for this
comparison only.

With `--device gpu` the phases are instead 1 replica and `--replicas` replicas, both with affinity: serve
throughput (calls/s, generated tokens/s) as replicas are added. The table goes to stdout (markdown), progress
to stderr.
"""

import argparse
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from proxy_process import start_proxy, stop_proxy  # noqa: E402
from steps.net import free_port  # noqa: E402
from steps.tiny_model import build_tiny_model  # noqa: E402
from steps.vllm_server import VllmServer, replica_env, spawn, stop_vllm, vllm_command, wait_healthy  # noqa: E402
from vllm_process import warm_up_call  # noqa: E402

ADMIN_KEY = "bench-admin-key"
NAME = "tiny"
METRICS = ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries")


def progress(line: str) -> None:
    print(f"replica_affinity: {line}", file=sys.stderr, flush=True)


def start_replicas(model: Path, replicas: int, device: str, folder: Path) -> list[VllmServer]:
    """`replicas` vLLM servers on `model`, started side by side; returns once all answer."""
    servers = []
    for index in range(replicas):
        port = free_port()
        servers.append(spawn(vllm_command(model, NAME, port, device=device), model, NAME, port,
                             folder / f"vllm-{replicas}-{index}.log", env=replica_env(index, replicas, device)))
    try:
        for server in servers:
            wait_healthy(server, 1800)
            warm_up_call(server)
    except BaseException:
        for server in servers:
            stop_vllm(server)
        raise
    return servers


def counters(server: VllmServer) -> dict[str, float]:
    """vLLM's prefix-cache counters (every engine's samples summed) from its `/metrics`.

    Prometheus names a counter's samples `NAME_total`; the label set follows in braces."""
    with urllib.request.urlopen(f"{server.base_url}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    found = dict.fromkeys(METRICS, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        for metric in METRICS:
            if name == f"{metric}_total":
                found[metric] += float(line.rsplit(" ", 1)[1])
    return found


def contexts(rollouts: int, chars: int) -> list[str]:
    """A different stretch of real text (the standard library's source) for each rollout to start from."""
    text = Path(sysconfig.get_paths()["stdlib"], "typing.py").read_text() * 4
    return [text[i * chars:(i + 1) * chars] for i in range(rollouts)]


def run_rollout(proxy_url: str, rollout: dict, context: str, turns: int, max_tokens: int, tokens: list[int]) -> None:
    """One rollout: `turns` calls, each appending the answer and a new user message to the context."""
    messages = [{"role": "system", "content": context}, {"role": "user", "content": "fix the failing test"}]
    with httpx.Client(timeout=600, headers={"authorization": f"Bearer {rollout['api_key']}"}) as client:
        for turn in range(turns):
            answer = client.post(f"{rollout['openai_base_url']}/chat/completions",
                                 json={"model": NAME, "messages": messages, "max_tokens": max_tokens, "temperature": 1.0})
            answer.raise_for_status()
            body = answer.json()
            tokens.append(body["usage"]["completion_tokens"])
            messages += [{"role": "assistant", "content": body["choices"][0]["message"]["content"] or ""},
                         {"role": "user", "content": f"the test still fails ({turn})"}]


def phase(servers: list[VllmServer], policy: str, label: str, args: argparse.Namespace, folder: Path) -> dict:
    """The rollouts through a proxy with `policy`: calls/s, tokens/s and the phase's prefix-cache hit rate."""
    for server in servers:  # each phase starts cold, so that neither inherits the other's cache
        urllib.request.urlopen(urllib.request.Request(f"{server.base_url}/reset_prefix_cache", method="POST"), timeout=60)
    before = [counters(server) for server in servers]
    upstreams = [word for server in servers[1:] for word in ("--upstream", server.base_url)]
    proxy = start_proxy(servers[0].base_url, str(folder / f"store-{label}"), ADMIN_KEY,
                        extra=[*upstreams, "--replica-policy", policy, "--sampling", "temperature=1.0"],
                        log_path=folder / f"proxy-{label}.log")
    try:
        registered = [proxy.register(f"{label}-{i}") for i in range(args.rollouts)]
        tokens: list[int] = []
        threads = [threading.Thread(target=run_rollout, args=(proxy.url, rollout, context, args.turns, args.max_tokens,
                                                              tokens))
                   for rollout, context in zip(registered, contexts(args.rollouts, args.context_chars))]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - started
    finally:
        stop_proxy(proxy)
    after = [counters(server) for server in servers]
    hits, queries = (sum(a[m] - b[m] for a, b in zip(after, before)) for m in METRICS)
    calls = args.rollouts * args.turns
    if len(tokens) != calls:
        raise RuntimeError(f"phase {label}: {len(tokens)} of {calls} calls answered; see {folder}")
    return {"phase": label, "replicas": len(servers), "calls": calls, "seconds": seconds, "calls_s": calls / seconds,
            "tokens_s": sum(tokens) / seconds, "hit_rate": hits / queries if queries else 0.0}


def table(rows: list[dict], args: argparse.Namespace) -> str:
    """The markdown table of the phases."""
    lines = [f"{args.rollouts} rollouts at once, {args.turns} calls each ({args.context_chars} characters of context "
             f"to start, {args.max_tokens} tokens per answer), device {args.device}:", "",
             "| phase | replicas | calls | seconds | calls/s | generated tokens/s | prefix-cache hit rate |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['phase']} | {r['replicas']} | {r['calls']} | {r['seconds']:.1f} | {r['calls_s']:.2f} | "
              f"{r['tokens_s']:.1f} | {r['hit_rate']:.1%} |" for r in rows]
    return "\n".join(lines)


def alternated(policies: tuple[str, str], repeats: int) -> list[str]:
    """Each policy `repeats` times, in the order ABBAABBA...: neither always runs first on a warmer machine.

    >>> alternated(("a", "b"), 3)
    ['a', 'b', 'b', 'a', 'a', 'b']
    """
    return [policies[(run + run // 2) % 2] for run in range(2 * repeats)]


def spread(rows: list[dict]) -> list[str]:
    """Per policy: the runs' median and range of calls/s and hit rate (phase labels are `policy-run`)."""
    lines = []
    for policy in dict.fromkeys(row["phase"].rsplit("-", 1)[0] for row in rows):
        runs = sorted((r for r in rows if r["phase"].rsplit("-", 1)[0] == policy), key=lambda r: r["calls_s"])
        rates = sorted(r["hit_rate"] for r in runs)
        lines.append(f"- {policy}: {len(runs)} runs, calls/s {runs[len(runs) // 2]['calls_s']:.2f} "
                     f"({runs[0]['calls_s']:.2f}-{runs[-1]['calls_s']:.2f}), hit rate "
                     f"{rates[len(rates) // 2]:.1%} ({rates[0]:.1%}-{rates[-1]:.1%})")
    return lines


def main() -> None:
    """Start the replicas, run the phases, print the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--rollouts", type=int, default=8)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--context-chars", type=int, default=8000)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3, help="runs of each policy on CPU, alternated (ABBA...)")
    p.add_argument("--model", type=Path, help="the checkpoint to serve (default: the tiny model, built here)")
    args = p.parse_args()
    if args.replicas < 2:
        p.error("--replicas takes a number >= 2: the comparison needs several replicas")
    with tempfile.TemporaryDirectory(prefix="replica-affinity-") as tmp:
        folder = Path(tmp)
        model = (args.model or build_tiny_model(folder / "tiny", seed=0)).resolve()
        rows = []
        if args.device == "cpu":
            progress(f"starting {args.replicas} vLLM servers")
            servers = start_replicas(model, args.replicas, "cpu", folder)
            try:
                for run, policy in enumerate(alternated(("affinity", "round-robin"), args.repeats)):
                    progress(f"phase {policy} ({run + 1} of {2 * args.repeats})")
                    rows.append(phase(servers, policy, f"{policy}-{run}", args, folder))
            finally:
                for server in servers:
                    stop_vllm(server)
        else:
            for count in (1, args.replicas):
                progress(f"starting {count} vLLM server(s) on GPU")
                servers = start_replicas(model, count, "gpu", folder)
                try:
                    rows.append(phase(servers, "affinity", f"{count}-replica", args, folder))
                finally:
                    for server in servers:
                        stop_vllm(server)
    print(table(rows, args))
    if args.device == "cpu":
        print("\n" + "\n".join(spread(rows)))


if __name__ == "__main__":
    main()
