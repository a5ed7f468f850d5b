"""Trajectory I/O: OpenForge's Parquet writer and reader against plain pyarrow on the same table.

    python benchmarks/trajectory_io.py [--calls 10000] [--tokens 2000] [--repeats 3] [--s3]

Builds a `calls` table of `--calls` rows with ~`--tokens` token ids each (prompt + response, ids drawn
from a Zipf-like distribution so they compress like text, logprobs for the response), then times, on a
local folder (and with `--s3` on a moto S3 server on 127.0.0.1):

- OpenForge: `steps.contracts.table_files.write_table` (schema check, page checksums, atomic temporary name +
  rename or one PUT) and `read_table` (checksum verification, schema check, cast to the documented schema);
- plain pyarrow: `pq.write_table` / `pq.read_table` of the same table, same zstd level.

Runs alternate between the two; prints the best of `--repeats` for each, the ratio OpenForge / plain (goal: <= 1.2), the file size, and
one JSON line with every figure.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from steps.contracts.table_files import COMPRESSION, COMPRESSION_LEVEL, partition_url, read_table, write_table
from steps.contracts.tables import CALLS

VOCAB = 151_000  # a Qwen-sized vocabulary


def token_lists(rng: np.random.Generator, lengths: np.ndarray, dtype: type) -> pa.ListArray:
    """One list per length, of Zipf-distributed ids (or, for floats, logprobs in [-8, 0])."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    total = int(offsets[-1])
    if dtype is np.float32:
        values = pa.array(-rng.exponential(1.0, total).clip(0, 8).astype(np.float32))
    else:
        values = pa.array((rng.zipf(1.2, total) % VOCAB).astype(np.int32))
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def calls_table(calls: int, tokens: int, seed: int = 0) -> pa.Table:
    """A `calls` table of the documented schema: ~`tokens` ids per call, 5% of them response tokens."""
    rng = np.random.default_rng(seed)
    total = rng.integers(int(tokens * 0.75), int(tokens * 1.25) + 1, calls)
    response = np.maximum(total // 20, 1)
    columns = {
        "run": pa.array(["bench"] * calls), "iteration": pa.array(np.zeros(calls, np.int32)),
        "rollout_id": pa.array([f"it0-task{i // 80}-s{(i // 10) % 8}" for i in range(calls)]),
        "task": pa.array([f"task{i // 80}" for i in range(calls)]),
        "sample": pa.array(((np.arange(calls) // 10) % 8).astype(np.int32)),
        "harness": pa.array(["codex"] * calls), "call_index": pa.array((np.arange(calls) % 10).astype(np.int32)),
        "dialect": pa.array(["responses"] * calls), "stream": pa.array(np.ones(calls, bool)),
        "status": pa.array(["ok"] * calls),
        "prompt_token_ids": token_lists(rng, total - response, np.int32),
        "response_token_ids": token_lists(rng, response, np.int32),
        "response_logprobs": token_lists(rng, response, np.float32),
        "finish_reason": pa.array(["tool_calls"] * calls), "weight_version": pa.array(["0"] * calls),
    }
    for name in ("received_at", "upstream_started_at", "upstream_ended_at", "responded_at", "upstream_s", "total_s"):
        columns[name] = pa.array(rng.random(calls) + 1.8e9)
    columns["error"] = pa.nulls(calls, pa.string())
    columns["sample_index"] = pa.array(np.zeros(calls, np.int32))
    columns["continued"] = pa.array(np.ones(calls, bool))
    columns |= {"temperature": pa.array(np.ones(calls)), "top_p": pa.array(np.ones(calls)),
                "top_k": pa.array(np.zeros(calls, np.int32))}
    return pa.table({name: columns[name] for name in CALLS.names}).cast(CALLS)


def interleaved(repeats: int, ours: Callable[[], object], plain: Callable[[], object]) -> tuple[float, float]:
    """The fastest of `repeats` runs of each, alternating them so drift on a shared machine hits both alike."""
    times: dict[str, list[float]] = {"ours": [], "plain": []}
    for _ in range(repeats):
        for name, fn in (("ours", ours), ("plain", plain)):
            started = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - started)
    return min(times["ours"]), min(times["plain"])


def compare(table: pa.Table, where: str, repeats: int, storage_options: dict | None, fs=None) -> dict:
    """Times OpenForge's writer/reader and plain pyarrow's on one location; returns the figures."""
    ours = partition_url(where, "bench", 0)
    plain = f"{where.rstrip('/')}/plain/calls.parquet"
    target = plain.removeprefix("s3://") if fs is not None else plain
    if fs is None:
        os.makedirs(os.path.dirname(plain), exist_ok=True)
    options = {"compression": COMPRESSION, "compression_level": COMPRESSION_LEVEL}
    figures = {}
    figures["openforge_write_s"], figures["pyarrow_write_s"] = interleaved(
        repeats, lambda: write_table(table, ours, "calls", storage_options),
        lambda: pq.write_table(table, target, filesystem=fs, **options))
    figures["openforge_read_s"], figures["pyarrow_read_s"] = interleaved(
        repeats, lambda: read_table(ours, "calls", storage_options), lambda: pq.read_table(target, filesystem=fs))
    assert read_table(ours, "calls", storage_options).equals(table)
    figures["write_ratio"] = figures["openforge_write_s"] / figures["pyarrow_write_s"]
    figures["read_ratio"] = figures["openforge_read_s"] / figures["pyarrow_read_s"]
    total_ours = figures["openforge_write_s"] + figures["openforge_read_s"]
    figures["write_read_ratio"] = total_ours / (figures["pyarrow_write_s"] + figures["pyarrow_read_s"])
    return {k: round(v, 4) for k, v in figures.items()}


def moto_s3() -> tuple[object, dict, str]:
    """A moto S3 server on loopback with a bucket; returns (server, s3fs options, bucket URL)."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    from steps.net import HOST, free_port

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request otherwise
    port = free_port()
    server = ThreadedMotoServer(ip_address=HOST, port=port, verbose=False)
    server.start()
    endpoint = f"http://{HOST}:{port}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket="bench")
    return server, {"key": "testing", "secret": "testing", "endpoint_url": endpoint}, "s3://bench/trajectories"


def report(label: str, figures: dict) -> None:
    """Human-readable lines for one location."""
    print(f"{label}: write  openforge {figures['openforge_write_s']:.3f} s  pyarrow {figures['pyarrow_write_s']:.3f} s"
          f"  ratio {figures['write_ratio']:.2f}")
    print(f"{label}: read   openforge {figures['openforge_read_s']:.3f} s  pyarrow {figures['pyarrow_read_s']:.3f} s"
          f"  ratio {figures['read_ratio']:.2f}")
    print(f"{label}: write+read ratio {figures['write_read_ratio']:.2f} (goal <= 1.2)")


def main() -> int:
    """Builds the table, runs the comparison on each location, prints the figures."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=10_000)
    p.add_argument("--tokens", type=int, default=2_000, help="mean token ids per call (prompt + response)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--s3", action="store_true", help="also on a moto S3 server on 127.0.0.1")
    args = p.parse_args()
    started = time.perf_counter()
    table = calls_table(args.calls, args.tokens)
    tokens = sum(pc.list_value_length(table[c]).to_numpy().sum() for c in ("prompt_token_ids", "response_token_ids"))
    print(f"{args.calls} calls, {tokens / args.calls:.0f} token ids per call, {table.nbytes / 2**20:.0f} MiB in memory"
          f" (built in {time.perf_counter() - started:.1f} s); zstd level {COMPRESSION_LEVEL}, best of {args.repeats}")
    results = {"calls": args.calls, "tokens_per_call": round(float(tokens) / args.calls), "repeats": args.repeats}
    folder = tempfile.mkdtemp(prefix="trajectory-io-")
    try:
        results["local"] = compare(table, folder, args.repeats, None)
        size = os.path.getsize(Path(partition_url(folder, "bench", 0)) / "calls.parquet")
        results["file_mib"] = round(size / 2**20, 1)
        report("local", results["local"])
        print(f"file: {results['file_mib']} MiB")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if args.s3:
        import s3fs

        server, options, url = moto_s3()
        try:
            results["s3"] = compare(table, url, args.repeats, options, fs=s3fs.S3FileSystem(**options))
            report("s3 (moto, loopback)", results["s3"])
        finally:
            server.stop()
    results["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
