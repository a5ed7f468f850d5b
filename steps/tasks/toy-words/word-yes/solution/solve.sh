#!/bin/bash
# The oracle replies as the `direct` harness would: its final answer lands in /logs/agent/answer.txt.
mkdir -p /logs/agent
echo yes > /logs/agent/answer.txt
