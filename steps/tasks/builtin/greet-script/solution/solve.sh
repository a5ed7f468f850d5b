#!/bin/bash
set -euo pipefail
cat > /app/greet.sh <<'SCRIPT'
#!/bin/bash
greeting="${GREETING:-Hello}"
if [ "$#" -eq 0 ]; then
  set -- world
fi
for name in "$@"; do
  printf '%s, %s!\n' "$greeting" "$name"
done
SCRIPT
chmod +x /app/greet.sh
