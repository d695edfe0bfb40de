"""The PostgreSQL connection pool that fleet-state code shares within one process."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg_pool import ConnectionPool


@dataclass(frozen=True)
class DbTimeouts:
    """Seconds: a checkout waits at most `pool`, a connection attempt `connect`, a
    statement `statement` (server-side)."""

    connect: float = 5.0
    statement: float = 15.0
    pool: float = 8.0


def open_pool(
    dsn: str,
    *,
    min_size: int = 1,
    max_size: int = 8,
    timeouts: DbTimeouts | None = None,
    wait: bool = True,
    max_lifetime: float | None = None,
) -> ConnectionPool:
    """Open a pool and (with `wait`) wait until one connection works, so a bad DSN fails
    here, loudly. A process that must start while the database is down passes
    `wait=False`: its first checkout then waits `timeouts.pool` and raises PoolTimeout.

    Every wait is bounded (`timeouts`) so a database outage surfaces as an error inside
    the caller's own deadline (an activity's start-to-close).

    `max_lifetime` (None: psycopg_pool's hour): a connection older than this is replaced,
    so a renewed client certificate is presented within that long (libpq reads the
    certificate files at each new connection)."""
    t = timeouts or DbTimeouts()
    # `check`: every connection is tested as it leaves the pool, so after a primary
    # switchover (Patroni) dead connections are replaced instead of failing the next
    # statement; what was in flight rolled back and the activity's retry re-applies it.
    pool = ConnectionPool(
        bounded_conninfo(dsn, t),
        min_size=min_size,
        max_size=max_size,
        open=False,
        check=ConnectionPool.check_connection,
        timeout=t.pool,
        # Keep trying to reconnect through an outage of any length; a checkout meanwhile
        # fails after `t.pool`, which is what the caller handles.
        reconnect_timeout=365 * 86400.0,
        max_lifetime=3600.0 if max_lifetime is None else max_lifetime,  # psycopg_pool's default
    )
    pool.open(wait=wait, timeout=max(15.0, t.connect * 2))
    return pool


def bounded_conninfo(dsn: str, timeouts: DbTimeouts) -> str:
    """`dsn` with a connect timeout and a server-side statement timeout; options the DSN
    already has are kept (ours are appended, so a DSN's own statement_timeout loses)."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    options = str(info.get("options") or "")
    ours = f"-c statement_timeout={round(timeouts.statement * 1000)}"
    return psycopg.conninfo.make_conninfo(
        dsn,
        # libpq takes whole seconds and treats 1 as 2; below that it would mean "forever".
        connect_timeout=max(2, round(timeouts.connect)),
        options=f"{options} {ours}".strip(),
    )
