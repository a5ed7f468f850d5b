"""The real update on 2 ranks of one node (torchrun, gloo on CPU) from and to S3 (moto on loopback): what each rank
read, in its `metrics.json` and its last stderr line (`steps.checkpoint.IO`).

One 2-rank update from the base model: the node fetched the weights once (local rank 0), the other rank nothing
(the base has no optimizer state); what each rank fetches of `optimizer/` is `tests/test_checkpoint_io.py`'s.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl==0.9.1 is not installed in this environment (the training env)")

from steps import checkpoint  # noqa: E402
from steps.contracts.config import RunConfig  # noqa: E402
from steps.tiny_model import build_tiny_model  # noqa: E402
from update_reference import craft_samples, write_samples  # noqa: E402
from workflows import commands  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
DISTRIBUTED_ENV = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}


def test_two_ranks_of_one_node_fetch_the_weights_once(s3_server: dict, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 read the base's files once (their bytes as the store lists them), rank 1 nothing; both are in
    `metrics.json`'s `io`, and each rank's whole count (its writes too) in its stderr line. Control: each rank
    fetching the whole checkpoint (`steps.checkpoint.fetch`, before) reads it twice on the node."""
    for key, value in s3_server["env"].items():
        monkeypatch.setenv(key, value)
    model = build_tiny_model(tmp_path / "base", seed=0)
    base, out = f"s3://{s3_server['bucket']}/io/base", f"s3://{s3_server['bucket']}/io/iteration-1"
    checkpoint.publish(model, base)
    stored = sum(path.stat().st_size for path in model.rglob("*") if path.is_file())
    trajectories = write_samples(craft_samples(model, seed=0), tmp_path / "samples")
    config = tmp_path / "update.yaml"
    config.write_text((REPO / "configs" / "update.yaml").read_text() + "compute_dtype: fp32\n")
    argv = commands.update(RunConfig(update_gpus=2, update_config=str(config), learning_rate=1e-5),
                           str(trajectories), base, out, python=sys.executable)
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV}
    done = subprocess.run(argv, cwd=REPO, env={**env, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    import fsspec

    metrics = json.loads(fsspec.open(f"{out}/metrics.json").open().read())
    assert [(c["rank"], c["node"], c["read_bytes"]) for c in metrics["io"]] == [(0, 0, stored), (1, 0, 0)]
    lines = [json.loads(line.split(" io ", 1)[1]) for line in done.stderr.splitlines()
             if line.startswith("steps.update: io {")]
    by_rank = {c["rank"]: c for c in lines}
    assert by_rank[1]["written_objects"] == 2  # its optimizer and extra-state shards
    assert by_rank[0]["written_bytes"] > stored  # the new weights, config, tokenizer, its shards, metrics.json
    assert not list(tmp_path.glob("openforge-node-*"))  # the node's folder went with its last rank
    before = 0
    for rank in range(2):
        checkpoint.IO.read_bytes = 0
        checkpoint.fetch(base, tmp_path / f"before-{rank}")
        before += checkpoint.IO.read_bytes
    assert before == 2 * stored
