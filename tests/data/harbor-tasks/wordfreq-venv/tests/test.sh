#!/bin/bash
# Verifier: runs the image's /opt/venv pytest on /tests/test_outputs.py and writes 1 (all tests
# pass) or 0 (a test fails) to /logs/verifier/reward.txt. Any other pytest exit (collection error,
# internal error, no tests) means the verifier itself broke: no reward. The settings file is given
# with -c and conftest.py files above /tests are not read, so the agent's files cannot change the run.
mkdir -p /logs/verifier
if [ ! -x /opt/venv/bin/pytest ]; then
  echo "verifier error: /opt/venv/bin/pytest is missing from this environment" >&2
  exit 2
fi
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 /opt/venv/bin/pytest -c /tests/pytest.ini --rootdir /tests \
  --confcutdir /tests /tests/test_outputs.py -rA
status=$?
case "$status" in
  0) echo 1 > /logs/verifier/reward.txt ;;
  1) echo 0 > /logs/verifier/reward.txt ;;
  *) echo "verifier error: pytest exited with status $status" >&2; exit "$status" ;;
esac
