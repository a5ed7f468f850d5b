#!/bin/bash
# Verifier: reward 1 when /app/answer.txt holds the word "hello" (surrounding whitespace ignored), else 0.
mkdir -p /logs/verifier
if [ -f /app/answer.txt ] && [ "$(tr -d '[:space:]' < /app/answer.txt)" = "hello" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: /app/answer.txt is missing or does not hold 'hello'"
  echo 0 > /logs/verifier/reward.txt
fi
