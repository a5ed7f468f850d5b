"""Pass when the site recorded exactly one sign-up, Ada Lovelace's, on the Pro plan with the terms accepted."""

import json
import sys
from pathlib import Path

# The site's own record, brought to the verifier from the app's sandbox (never from the agent's).
STATE = Path("/var/lib/openforge/app/state.json")

if not STATE.is_file():
    print("no site state: the site never ran")
    sys.exit(1)
signups = json.loads(STATE.read_text())["signups"]
expected = {"name": "Ada Lovelace", "email": "ada@example.org", "plan": "pro", "terms": "yes"}
if signups != [expected]:
    print(f"expected one sign-up {expected}, the site recorded {signups}")
    sys.exit(1)
print("ok")
