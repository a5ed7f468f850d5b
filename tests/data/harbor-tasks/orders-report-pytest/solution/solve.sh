#!/bin/bash
set -euo pipefail
cat > /workspace/report.py <<'PY'
"""Summarise an orders CSV: python report.py ORDERS_CSV REPORT_JSON."""

import csv
import json
import sys
from collections import Counter


def main(orders_path: str, report_path: str) -> None:
    with open(orders_path, newline="") as f:
        rows = list(csv.DictReader(f))
    quantities = Counter()
    revenue = 0.0
    for row in rows:
        quantity = int(row["quantity"])
        quantities[row["product"]] += quantity
        revenue += quantity * float(row["unit_price"])
    report = {
        "orders": len(rows),
        "revenue": round(revenue, 2),
        "top_product": max(sorted(quantities), key=quantities.get) if quantities else None,
        "customers": sorted({row["customer"] for row in rows}),
    }
    with open(report_path, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
PY
cd /workspace
python report.py orders.csv report.json
