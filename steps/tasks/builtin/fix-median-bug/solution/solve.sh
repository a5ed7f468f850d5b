#!/bin/bash
set -euo pipefail
python3 - <<'PY'
from pathlib import Path

path = Path("/app/stats.py")
source = path.read_text()
source = source.replace(
    """    middle = len(values) // 2
    return values[middle]
""",
    """    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2
""")
source = source.replace(
    "    return max(counts, key=counts.get)\n",
    "    return min(counts, key=lambda value: (-counts[value], value))\n")
path.write_text(source)
PY
cd /app && python3 -m unittest test_stats
