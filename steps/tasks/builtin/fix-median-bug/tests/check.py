"""Checks the fix of /app/stats.py: tests unchanged, visible tests pass, hidden tests pass.

The agent's code runs in subprocesses, so whatever it raises is a failed check, not a verifier crash.
"""

import os
import subprocess
import sys
import traceback
from pathlib import Path


def run_tests(args: list[str]) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": "/app", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "unittest", *args], cwd="/app", env=env,
                          capture_output=True, text=True, check=False, timeout=30)


def check() -> None:
    original = Path("/tests/test_stats_original.py").read_text()
    assert Path("/app/test_stats.py").read_text() == original, "/app/test_stats.py was modified"
    visible = run_tests(["test_stats"])
    assert visible.returncode == 0, f"visible tests fail:\n{visible.stderr[-2000:]}"
    hidden = run_tests(["discover", "-s", "/tests", "-p", "test_hidden.py", "-t", "/tests"])
    assert hidden.returncode == 0, f"hidden tests fail:\n{hidden.stderr[-2000:]}"


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
