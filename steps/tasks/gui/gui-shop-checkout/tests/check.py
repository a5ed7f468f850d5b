"""Pass when exactly one order was placed: two Blue Mugs and a Tea Sampler, for Grace Hopper at 1 Navy Way."""

import json
import sys
from pathlib import Path

# The site's own record, brought to the verifier from the app's sandbox (never from the agent's).
STATE = Path("/var/lib/openforge/app/state.json")

if not STATE.is_file():
    print("no site state: the site never ran")
    sys.exit(1)
placed = json.loads(STATE.read_text())["placed"]
expected = {"items": {"Blue Mug": 2, "Tea Sampler": 1}, "name": "Grace Hopper", "address": "1 Navy Way, Arlington"}
if len(placed) != 1 or placed[0]["items"] != expected["items"] or placed[0]["name"].strip() != expected["name"] \
        or placed[0]["address"].strip() != expected["address"]:
    print(f"expected one order {expected}, the site recorded {placed}")
    sys.exit(1)
print("ok")
