"""Structured logging: one line per event, `key=value` pairs or JSON, fields passed as `extra=`."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

# Attributes every LogRecord has; anything else on a record came from `extra=` and is a field.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}


def fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}


def _timestamp(record: logging.LogRecord) -> str:
    return (
        datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        parts = [_timestamp(record), record.levelname.lower(), record.name, json.dumps(record.getMessage())]
        parts += [f"{k}={_kv(v)}" for k, v in fields(record).items()]
        if record.exc_info:
            parts.append("error=" + json.dumps(self.formatException(record.exc_info)))
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(fields(record))
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def _kv(value: Any) -> str:
    """A field's value bare when that reads back unambiguously, else as a JSON string. A value with
    anything unprintable (an ESC, a newline, a bidi override in a hostile host's interface name or a
    --root given on the command line) is always quoted and escaped: raw, it could move a terminal's
    cursor or forge a log line of its own."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    bare = text and text.isprintable() and not any(c in text for c in ' ="')
    return text if bare else json.dumps(text)


def configure(*, json_output: bool = False, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_output else KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class _DefaultFields(logging.Filter):
    def __init__(self, values: dict[str, Any]) -> None:
        super().__init__()
        self.values = values

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in self.values.items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


def default_fields(**values: Any) -> None:
    """Give every line our handlers write these fields unless the line names its own: the agent's `node`,
    so `grep node=<name>` finds every line of one node's agent, its device plugin's and gRPC's included."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler.formatter, KeyValueFormatter | JsonFormatter):
            handler.addFilter(_DefaultFields(values))
