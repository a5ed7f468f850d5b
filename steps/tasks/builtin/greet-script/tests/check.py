"""Checks /app/greet.sh against its specification, edge cases included."""

import os
import subprocess
import sys
import traceback
from pathlib import Path

SCRIPT = Path("/app/greet.sh")
CASES = [  # (arguments, GREETING or None, expected stdout)
    ([], None, "Hello, world!\n"),
    (["Ada Lovelace", "Linus"], None, "Hello, Ada Lovelace!\nHello, Linus!\n"),
    (["100%s", "-n", "back\\slash"], None, "Hello, 100%s!\nHello, -n!\nHello, back\\slash!\n"),
    (["Ada"], "Hi", "Hi, Ada!\n"),
    ([], "Good morning", "Good morning, world!\n"),
    (["Ada"], "", "Hello, Ada!\n"),
]


def check() -> None:
    assert SCRIPT.is_file(), f"{SCRIPT} does not exist"
    assert os.access(SCRIPT, os.X_OK), f"{SCRIPT} is not executable"
    for args, greeting, expected in CASES:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        if greeting is not None:
            env["GREETING"] = greeting
        done = subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True, check=False, timeout=10)
        assert done.returncode == 0, f"greet.sh {args} exited with {done.returncode}"
        assert done.stdout == expected, \
            f"greet.sh {args} (GREETING={greeting!r}) printed {done.stdout!r}, expected {expected!r}"


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
