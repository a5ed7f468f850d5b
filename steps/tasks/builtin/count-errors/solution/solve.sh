#!/bin/bash
set -euo pipefail
awk '$3 == "ERROR"' /app/server.log | wc -l > /app/error_count.txt
