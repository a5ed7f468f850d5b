#!/bin/bash
set -euo pipefail
jq -s '
  (map(select(.action == "purchase"))) as $buys
  | ($buys | group_by(.user) | map({user: .[0].user, total: (map(.amount_cents) | add)})) as $by_user
  | {
      users: (map(.user) | unique | length),
      purchases: ($buys | length),
      revenue_cents: ($buys | map(.amount_cents) | add),
      top_buyer: ($by_user | max_by(.total) | .user)
    }
' /app/events.jsonl > /app/summary.json
