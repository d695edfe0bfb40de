"""`sco console`: one process serving the console's pages (workers/console/pages.py) with
the standard library's threading HTTP server. GET only: nothing here writes anything.

Who may read: with `console.cert_file`/`key_file` it speaks TLS, and with
`console.client_ca_file` only an operator presenting a client certificate that CA signed
gets a page (the operators' identities, as at Temporal's front); each request is logged
with the certificate's subject. Without them it is plain HTTP: keep it on loopback (the
default) or behind a TLS front that checks the certificates. The TLS handshake runs in the
request's own thread, so a client that never finishes one holds up nobody else."""

from __future__ import annotations

import json
import logging
import socket
import ssl
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from workers.console.pages import PAGES, render
from workers.settings import Settings

log = logging.getLogger(__name__)


def make_server(s: Settings, host: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        server_version = "sco-console"

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            params = dict(parse_qsl(url.query))
            path = url.path.rstrip("/") or "/"
            as_json = params.pop("format", "") == "json" or path.endswith(".json")
            path = path.removesuffix(".json") or "/"
            if path == "/index":
                path = "/"
            if path == "/healthz":
                self._send(HTTPStatus.OK, "text/plain", b"ok\n")
                return
            if path not in PAGES:
                self._send(HTTPStatus.NOT_FOUND, "text/plain", b"no such page\n")
                return
            data = PAGES[path][1](s, params)
            if as_json:
                body = json.dumps(data, indent=2, default=str).encode()
                self._send(HTTPStatus.OK, "application/json", body)
            else:
                self._send(
                    HTTPStatus.OK, "text/html; charset=utf-8", render(path, data, s).encode()
                )

        def _refuse(self) -> None:
            self._send(HTTPStatus.METHOD_NOT_ALLOWED, "text/plain", b"read-only\n")

        do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

        def _send(self, status: HTTPStatus, ctype: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.info("%s %s " + format, self.address_string(), _subject(self.connection), *args)

    context = tls_context(s)
    if context is None:
        return ThreadingHTTPServer((host, port), Handler)
    return _TLSServer((host, port), Handler, context)


#: Seconds a client has to finish its TLS handshake.
HANDSHAKE_SECONDS = 10.0


class _TLSServer(ThreadingHTTPServer):
    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        context: ssl.SSLContext,
    ) -> None:
        super().__init__(address, handler)
        self.context = context

    def finish_request(self, request: Any, client_address: Any) -> None:
        # In the request's thread (ThreadingMixIn): the handshake blocks only this client.
        request.settimeout(HANDSHAKE_SECONDS)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            log.info("%s: TLS refused: %s", client_address[0], exc)
            return
        try:
            super().finish_request(tls, client_address)
        finally:
            tls.close()  # the server closes the plain socket it accepted, now detached

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.info("%s: connection ended with an error", client_address[0], exc_info=True)


def tls_context(s: Settings) -> ssl.SSLContext | None:
    """The console's server context from `console.*`, or None for plain HTTP."""
    c = s.console
    if c.cert_file is None or c.key_file is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(c.cert_file, c.key_file)
    if c.client_ca_file is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(c.client_ca_file)
    return context


def _subject(conn: socket.socket) -> str:
    """The client certificate's subject (e.g. "CN=dana,O=sco-operators"), "-" without one."""
    if not isinstance(conn, ssl.SSLSocket):
        return "-"
    cert = conn.getpeercert()
    if not cert:
        return "-"
    parts: list[str] = []
    for rdn in cert.get("subject", ()):
        for attribute in rdn:
            parts.append(f"{attribute[0]}={attribute[1]}")
    return ",".join(parts)


def serve(s: Settings, host: str, port: int, stop: threading.Event) -> None:
    """Serve until `stop` is set (SIGTERM/SIGINT in `sco console`)."""
    server = make_server(s, host, port)
    thread = threading.Thread(target=server.serve_forever, name="console", daemon=True)
    thread.start()
    scheme = "http" if s.console.cert_file is None else "https"
    log.info("console on %s://%s:%d", scheme, host, server.server_address[1])
    try:
        stop.wait()
    finally:
        server.shutdown()
        server.server_close()
