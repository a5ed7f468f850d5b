#!/bin/bash
# Verifier: runs /tests/check.py and writes 1 (pass) or 0 (fail) to /logs/verifier/reward.txt.
# check.py exits 0 on pass and 1 on a wrong or missing answer; any other exit means the verifier
# itself broke, so no reward is written: the rollout scores 0 and its error says why (a pristine root leaves only the
# agent's work to blame; `python -m steps.tasks check` finds a task whose own checker breaks).
mkdir -p /logs/verifier
python3 /tests/check.py
status=$?
case "$status" in
  0) echo 1 > /logs/verifier/reward.txt ;;
  1) echo 0 > /logs/verifier/reward.txt ;;
  *) echo "verifier error: check.py exited with status $status" >&2; exit "$status" ;;
esac
