"""Checks /app/out/active_by_team.json: active users' names per team, by join date."""

import json
import sys
import traceback
from pathlib import Path

EXPECTED = {
    "data": ["Dennis", "Guido", "Margaret", "Grace"],
    "infra": ["Lynn", "Ken", "John"],
    "web": ["Edsger", "Radia", "Barbara", "Frances", "Tim"],
}


def check() -> None:
    result = json.loads(Path("/app/out/active_by_team.json").read_text())
    assert isinstance(result, dict), "the file must hold a JSON object"
    assert set(result) == set(EXPECTED), f"teams must be {sorted(EXPECTED)}, got {sorted(result)}"
    for team, names in EXPECTED.items():
        assert result[team] == names, f"team {team}: expected {names}, got {result[team]!r}"


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
