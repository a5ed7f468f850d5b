"""Checks /app/stats.json: row count, total, mean, per-region totals and top region of sales.csv."""

import json
import sys
import traceback
from pathlib import Path

EXPECTED = {
    "rows": 20,
    "total": 14184.81,
    "mean": 709.24,
    "by_region": {"East": 735.49, "North": 3916.65, "North East": 3045.26, "South": 3518.75, "West": 2968.66},
    "top_region": "North",
}


def close(a: object, b: float) -> bool:
    return isinstance(a, (int, float)) and not isinstance(a, bool) and abs(a - b) < 0.006


def check() -> None:
    stats = json.loads(Path("/app/stats.json").read_text())
    assert isinstance(stats, dict), "stats.json must hold a JSON object"
    assert set(stats) == set(EXPECTED), f"keys must be {sorted(EXPECTED)}, got {sorted(stats)}"
    assert stats["rows"] == 20 and not isinstance(stats["rows"], bool), f"rows: expected 20, got {stats['rows']!r}"
    for key in ("total", "mean"):
        assert close(stats[key], EXPECTED[key]), f"{key}: expected {EXPECTED[key]}, got {stats[key]!r}"
    regions = stats["by_region"]
    assert isinstance(regions, dict) and set(regions) == set(EXPECTED["by_region"]), \
        f"by_region must have the regions {sorted(EXPECTED['by_region'])}, got {regions!r}"
    for region, total in EXPECTED["by_region"].items():
        assert close(regions[region], total), f"by_region[{region!r}]: expected {total}, got {regions[region]!r}"
    assert stats["top_region"] == "North", f"top_region: expected 'North', got {stats['top_region']!r}"


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
