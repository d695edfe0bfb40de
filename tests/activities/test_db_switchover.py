"""A primary switchover drops every connection: the pool replaces dead ones at checkout, so
the next fleet-state call works instead of failing on a stale connection."""

from __future__ import annotations

import psycopg
import pytest
from pydantic import ValidationError

from activities.fleet.db import DbTimeouts, open_pool
from activities.fleet.repository import FleetRepository
from workers.settings import FleetDbSettings


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


def test_pool_connections_carry_the_statement_timeout(pg_dsn: str) -> None:
    pool = open_pool(pg_dsn, max_size=1, timeouts=DbTimeouts(connect=3, statement=0.5, pool=2))
    try:
        with pool.connection() as conn:
            row = conn.execute("SHOW statement_timeout").fetchone()
            assert row is not None and row[0] == "500ms"
            # The server cancels a statement past it: a wait inside the caller's deadline.
            with pytest.raises(psycopg.errors.QueryCanceled):
                conn.execute("SELECT pg_sleep(3)")
    finally:
        pool.close()


def test_fleet_db_waits_must_fit_inside_the_activity_timeout() -> None:
    assert FleetDbSettings().timeouts() == DbTimeouts(connect=5, statement=15, pool=8)
    with pytest.raises(ValidationError, match="start-to-close"):
        FleetDbSettings(pool_timeout_seconds=20, statement_timeout_seconds=15)
