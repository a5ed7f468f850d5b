#!/bin/bash
set -euo pipefail
cat > /app/backup.sh <<'SCRIPT'
#!/bin/bash
set -uo pipefail
if [ "$#" -ne 2 ]; then
  echo "usage: backup.sh SRC DEST" >&2
  exit 2
fi
src="$1"
dest="$2"
if [ ! -d "$src" ]; then
  echo "backup.sh: source '$src' is not a folder" >&2
  exit 1
fi
count=0
while IFS= read -r -d '' file; do
  relative="${file#"$src"/}"
  mkdir -p -- "$dest/$(dirname -- "$relative")" || exit 1
  cp -- "$file" "$dest/$relative.bak" || exit 1
  count=$((count + 1))
done < <(find "$src" -type f -print0)
echo "copied $count files"
SCRIPT
chmod +x /app/backup.sh
