#!/bin/bash
set -euo pipefail
echo hello > /app/answer.txt
