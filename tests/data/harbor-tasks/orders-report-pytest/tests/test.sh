#!/bin/bash
# Verifier: runs pytest on $TEST_DIR/test_outputs.py (pytest is installed by the image) and writes
# 1 (all tests pass) or 0 (a test fails) to /logs/verifier/reward.txt. Any other pytest exit
# (collection error, internal error, no tests) means the verifier itself broke: no reward.
# The settings file is given with -c and conftest.py files above $TEST_DIR are not read
# (--confcutdir), so files the agent leaves in the workspace cannot change the run.
mkdir -p /logs/verifier

# The tests run the agent's code, which may leave processes behind (one that keeps writing
# /logs/verifier/reward.json, say); all are stopped before the reward is written, so only this
# script's reward counts.
stop_other_processes() {
  local round dir pid stat state alive
  for round in {1..50}; do
    kill -KILL -1 2>/dev/null
    alive=0
    for dir in /proc/[0-9]*; do
      pid=${dir#/proc/}
      if [ "$pid" = 1 ] || [ "$pid" = "$$" ]; then continue; fi
      read -r stat 2>/dev/null < "$dir/stat" || continue
      state=${stat##*) }
      [ "${state%% *}" = Z ] || alive=1
    done
    [ "$alive" = 0 ] && return 0
    sleep 0.1
  done
  return 1
}

TEST_DIR="${TEST_DIR:-/tests}"
if ! command -v pytest >/dev/null; then
  echo "verifier error: pytest is not installed in this environment" >&2
  exit 2
fi
cd /workspace || exit 2
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 pytest -c "$TEST_DIR/pytest.ini" --rootdir "$TEST_DIR" \
  --confcutdir "$TEST_DIR" "$TEST_DIR/test_outputs.py" -rA
status=$?
if ! stop_other_processes; then
  echo "verifier error: processes the tests started could not be stopped" >&2
  exit 3
fi
rm -f /logs/verifier/reward.json /logs/verifier/reward.txt
case "$status" in
  0) echo 1 > /logs/verifier/reward.txt ;;
  1) echo 0 > /logs/verifier/reward.txt ;;
  *) echo "verifier error: pytest exited with status $status" >&2; exit "$status" ;;
esac
