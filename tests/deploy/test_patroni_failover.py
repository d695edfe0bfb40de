"""Fleet state on a real three-member Patroni cluster (tests/support/patroni_cluster.py),
reached through SCO's multi-host connection string (`target_session_attrs=read-write`).

The primary's PostgreSQL is SIGKILLed: the synchronous standby takes over within seconds,
every commit acknowledged before the kill is on it, and the old primary rejoins as a
standby. Then the same in the middle of acquisitions run by a real region worker process on
Temporal's dev server: every acquisition completes, no instance is duplicated, leaked or
lost between the provider and fleet state (a chaos case: its counts are printed as JSON).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from temporalio.testing import WorkflowEnvironment

from activities.events import InstanceState
from activities.fleet.db import open_pool
from activities.fleet.migrate import migrate
from activities.fleet.repository import FleetRepository
from activities.provider.simulator import Latency, SimulatedCloud
from contracts.region import Region
from tests.support import chaos, tools
from tests.support.patroni_cluster import ClusterError, PatroniCluster, missing_prerequisite
from tests.support.wait import eventually, eventually_async
from tests.support.worker_kills import (
    KillableWorker,
    region_namespace,
    served_cloud,
    start_acquisitions,
    worker_env,
)
from workflows.acquisition.models import AcquisitionState

#: The cluster's first start (initdb, two base backups) on a loaded machine.
START_WITHIN = 300.0
#: A failover and a rejoin: seconds when idle, generous for a loaded machine.
FAILOVER_WITHIN = 90.0
REJOIN_WITHIN = 180.0


@pytest.fixture(scope="module")
def patroni() -> Iterator[PatroniCluster]:
    tools.require("etcd-server")
    if why := missing_prerequisite():
        pytest.skip(why)
    cluster = PatroniCluster.create()
    try:
        cluster.start(within=START_WITHIN)
        cluster.create_sco_database()
        yield cluster
    finally:
        cluster.stop()


def _healthy(patroni: PatroniCluster) -> None:
    """Each test starts on a whole cluster (the one before may have failed one over)."""
    patroni.wait_for(patroni.healthy, REJOIN_WITHIN, "leader, sync and async standby")


def _when_writable(dsn: str, query: str, started: float) -> tuple[object, ...] | None:
    """`query`'s row on the first connection that reaches a writable primary (retried
    as SCO's activities retry, bounded by FAILOVER_WITHIN from `started`)."""

    def row() -> tuple[tuple[object, ...] | None]:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
            return (conn.execute(query).fetchone(),)  # a tuple: truthy even when no row

    left = max(0.0, FAILOVER_WITHIN - (time.monotonic() - started))
    return eventually(
        row, timeout=left, what="a writable primary", every=0.5, retrying=psycopg.OperationalError
    )[0]


def _kill_leader(patroni: PatroniCluster) -> tuple[str, str]:
    """SIGKILL the leader's postmaster; (old leader, synchronous standby) by name."""
    roles = patroni.roles()
    leader = next(n for n, r in roles.items() if r == "leader")
    sync = next(n for n, r in roles.items() if r == "sync")
    patroni.kill_postgres(patroni.member(leader))
    return leader, sync


@pytest.mark.timeout(600)
def test_the_sync_standby_takes_over_with_every_acknowledged_commit(
    patroni: PatroniCluster,
) -> None:
    _healthy(patroni)
    dsn = patroni.dsn()
    table = f"ack_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f"CREATE TABLE {table} (n int PRIMARY KEY)")
        for n in range(200):
            conn.execute(f"INSERT INTO {table} VALUES (%s)", (n,))
    old, sync = _kill_leader(patroni)
    started = time.monotonic()
    patroni.wait_for(lambda s: patroni._roles(s).get(sync) == "leader", FAILOVER_WITHIN, sync)
    # The same connection string finds the new primary by itself, once it is promoted.
    rows = _when_writable(
        dsn,
        f"WITH w AS (INSERT INTO {table} VALUES (200) ON CONFLICT DO NOTHING) "
        f"SELECT count(*), max(n) FROM {table}",
        started,
    )
    took = time.monotonic() - started
    print(f"writable again {took:.1f} s after the kill")
    assert rows == (200, 199)
    assert took < FAILOVER_WITHIN
    # The old primary comes back by itself, as a standby of the new one.
    patroni.wait_for(
        lambda s: patroni._roles(s).get(old) in ("sync", "async"), REJOIN_WITHIN, f"{old} rejoins"
    )


# -- mid-acquisition failover (chaos) ---------------------------------------------------

ACQUISITIONS = 4
INSTANCES_EACH = 6


@pytest.fixture
def patroni_fleet(patroni: PatroniCluster, region_r1: Region) -> Iterator[str]:
    """Fleet state (migrated, r1's pools) in the cluster's `sco` database, empty."""
    _healthy(patroni)
    dsn = patroni.dsn()
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    migrate(dsn)
    pool = open_pool(dsn, max_size=2)
    try:
        FleetRepository(pool).sync_pools(region_r1)
    finally:
        pool.close()
    yield dsn


@pytest.fixture
async def sim(region_r1: Region) -> AsyncIterator[tuple[SimulatedCloud, str]]:
    # Boots take a while, so the failover lands while instances wait for ACTIVE too.
    async with served_cloud(region_r1, "patroni", Latency(api_s=0.01, boot_s=0.8)) as served:
        yield served


def _fleet_rows(dsn: str) -> list[tuple[str, str | None, InstanceState]]:
    pool = open_pool(dsn, max_size=1)
    try:
        return [
            (r.instance_id, r.provider_id, r.state)
            for r in FleetRepository(pool).list_instances("r1")
        ]
    finally:
        pool.close()


@pytest.mark.chaos
@pytest.mark.timeout(900)
async def test_killing_the_primary_mid_acquisition_loses_nothing(
    dev_server_env: WorkflowEnvironment,
    patroni: PatroniCluster,
    patroni_fleet: str,
    sim: tuple[SimulatedCloud, str],
    tmp_path: Path,
) -> None:
    cloud, prefix = sim
    client, ns_prefix = await region_namespace(dev_server_env, "patroni")
    env = worker_env(
        client.service_client.config.target_host,
        ns_prefix,
        # The multi-host DSN: SCO finds whichever member is the primary.
        patroni_fleet,
        tmp_path,
        SCO_PROVIDER__KIND="simulator",
        SCO_PROVIDER__SIMULATOR_PREFIX=prefix,
        # ~12 s for the 24 creates: the kill lands mid-acquisition even when the machine
        # is slow to poll (at 6/s they were once all done before it).
        SCO_CONTROL__BUDGET_RATE_PER_SECOND="2",
        SCO_CONTROL__BUDGET_BURST="2",
    )
    handles = await start_acquisitions(
        client, "patroni", ACQUISITIONS, INSTANCES_EACH, max_parallel=3
    )
    worker = KillableWorker(env, tmp_path / "worker.log")
    worker.start()
    total = ACQUISITIONS * INSTANCES_EACH
    try:
        # Mid-acquisition: some instances recorded, most still to come.

        async def recorded() -> int | None:
            assert worker.alive(), worker.log.read_text()[-2000:]
            count = len(await asyncio.to_thread(_fleet_rows, patroni_fleet))
            return count if count >= total // 4 else None

        recorded_at_kill = await eventually_async(
            recorded, timeout=120, what=f"{total // 4} instances recorded", retrying=()
        )
        # Counted just before the kill: a count after it waits for the promotion (the DSN
        # wants a read-write member), by when the worker may well have finished.
        old, sync = await asyncio.to_thread(_kill_leader, patroni)
        await asyncio.to_thread(
            patroni.wait_for,
            lambda s: patroni._roles(s).get(sync) == "leader",
            FAILOVER_WITHIN,
            f"{sync} leads",
        )
        results = [await asyncio.wait_for(h.result(), timeout=300) for h in handles]
        worker_dead = int(not worker.alive())
    finally:
        worker.stop(within=60)
    assert recorded_at_kill < total, "the failover came after the acquisitions were done"
    # The old primary rejoins (bounded); a member still down counts as a dead process.
    with contextlib.suppress(ClusterError):
        await asyncio.to_thread(patroni.wait_for, patroni.healthy, REJOIN_WITHIN, "rejoin")
    roles = patroni.roles()

    owned = [i for i in await cloud.list_owned("r1") if i.name.startswith("acq-r1-patroni-")]
    names = [i.name for i in owned]
    at_provider = {(i.name, i.provider_id) for i in owned}
    rows = await asyncio.to_thread(_fleet_rows, patroni_fleet)
    in_fleet = {(iid, pid) for iid, pid, st in rows if st is InstanceState.ACTIVE}
    acknowledged = {iid for r in results for iid in r.instance_ids}
    active_ids = {iid for iid, _ in in_fleet}
    counts = chaos.report(
        "patroni_failover",
        duplicate_instances=len(names) - len(set(names)),
        leaked_instances=len(at_provider - in_fleet),
        ghost_instances=len(in_fleet - at_provider),
        lost_writes=len(acknowledged - active_ids),
        workflows_failed=sum(
            1
            for r in results
            if r.progress.state is not AcquisitionState.COMPLETED
            or r.progress.active != INSTANCES_EACH
        ),
        not_taken_over_by_sync_standby=int(roles.get(sync) != "leader"),
        processes_dead=worker_dead
        + (len(patroni.members) - patroni.patroni_alive())
        + sum(1 for r in roles.values() if r == "down")
        + (len(patroni.members) - len(roles)),
    )
    assert chaos.nonzero(counts) == {}, (old, sync, roles)
    assert len(owned) == total
