#!/bin/bash
set -euo pipefail
cd /app/photos
for file in IMG_*; do
  if [[ "$file" =~ ^IMG_([0-9]+)\.([jJ][pP][eE]?[gG])$ ]]; then
    mv -- "$file" "photo-${BASH_REMATCH[1]}.jpg"
  fi
done
