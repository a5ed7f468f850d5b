#!/bin/bash
# Verifier, in shell: compares /app/summary.json with the expected summary using jq and writes
# 1 (match) or 0 (missing, not JSON, or different) to /logs/verifier/reward.txt. Without jq the
# check cannot run at all, so it exits without a reward: a broken image, not a wrong answer.
mkdir -p /logs/verifier
if ! command -v jq >/dev/null; then
  echo "verifier error: jq is not installed in this environment" >&2
  exit 2
fi
expected='{"users": 6, "purchases": 11, "revenue_cents": 44415, "top_buyer": "eli"}'
if [ ! -f /app/summary.json ]; then
  echo "FAIL: /app/summary.json does not exist"
  echo 0 > /logs/verifier/reward.txt
elif jq -e --argjson want "$expected" '. == $want' /app/summary.json >/dev/null 2>&1; then
  echo "PASS"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: expected $expected, found: $(head -c 300 /app/summary.json)"
  echo 0 > /logs/verifier/reward.txt
fi
