#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import csv
from decimal import Decimal

with open("/app/customers.csv", newline="") as f:
    customers = list(csv.DictReader(f))
totals = {c["id"]: Decimal("0") for c in customers}
counts = {c["id"]: 0 for c in customers}
with open("/app/orders.csv", newline="") as f:
    for order in csv.DictReader(f):
        if order["customer_id"] in totals:
            totals[order["customer_id"]] += Decimal(order["amount"])
            counts[order["customer_id"]] += 1
cents = {key: value.quantize(Decimal("0.01")) for key, value in totals.items()}
customers.sort(key=lambda c: (-cents[c["id"]], int(c["id"])))
with open("/app/customer_totals.csv", "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["id", "name", "orders", "total"])
    for c in customers:
        writer.writerow([c["id"], c["name"], counts[c["id"]], f"{cents[c['id']]:.2f}"])
PY
