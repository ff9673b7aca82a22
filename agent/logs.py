"""Logging set-up: JSON lines under systemd (or on request), readable text on a terminal.

Secrets never reach a log line: every formatted message passes through :func:`redact`,
which hides URL passwords and ``key=...``/``token=...`` style values.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from typing import Literal

__all__ = ["redact", "setup_logging"]

_URL_PASSWORD = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.\-]*://[^:/@\s]*):[^@/\s]+@")
_SECRET_KV = re.compile(r"(?i)\b(?P<k>api[_-]?key|password|passwd|secret|token)(?P<sep>\s*[=:]\s*)[^\s,;&]+")


def redact(text: str) -> str:
    """Hide credentials in ``text`` (URL passwords and key/token/password assignments)."""
    text = _URL_PASSWORD.sub(r"\g<scheme>:***@", text)
    return _SECRET_KV.sub(r"\g<k>\g<sep>***", text)


class _RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            payload.update({k: redact(v) if isinstance(v, str) else v for k, v in extra.items()})
        if record.exc_info:
            payload["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(payload, default=str)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at emit time (not the object seen at set-up), so a
    CLI run inside a host that swaps stderr (a test runner, an embedding program) never writes
    to a stream that has since been closed."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def setup_logging(fmt: Literal["auto", "json", "text"] = "auto", level: int = logging.INFO) -> None:
    """Configure the root logger once for the process (stderr)."""
    if fmt == "auto":
        fmt = "json" if os.environ.get("JOURNAL_STREAM") else "text"
    handler = _StderrHandler()
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(_RedactingFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
