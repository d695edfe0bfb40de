"""A primary switchover drops every connection: the pool replaces dead ones at checkout, so
the next fleet-state call works instead of failing on a stale connection."""

from __future__ import annotations

import psycopg

from activities.fleet.db import open_pool
from activities.fleet.repository import FleetRepository


def test_the_pool_survives_its_connections_being_killed(pg_dsn: str) -> None:
    pool = open_pool(pg_dsn, min_size=2, max_size=2)
    repo = FleetRepository(pool)
    try:
        assert repo.outbox_backlog()[0] >= 0
        dbname = psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"]
        admin = psycopg.conninfo.make_conninfo(pg_dsn, dbname="postgres")
        with psycopg.connect(admin, autocommit=True) as conn:
            killed = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (dbname,),
            ).fetchone()
        assert killed is not None and killed[0] >= 1
        for _ in range(3):  # every pooled connection was dead; each is replaced on checkout
            assert repo.outbox_backlog()[0] >= 0
    finally:
        pool.close()
