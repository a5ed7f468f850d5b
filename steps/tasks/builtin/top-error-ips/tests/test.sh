#!/bin/bash
# Verifier: reward 1 when /app/report.txt lists the top three 5xx IPs exactly, else 0.
mkdir -p /logs/verifier
expected="$(printf '4 10.0.0.2\n3 10.0.0.10\n3 10.0.0.9')"
# Tolerate trailing whitespace and a missing final newline, nothing else.
actual="$(sed 's/[[:space:]]*$//' /app/report.txt 2>/dev/null)"
if [ "$actual" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  printf 'FAIL: expected\n%s\ngot\n%s\n' "$expected" "$actual"
  echo 0 > /logs/verifier/reward.txt
fi
