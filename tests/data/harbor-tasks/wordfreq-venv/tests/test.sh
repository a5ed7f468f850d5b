#!/bin/bash
# Verifier: runs the image's /opt/venv pytest on /tests/test_outputs.py and writes 1 (all tests
# pass) or 0 (a test fails) to /logs/verifier/reward.txt. Any other pytest exit (collection error,
# internal error, no tests) means the verifier itself broke: no reward. The settings file is given
# with -c and conftest.py files above /tests are not read, so the agent's files cannot change the run.
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

if [ ! -x /opt/venv/bin/pytest ]; then
  echo "verifier error: /opt/venv/bin/pytest is missing from this environment" >&2
  exit 2
fi
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 /opt/venv/bin/pytest -c /tests/pytest.ini --rootdir /tests \
  --confcutdir /tests /tests/test_outputs.py -rA
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
