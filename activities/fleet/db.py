"""The PostgreSQL connection pool that fleet-state code shares within one process."""

from __future__ import annotations

from psycopg_pool import ConnectionPool


def open_pool(dsn: str, *, min_size: int = 1, max_size: int = 8) -> ConnectionPool:
    """Open a pool and wait until one connection works, so a bad DSN fails here, loudly."""
    # `check`: every connection is tested as it leaves the pool, so after a primary
    # switchover (Patroni) dead connections are replaced instead of failing the next
    # statement; what was in flight rolled back and the activity's retry re-applies it.
    pool = ConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        open=False,
        check=ConnectionPool.check_connection,
    )
    pool.open(wait=True, timeout=15)
    return pool
