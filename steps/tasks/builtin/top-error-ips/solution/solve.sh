#!/bin/bash
set -euo pipefail
# Split on the double quotes: field 1 starts with the IP, field 3 starts with " STATUS BYTES".
awk -F'"' '{ split($3, after, " "); split($1, before, " ")
             if (after[1] ~ /^5[0-9][0-9]$/) print before[1] }' /app/access.log \
  | LC_ALL=C sort | uniq -c | awk '{ print $1, $2 }' \
  | LC_ALL=C sort -k1,1nr -k2,2 | head -n 3 > /app/report.txt
