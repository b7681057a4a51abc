"""Log output for the runrelay processes: text for people, JSON lines for
collectors. Fields passed as `extra=` (run_id, attempt, queue, outcome,
duration_ms, ...) become JSON keys, or `key=value` pairs after the text message.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("text", "json")
# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, the extras, and
    the traceback as one string when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **extras(record),
        }
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """`time level logger message key=value ...`, then the traceback."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        pairs = " ".join(f"{k}={v}" for k, v in extras(record).items())
        return f"{line} {pairs}" if pairs else line


def configure(level: str = "INFO", fmt: str = "text") -> None:
    """Route every log record to stderr in `fmt`, at `level` and above."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Alembic narrates every plugin it loads at INFO; keep it to what matters.
    logging.getLogger("alembic").setLevel(max(root.level, logging.WARNING))
    # httpx logs every request at INFO, URL included (a webhook URL may carry
    # credentials or a token in its query string): off unless asked for with
    # --log-level debug, and even then WebhookSink's URLs are redacted.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(max(root.level, logging.WARNING))
