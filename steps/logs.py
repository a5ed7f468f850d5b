"""Structured, quiet-by-default logging shared by every step.

Each record is one JSON object per line on stderr, so a pod's log and a local run's log read the
same and can be filtered with `jq`. Call `setup("warning")` once in a step's `main()`.
"""

import logging
import sys
import time

import orjson

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message"}


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line with its `extra=` fields at top level."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in _RESERVED})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def setup(level: str = "warning") -> None:
    """Routes the root logger to stderr as JSON lines at `level`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def now() -> float:
    """Wall-clock seconds, the one clock used for recorded timings."""
    return time.time()
