"""Checks /app/emails.txt: the distinct lower-cased addresses in mail.log, byte-sorted."""

import sys
import traceback
from pathlib import Path

EXPECTED = [
    "alice@example.org",
    "carol@mail.example.co.uk",
    "dave.smith+news@example.com",
    "erin@example.net",
    "grace@example.io",
    "ivan@sub-domain.example.org",
    "judy@example.com",
    "mallory%ops@corp-mail.example.net",
    "trent@example.travel",
]


def check() -> None:
    lines = Path("/app/emails.txt").read_text().splitlines()
    missing = [e for e in EXPECTED if e not in lines]
    extra = [e for e in lines if e not in EXPECTED]
    assert not missing and not extra, f"missing {missing}, unexpected {extra}"
    assert lines == EXPECTED, "every address must appear once, in byte order"


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
