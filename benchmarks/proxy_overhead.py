"""What the recording proxy adds to a model call: latency, throughput and CPU, at 1 to 256 rollouts.

    .venv/bin/python benchmarks/proxy_overhead.py [--levels 1,16,64,256] [--seconds 4] \
        [--dialect chat|responses|messages] [--paced-ms 500] [--paced-rounds 3] [--store-dir DIR] \
        [--client-procs 1] [--no-pin]

Starts `benchmarks/fake_vllm.py` (answers with a canned vLLM body) and the real proxy
(`python -m steps.proxy`) as subprocesses on 127.0.0.1. For each level C it registers C rollouts and
runs C sessions, each sending agent-sized calls (~50 KB: the real first requests of the harnesses in
`tests/data/harness_requests/`, streamed) back to back, first straight to the fake upstream (the same
body, not streamed: a small answer, as vLLM gives a harness that asks for no token ids), then through
the proxy (which asks for token ids and logprobs: a 40-110 KB answer). It prints, per C, p50/p99
latency of both paths, what the proxy adds, calls/s of both, and the CPU each process spent, then
whether the goals of issue 2 are met. Progress goes to stderr, the table to stdout.

With an instant upstream the sessions saturate the machine, so latency there is mostly queueing
(Little's law: p50 ~ C / calls/s) and those rows measure throughput. One more row runs 64 sessions
against an upstream that takes `--paced-ms` per call, as a model does: that row measures the latency
the proxy adds to a call when it is not the bottleneck; its direct and proxied windows take turns over
`--paced-rounds` rounds, so that a shared VM's drifting load falls on both paths alike.

With two or more cores the proxy gets one of its own and the load (client sessions, fake upstream)
the rest, as in a deployment, where the proxy shares a pod with vLLM and the harnesses run in
their own pods: on shared cores, much of the "added" latency was the proxy waiting for a core the
benchmark's own client held. `--no-pin` runs everything on every core.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import multiprocessing
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
import uvloop

from steps.proxy.client import ProxyClient, ProxyClientError

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "data" / "harness_requests"
ADMIN_KEY = "bench-admin-key"
DIALECT_PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
STREAM_END = {"chat": b"data: [DONE]\n\n", "responses": b"response.completed", "messages": b"message_stop"}
WARMUP_S = 0.5
GOAL_C, GOAL_P50_MS, GOAL_P99_MS, GOAL_CALLS_S = 64, 2.0, 10.0, 1000.0


# --- requests ------------------------------------------------------------------------------------
@dataclass
class Workload:
    """The calls one session sends: proxy path suffix, streamed body for the proxy, plain body direct."""

    source: str
    path: str
    proxy_bodies: list[bytes]
    direct_bodies: list[bytes]


def synthetic_chat() -> dict:
    """A ~50 KB Chat Completions request: long system prompt, 12 tools, a 20-turn tool-calling history."""
    system = "You are a careful coding agent working in a Linux sandbox. " * 300
    tools = [{"type": "function", "function": {
        "name": f"tool_{i}", "description": "Runs one operation on the workspace. " * 20,
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "cmd": {"type": "string"}},
                       "required": ["cmd"]}}} for i in range(12)]
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Fix the failing test."}]
    for turn in range(10):
        messages.append({"role": "assistant", "content": None, "tool_calls": [{
            "id": f"call_{turn}", "type": "function",
            "function": {"name": "tool_0", "arguments": json.dumps({"cmd": f"sed -n {turn},+40p src/main.py"})}}]})
        messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": "def main():\n    pass\n" * 60})
    return {"model": "fake", "messages": messages, "tools": tools, "stream": True,
            "stream_options": {"include_usage": True}, "max_tokens": 1024}


def load_workload(dialect: str) -> Workload:
    """The captured harness requests of `dialect` (synthesised for chat if none were captured)."""
    bodies = []
    for path in sorted(glob.glob(str(FIXTURES / "*.json"))):
        captured = json.loads(Path(path).read_text())
        if DIALECT_PATHS[dialect] in captured["path"] and isinstance(captured.get("body"), dict):
            bodies.append((Path(path).stem, captured["body"]))
    if not bodies and dialect == "chat":
        bodies = [("synthetic", synthetic_chat())]
    if not bodies:
        sys.exit(f"no captured {dialect} request in {FIXTURES}; use --dialect chat or capture one "
                 "with tests/capture_requests.py")
    return Workload(
        source=", ".join(f"{name} ({len(orjson.dumps(body)) // 1000} KB)" for name, body in bodies),
        path=DIALECT_PATHS[dialect],
        proxy_bodies=[orjson.dumps({**body, "stream": True}) for _, body in bodies],
        direct_bodies=[orjson.dumps({**body, "stream": False}) for _, body in bodies],
    )


# --- processes -----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(proc: int | str) -> float:
    """User + system CPU seconds a process (pid) or one of its threads ("pid/task/tid") has used so far."""
    fields = Path(f"/proc/{proc}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def steal_seconds() -> float:
    """CPU seconds the hypervisor gave other guests while this VM's vCPUs wanted to run (all vCPUs)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0


def start(cmd: list[str], log_path: Path, cpus: set[int] | None = None) -> subprocess.Popen:
    """Starts `cmd` in the repository root, output to `log_path`; on `cpus` only, if given (the child
    inherits this process's CPU set, which is switched for the moment of the start)."""
    mine = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        with open(log_path, "wb") as log:  # the child keeps its own copy of the handle
            return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    finally:
        os.sched_setaffinity(0, mine)


def split_cpus(pin: bool) -> tuple[set[int] | None, set[int] | None]:
    """(the proxy's CPU, the load's CPUs): one core for the proxy and the rest for everything else, or
    (None, None) when not pinning or with a single core."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) < 2:
        return None, None
    return {cpus[-1]}, set(cpus[:-1])


async def wait_ready(http: aiohttp.ClientSession, url: str, proc: subprocess.Popen, log_path: Path) -> None:
    """Polls `url` until it answers 200 (at most 30 s)."""
    for _ in range(300):
        if proc.poll() is not None:
            sys.exit(f"{' '.join(proc.args[:3])} exited with {proc.returncode}:\n{log_path.read_text()[-2000:]}")
        try:
            async with http.get(url) as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    sys.exit(f"{url} did not come up within 30 s; see {log_path}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --- load ----------------------------------------------------------------------------------------
@dataclass
class Phase:
    """What one path (direct or proxy) did at one concurrency level, within the measured window."""

    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""
    window_s: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)
    steal_s: float = 0.0  # the VM's stolen CPU time in the window: a noisy neighbour, not the proxy

    @property
    def calls_s(self) -> float:
        return len(self.latencies_ms) / self.window_s if self.window_s else 0.0

    def add(self, other: Phase) -> None:
        """Takes in another window of the same path: its calls, errors, time and CPU."""
        self.latencies_ms += other.latencies_ms
        self.errors += other.errors
        self.first_error = self.first_error or other.first_error
        self.window_s += other.window_s
        self.steal_s += other.steal_s
        for name, seconds in other.cpu_s.items():
            self.cpu_s[name] = self.cpu_s.get(name, 0.0) + seconds

    def pct(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


@dataclass
class Load:
    """One phase's sessions: where each sends, what, for how long, and over how long they start."""

    targets: list[tuple[str, dict]]
    bodies: list[bytes]
    end_marker: bytes | None
    seconds: float
    stagger_s: float = 0.0


async def session(http, url: str, headers: dict, load: Load, index: int, window: tuple[float, float],
                  phase: Phase) -> None:
    """One rollout's calls, back to back until the window closes; only calls inside it count."""
    start_at, end_at = window
    await asyncio.sleep(random.uniform(0, load.stagger_s))
    n = index
    while (t0 := time.perf_counter()) < end_at:
        body = load.bodies[n % len(load.bodies)]
        n += 1
        try:
            async with http.post(url, data=body, headers=headers) as resp:
                raw = await resp.read()
                ok = resp.status == 200 and (load.end_marker is None or load.end_marker in raw)
        except aiohttp.ClientError as exc:
            ok, raw = False, repr(exc).encode()
        t1 = time.perf_counter()
        if t0 < start_at or t1 > end_at:
            continue
        if ok:
            phase.latencies_ms.append((t1 - t0) * 1000)
        else:
            phase.errors += 1
            phase.first_error = phase.first_error or raw[:300].decode(errors="replace")


async def run_phase(load: Load, pids: dict[str, int | str]) -> Phase:
    """Runs the load's sessions, then measures calls and the CPU of `pids` for `load.seconds`."""
    phase, clock = Phase(), time.perf_counter  # uvloop's loop.time() ticks in whole milliseconds
    start_at = clock() + load.stagger_s + WARMUP_S
    end_at = start_at + load.seconds
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as http:
        async def meter():
            await asyncio.sleep(max(0.0, start_at - clock()))
            before, steal = {name: cpu_seconds(pid) for name, pid in pids.items()}, steal_seconds()
            t0 = clock()
            await asyncio.sleep(max(0.0, end_at - clock()))
            phase.window_s = clock() - t0
            phase.cpu_s = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
            phase.steal_s = steal_seconds() - steal

        await asyncio.gather(meter(), *(session(http, url, headers, load, i, (start_at, end_at), phase)
                                        for i, (url, headers) in enumerate(load.targets)))
    return phase


def _client_proc(args: tuple[Load, float]) -> tuple[list[float], int, str]:
    """A load-generating subprocess: runs its share of the sessions, returns latencies and errors."""
    load, start_wall = args

    async def go():
        await asyncio.sleep(max(0.0, start_wall - time.time()))
        return await run_phase(load, {})

    phase = uvloop.run(go())
    return phase.latencies_ms, phase.errors, phase.first_error


async def measure(load: Load, pids: dict[str, int | str], pool) -> Phase:
    """One phase, run in this process or split over the `pool` of client processes."""
    if pool is None:
        return await run_phase(load, {**pids, "client": os.getpid()})
    workers = multiprocessing.active_children()
    pids = {**pids, **{f"client{i}": worker.pid for i, worker in enumerate(workers)}}
    start_wall = time.time() + 0.3
    shares = [(Load(load.targets[i::len(workers)], load.bodies, load.end_marker, load.seconds, load.stagger_s),
               start_wall) for i in range(len(workers)) if load.targets[i::len(workers)]]
    results = asyncio.get_running_loop().run_in_executor(None, lambda: pool.map(_client_proc, shares))
    await asyncio.sleep(0.3)
    phase = await run_phase(Load([], [], None, load.seconds, load.stagger_s), pids)  # meters the same window
    for latencies, errors, first_error in await results:
        phase.latencies_ms += latencies
        phase.errors += errors
        phase.first_error = phase.first_error or first_error
    return phase


# --- the run -------------------------------------------------------------------------------------
def register(proxy: str, name: str, sessions: int, workload: Workload, dialect: str) -> list[tuple[str, dict]]:
    """Registers one rollout per session (before the level's clock starts); returns each session's proxy URL
    and headers."""
    client, targets = ProxyClient(proxy, ADMIN_KEY), []
    for i in range(sessions):
        try:
            info = client.register(f"bench-{name}-{i}")
        except ProxyClientError as exc:
            sys.exit(f"registering rollout {i} failed: {exc}")
        if dialect == "messages":
            url, headers = info["anthropic_base_url"] + workload.path, {"x-api-key": info["api_key"]}
        else:
            url = info["openai_base_url"] + workload.path.removeprefix("/v1")
            headers = {"authorization": f"Bearer {info['api_key']}"}
        targets.append((url, {**headers, "content-type": "application/json"}))
    return targets


def _cpu_pct(phase: Phase) -> dict[str, int]:
    cpu = {"proxy": 0.0, "fake": 0.0, "client": 0.0}
    for name, seconds in phase.cpu_s.items():
        if name != "proxy_loop":
            cpu["client" if name.startswith("client") else name] += seconds
    return {name: round(100 * seconds / phase.window_s) for name, seconds in cpu.items()}


def row(sessions: int, upstream_ms: float, direct: Phase, proxied: Phase, rounds: list[float]) -> dict:
    """The figures of one level, as printed and as --json writes them; `rounds`: the added p50 of each
    round of a level measured in alternating rounds."""
    calls = len(proxied.latencies_ms) or float("nan")
    return {
        "sessions": sessions, "upstream_ms": upstream_ms, "added_p50_ms_by_round": rounds,
        "direct_p50_ms": direct.pct(50), "direct_p99_ms": direct.pct(99),
        "proxy_p50_ms": proxied.pct(50), "proxy_p99_ms": proxied.pct(99),
        "added_p50_ms": proxied.pct(50) - direct.pct(50), "added_p99_ms": proxied.pct(99) - direct.pct(99),
        "direct_calls_s": direct.calls_s, "proxy_calls_s": proxied.calls_s,
        "ratio": proxied.calls_s / direct.calls_s if direct.calls_s else float("nan"),
        # All the proxy's threads, and its event loop's thread alone: the loop is what one process cannot outgrow.
        "proxy_cpu_ms_per_call": 1000 * proxied.cpu_s.get("proxy", 0.0) / calls,
        "loop_cpu_ms_per_call": 1000 * proxied.cpu_s.get("proxy_loop", 0.0) / calls,
        "cpu_pct_direct": _cpu_pct(direct), "cpu_pct_proxy": _cpu_pct(proxied),
        "steal_pct": round(100 * proxied.steal_s / (proxied.window_s * os.cpu_count()), 1) if proxied.window_s else 0.0,
        "errors": direct.errors + proxied.errors, "first_error": proxied.first_error or direct.first_error,
    }


def _placement(args) -> str:
    load = f"fake upstream and {args.client_procs} client process(es)"
    if args.proxy_cpus:
        return f"proxy pinned to CPU {min(args.proxy_cpus)}, {load} on the other {len(os.sched_getaffinity(0))}"
    return f"{len(os.sched_getaffinity(0))} cores shared by proxy, {load}"


def print_table(rows: list[dict], args, workload: Workload) -> None:
    print(f"\nproxy overhead, {args.dialect} dialect [{workload.source}], streamed through the proxy; "
          f"{args.seconds:g} s per path and level (and round); {_placement(args)}")
    print("| sessions | upstream ms | direct p50 / p99 ms | proxy p50 / p99 ms | added p50 / p99 ms "
          "| direct calls/s | proxy calls/s | proxy / direct | proxy CPU ms/call: all / loop "
          "| CPU % direct: fake / client | CPU % proxied: proxy / fake / client | VM steal % | errors |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        d, p = r["cpu_pct_direct"], r["cpu_pct_proxy"]
        print(f"| {r['sessions']} | {r['upstream_ms']:g} | {r['direct_p50_ms']:.2f} / {r['direct_p99_ms']:.2f} "
              f"| {r['proxy_p50_ms']:.2f} / {r['proxy_p99_ms']:.2f} "
              f"| {r['added_p50_ms']:.2f} / {r['added_p99_ms']:.2f} "
              f"| {r['direct_calls_s']:.0f} | {r['proxy_calls_s']:.0f} | {r['ratio']:.2f} "
              f"| {r['proxy_cpu_ms_per_call']:.2f} / {r['loop_cpu_ms_per_call']:.2f} | {d['fake']} / {d['client']} "
              f"| {p['proxy']} / {p['fake']} / {p['client']} | {r['steal_pct']:g} | {r['errors']} |")
    for r in rows:
        if r["added_p50_ms_by_round"]:
            print(f"{r['sessions']} sessions, upstream {r['upstream_ms']:g} ms: direct and proxied windows took turns "
                  f"in {len(r['added_p50_ms_by_round'])} rounds of {args.seconds:g} s each (the row pools them); "
                  f"added p50 by round: {', '.join(f'{x:.2f}' for x in r['added_p50_ms_by_round'])} ms")


def print_goals(rows: list[dict]) -> None:
    """One line per goal of issue 2: the figure, and MET or NOT MET."""
    saturated = [r for r in rows if r["upstream_ms"] == 0]
    for r in [r for r in rows if r["sessions"] == GOAL_C]:
        pace = (f"upstream answering in {r['upstream_ms']:g} ms" if r["upstream_ms"]
                else "instant upstream, saturated: added latency is queueing")
        for name, limit in (("p50", GOAL_P50_MS), ("p99", GOAL_P99_MS)):
            value = r[f"added_{name}_ms"]
            print(f"goal: at {GOAL_C} sessions ({pace}) the proxy adds < {limit:g} ms at {name}: "
                  f"{value:.2f} ms -> {'MET' if value < limit else 'NOT MET'}")
    if saturated:
        best = max(saturated, key=lambda r: r["proxy_calls_s"])
        capacity = 1000 / min(r["loop_cpu_ms_per_call"] for r in saturated)
        print(f"goal: one proxy process sustains >= {GOAL_CALLS_S:.0f} calls/s: {best['proxy_calls_s']:.0f} calls/s "
              f"at {best['sessions']} sessions -> {'MET' if best['proxy_calls_s'] >= GOAL_CALLS_S else 'NOT MET'} "
              f"(its event loop's CPU per call would allow ~{capacity:.0f} calls/s on a core of its own)")


async def run_level(http, urls: tuple[str, str], level: tuple[int, int, float], args, workload: Workload,
                    pids: dict[str, int | str], pool) -> dict:
    """Direct, then proxied, at one level (number, sessions, upstream answer time); returns its row."""
    (upstream, proxy), (number, sessions, upstream_ms) = urls, level
    async with http.post(f"{upstream}/delay", json={"ms": upstream_ms}) as resp:
        resp.raise_for_status()
    name = f"{number}-c{sessions}-{upstream_ms:g}ms"
    targets = register(proxy, name, sessions, workload, args.dialect)
    direct_targets = [(f"{upstream}/v1/chat/completions", {"content-type": "application/json"})] * sessions
    stagger_s = upstream_ms / 1000  # independent agents are not in step: spread their first calls over one answer time
    # A paced row's added latency is a millisecond against 500: a VM's neighbours drifting between one
    # direct and one proxied window would move it by as much, so its paths take turns over several rounds.
    rounds = args.paced_rounds if upstream_ms else 1
    direct, proxied, added = Phase(), Phase(), []
    for n in range(rounds):
        of = f" (round {n + 1} of {rounds})" if rounds > 1 else ""
        print(f"[{name}] direct for {args.seconds:g} s{of} ...", file=sys.stderr, flush=True)
        d = await measure(Load(direct_targets, workload.direct_bodies, None, args.seconds, stagger_s), pids, pool)
        print(f"[{name}] proxy for {args.seconds:g} s{of} ...", file=sys.stderr, flush=True)
        p = await measure(Load(targets, workload.proxy_bodies, STREAM_END[args.dialect], args.seconds, stagger_s),
                          pids, pool)
        added.append(round(p.pct(50) - d.pct(50), 3))
        direct.add(d)
        proxied.add(p)
    r = row(sessions, upstream_ms, direct, proxied, added if rounds > 1 else [])
    print(f"[{name}] direct {r['direct_calls_s']:.0f} calls/s, proxy {r['proxy_calls_s']:.0f} calls/s, "
          f"added p50 {r['added_p50_ms']:.2f} ms, errors {r['errors']} {r['first_error']}", file=sys.stderr, flush=True)
    return r


async def run(args, workload: Workload, pool) -> list[dict]:
    """Starts the fake upstream and the proxy, runs every level, stops both; returns the rows."""
    tmp = Path(tempfile.mkdtemp(prefix="openforge-bench-", dir=args.store_dir))
    upstream, proxy = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    fake = start([sys.executable, "benchmarks/fake_vllm.py", "--port", upstream.rsplit(":", 1)[1]], tmp / "fake.log")
    # A session sends thousands of calls where a rollout sends dozens: the store quotas, which would refuse them
    # past 2048 calls, are off. Every other limit stays at the run's default.
    prox = start([sys.executable, "-m", "steps.proxy", "--upstream", upstream, "--port", proxy.rsplit(":", 1)[1],
                  "--store", str(tmp / "store"), "--admin-key", ADMIN_KEY, "--store-quota-calls", "0",
                  "--store-quota-mb", "0", *args.proxy_arg], tmp / "proxy.log", args.proxy_cpus)
    levels = [(c, 0.0) for c in args.levels] + ([(GOAL_C, args.paced_ms)] if args.paced_ms > 0 else [])
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, f"{upstream}/v1/models", fake, tmp / "fake.log")
            await wait_ready(http, f"{proxy}/health", prox, tmp / "proxy.log")
            pids = {"proxy": prox.pid, "proxy_loop": f"{prox.pid}/task/{prox.pid}", "fake": fake.pid}
            return [await run_level(http, (upstream, proxy), (number, *level), args, workload, pids, pool)
                    for number, level in enumerate(levels)]
    finally:
        stop(prox)
        stop(fake)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--levels", default="1,16,64,256", help="comma-separated numbers of concurrent sessions")
    p.add_argument("--seconds", type=float, default=4.0, help="measured seconds per path and level")
    p.add_argument("--dialect", choices=sorted(DIALECT_PATHS), default="chat")
    p.add_argument("--paced-ms", type=float, default=500.0,
                   help=f"upstream answer time of the extra {GOAL_C}-session row (0: no such row)")
    p.add_argument("--paced-rounds", type=int, default=3,
                   help="rounds in which the paced row's direct and proxied windows take turns")
    p.add_argument("--store-dir", help="folder to put the proxy's store in (default: the system's temp folder)")
    p.add_argument("--client-procs", type=int, default=1, help="load-generating processes (1: this one)")
    p.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                   help="give the proxy a core of its own and the load the others (default; needs 2+ cores)")
    p.add_argument("--proxy-arg", action="append", default=[], metavar="ARG",
                   help="passed on to the proxy, e.g. --proxy-arg=--http-server=uvicorn (repeatable)")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args()
    try:
        args.levels = [int(x) for x in args.levels.split(",") if x.strip()]
    except ValueError:
        p.error(f"--levels takes comma-separated integers, got {args.levels!r}")
    if not args.levels or min(args.levels) < 1 or max(args.levels) > 4096:
        p.error("--levels must be between 1 and 4096 sessions")
    if not 0.5 <= args.seconds <= 60 or not 0 <= args.paced_ms <= 10_000 or not 1 <= args.client_procs <= 16:
        p.error("--seconds must be 0.5..60, --paced-ms 0..10000 and --client-procs 1..16")
    if not 1 <= args.paced_rounds <= 20:
        p.error("--paced-rounds must be 1..20")
    workload = load_workload(args.dialect)
    args.proxy_cpus, load_cpus = split_cpus(args.pin)
    if load_cpus:
        os.sched_setaffinity(0, load_cpus)  # the client processes and the fake upstream inherit it
    pool = multiprocessing.get_context("spawn").Pool(args.client_procs) if args.client_procs > 1 else None
    try:
        rows = uvloop.run(run(args, workload, pool))
    finally:
        if pool is not None:
            pool.terminate()
    print_table(rows, args, workload)
    print_goals(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1, default=sorted))


if __name__ == "__main__":
    main()
