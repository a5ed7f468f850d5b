"""Checks /app/app.ini: [server] port 8080 and debug uncommented, everything else byte-identical."""

import sys
import traceback
from pathlib import Path

EXPECTED = """; application settings
[server]
host = 0.0.0.0
port = 8080
debug = true
workers = 4

[database]
host = db.internal
port = 5432
# debug = true

[cache]
ttl = 300
"""


def check() -> None:
    text = Path("/app/app.ini").read_text()
    if text != EXPECTED:
        got, want = text.splitlines(), EXPECTED.splitlines()
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        raise AssertionError(f"app.ini differs from the expected file at line {first + 1}")


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
