"""Tests for /app/service.json, the JSON form of /app/service.ini."""

import json
from pathlib import Path

EXPECTED = {
    "server": {"host": "0.0.0.0", "port": 8080, "workers": 4, "debug": False},
    "database": {"url": "postgresql://billing@db:5432/billing", "pool_size": 10, "timeout_s": 2.5},
    "features": {"invoices": True, "refunds": False},
}


def load() -> dict:
    return json.loads(Path("/app/service.json").read_text())


def test_sections():
    assert sorted(load()) == sorted(EXPECTED)


def test_values_and_types():
    found = load()
    for section, values in EXPECTED.items():
        for key, value in values.items():
            assert found[section][key] == value and type(found[section][key]) is type(value), \
                f"[{section}] {key}: expected {value!r}, found {found[section].get(key)!r}"


def test_no_extra_keys():
    found = load()
    for section, values in EXPECTED.items():
        assert sorted(found[section]) == sorted(values), f"[{section}] has keys {sorted(found[section])}"
