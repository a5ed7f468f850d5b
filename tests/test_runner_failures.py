"""Failures of the rollout runner itself: a full output disk and a crash of its own code are `infra_error`
with exit code 3, and `result.json` is whole or absent, never empty or half written.

The disk is a real tmpfs of `DISK_SIZE` mounted under the test's folder (needs root; skipped otherwise) and
unmounted afterwards; the rollouts are the `direct` harness working hello-file through the real proxy, with
`tests/scripted_model.py` as the model (see `test_rollout.py`).
"""

import errno
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import steps.rollout
from steps.contracts.rollout import RolloutResult
from steps.rollout import run_rollout
from steps.tasks import BUILTIN_DATASET
from test_rollout import ADMIN_KEY, oracle, spec_for

DISK_SIZE = "4m"
TASK = BUILTIN_DATASET / "hello-file"


@pytest.fixture
def small_disk(tmp_path: Path):
    """A tmpfs of `DISK_SIZE` at tmp_path/disk, unmounted at teardown."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE}", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def fill(disk: Path) -> None:
    """Writes zeros into `disk` until it is full."""
    chunk = b"\0" * 65536
    with open(disk / "filler", "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    with pytest.raises(OSError):
        (disk / "probe").write_bytes(b"x" * 4096)
    (disk / "probe").unlink()


def run_cli(proxy, out: Path) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "steps.rollout", "--task", str(TASK), "--harness", "direct",
            "--proxy-url", proxy.url, "--rollout-id", f"disk-{uuid.uuid4().hex[:6]}", "--out", str(out)]
    return subprocess.run(argv, env={**os.environ, "OPENFORGE_ADMIN_KEY": ADMIN_KEY}, capture_output=True, text=True,
                          timeout=120)


def test_a_full_output_disk_is_an_infra_error_with_exit_3_and_no_result_json(scripted, scripted_proxy, small_disk):
    """No room even for result.json: exit 3, one line on stderr saying why, and no result.json at all (an
    earlier attempt's `ok` result in the same folder is removed, so nobody reads it as this one's)."""
    scripted.set_commands([oracle("hello-file")])
    out = small_disk / "rollout"
    out.mkdir()
    stale = RolloutResult(rollout_id="earlier", task="hello-file", harness="direct", status="ok", reward=1.0)
    assert steps.rollout.write_result(out, stale) is None
    fill(small_disk)
    done = run_cli(scripted_proxy, out)
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("steps.rollout: infra_error: ") and "result.json could not be written" in last, last
    assert "No space left on device" in last, last
    assert json.loads(done.stdout.splitlines()[-1])["status"] == "infra_error"
    assert not any(path.name.startswith(".result.json") or path.name == "result.json" for path in out.iterdir())


def test_the_same_disk_with_room_gives_the_rollouts_result(scripted, scripted_proxy, small_disk):
    """Control: the same rollout on the same (empty) tmpfs is scored, so the full disk is what failed above."""
    scripted.set_commands([oracle("hello-file")])
    done = run_cli(scripted_proxy, small_disk / "rollout")
    assert done.returncode == 0, done.stderr
    assert json.loads((small_disk / "rollout" / "result.json").read_text())["reward"] == 1.0


def test_a_plain_write_on_a_full_disk_leaves_an_empty_result_json(small_disk, tmp_path):
    """Control: the write the runner used before (`write_text`) leaves an empty result.json and raises on a full
    disk; `write_result` leaves none and says why."""
    result = RolloutResult(rollout_id="r", task="hello-file", harness="direct", status="ok", reward=1.0)
    fill(small_disk)
    with pytest.raises(OSError):
        (small_disk / "result.json").write_text(json.dumps(result.to_json(), indent=2))
    assert (small_disk / "result.json").stat().st_size == 0
    (small_disk / "result.json").unlink()
    why = steps.rollout.write_result(small_disk, result)
    assert why is not None and "No space left on device" in why
    assert sorted(path.name for path in small_disk.iterdir()) == ["filler"]


def test_a_crash_of_an_internal_step_is_an_infra_error_with_a_readable_result(scripted, scripted_proxy, tmp_path,
                                                                              monkeypatch, capsys):
    """An unexpected exception in the runner's own code (here the grading step) through the CLI: exit 3 and a
    result.json that names it; the same rollout unpatched earns its reward (control)."""
    scripted.set_commands([oracle("hello-file")])
    control = run_rollout(spec_for(scripted_proxy, TASK, "direct", tmp_path))
    assert (control.status, control.reward) == ("ok", 1.0), control

    def broken_grade(*args, **kwargs):
        raise KeyError("reward")

    monkeypatch.setattr(steps.rollout, "grade", broken_grade)
    monkeypatch.setenv("OPENFORGE_ADMIN_KEY", ADMIN_KEY)
    out = tmp_path / "crashed"
    code = steps.rollout.main(["--task", str(TASK), "--harness", "direct", "--proxy-url", scripted_proxy.url,
                               "--rollout-id", f"crash-{uuid.uuid4().hex[:6]}", "--out", str(out)])
    result = json.loads((out / "result.json").read_text())
    assert code == 3
    assert (result["status"], result["reward"]) == ("infra_error", None)
    assert result["error"] == "the rollout runner crashed (KeyError: 'reward')"
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["status"] == "infra_error"


def test_a_crash_outside_the_runners_guard_still_exits_3_with_a_result(tmp_path, monkeypatch, capsys):
    """Even run_rollout itself raising (a bug before its guard) gives exit 3 and a readable infra_error result."""
    def broken_run(spec):
        raise RuntimeError("bug")

    monkeypatch.setattr(steps.rollout, "run_rollout", broken_run)
    monkeypatch.setenv("OPENFORGE_ADMIN_KEY", ADMIN_KEY)
    tmp_path.joinpath("out").mkdir()
    code = steps.rollout.main(["--task", str(TASK), "--harness", "direct", "--proxy-url", "http://127.0.0.1:9",
                               "--rollout-id", "bug", "--out", str(tmp_path / "out")])
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert code == 3 and result["status"] == "infra_error" and "RuntimeError: bug" in result["error"]
    assert capsys.readouterr().err == ""  # the result was written, so nothing to say on stderr


def test_an_output_folder_that_cannot_be_made_exits_3_with_one_line_on_stderr(tmp_path):
    """--out under a regular file: nothing can be written; exit 3 and one line naming why."""
    (tmp_path / "file").write_text("")
    argv = [sys.executable, "-m", "steps.rollout", "--task", str(TASK), "--harness", "direct",
            "--proxy-url", "http://127.0.0.1:9", "--rollout-id", "nowhere", "--out", str(tmp_path / "file" / "out")]
    done = subprocess.run(argv, env={**os.environ, "OPENFORGE_ADMIN_KEY": ADMIN_KEY}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "result.json could not be written" in line and "Not a directory" in line, line
