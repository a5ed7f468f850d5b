#!/bin/bash
# Verifier: runs `python3 -m pytest` (pytest comes from the image's requirements.txt) on
# /tests/test_outputs.py and writes 1 (all tests pass) or 0 (a test fails) to
# /logs/verifier/reward.txt. Any other pytest exit means the verifier itself broke: no reward.
mkdir -p /logs/verifier
if ! python3 -c "import pytest" 2>/dev/null; then
  echo "verifier error: pytest is not installed in this environment" >&2
  exit 2
fi
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python3 -m pytest -c /tests/pytest.ini --rootdir /tests \
  --confcutdir /tests /tests/test_outputs.py -rA
status=$?
case "$status" in
  0) echo 1 > /logs/verifier/reward.txt ;;
  1) echo 0 > /logs/verifier/reward.txt ;;
  *) echo "verifier error: pytest exited with status $status" >&2; exit "$status" ;;
esac
