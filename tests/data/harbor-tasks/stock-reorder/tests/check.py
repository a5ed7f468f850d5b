"""Checks /app/reorder.txt: the SKUs below their reorder level, sorted, one per line."""

import sys
import traceback
from pathlib import Path

# SKU-1112 has exactly its reorder level on hand, so it is not below it.
EXPECTED = ["SKU-1063", "SKU-1084", "SKU-1091", "SKU-1098", "SKU-1105"]


def check() -> None:
    lines = Path("/app/reorder.txt").read_text().splitlines()
    found = [line.strip() for line in lines if line.strip()]
    assert found == EXPECTED, f"expected {EXPECTED}, found {found[:20]}"


def main() -> int:
    try:
        check()
    except (AssertionError, OSError, UnicodeDecodeError) as failure:
        print(f"FAIL: {failure}")
        return 1
    except Exception:  # noqa: BLE001 - a bug in this checker: exit 3, so no reward is written
        traceback.print_exc()
        return 3
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
