#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import csv
import json

with open("/app/sales.csv", newline="") as f:
    rows = list(csv.DictReader(f))
amounts = [float(row["amount"]) for row in rows]
by_region = {}
for row, amount in zip(rows, amounts):
    by_region[row["region"]] = by_region.get(row["region"], 0.0) + amount
stats = {
    "rows": len(rows),
    "total": round(sum(amounts), 2),
    "mean": round(sum(amounts) / len(amounts), 2),
    "by_region": {region: round(total, 2) for region, total in by_region.items()},
    "top_region": max(by_region, key=by_region.get),
}
with open("/app/stats.json", "w") as f:
    json.dump(stats, f, indent=2)
PY
