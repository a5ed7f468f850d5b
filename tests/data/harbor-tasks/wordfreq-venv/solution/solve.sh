#!/bin/bash
set -euo pipefail
python3 - <<'PY'
from pathlib import Path

path = Path("/app/wordfreq.py")
source = path.read_text()
source = source.replace("return WORD.findall(text)", "return WORD.findall(text.lower())")
source = source.replace("key=lambda item: item[1], reverse=True)", "key=lambda item: (-item[1], item[0]))")
path.write_text(source)
PY
