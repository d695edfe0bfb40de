"""The one function that masks credentials in DSNs and URLs (contracts/redact.py), and the
log formatter every process (and the node agent) writes through."""

from __future__ import annotations

import io
import logging

import pytest

from contracts.logformat import JsonFormatter, TextFormatter
from contracts.redact import has_credentials, mask_credentials


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("postgresql://sco:s3cret@db:5432/sco", "postgresql://sco:***@db:5432/sco"),
        ("postgresql://sco@db:5432/sco", "postgresql://sco@db:5432/sco"),
        (
            "postgresql://sco:s3cret@10.0.0.1:5432,10.0.0.2:5432/sco?sslmode=verify-full",
            "postgresql://sco:***@10.0.0.1:5432,10.0.0.2:5432/sco?sslmode=verify-full",
        ),
        ("https://sco:s3cret@ch:8443/", "https://sco:***@ch:8443/"),
        (
            "nats://ctl:s3cret@a:4222,nats://ctl:s3cret@b:4222",
            "nats://ctl:***@a:4222,nats://ctl:***@b:4222",
        ),
        ("nats://s3cret@nats:4222", "nats://***@nats:4222"),
        ("tls://s3cret@nats:4222", "tls://***@nats:4222"),
        (
            "host=a,b user=sco password='s3 cret' dbname=sco",
            "host=a,b user=sco password=*** dbname=sco",
        ),
        ("host=a password=s3cret", "host=a password=***"),
        (
            "http://ch:8123/?user=sco&password=s3cret&x=1",
            "http://ch:8123/?user=sco&password=***&x=1",
        ),
        (
            "https://oauth2:s3cret@git.example/contracts.git",
            "https://oauth2:***@git.example/contracts.git",
        ),
        ("127.0.0.1:7233", "127.0.0.1:7233"),
        ("http://127.0.0.1:8233/namespaces/r1", "http://127.0.0.1:8233/namespaces/r1"),
        ("chdb:///var/lib/sco/ledger", "chdb:///var/lib/sco/ledger"),
        (
            "NATS at nats://u:s3cret@h:4222 unavailable (x)",
            "NATS at nats://u:***@h:4222 unavailable (x)",
        ),
        ("", ""),
    ],
)
def test_credentials_are_masked_and_nothing_else(text: str, shown: str) -> None:
    assert mask_credentials(text) == shown
    assert "s3cret" not in mask_credentials(text) and "s3 cret" not in mask_credentials(text)
    assert mask_credentials(shown) == shown  # idempotent
    assert has_credentials(text) == (text != shown)


def _record(msg: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    record = logging.LogRecord("sco.test", logging.WARNING, __file__, 1, msg, args, None)
    if exc is not None:
        try:
            raise exc
        except type(exc):
            import sys

            record.exc_info = sys.exc_info()
    return record


@pytest.mark.parametrize("formatter", [JsonFormatter(), TextFormatter()], ids=["json", "text"])
def test_every_log_line_is_masked(formatter: logging.Formatter) -> None:
    """The message, its arguments, `extra=` fields and a traceback: none shows the password."""
    lines = [
        formatter.format(_record("connecting to postgresql://sco:s3cret@db/sco")),
        formatter.format(_record("NATS at %s down", "nats://ctl:s3cret@nats:4222")),
        formatter.format(
            _record("failed", exc=RuntimeError("ledger https://sco:s3cret@ch:8443/ down"))
        ),
    ]
    if isinstance(formatter, JsonFormatter):  # the text line does not show `extra=` fields
        extra = _record("with extra")
        extra.dsn = "postgresql://sco:s3cret@db/sco"
        lines.append(formatter.format(extra))
    for line in lines:
        assert "s3cret" not in line and "***" in line, line


def test_configured_logging_masks_what_a_library_logs() -> None:
    """A line from a library logger (not ours) goes through the same formatter."""
    from contracts.logformat import configure_logging

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    out = io.StringIO()
    try:
        configure_logging("json", "INFO", out)
        logging.getLogger("nats.aio.client").warning("reconnecting to nats://a:s3cret@h:4222")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    assert "s3cret" not in out.getvalue() and "nats://a:***@h:4222" in out.getvalue()
