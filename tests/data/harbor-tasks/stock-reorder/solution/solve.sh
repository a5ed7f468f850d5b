#!/bin/bash
set -euo pipefail
stockctl list | awk -F '\t' 'NR > 1 && $3 < $4 { print $1 }' | sort > /app/reorder.txt
