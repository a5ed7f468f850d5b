#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import configparser
import json
import re


def typed(value: str):
    if value in ("true", "false"):
        return value == "true"
    if re.fullmatch(r"-?\d+", value):
        return int(value)
    if re.fullmatch(r"-?\d+\.\d*", value):
        return float(value)
    return value


config = configparser.ConfigParser()
config.read("/app/service.ini")
result = {section: {key: typed(value) for key, value in config[section].items()} for section in config.sections()}
with open("/app/service.json", "w") as f:
    json.dump(result, f, indent=2)
PY
