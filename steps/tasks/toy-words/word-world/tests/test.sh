#!/bin/bash
# Partial credit, so that even a small random model earns different rewards on different samples:
# the reward is the length of the longest prefix of "world" found in the reply, over 5
# (the whole word "world": 1.0). The reply is the agent's final answer in /logs/agent/answer.txt.
mkdir -p /logs/verifier
python3 - <<'PY'
from pathlib import Path

target = "world"
answer = Path("/logs/agent/answer.txt")
reply = answer.read_text(errors="replace").lower() if answer.is_file() else ""
best = max((k for k in range(len(target) + 1) if target[:k] in reply), default=0)
Path("/logs/verifier/reward.txt").write_text(f"{best / len(target)}\n")
print(f"reply {reply[:80]!r}: longest prefix of {target!r} found: {target[:best]!r}")
PY
