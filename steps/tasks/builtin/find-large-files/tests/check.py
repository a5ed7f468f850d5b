"""Checks /app/large_files.txt: regular files > 1024 bytes under /app/data, relative, byte-sorted."""

import sys
import traceback
from pathlib import Path

EXPECTED = ["big.bin", "img/photo.jpg", "logs/app.log", "my docs/report 2024.pdf"]


def check() -> None:
    lines = Path("/app/large_files.txt").read_text().splitlines()
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
