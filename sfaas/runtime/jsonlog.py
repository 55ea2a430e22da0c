"""JSON-lines logs (setting ``log_format = json``): one JSON object a line, so a log
shipper reads the fields without parsing prose, and a line finds its trace.

Each line holds ``time`` (ISO 8601, UTC, milliseconds), ``level``, ``logger``, ``message``
(the formatted message), the record's structured fields (what the code passed as
``extra=``, e.g. ``worker``), ``exception`` with the traceback when there is one, and —
tracing on and a span current — ``trace_id`` and ``span_id`` in hex, as Jaeger shows them.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from sfaas.runtime import tracing

__all__ = ["JsonLines"]

#: The attributes every ``LogRecord`` has: anything else on a record is a structured field.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName"}


class JsonLines(logging.Formatter):
    """A formatter writing each record as one JSON object (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                    + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in doc:
                doc[key] = value
        if tracing.ON:
            ids = tracing.current_ids()
            if ids is not None:
                doc["trace_id"], doc["span_id"] = ids
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exception"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, default=repr, ensure_ascii=False)
