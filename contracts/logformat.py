"""How every SCO process writes its log: one JSON object per line, or plain text on a terminal.

The one implementation for the control plane (workers/logs.py) and the node agent
(agent/cli.py): it lives here because both may import `contracts` and neither may import
the other. Standard library only, so the agent stays small and `sco --help` stays fast.

A JSON line carries `ts` (UTC, RFC 3339), `level`, `logger` and `message`; lines the
Temporal SDK emits inside a workflow or an activity also carry `workflow_id`, `run_id`,
`workflow_type` and, for activities, `activity_type` and `activity_id` (the SDK attaches
them to the record as `temporal_workflow` / `temporal_activity`). Other `extra=` fields of a
record are kept under their own names. Every line, in either format, goes through
`contracts.redact.mask_credentials`: a DSN or URL a message, an argument or an exception
names never shows its password.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from contracts.redact import mask_credentials

LogFormat = Literal["auto", "json", "text"]
LOG_FORMATS: tuple[LogFormat, ...] = ("auto", "json", "text")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: Attributes every LogRecord has; anything else on a record came from `extra=`.
_RECORD_ATTRS = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None)).keys()
) | {"message", "asctime", "taskName"}

#: temporalio's detail keys -> ours (an activity names its workflow's run `workflow_run_id`).
_TEMPORAL_KEYS = {
    "workflow_id": "workflow_id",
    "run_id": "run_id",
    "workflow_run_id": "run_id",
    "workflow_type": "workflow_type",
    "activity_id": "activity_id",
    "activity_type": "activity_type",
    "namespace": "namespace",
    "task_queue": "task_queue",
    "attempt": "attempt",
    "update_id": "update_id",
    "update_name": "update_name",
}


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (a traceback is a field, not more lines)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("temporal_workflow", "temporal_activity", "temporal_update"):
            details = getattr(record, key, None)
            if isinstance(details, dict):
                for name, value in details.items():
                    if name in _TEMPORAL_KEYS:
                        out.setdefault(_TEMPORAL_KEYS[name], _jsonable(value))
        for name, value in vars(record).items():
            # `__temporal_error_identifier` and the like are the SDK's private markers.
            if name in _RECORD_ATTRS or name.startswith("_") or name.startswith("temporal_"):
                continue
            out.setdefault(name, _jsonable(value))
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc_info"] = record.exc_text
        if record.stack_info:
            out["stack_info"] = self.formatStack(record.stack_info)
        return mask_credentials(json.dumps(out, ensure_ascii=False))


class TextFormatter(logging.Formatter):
    """One readable line per record (TEXT_FORMAT), credentials masked like the JSON lines."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        return mask_credentials(super().format(record))


def resolve_format(fmt: LogFormat, stream: TextIO) -> Literal["json", "text"]:
    """`auto`: text for a person at a terminal, JSON for everything that collects logs."""
    if fmt != "auto":
        return fmt
    isatty = getattr(stream, "isatty", None)
    return "text" if isatty is not None and isatty() else "json"


def formatter_for(fmt: Literal["json", "text"]) -> logging.Formatter:
    return JsonFormatter() if fmt == "json" else TextFormatter()


def configure_logging(
    fmt: LogFormat = "auto", level: str | int = "INFO", stream: TextIO | None = None
) -> Literal["json", "text"]:
    """Send the root logger to `stream` (stderr) in `fmt`; replaces earlier handlers, so a
    process may call it again once its settings are loaded. Returns the format chosen."""
    out = sys.stderr if stream is None else stream
    chosen = resolve_format(fmt, out)
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter_for(chosen))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return chosen


def parse_format(value: str, source: str) -> LogFormat:
    """VALUE as a log format, or a ValueError naming SOURCE and the choices."""
    for fmt in LOG_FORMATS:
        if value == fmt:
            return fmt
    raise ValueError(f"{source}: log format {value!r} is not one of {', '.join(LOG_FORMATS)}")
