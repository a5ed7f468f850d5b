"""The real update on 2 ranks of one node (torchrun, gloo on CPU) from and to S3 (moto on loopback): what each rank
read, in its `metrics.json` and its last stderr line (`steps.checkpoint.IO`), and a skipped update's copy.

The module runs two 2-rank updates: one from the base model (the node fetched the weights once, by local rank 0;
the base has no optimizer state), then one from its checkpoint on samples of equal rewards (skipped: nothing
trained, the input copied). What each rank fetches of `optimizer/` is `tests/test_checkpoint_io.py`'s.
"""

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
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


@pytest.fixture(scope="module")
def runs(s3_server: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The base model in S3, the trained update from it and the skipped one after, each with its process."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in s3_server["env"].items():
            patch.setenv(key, value)
        yield made_runs(tmp_path_factory.mktemp("io"), f"s3://{s3_server['bucket']}/io")


def made_runs(tmp: Path, bucket: str) -> dict:
    """`runs`'s updates, in `tmp` and below `bucket`."""
    model = build_tiny_model(tmp / "base", seed=0)
    checkpoint.publish(model, f"{bucket}/base")
    config = tmp / "update.yaml"
    config.write_text((REPO / "configs" / "update.yaml").read_text() + "compute_dtype: fp32\n")
    samples = craft_samples(model, seed=0)
    flat = [dataclasses.replace(sample, reward=0.5) for sample in samples]
    trained = update(write_samples(samples, tmp / "samples"), f"{bucket}/base", f"{bucket}/one", config, tmp)
    skipped = update(write_samples(flat, tmp / "flat"), f"{bucket}/one", f"{bucket}/two", config, tmp)
    return {"model": model, "bucket": bucket, "tmp": tmp, "trained": trained, "skipped": skipped}


def update(trajectories: Path, start: str, out: str, config: Path, tmp: Path) -> subprocess.CompletedProcess:
    """The run's 2-rank update command, `start` -> `out`, its temporary folder in `tmp`."""
    argv = commands.update(RunConfig(update_gpus=2, update_config=str(config), learning_rate=1e-5),
                           str(trajectories), start, out, python=sys.executable)
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV}
    return subprocess.run(argv, cwd=REPO, env={**env, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp)},
                          capture_output=True, text=True, timeout=900)


def test_two_ranks_of_one_node_fetch_the_weights_once(runs: dict, tmp_path: Path) -> None:
    """Rank 0 read the base's files once (their bytes as stored), rank 1 nothing; both are in `metrics.json`'s
    `io`, and each rank's whole count (its writes too) in its stderr line. Control: each rank fetching the whole
    checkpoint (`steps.checkpoint.fetch`, as before) reads it twice on the node."""
    import fsspec

    done = runs["trained"]
    assert done.returncode == 0, done.stderr[-3000:]
    stored = sum(path.stat().st_size for path in runs["model"].rglob("*") if path.is_file())
    metrics = json.loads(fsspec.open(f"{runs['bucket']}/one/metrics.json").open().read())
    assert [(c["rank"], c["node"], c["read_bytes"]) for c in metrics["io"]] == [(0, 0, stored), (1, 0, 0)]
    lines = [json.loads(line.split(" io ", 1)[1]) for line in done.stderr.splitlines()
             if line.startswith("steps.update: io {")]
    by_rank = {c["rank"]: c for c in lines}
    fs, root = fsspec.core.url_to_fs(f"{runs['bucket']}/one")
    fs.invalidate_cache()
    written = fs.find(root, detail=True)
    # every object once, by the rank that wrote it: rank 1 its own shards (and weight files), rank 0 the rest
    assert sum(c["written_objects"] for c in lines) == len(written)
    assert sum(c["written_bytes"] for c in lines) == sum(info["size"] for info in written.values())
    assert by_rank[1]["written_objects"] >= len([path for path in written if path.endswith("_rank_1.pt")]) > 0
    assert not list(runs["tmp"].glob("openforge-node-*"))  # the node's folder went with its last rank
    before = 0
    for rank in range(2):
        checkpoint.IO.read_bytes = 0
        checkpoint.fetch(f"{runs['bucket']}/base", tmp_path / f"before-{rank}")
        before += checkpoint.IO.read_bytes
    assert before == 2 * stored


def test_a_skipped_update_from_s3_keeps_every_ranks_optimizer_state(runs: dict) -> None:
    """Every reward equal: nothing is trained and rank 0 copies the input to the output, which must hold both
    ranks' optimizer shards though rank 0 fetched only its own to start with (`steps.checkpoint.fetch_shards`).
    Control: they are the input's shards, byte for byte, which the trained update wrote."""
    import fsspec

    assert runs["skipped"].returncode == 0, runs["skipped"].stderr[-3000:]
    bucket = runs["bucket"]
    fs, _ = fsspec.core.url_to_fs(bucket)
    fs.invalidate_cache()
    names = [f"{kind}_world_size_2_rank_{rank}.pt" for kind in ("optim", "extra_state") for rank in (0, 1)]
    shards = {name: fs.cat(f"{bucket}/one/optimizer/{name}") for name in names}
    assert {name: fs.cat(f"{bucket}/two/optimizer/{name}") for name in names} == shards
    metrics = json.loads(fs.cat(f"{bucket}/two/metrics.json"))
    assert metrics["skipped"] == "no advantage"
