"""Bytes each update rank and node reads from and writes to the store, counted (`steps.checkpoint.IO`), not estimated.

    .venv-train/bin/python benchmarks/update_bytes.py [--layouts 1x1,1x2,2x1] [--samples-per-task 3]

Starts a moto S3 server on loopback, builds the tiny model (and a tiny Qwen3-MoE where `steps.tiny_model`
has `--moe`), publishes it as the run's base and runs the real update command (`workflows.commands.update`:
`steps.update`, under torchrun past one rank, gloo on CPU) twice per layout `NODESxRANKS` (nodes x ranks per
node; 2 nodes are two torchrun launches on this machine with a static rendezvous on loopback, each with its
own temporary folder as each node's pod has): the first from the base (no optimizer state), the second from
the first's checkpoint (its optimizer state carried): the second is what every later iteration moves. Each
rank's counts come from its last stderr line (`steps.update: io {...}`).

Prints, per layout, each rank's and each node's bytes and objects read and written, checks the goal (per
node, downloads at most the weights once plus that node's optimizer shards and `optimizer/`'s small files,
once per rank) against the second update's input checkpoint as listed in the store, and the projection to
8B and 30B-A3B on 8 GPUs x 1 and 2 nodes (`docs/benchmarks.md`, "Bytes per update").
"""

import argparse
import inspect
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from steps import checkpoint  # noqa: E402
from steps.contracts.config import RunConfig  # noqa: E402
from steps.net import HOST, free_port  # noqa: E402
from steps.tiny_model import build_tiny_model  # noqa: E402
from update_reference import craft_samples, write_samples  # noqa: E402
from workflows import commands  # noqa: E402

BUCKET = "openforge-bench"
ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
       "AWS_DEFAULT_REGION": "us-east-1"}
# The projection's models (parameters) and bytes per parameter (the formulas in docs/benchmarks.md).
MODELS = {"Qwen3-8B": 8.19e9, "Qwen3-30B-A3B": 30.5e9}
SERVED, MASTER, ADAMW = 2, 4, 8  # bf16 weights served; fp32 master weights; AdamW's two fp32 moments
GPUS_PER_NODE = 8


def start_s3() -> tuple[object, dict]:
    """A moto S3 server on loopback with the bucket; its environment for s3fs."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address=HOST, port=port, verbose=False)
    server.start()
    endpoint = f"http://{HOST}:{port}"
    env = {**ENV, "AWS_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": endpoint}
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket=BUCKET)
    return server, env


def update(layout: tuple[int, int], trajectories: Path, start: str, out: str, config: Path, env: dict,
           tmp: Path) -> list[dict]:
    """The real update `start` -> `out` with `layout` (nodes, ranks per node); every rank's io counts."""
    nodes, per_node = layout
    run = RunConfig(update_gpus=per_node, update_nodes=nodes, update_config=str(config), learning_rate=1e-5)
    port = str(free_port())
    launches = []
    for node in range(nodes):
        argv = commands.update(run, str(trajectories), start, out, python=sys.executable,
                               node_rank=str(node), master_addr=HOST)
        if "--master-port" in argv:  # not the fixed cluster port: another process here may hold it
            argv[argv.index("--master-port") + 1] = port
        node_tmp = tmp / f"node-{node}"
        node_tmp.mkdir(parents=True, exist_ok=True)
        launches.append(subprocess.Popen(
            argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **env, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(node_tmp)}))
    counts = []
    for launch in launches:
        _, err = launch.communicate()
        if launch.returncode != 0:
            sys.exit(f"the update ({nodes}x{per_node}) failed ({launch.returncode}):\n{err[-3000:]}")
        counts += [json.loads(line.split(" io ", 1)[1]) for line in err.splitlines()
                   if line.startswith("steps.update: io {")]
    return sorted(counts, key=lambda c: c["rank"])


def listing(url: str) -> dict[str, int]:
    """The checkpoint's files in the store, relative path -> bytes."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    return {path[len(root.rstrip("/")) + 1:]: info["size"] for path, info in fs.find(root, detail=True).items()}


def goal(files: dict[str, int], ranks: list[int]) -> int:
    """The most one node with `ranks` may download of a checkpoint with `files`: the weights, config and
    tokenizer once, plus its ranks' own optimizer shards, plus `optimizer/`'s small files once per rank."""
    weights = sum(size for name, size in files.items() if name.split("/")[0] not in checkpoint.TRAINING_ONLY)
    shards = sum(size for name, size in files.items() if name.startswith("optimizer/")
                 and (m := checkpoint.RANK_FILE.search(name)) and int(m.group(1)) in ranks)
    small = sum(size for name, size in files.items() if name.startswith("optimizer/")
                and not checkpoint.RANK_FILE.search(name))
    return weights + shards + small * len(ranks)


def mb(value: float) -> str:
    return f"{value / 1e6:,.2f}"


def measure(model: Path, name: str, layouts: list[tuple[int, int]], env: dict, root: Path,
            samples_per_task: int) -> dict:
    """Both updates per layout on `model`; prints the tables; returns the per-parameter ratios measured."""
    samples = craft_samples(model, seed=0, rollouts_per_task=(samples_per_task,) * 4)
    trajectories = write_samples(samples, root / f"{name}-samples")
    config = root / "update.yaml"
    config.write_text((REPO / "configs" / "update.yaml").read_text() + "compute_dtype: fp32\n")
    base = f"s3://{BUCKET}/{name}/base"
    checkpoint.publish(model, base)
    params = parameters(model)
    print(f"\n{name}: {params:,} parameters, {len(samples)} samples")
    print("| nodes x ranks | rank | node | read MB | read objects | written MB | written objects |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    ratios, goals = {}, []
    for nodes, per_node in layouts:
        label = f"{nodes} x {per_node}"
        first, second = (f"s3://{BUCKET}/{name}/{nodes}x{per_node}/iteration-{i}" for i in (1, 2))
        update((nodes, per_node), trajectories, base, first, config, env, root / f"{nodes}x{per_node}-1")
        counts = update((nodes, per_node), trajectories, first, second, config, env, root / f"{nodes}x{per_node}-2")
        for c in counts:
            print(f"| {label} | {c['rank']} | {c['node']} | {mb(c['read_bytes'])} | {c['read_objects']} | "
                  f"{mb(c['written_bytes'])} | {c['written_objects']} |")
        files = listing(first)
        for node in range(nodes):
            mine = [c for c in counts if c["node"] == node]
            read = sum(c["read_bytes"] for c in mine)
            print(f"| {label} | all | {node} | {mb(read)} | {sum(c['read_objects'] for c in mine)} | "
                  f"{mb(sum(c['written_bytes'] for c in mine))} | {sum(c['written_objects'] for c in mine)} |")
            # before: each rank downloaded the whole checkpoint into its own folder
            goals.append((label, node, read, goal(files, [c["rank"] for c in mine]), sum(files.values()) * len(mine)))
        weights = sum(size for n, size in files.items() if n.endswith(".safetensors"))
        optimizer = sum(size for n, size in files.items() if checkpoint.RANK_FILE.search(n))
        ratios[label] = {"weights_per_param": round(weights / params, 3),
                         "optimizer_per_param": round(optimizer / params, 3)}
    print("\n| layout | node | read MB | goal: at most, MB | met | before (each rank the whole checkpoint), MB |")
    print("|---|---:|---:|---:|---|---:|")
    for label, node, read, limit, before in goals:
        print(f"| {label} | {node} | {mb(read)} | {mb(limit)} | {'yes' if read <= limit else 'NO'} | {mb(before)} |")
    print(f"measured bytes per parameter: {json.dumps(ratios)}")
    return ratios


def parameters(model: Path) -> int:
    """The parameters in the model folder's safetensors files."""
    from safetensors import safe_open

    total = 0
    for path in model.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            for key in f.keys():
                total += math.prod(f.get_slice(key).get_shape())
    return total


def projection(measured: dict[str, float]) -> None:
    """Per node and per rank, one update of 8B and 30B-A3B on 8 GPUs x 1 and 2 nodes, by the formulas (served
    weights SERVED, training state MASTER + ADAMW bytes per parameter, the state sharded over all ranks) and, for
    the node's reads, by the tiny model's `measured` bytes per parameter (weights, training state)."""
    print("\n| model | nodes x GPUs | read per node, GB | read per rank (local rank 0 / others), GB | "
          "written per node, GB | read per node by the measured ratios, GB | before: read per node, GB |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for model, params in MODELS.items():
        for nodes in (1, 2):
            share = GPUS_PER_NODE / (nodes * GPUS_PER_NODE)  # the node's part of the sharded state
            state = (MASTER + ADAMW) * params * share / GPUS_PER_NODE  # one rank's shard
            node_read = SERVED * params + GPUS_PER_NODE * state
            written = (SERVED + MASTER + ADAMW) * params * share  # each rank its shards of everything
            by_ratio = (measured["weights_per_param"] + measured["optimizer_per_param"] * share) * params
            before = GPUS_PER_NODE * (MASTER + ADAMW) * params  # each rank: fp32 weights + every AdamW shard
            print(f"| {model} | {nodes} x {GPUS_PER_NODE} | {node_read / 1e9:,.0f} | "
                  f"{(SERVED * params + state) / 1e9:,.1f} / {state / 1e9:,.1f} | {written / 1e9:,.0f} | "
                  f"{by_ratio / 1e9:,.0f} | {before / 1e9:,.0f} |")


def main(argv: list[str] | None = None) -> int:
    """Measure, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layouts", default="1x1,1x2,2x1", help="NODESxRANKS, comma-separated")
    parser.add_argument("--samples-per-task", type=int, default=3)
    args = parser.parse_args(argv)
    layouts = [tuple(int(x) for x in item.split("x")) for item in args.layouts.split(",")]
    server, env = start_s3()
    os.environ.update(env)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            ratios = measure(build_tiny_model(root / "tiny", seed=0), "tiny", layouts, env, root,
                             args.samples_per_task)
            if "moe" in inspect.signature(build_tiny_model).parameters:
                measure(build_tiny_model(root / "tiny-moe", seed=0, moe=True), "tiny-moe", layouts, env, root,
                        args.samples_per_task)
            else:
                print("\ntiny MoE: skipped (this steps.tiny_model has no --moe)")
    finally:
        server.stop()
    projection(list(ratios.values())[-1])  # the last layout's (they differ by veRL's small files only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
