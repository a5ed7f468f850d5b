"""Checks /app/unique_names.txt: distinct trimmed names of names.txt in byte order."""

import sys
import traceback
from pathlib import Path

EXPECTED = ["Ava", "Emma", "Olivia", "Zoe", "ava", "liam", "maria", "noah", "olivia"]


def check() -> None:
    lines = Path("/app/unique_names.txt").read_text().splitlines()
    assert lines == EXPECTED, f"expected {EXPECTED}, got {lines}"


def main() -> int:
    try:
        check()
    except (AssertionError, OSError, ValueError) as failure:
        print(f"FAIL: {failure}")
        return 1
    except Exception:  # noqa: BLE001 - a bug in this checker: exit 3, so no reward is written
        traceback.print_exc()
        return 3
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
