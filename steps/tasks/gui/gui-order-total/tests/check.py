"""Pass when the one reported answer names Ines's order and its total as the site drew it for this run."""

import json
import sys
from pathlib import Path

# The site's own record, brought to the verifier from the app's sandbox (never from the agent's).
STATE = Path("/var/lib/openforge/app/state.json")

if not STATE.is_file():
    print("no site state: the site never ran")
    sys.exit(1)
state = json.loads(STATE.read_text())
number, order = next((n, o) for n, o in state["orders"].items() if o["customer"] == "Ines")
cents = order["total_cents"]
expected = {"order": number, "total": f"${cents // 100}.{cents % 100:02d}"}
answers = [{"order": a["order"].strip().lstrip("#"), "total": a["total"].strip()} for a in state["answers"]]
if answers != [expected]:
    print(f"expected one answer {expected}, the site recorded {answers}")
    sys.exit(1)
print("ok")
