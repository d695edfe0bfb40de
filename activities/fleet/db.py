"""The PostgreSQL connection pool that fleet-state code shares within one process."""

from __future__ import annotations

from psycopg_pool import ConnectionPool


def open_pool(dsn: str, *, min_size: int = 1, max_size: int = 8) -> ConnectionPool:
    """Open a pool and wait until one connection works, so a bad DSN fails here, loudly."""
    pool = ConnectionPool(dsn, min_size=min_size, max_size=max_size, open=False)
    pool.open(wait=True, timeout=15)
    return pool
