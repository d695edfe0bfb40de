"""Logging of the `sco` processes from settings: `log.format` and `log.level`.

The formatter is contracts/logformat.py (shared with the node agent). `sco` configures
logging from SCO_LOG__* before a command loads its settings, and again from the loaded
settings (the TOML file may set `[log]`), so a worker's first line is already in its format.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Literal, TextIO

from contracts.logformat import LogFormat, configure_logging, parse_format, resolve_format

if TYPE_CHECKING:
    from temporalio.runtime import LoggingConfig

    # Not at run time: `sco` configures logging before it imports any settings.
    from workers.settings import LogSettings

FORMAT_ENV = "SCO_LOG__FORMAT"
LEVEL_ENV = "SCO_LOG__LEVEL"


#: Set by `sco`'s entry point: this process's logging is ours to configure. A command run
#: in-process (typer's CliRunner, in tests) leaves the host's logging alone.
_owned = False
#: An operator's command (`sco demand set`) logs warnings and errors only, to stderr: its
#: stdout is the answer and its stderr the one-line error. `-v` shows its INFO lines; a
#: long-running process (services/registry.py loads its `run`) logs at `log.level`.
_verbose = False
_serving = False
_last: LogSettings | None = None


def configure_from_env(verbose: bool = False) -> None:
    """Before settings load: the format and level the environment asks for (a bad value is
    left to the settings, which refuse it with the field's name)."""
    global _owned, _verbose
    _owned = True
    _verbose = verbose
    try:
        fmt: LogFormat = parse_format(os.environ.get(FORMAT_ENV, "auto"), FORMAT_ENV)
    except ValueError:
        fmt = "auto"
    level = os.environ.get(LEVEL_ENV, "INFO").upper()
    level = level if level in {"DEBUG", "INFO", "WARNING", "ERROR"} else "INFO"
    configure_logging(fmt, _command_level(level))
    quiet_libraries()


def _command_level(level: str) -> str:
    """LEVEL for a long-running process or under `-v`; at least WARNING for a command."""
    if _verbose or _serving or level in {"WARNING", "ERROR"}:
        return level
    return "WARNING"


def set_verbose(verbose: bool) -> None:
    """`sco -v`: the command's own INFO lines too (set before the command runs)."""
    global _verbose
    _verbose = verbose
    if _owned:
        import logging

        level = _last.level if _last is not None else os.environ.get(LEVEL_ENV, "INFO")
        logging.getLogger().setLevel(_command_level(level.upper()))


def verbose() -> bool:
    return _verbose


def serving() -> None:
    """A long-running process starts (its `run` is loaded): it logs at `log.level`."""
    global _serving
    _serving = True
    if _owned and _last is not None:
        configure_from_settings(_last)


def configure_from_settings(
    log: LogSettings, stream: TextIO | None = None
) -> Literal["json", "text"]:
    level = _command_level(log.level.upper()) if _owned and stream is None else log.level
    chosen = configure_logging(log.format, level, stream)
    quiet_libraries()
    return chosen


def configure_owned(log: LogSettings) -> None:
    """Once a command has its settings: their `[log]`, when `sco` owns the process's logging."""
    global _last
    _last = log
    if _owned:
        configure_from_settings(log)


def _not_asyncio_ssl_eof(record: logging.LogRecord) -> bool:
    """asyncio warns on every TLS connection nats-py closes (its protocol answers EOF with
    True, which only plain transports honour): noise in every command against TLS NATS."""
    return "eof_received() has no effect when using ssl" not in record.getMessage()


def quiet_libraries() -> None:
    # One line per HTTP request (the Kubernetes and OpenStack clients) drowns the rest.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    aio = logging.getLogger("asyncio")
    if _not_asyncio_ssl_eof not in aio.filters:
        aio.addFilter(_not_asyncio_ssl_eof)


def prepare_temporal_logging(log: LogSettings, stream: TextIO | None = None) -> None:
    """For a process hosting workflows and activities. In JSON the workflow and activity ids
    are fields; the SDK would also append them to every message as a Python dict, which a
    log query would then have to parse."""
    from temporalio import activity, workflow

    if resolve_format(log.format, sys.stderr if stream is None else stream) != "json":
        return

    workflow.logger.workflow_info_on_message = False
    activity.logger.activity_info_on_message = False


def temporal_core_logging() -> LoggingConfig:
    """The SDK core's (Rust) log at its default levels, forwarded to the `temporalio.core`
    Python logger, so it comes out in the process's format like every other line."""
    import logging

    from temporalio.runtime import LogForwardingConfig, LoggingConfig, TelemetryFilter

    return LoggingConfig(
        filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
        # The target (the core module) is already in the logger name.
        forwarding=LogForwardingConfig(
            logger=logging.getLogger("temporalio.core"), prepend_target_on_message=False
        ),
    )
