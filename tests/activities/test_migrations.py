from __future__ import annotations

import psycopg
import pytest

from activities.fleet.migrate import (
    Migration,
    MigrationError,
    bundled_migrations,
    current_version,
    migrate,
)
from tests.support import services
from tests.support.paths import BASE_DSN

EXPECTED_TABLES = {"pools", "instances", "floors", "exclusions", "acquisitions", "demand", "outbox"}


@pytest.fixture
def empty_db() -> object:
    dsn = services.scratch_database(BASE_DSN)
    yield dsn
    services.drop_database(dsn)


def tables(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        ).fetchall()
    return {r[0] for r in rows}


def test_migrations_apply_to_an_empty_database_then_are_a_noop(empty_db: str) -> None:
    assert current_version(empty_db) == 0
    applied = migrate(empty_db)
    assert [m.version for m in applied] == [m.version for m in bundled_migrations()]
    assert tables(empty_db) >= EXPECTED_TABLES
    assert current_version(empty_db) == bundled_migrations()[-1].version
    assert migrate(empty_db) == []  # second run: nothing to do


def test_new_migrations_apply_in_order_and_are_recorded(empty_db: str) -> None:
    migrate(empty_db)
    extra = [
        Migration(9001, "second", "CREATE TABLE m_b (a int REFERENCES m_a (a))"),
        Migration(9000, "first", "CREATE TABLE m_a (a int PRIMARY KEY)"),
    ]
    applied = migrate(empty_db, [*bundled_migrations(), *sorted(extra, key=lambda m: m.version)])
    assert [m.name for m in applied] == ["first", "second"]
    with psycopg.connect(empty_db) as conn:
        names = [
            r[0]
            for r in conn.execute("SELECT name FROM schema_migrations ORDER BY version").fetchall()
        ]
    assert names[-2:] == ["first", "second"]


def test_an_edited_applied_migration_is_refused(empty_db: str) -> None:
    migrate(empty_db)
    first = bundled_migrations()[0]
    edited = Migration(first.version, first.name, first.sql + "\n-- edited")
    with pytest.raises(MigrationError, match="has changed"):
        migrate(empty_db, [edited])


def test_a_failing_migration_leaves_nothing_half_applied(empty_db: str) -> None:
    migrate(empty_db)
    broken = Migration(9100, "broken", "CREATE TABLE half (a int); SELECT no_such_function();")
    with pytest.raises(psycopg.Error):
        migrate(empty_db, [*bundled_migrations(), broken])
    assert "half" not in tables(empty_db)
    assert current_version(empty_db) == bundled_migrations()[-1].version
