"""Which `task.toml` fields exist and what type each must have (Harbor's schema_version 1.0 to 2.0).

`check_config(raw)` returns the first problem of a parsed task.toml as one sentence, or None:
a known field of the wrong type, or an unknown field that looks like a misspelt known one (so that
`timeout_secs = 60` is reported instead of silently becoming the 600 s default). Every field Harbor
documents is accepted, even those local mode does not use (user, network policy, MCP servers...).
Other unknown fields are ignored, as Harbor ignores them (its schema keeps growing: a task written
for a newer Harbor must still load); `unknown_fields(raw)` lists them so callers can say so.

    python -m pytest --doctest-modules steps/tasks/schema.py
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable

Check = tuple[Callable[[object], bool], str]


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


SECONDS: Check = (lambda v: _is_number(v) and v > 0, "a number of seconds > 0")
COUNT: Check = (_is_count, "a whole number >= 0")
TEXT: Check = (lambda v: isinstance(v, str), "a string")
TEXTS: Check = (_is_str_list, "a list of strings")
FLAG: Check = (lambda v: isinstance(v, bool), "true or false")
TABLE: Check = (lambda v: isinstance(v, dict), "a table")
TABLES: Check = (lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v), "a list of tables")
STRING_TABLE: Check = (lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
                       "a table of strings, e.g. { NAME = \"value\" }")
ABSOLUTE_PATHS: Check = (lambda v: _is_str_list(v) and all(p.startswith("/") and p != "/" for p in v),
                         "a list of absolute paths other than /, such as [\"/app\", \"/etc/nginx\"]")
USER: Check = (lambda v: isinstance(v, str) or _is_count(v), "a user name or uid")
SIZE: Check = (lambda v: isinstance(v, str) and re.fullmatch(r"\d+(\.\d+)?[GgMmKk]", v.strip()) is not None,
               "a size such as \"2G\" or \"512M\"")
NETWORK: Check = (lambda v: v in ("public", "no-network", "allowlist"), "one of public, no-network, allowlist")
LINUX: Check = (lambda v: v == "linux", "\"linux\" (Windows tasks are not supported)")

SECTIONS: dict[str, dict[str, Check]] = {
    "task": {"name": TEXT, "description": TEXT, "authors": TABLES, "keywords": TEXTS},
    "verifier": {"timeout_sec": SECONDS, "env": STRING_TABLE, "user": USER, "network_mode": NETWORK,
                 "allowed_hosts": TEXTS, "environment_mode": TEXT, "environment": TABLE, "collect": TABLES,
                 "graded_paths": ABSOLUTE_PATHS, "judge": FLAG},
    "agent": {"timeout_sec": SECONDS, "setup_timeout_sec": SECONDS, "user": USER, "network_mode": NETWORK,
              "allowed_hosts": TEXTS},
    "environment": {"build_timeout_sec": SECONDS, "docker_image": TEXT, "cpus": COUNT, "memory_mb": COUNT,
                    "storage_mb": COUNT, "memory": SIZE, "storage": SIZE, "gpus": COUNT, "gpu_types": TEXTS,
                    "allow_internet": FLAG, "network_mode": NETWORK, "allowed_hosts": TEXTS, "mcp_servers": TABLES,
                    "env": STRING_TABLE, "skills_dir": TEXT, "healthcheck": TABLE, "os": LINUX, "workdir": TEXT,
                    "app": TEXT},
    "solution": {"env": STRING_TABLE},
}
TOP_LEVEL: dict[str, Check] = {"version": TEXT, "schema_version": TEXT, "source": TEXT, "metadata": TABLE,
                               "artifacts": (lambda v: isinstance(v, list), "a list"),
                               "multi_step_reward_mode": TEXT, **{name: TABLE for name in SECTIONS}}
# How alike an unknown name must be to a known one to count as a typo of it (difflib's ratio).
TYPO_CUTOFF = 0.75


def check_config(raw: dict) -> str | None:
    """The first problem in a parsed task.toml, as one sentence; None when it is valid.

    >>> check_config({"version": "1.0", "agent": {"timeout_sec": 300}, "metadata": {"anything": [1, 2]}}) is None
    True
    >>> check_config({"agent": {"timeout": 300}})
    'unknown field [agent] timeout (did you mean timeout_sec?)'
    >>> check_config({"verifier": {"timeout_sec": "fast"}})
    "[verifier] timeout_sec must be a number of seconds > 0, got 'fast'"
    >>> check_config({"schema_version": "2.0", "environment": {"sandbox_flavour": "x"}}) is None  # not a typo
    True
    >>> check_config({"steps": []})
    'multi-step tasks ([[steps]]) are not supported'
    """
    if "steps" in raw:
        return "multi-step tasks ([[steps]]) are not supported"
    tables = [("", raw, TOP_LEVEL)] + [(f"[{name}] ", raw.get(name, {}), fields) for name, fields in SECTIONS.items()]
    for where, table, fields in tables:
        if not isinstance(table, dict):
            continue  # reported with the top-level fields
        for key, value in table.items():
            if key in fields:
                accepts, expected = fields[key]
                if not accepts(value):
                    return f"{where}{key} must be {expected}, got {value!r}"
                continue
            typo_of = difflib.get_close_matches(key, fields, n=1, cutoff=TYPO_CUTOFF)
            if typo_of:
                return f"unknown field {where}{key} (did you mean {typo_of[0]}?)"
    return None


def unknown_fields(raw: dict) -> list[str]:
    """The fields of a task.toml that OpenForge does not know and ignores, as "[section] name".

    >>> unknown_fields({"future": 1, "environment": {"sandbox_flavour": "x", "cpus": 1}, "metadata": {"x": 1}})
    ['future', '[environment] sandbox_flavour']
    """
    found = [key for key in raw if key not in TOP_LEVEL]
    for name, fields in SECTIONS.items():
        table = raw.get(name, {})
        found += [f"[{name}] {key}" for key in (table if isinstance(table, dict) else {}) if key not in fields]
    return found
