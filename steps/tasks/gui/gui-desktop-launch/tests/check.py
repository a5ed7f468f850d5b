"""Pass when the kiosk's Launch button was clicked exactly once."""

import json
import sys
from pathlib import Path

# The site's own record, brought to the verifier from the app's sandbox (never from the agent's).
STATE = Path("/var/lib/openforge/app/state.json")

if not STATE.is_file():
    print("no site state: the site never ran")
    sys.exit(1)
launched = json.loads(STATE.read_text())["launched"]
if launched != 1:
    print(f"expected the Launch button clicked once, the site recorded {launched} clicks")
    sys.exit(1)
print("ok")
