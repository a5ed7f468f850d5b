#!/bin/bash
# Verifier: reward 1 when /app/error_count.txt holds 11 (the ERROR-level lines of server.log), else 0.
mkdir -p /logs/verifier
answer="$( { tr -d '[:space:]' < /app/error_count.txt; } 2>/dev/null )"
if [ "$answer" = "11" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: expected 11 in /app/error_count.txt, found '${answer}'"
  echo 0 > /logs/verifier/reward.txt
fi
