"""`sco console`: the read-only operator console (workers/console/)."""

from __future__ import annotations

import socket
import ssl

import typer

from workers.cli import bounds
from workers.cli.common import console as out
from workers.cli.common import fail, settings, shown


def console(
    host: str = typer.Option(
        "127.0.0.1", "--host", envvar="SCO_CONSOLE_HOST", help="Address to listen on."
    ),
    port: int = typer.Option(8099, "--port", envvar="SCO_CONSOLE_PORT", help="Port."),
) -> None:
    """Serve the read-only operator console until SIGTERM/Ctrl-C.

    Pages: / (regions x halls), /pools (reclaim heat map, exclusions), /acquisitions (open
    ones with Temporal UI links, approvals waiting), /spend (spend and lost work per team,
    ?window=7d); each also as JSON with ?format=json. Nothing on it writes."""
    from workers.console.server import serve
    from workers.shutdown import thread_stop_event

    bounds.identifier("--host", host, max_len=253)  # '' would listen on every interface
    bounds.whole("--port", port, low=1, high=65535)
    s = settings()
    for name in ("cert_file", "key_file", "client_ca_file"):
        if (path := getattr(s.console, name)) is not None:
            bounds.in_file(f"console.{name}", path)
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        fail(f"--host {shown(host)}: {exc}")
    scheme = "http" if s.console.cert_file is None else "https"
    who = " (client certificates required)" if s.console.client_ca_file else ""
    out.print(f"console: {scheme}://{host}:{port}/{who}")
    with thread_stop_event() as stop:
        try:
            serve(s, host, port, stop)
        except ssl.SSLError as exc:
            fail(f"console.cert_file/key_file/client_ca_file: {exc}")
        except OSError as exc:
            fail(f"listening on {host}:{port}: {exc.strerror or exc}")
