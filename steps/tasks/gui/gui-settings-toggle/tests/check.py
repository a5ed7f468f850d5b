"""Pass when the settings were saved with two-factor on, marketing emails off, and the others as they started."""

import json
import sys
from pathlib import Path

# The site's own record, brought to the verifier from the app's sandbox (never from the agent's).
STATE = Path("/var/lib/openforge/app/state.json")

if not STATE.is_file():
    print("no site state: the site never ran")
    sys.exit(1)
state = json.loads(STATE.read_text())
expected = {"two_factor": True, "marketing_emails": False, "weekly_digest": True, "dark_mode": False}
if state["settings_saved"] < 1 or state["settings"] != expected:
    print(f"expected saved settings {expected}, the site has {state['settings']} (saved {state['settings_saved']} times)")
    sys.exit(1)
print("ok")
