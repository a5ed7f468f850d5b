"""Pass when the only book borrowed is The Dispossessed (b2), not its namesake study guide."""

import json
import sys
from pathlib import Path

# The site's own record, brought to the verifier from the app's sandbox (never from the agent's).
STATE = Path("/var/lib/openforge/app/state.json")

if not STATE.is_file():
    print("no site state: the site never ran")
    sys.exit(1)
borrowed = json.loads(STATE.read_text())["borrowed"]
if borrowed != ["b2"]:
    print(f"expected only The Dispossessed (b2) borrowed, the site recorded {borrowed}")
    sys.exit(1)
print("ok")
