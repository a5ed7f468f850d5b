"""Checks /app/backup.sh on normal, tricky and wrong inputs, each in a fresh temporary folder."""

import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

SCRIPT = "/app/backup.sh"
FILES = {"a.txt": "alpha\n", ".hidden": "secret\n", "dir with space/b c.txt": "bravo\n",
         "deep/er/x": "x-ray\n", "-dash.txt": "dash\n", "star*.txt": "star\n", "q?[1].txt": "glob\n"}


def run(*args: str) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    return subprocess.run([SCRIPT, *args], env=env, capture_output=True, text=True, check=False, timeout=30)


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


def check_copy(work: Path) -> None:
    src, dest = work / "src", work / "out" / "backup"
    for name, text in FILES.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    (src / "link").symlink_to("a.txt")
    (dest / "deep" / "er").mkdir(parents=True)
    (dest / "deep" / "er" / "x.bak").write_text("stale\n")
    done = run(str(src), str(dest))
    assert done.returncode == 0, f"backup.sh SRC DEST exited with {done.returncode}: {done.stderr.strip()}"
    assert done.stdout == f"copied {len(FILES)} files\n", f"expected 'copied {len(FILES)} files', got {done.stdout!r}"
    expected = {f"{name}.bak": text for name, text in FILES.items()}
    assert snapshot(dest) == expected, f"DEST holds {sorted(snapshot(dest))}, expected {sorted(expected)}"
    assert not any(p.is_symlink() for p in dest.rglob("*")), "symbolic links must be skipped"
    assert snapshot(src) == FILES, "SRC was modified"


def check_edges(work: Path) -> None:
    (work / "empty").mkdir()
    done = run(str(work / "empty"), str(work / "empty-out"))
    assert done.returncode == 0 and done.stdout == "copied 0 files\n", \
        f"empty SRC: got {done.returncode} {done.stdout!r}"
    for args in ([], [str(work / "empty")], [str(work / "empty"), str(work / "x"), "extra"]):
        done = run(*args)
        assert done.returncode == 2, f"{len(args)} arguments: expected exit 2, got {done.returncode}"
        assert done.stdout == "" and done.stderr.lower().startswith("usage:"), \
            f"{len(args)} arguments: expected a usage line on stderr only, got {done.stdout!r} / {done.stderr!r}"
    done = run(str(work / "missing"), str(work / "out2"))
    assert done.returncode == 1, f"missing SRC: expected exit 1, got {done.returncode}"
    assert done.stdout == "" and done.stderr.strip(), "missing SRC: expected a message on stderr only"


def check() -> None:
    assert Path(SCRIPT).is_file() and os.access(SCRIPT, os.X_OK), f"{SCRIPT} is missing or not executable"
    with tempfile.TemporaryDirectory() as work:
        check_copy(Path(work))
    with tempfile.TemporaryDirectory() as work:
        check_edges(Path(work))


def main() -> int:
    try:
        check()
    except (AssertionError, OSError, ValueError, subprocess.SubprocessError) as failure:
        print(f"FAIL: {failure}")
        return 1
    except Exception:  # noqa: BLE001 - a bug in this checker: exit 3, so no reward is written
        traceback.print_exc()
        return 3
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
