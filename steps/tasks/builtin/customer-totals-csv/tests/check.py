"""Checks /app/customer_totals.csv: header, rows, two-decimal totals, order (ties by id), CSV quoting."""

import csv
import sys
import traceback

EXPECTED = [
    ["id", "name", "orders", "total"],
    ["1", "Acme Corp", "2", "500.10"],
    ["2", "Globex, Inc.", "3", "500.10"],
    ["3", "Initech", "2", "500.01"],
    ["4", 'Umbrella "Bio" Labs', "2", "500.00"],
    ["5", "Hooli", "1", "0.50"],
    ["6", "Vandelay Industries", "0", "0.00"],
]


def check() -> None:
    with open("/app/customer_totals.csv", newline="") as f:
        rows = [row for row in csv.reader(f) if row]
    assert rows[:1] == EXPECTED[:1], f"header must be id,name,orders,total, got {rows[:1]}"
    assert len(rows) == len(EXPECTED), f"expected {len(EXPECTED) - 1} customer rows, got {len(rows) - 1}"
    for want, got in zip(EXPECTED[1:], rows[1:]):
        assert got == want, f"expected row {want}, got {got}"


def main() -> int:
    try:
        check()
    except (AssertionError, OSError, ValueError, csv.Error) as failure:
        print(f"FAIL: {failure}")
        return 1
    except Exception:  # noqa: BLE001 - a bug in this checker: exit 3, so no reward is written
        traceback.print_exc()
        return 3
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
