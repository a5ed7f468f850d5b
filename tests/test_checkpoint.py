"""Checkpoint folders in S3 (a moto server on loopback): published whole, fetched without what serving
does not read."""

from pathlib import Path

import pytest

from steps import checkpoint, follow


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


def test_a_local_checkpoint_being_written_again_is_not_complete_until_its_new_metrics(tmp_path: Path) -> None:
    run_url = str(tmp_path / "run")
    folder = Path(follow.checkpoint(run_url, 1))
    folder.mkdir(parents=True)
    write_checkpoint(folder)  # an earlier attempt's, whole
    assert follow.complete(run_url, 1)  # the control: a whole one counts
    checkpoint.unmark(str(folder))
    assert not follow.complete(run_url, 1) and (folder / "model.safetensors").exists()
    checkpoint.unmark(str(tmp_path / "never-written"))  # nothing to remove is no error


def test_a_checkpoint_published_again_is_never_complete_before_its_last_upload(
        s3_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import s3fs

    write_checkpoint(tmp_path / "first")
    checkpoint.publish(tmp_path / "first", s3_url)  # the attempt a retry writes over
    marker = f"{s3_url.removeprefix('s3://')}/metrics.json"
    seen, put_file = [], s3fs.S3FileSystem._put_file

    async def recording(self, lpath, rpath, *args, **kwargs):  # is the old metrics.json there at each upload?
        self.invalidate_cache()
        seen.append((rpath.rsplit("/", 1)[-1], await self._exists(marker)))
        return await put_file(self, lpath, rpath, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_put_file", recording)
    s3fs.S3FileSystem.clear_instance_cache()  # a new instance's put_file calls the recording one
    write_checkpoint(tmp_path / "second")
    checkpoint.publish(tmp_path / "second", s3_url)
    assert seen[-1] == ("metrics.json", False) and len(seen) == 6
    assert [there for _, there in seen] == [False] * 6  # the earlier attempt's was removed before the first PUT
