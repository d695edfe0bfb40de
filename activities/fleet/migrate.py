"""Versioned schema migrations for fleet state.

Files `migrations/NNNN_name.sql` apply in version order, each in its own transaction,
recorded in `schema_migrations` with a checksum. A second run is a no-op; an applied
file that changed since is an error, never silently re-applied. An advisory lock makes
concurrent runs (three worker replicas starting at once) safe.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

import psycopg

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# Arbitrary constant: the advisory lock id that serialises migration runs.
_LOCK_ID = 0x5C0_0001


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


class MigrationError(RuntimeError):
    pass


def bundled_migrations() -> list[Migration]:
    found = []
    for entry in resources.files("activities.fleet.migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text()))
        elif entry.name.endswith(".sql"):
            raise MigrationError(f"{entry.name}: migration file name must be NNNN_name.sql")
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"duplicate migration versions: {versions}")
    return found


def migrate(dsn: str, migrations: list[Migration] | None = None) -> list[Migration]:
    """Apply pending migrations; return the ones applied (empty when current)."""
    todo = bundled_migrations() if migrations is None else migrations
    applied: list[Migration] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_ID,))
        try:
            conn.execute(
                """CREATE TABLE IF NOT EXISTS schema_migrations (
                       version integer PRIMARY KEY,
                       name text NOT NULL,
                       checksum text NOT NULL,
                       applied_at timestamptz NOT NULL DEFAULT now())"""
            )
            done = {
                row[0]: (row[1], row[2])
                for row in conn.execute("SELECT version, name, checksum FROM schema_migrations")
            }
            for mig in todo:
                if mig.version in done:
                    name, checksum = done[mig.version]
                    if checksum != mig.checksum:
                        raise MigrationError(
                            f"migration {mig.version:04d}_{name} was applied but its file "
                            "has changed since; write a new migration instead"
                        )
                    continue
                with conn.transaction():
                    conn.execute(mig.sql.encode())
                    conn.execute(
                        "INSERT INTO schema_migrations (version, name, checksum) "
                        "VALUES (%s, %s, %s)",
                        (mig.version, mig.name, mig.checksum),
                    )
                applied.append(mig)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_ID,))
    return applied


def current_version(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        exists = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
        if not exists or not exists[0]:
            return 0
        row = conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
        return int(row[0]) if row else 0


def ensure_database(dsn: str) -> bool:
    """Create the DSN's database when the server answers but it does not exist yet."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    dbname = str(info.get("dbname") or "")
    if not dbname:
        return False
    admin = psycopg.conninfo.make_conninfo(dsn, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone():
            return False
        conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(dbname)))
        return True
