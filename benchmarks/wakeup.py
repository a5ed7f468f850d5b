"""What it costs this machine to wake a process that sat idle: the floor under the proxy's paced latency.

    .venv/bin/python benchmarks/wakeup.py [--rounds 400] [--gap-ms 4]

Two processes pass one byte back and forth over a socket pair, pinned to the same CPU or to two; each
round is timed back to back (the baseline) and again after `--gap-ms` of idle, as a proxied call at 64
paced sessions is (each process waits a few ms between its wake-ups). Prints the round trip's p50 and
p90 and its ratio to the back-to-back round trip on the same CPUs. On a VM each idle wake-up can cost
a vCPU exit and cold caches; a proxied call wakes a process four times across CPUs where a direct call
wakes one on its own CPU (README, proxy overhead).
"""

import argparse
import os
import socket
import statistics
import time


def round_trips(cpu_a: int, cpu_b: int, gap_s: float, rounds: int) -> list[float]:
    """Microseconds of each round trip between a process on `cpu_a` and one on `cpu_b`."""
    mine, theirs = socket.socketpair()
    child = os.fork()
    if child == 0:  # the echoing side
        mine.close()
        os.sched_setaffinity(0, {cpu_b})
        while (byte := theirs.recv(1)) not in (b"", b"q"):
            theirs.send(byte)
        os._exit(0)
    theirs.close()
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu_a})
    try:
        times = []
        for _ in range(rounds):
            if gap_s:
                time.sleep(gap_s)
            start = time.perf_counter()
            mine.send(b"x")
            mine.recv(1)
            times.append((time.perf_counter() - start) * 1e6)
        return times
    finally:
        mine.send(b"q")
        os.waitpid(child, 0)
        os.sched_setaffinity(0, before)
        mine.close()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--gap-ms", type=float, default=4.0, help="idle time before each timed round")
    args = parser.parse_args()
    if args.rounds < 10 or not 0 < args.gap_ms <= 1000:
        parser.error("--rounds must be >= 10 and --gap-ms in (0, 1000]")
    cpus = sorted(os.sched_getaffinity(0))
    pairs = [("one CPU", cpus[0], cpus[0])] + ([("two CPUs", cpus[0], cpus[-1])] if len(cpus) > 1 else [])
    print(f"| processes on | back to back p50 / p90 us | after {args.gap_ms:g} ms idle p50 / p90 us | ratio p50 |")
    print("|---|---:|---:|---:|")
    for name, a, b in pairs:
        base = round_trips(a, b, 0.0, args.rounds)
        idle = round_trips(a, b, args.gap_ms / 1000, args.rounds)
        print(f"| {name} | {statistics.median(base):.0f} / {pct(base, 90):.0f} | {statistics.median(idle):.0f} / "
              f"{pct(idle, 90):.0f} | {statistics.median(idle) / statistics.median(base):.1f} |")


if __name__ == "__main__":
    main()
