#!/bin/bash
set -euo pipefail
grep -oE '[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}' /app/mail.log \
  | tr 'A-Z' 'a-z' | LC_ALL=C sort -u > /app/emails.txt
