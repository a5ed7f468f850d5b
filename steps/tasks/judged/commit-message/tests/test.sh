#!/bin/bash
# The judge grades the message: judge.py asks the run's judge model (through the proxy's judge route) and writes
# its score over 10 as the reward. A missing message scores 0 without asking. A judge that cannot be reached or
# answers with an error leaves no reward (exit 3): the runner, told by the proxy that the judge failed, makes the
# rollout an infra error, never a 0.
mkdir -p /logs/verifier
python3 /tests/judge.py
