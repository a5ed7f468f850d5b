#!/bin/bash
set -euo pipefail
sed 's/^[[:space:]]*//; s/[[:space:]]*$//' /app/names.txt | grep -v '^$' | LC_ALL=C sort -u > /app/unique_names.txt
