"""What each update rank reads from the store and what the run keeps there, counted (`steps.checkpoint.IO`),
against S3 (a moto server on loopback).

Each rank is its own process here, as under torchrun (the counts are per process), with torchrun's environment:
2 ranks of one node share the weights one of them fetched, and each fetches its own optimizer shard.
"""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from steps import checkpoint
from steps.contracts.config import RunConfig

REPO = Path(__file__).resolve().parents[1]
WEIGHTS = {"model-00001-of-00002.safetensors": 7000, "model-00002-of-00002.safetensors": 5000,
           "model.safetensors.index.json": 100, "config.json": 20, "tokenizer.json": 30}
SHARD = 3000  # each per-rank optimizer file's bytes


@pytest.fixture
def s3_url(s3_server: dict, monkeypatch: pytest.MonkeyPatch, request) -> str:
    for key, value in s3_server["env"].items():
        monkeypatch.setenv(key, value)
    return f"s3://{s3_server['bucket']}/{request.node.name}"


def saved_checkpoint(folder: Path, world_size: int) -> Path:
    """A checkpoint as the update saves it with `world_size` ranks (sizes, not contents, matter here)."""
    files = {**WEIGHTS, "metrics.json": 10, "optimizer/state.json": 0}
    for rank in range(world_size):
        for kind in ("optim", "extra_state", "model"):
            files[f"optimizer/{kind}_world_size_{world_size}_rank_{rank}.pt"] = SHARD
    for name, size in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"x" * size)
    (folder / "optimizer" / "state.json").write_text(json.dumps({"world_size": world_size}))
    (folder / "metrics.json").write_text('{"loss":1}')  # 10 bytes, as counted
    return folder


def run_ranks(url: str, tmp: Path, world_size: int, per_node: int, old: bool = False) -> list[dict]:
    """`world_size` processes, `per_node` to a node, each fetching `url` as an update rank does (`old`: the whole
    checkpoint per rank, as before), in parallel; each one's counts and the files it got."""
    script = ("import json, os, sys; from pathlib import Path; from steps import checkpoint as c\n"
              "local = Path(sys.argv[1]); rank = int(os.environ['RANK']); node = c.node_folder()\n"
              "if sys.argv[3] == 'old': c.fetch(sys.argv[2], local)\n"
              "else: c.fetch_rank(sys.argv[2], local, rank, int(os.environ['WORLD_SIZE']),"
              " int(os.environ['LOCAL_RANK']), node, poll_s=0.05)\n"
              "got = sorted(str(p.relative_to(local)) for p in local.rglob('*') if p.is_file())\n"
              "sizes = {name: (local / name).stat().st_size for name in got}\n"
              "c.release(node, int(os.environ['LOCAL_RANK']), int(os.environ['LOCAL_WORLD_SIZE']))\n"
              "print(json.dumps({**c.IO.as_dict(), 'rank': rank, 'files': sizes}))\n")
    processes = []
    for rank in range(world_size):
        node = rank // per_node
        env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": str(rank), "WORLD_SIZE": str(world_size),
               "LOCAL_RANK": str(rank % per_node), "LOCAL_WORLD_SIZE": str(per_node), "GROUP_RANK": str(node),
               # one temporary folder per node, as each node's pod has its own
               "TORCHELASTIC_RUN_ID": "test", "TMPDIR": str(tmp / f"node-{node}")}
        (tmp / f"node-{node}").mkdir(parents=True, exist_ok=True)
        processes.append(subprocess.Popen(
            [sys.executable, "-c", script, str(tmp / f"rank-{rank}"), url, "old" if old else "new"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def own_shards(rank: int, world_size: int) -> set[str]:
    return {f"optimizer/{kind}_world_size_{world_size}_rank_{rank}.pt" for kind in ("optim", "extra_state", "model")}


def test_a_node_fetches_the_weights_once_and_each_rank_only_its_own_shard(s3_url: str, tmp_path: Path) -> None:
    """2 ranks on one node: the weights are downloaded once (by local rank 0) and both ranks see them whole; each
    rank downloads its own 3 shard files and `state.json`. Control: the whole checkpoint per rank, as before,
    downloads the weights twice and every shard on every rank. Then 2 nodes of 1 rank: each node fetches them."""
    checkpoint.publish(saved_checkpoint(tmp_path / "saved", 2), s3_url)
    weights, state = sum(WEIGHTS.values()), len(json.dumps({"world_size": 2}))
    ranks = run_ranks(s3_url, tmp_path / "one-node", world_size=2, per_node=2)
    for result in ranks:
        assert set(result["files"]) == {*WEIGHTS, "optimizer/state.json", *own_shards(result["rank"], 2)}
        assert all(result["files"][name] == size for name, size in WEIGHTS.items())  # linked, whole
    assert [r["read_bytes"] for r in ranks] == [weights + state + 3 * SHARD, state + 3 * SHARD]
    assert [r["read_objects"] for r in ranks] == [len(WEIGHTS) + 4, 4]
    assert not list((tmp_path / "one-node" / "node-0").glob("openforge-node-*"))  # the last rank done removed it
    old = run_ranks(s3_url, tmp_path / "old", world_size=2, per_node=2, old=True)
    assert [r["read_bytes"] for r in old] == [weights + state + 6 * SHARD + 10] * 2
    assert sum(r["read_bytes"] for r in old) - sum(r["read_bytes"] for r in ranks) == weights + 6 * SHARD + 20
    two_nodes = run_ranks(s3_url, tmp_path / "two-nodes", world_size=2, per_node=1)
    assert [r["read_bytes"] for r in two_nodes] == [weights + state + 3 * SHARD] * 2


def test_a_state_saved_by_another_number_of_ranks_is_fetched_whole_for_resharding(s3_url: str,
                                                                                  tmp_path: Path) -> None:
    """Saved by 1 rank, loaded by 2: each rank needs every saved shard (`steps.update.reshard`). Control: saved
    by 2, each rank gets only its own (the test above)."""
    checkpoint.publish(saved_checkpoint(tmp_path / "saved", 1), s3_url)
    for result in run_ranks(s3_url, tmp_path / "ranks", world_size=2, per_node=2):
        assert {name for name in result["files"] if "_rank_" in name} == own_shards(0, 1)


def test_publishing_and_deleting_are_counted(s3_url: str, tmp_path: Path) -> None:
    """Every file published is one object and its bytes, metrics.json last; a rank's own shards alone; a deleted
    checkpoint every object it had, metrics.json first."""
    saved = saved_checkpoint(tmp_path / "saved", 2)
    files = [p for p in saved.rglob("*") if p.is_file()]
    before = checkpoint.IO.as_dict()
    checkpoint.publish(saved, s3_url)
    after = checkpoint.IO.as_dict()
    assert after["written_objects"] - before["written_objects"] == len(files)
    assert after["written_bytes"] - before["written_bytes"] == sum(p.stat().st_size for p in files)
    checkpoint.publish_rank(saved, f"{s3_url}-rank", 1)  # the weight files it wrote and its 3 shards
    assert checkpoint.IO.written_objects - after["written_objects"] == 2 + 3
    deleted = checkpoint.IO.deleted_objects
    checkpoint.delete(s3_url)
    assert checkpoint.IO.deleted_objects - deleted == len(files)
    assert checkpoint.written(s3_url.rsplit("/", 1)[0]) == []


def write_run(run_url: str, tmp: Path, iterations: range) -> None:
    """Checkpoints of `iterations` in the run's store."""
    saved = saved_checkpoint(tmp / "saved", 1)
    for iteration in iterations:
        url = f"{run_url}/checkpoints/iteration-{iteration}"
        if checkpoint.is_remote(run_url):
            checkpoint.publish(saved, url)
        else:
            import shutil

            shutil.copytree(saved, url)


@pytest.mark.parametrize("store", ["local", "s3"])
def test_keep_checkpoints_deletes_the_old_ones_but_never_a_protected_one(store: str, s3_url: str,
                                                                         tmp_path: Path) -> None:
    """keep 2 after checkpoint 8 is written (iteration 9's update may be writing 9): 7 and 8 stay as the last
    two, 2 is pinned, 4 an evaluation recorded, 6 one eval_every 6 scheduled; 1, 3 and 5 go, with one line said.
    With max_staleness 2, 6 is still served. Control: keep_checkpoints 0 (the default) deletes nothing."""
    run_url = s3_url if store == "s3" else str(tmp_path / "run")
    write_run(run_url, tmp_path, range(1, 10))
    store_url, run = run_url.rsplit("/", 1)
    config = RunConfig(store=store_url, run=run, iterations=20)
    assert config.run_url == run_url
    assert checkpoint.retire(config, 8, evaluations=[4]) == []  # the control: keep all
    lines: list[str] = []
    keep = replace(config, keep_checkpoints=2, pin_checkpoints=(2,), eval_every=6)
    assert checkpoint.retire(keep, 8, evaluations=[4], say=lines.append) == [1, 3, 5]
    assert checkpoint.written(run_url) == [2, 4, 6, 7, 8, 9]
    assert len(lines) == 1 and "iterations 1, 3, 5" in lines[0]
    # max_staleness 2 after 9: 7 may still be served, and 4 and 6 are no longer evaluated nor scheduled here
    assert checkpoint.retire(replace(keep, eval_every=0, max_staleness=2), 9, evaluations=[]) == [4, 6]
    assert checkpoint.written(run_url) == [2, 7, 8, 9]


def test_both_drivers_retire_old_checkpoints_when_an_iteration_succeeds(tmp_path: Path, capsys) -> None:
    """The local runner's `finish` and the Argo driver's `mark` (Succeeded) delete what `keep_checkpoints: 1`
    lets go once the iteration's checkpoint is written, and say so; the Argo driver marking one Running deletes
    nothing (the control: its checkpoint is not written yet)."""
    from steps.contracts.manifest import IterationRecord
    from workflows import local, submit

    config = RunConfig(store=str(tmp_path / "store"), run="r", iterations=9, keep_checkpoints=1)
    write_run(config.run_url, tmp_path, range(1, 6))
    submit.mark(config, 3, "wf-3", "Running")
    assert checkpoint.written(config.run_url) == [1, 2, 3, 4, 5]
    submit.mark(config, 3, "wf-3", "Succeeded")  # wrote checkpoint 4
    assert checkpoint.written(config.run_url) == [4, 5]
    summary = {"update": None, "timings_s": {}, "staleness": None, "phase_times": {}}
    local.finish(config, IterationRecord(iteration=4, workflow="local"), summary)  # wrote checkpoint 5
    assert checkpoint.written(config.run_url) == [5]
    said = capsys.readouterr()
    assert "keep_checkpoints=1: deleted the checkpoints of iterations 1, 2, 3" in said.out  # the Argo driver's
    assert "keep_checkpoints=1: deleted the checkpoints of iterations 4" in said.err  # the local runner's


def test_a_pin_that_is_not_an_iteration_is_refused_in_one_sentence() -> None:
    """Control: a list of iterations passes."""
    from workflows.config import ConfigError, from_dict, validate

    validate(from_dict({"pin_checkpoints": [3, 5], "keep_checkpoints": 2}), check_dataset=False)
    with pytest.raises(ConfigError, match="'pin_checkpoints' must be a list of iteration numbers"):
        validate(from_dict({"pin_checkpoints": [-1]}), check_dataset=False)


def test_a_skipped_updates_rank_0_fetches_the_other_ranks_shards_it_copies(s3_url: str, tmp_path: Path) -> None:
    """A skipped update copies the input whole: rank 0, which fetched its own shard, fetches the others' (and
    nothing twice). Control: before that its folder lacks rank 1's."""
    checkpoint.publish(saved_checkpoint(tmp_path / "saved", 2), s3_url)
    local = checkpoint.fetch_rank(s3_url, tmp_path / "rank-0", rank=0, world_size=2)
    shards = {str(p.relative_to(local)) for p in (local / "optimizer").glob("*_rank_*.pt")}
    assert shards == own_shards(0, 2)
    read = checkpoint.IO.read_bytes
    checkpoint.fetch_shards(s3_url, local)
    assert {str(p.relative_to(local)) for p in (local / "optimizer").glob("*_rank_*.pt")} == own_shards(0, 2) | \
        own_shards(1, 2)
    assert checkpoint.IO.read_bytes - read == 3 * SHARD
