"""A fleet-state database of a test's own: the session's (tests/conftest.py) or a module's that
must not share rows with the rest of its worker (tests/activities/test_outbox.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from activities.fleet.db import open_pool
from activities.fleet.migrate import migrate
from activities.fleet.repository import FleetRepository
from contracts.region import Region
from tests.support import services
from tests.support.paths import BASE_DSN


@contextlib.contextmanager
def migrated_scratch_database() -> Iterator[str]:
    """A migrated scratch database on the machine's PostgreSQL, dropped after."""
    dsn = services.scratch_database(BASE_DSN)
    migrate(dsn)
    try:
        yield dsn
    finally:
        services.drop_database(dsn)


@contextlib.contextmanager
def fleet_repository(dsn: str, region: Region, max_size: int) -> Iterator[FleetRepository]:
    """A repository on `dsn` with `region`'s pools synced; its pool closed after."""
    pool = open_pool(dsn, max_size=max_size)
    try:
        repo = FleetRepository(pool)
        repo.sync_pools(region)
        yield repo
    finally:
        pool.close()
