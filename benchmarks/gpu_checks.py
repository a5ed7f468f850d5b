"""GPU checks of what the update relies on and CPU tests cannot show: run on a machine with an NVIDIA GPU and torch.

    python benchmarks/gpu_checks.py [--out results.json]

The update alone on a GPU (`steps.update.train.prepare_runtime`) makes its one-rank process group with veRL's
backend, "cpu:gloo,cuda:nccl", and its store in memory (`steps.update.ranks.process_group`), binding no port: NCCL
must make its communicator through that store. Each case runs in a Python of its own (a process has one default
group) and reports whether the group's MASTER_PORT was bound, an all-reduce on the GPU and on the CPU, and one FSDP2
(`fully_shard`) forward, backward and AdamW step on the GPU. The control: a group a launcher gave a port (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT set) listens on it. Prints one JSON line per case; exit code 0 when every
check held.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
CASE = """
import json, os, socket
import torch
from steps.update import ranks

torch.cuda.set_device(0)
ranks.process_group("cpu:gloo,cuda:nccl", launched=os.environ.get("LAUNCHED") == "1")
port = int(os.environ["MASTER_PORT"])
probe = socket.socket()
try:
    probe.bind(("127.0.0.1", port))
    bound = False
except OSError:
    bound = True
gpu, cpu = torch.ones(4, device="cuda"), torch.ones(4)
torch.distributed.all_reduce(gpu)
torch.distributed.all_reduce(cpu)
from torch.distributed.fsdp import fully_shard
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).cuda()
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
before = float(model(torch.ones(8, 64, device="cuda")).sum())
model(torch.ones(8, 64, device="cuda")).pow(2).sum().backward()
optimizer.step()
after = float(model(torch.ones(8, 64, device="cuda")).sum())
print(json.dumps({"backend": torch.distributed.get_backend(), "world_size": torch.distributed.get_world_size(),
                  "bound_master_port": bound, "all_reduce_gpu": gpu.tolist(), "all_reduce_cpu": cpu.tolist(),
                  "fsdp2_step_moved": before != after, "device": torch.cuda.get_device_name(0),
                  "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version()))}))
torch.distributed.destroy_process_group()
"""


def run_case(env: dict[str, str]) -> dict:
    """One case in its own Python; its JSON line, or its error."""
    clean = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    done = subprocess.run([sys.executable, "-c", CASE], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**clean, **env, "PYTHONPATH": str(REPO)})
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="also write the results here (JSON)")
    args = p.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = {"alone": run_case({}),
               "launched": run_case({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                                     "MASTER_PORT": str(port), "LAUNCHED": "1"})}
    for name, result in results.items():
        print(json.dumps({"case": name, **result}), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    alone, launched = results["alone"], results["launched"]
    held = (alone.get("bound_master_port") is False and launched.get("bound_master_port") is True
            and all(r.get("all_reduce_gpu") == [1.0] * 4 and r.get("fsdp2_step_moved") for r in results.values()))
    print("all checks held" if held else "a check failed", flush=True)
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
