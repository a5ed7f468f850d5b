#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import json

users = json.load(open("/app/data/users.json"))
by_team = {}
for user in sorted(users, key=lambda u: u["joined"]):
    if user["active"]:
        by_team.setdefault(user["team"], []).append(user["name"])
with open("/app/out/active_by_team.json", "w") as f:
    json.dump(by_team, f, indent=2, sort_keys=True)
PY
