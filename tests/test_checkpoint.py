"""Checkpoint folders in S3 (a moto server on loopback): published whole, fetched without what serving
does not read."""

from pathlib import Path

import pytest

from steps import checkpoint


@pytest.fixture
def s3_url(s3_server: dict, monkeypatch: pytest.MonkeyPatch, request) -> str:
    for key, value in s3_server["env"].items():
        monkeypatch.setenv(key, value)
    return f"s3://{s3_server['bucket']}/{request.node.name}"


def write_checkpoint(folder: Path) -> dict[str, bytes]:
    """A checkpoint as steps.update writes it; returns its files by relative path."""
    files = {"model.safetensors": b"w" * 5000, "config.json": b"{}", "tokenizer.json": b'{"v": 1}',
             "optimizer/optim_world_size_1_rank_0.pt": b"m" * 10000, "optimizer/state.json": b"{}",
             "metrics.json": b'{"loss": 0.1}'}
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return files


def test_a_published_checkpoint_is_fetched_without_what_only_training_reads(s3_url: str, tmp_path: Path) -> None:
    files = write_checkpoint(tmp_path / "written")
    checkpoint.publish(tmp_path / "written", s3_url)
    lines = []
    local = checkpoint.fetch(s3_url, tmp_path / "served", skip=checkpoint.TRAINING_ONLY, progress=lines.append)
    fetched = {str(path.relative_to(local)): path.read_bytes() for path in local.rglob("*") if path.is_file()}
    assert fetched == {name: data for name, data in files.items()
                       if not name.startswith("optimizer/") and name != "metrics.json"}
    assert [line.split(",")[0] for line in lines] == ["fetched 1/3 files", "fetched 2/3 files", "fetched 3/3 files"]
    assert lines[-1].endswith(f"MB, from {s3_url}")
    everything = checkpoint.fetch(s3_url, tmp_path / "trained")  # the update reads it all
    assert {str(path.relative_to(everything)) for path in everything.rglob("*") if path.is_file()} == set(files)


def test_a_local_checkpoint_is_used_where_it_is(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "local")
    assert checkpoint.fetch(str(tmp_path / "local"), tmp_path / "unused") == tmp_path / "local"
    assert checkpoint.fetch(f"file://{tmp_path / 'local'}", tmp_path / "unused") == tmp_path / "local"
    assert not (tmp_path / "unused").exists()


def test_nothing_at_the_url_is_a_clear_error(s3_url: str, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"no checkpoint files at {s3_url}/missing"):
        checkpoint.fetch(f"{s3_url}/missing", tmp_path / "m")
