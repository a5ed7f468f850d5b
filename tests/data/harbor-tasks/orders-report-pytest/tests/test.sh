#!/bin/bash
# Verifier: runs pytest on $TEST_DIR/test_outputs.py (pytest is installed by the image) and writes
# 1 (all tests pass) or 0 (a test fails) to /logs/verifier/reward.txt. Any other pytest exit
# (collection error, internal error, no tests) means the verifier itself broke: no reward.
# The settings file is given with -c and conftest.py files above $TEST_DIR are not read
# (--confcutdir), so files the agent leaves in the workspace cannot change the run.
mkdir -p /logs/verifier
TEST_DIR="${TEST_DIR:-/tests}"
if ! command -v pytest >/dev/null; then
  echo "verifier error: pytest is not installed in this environment" >&2
  exit 2
fi
cd /workspace || exit 2
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 pytest -c "$TEST_DIR/pytest.ini" --rootdir "$TEST_DIR" \
  --confcutdir "$TEST_DIR" "$TEST_DIR/test_outputs.py" -rA
status=$?
case "$status" in
  0) echo 1 > /logs/verifier/reward.txt ;;
  1) echo 0 > /logs/verifier/reward.txt ;;
  *) echo "verifier error: pytest exited with status $status" >&2; exit "$status" ;;
esac
