"""Structured log lines: one JSON object per line on stderr, fields instead of prose."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        line.update(getattr(record, "fields", {}))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class EventLog:
    """A logger whose calls name an event and its fields: log.info("swap_enabled", device=...)."""

    def __init__(self, name: str) -> None:
        self._logger = logging.getLogger(name)

    def _log(self, level: int, event: str, fields: dict[str, Any], exc: bool = False) -> None:
        self._logger.log(level, event, extra={"fields": fields}, exc_info=exc)

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, event, fields)

    def error(self, event: str, exc: bool = False, **fields: Any) -> None:
        self._log(logging.ERROR, event, fields, exc)


def configure(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.Formatter.converter = time.gmtime


class Repeats:
    """A warning that can repeat thousands of times a second (a failing accept): the first is
    logged, then at most one line per interval per event, counting those not logged."""

    def __init__(self, log: EventLog, interval_s: float = 10.0) -> None:
        self._log = log
        self._interval_s = interval_s
        self._seen: dict[str, tuple[float, int]] = {}  # event: (last logged, not logged since)

    def warning(self, event: str, **fields: Any) -> None:
        now = time.monotonic()
        last, unlogged = self._seen.get(event, (-self._interval_s, 0))
        if now - last < self._interval_s:
            self._seen[event] = (last, unlogged + 1)
            return
        if unlogged:
            fields["repeated"] = unlogged
            fields["interval_s"] = self._interval_s
        self._log.warning(event, **fields)
        self._seen[event] = (now, 0)
