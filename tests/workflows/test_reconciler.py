"""ReconcilerWorkflow on the time-skipping server, a scratch PostgreSQL database and the
in-process simulated cloud: an orphan server, an orphan lease and a ghost row, each found
and handled; a fallback lease in use renewed; young orphans left alone; a dry run that
changes nothing; plus the pure comparison."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from psycopg_pool import ConnectionPool
from temporalio.testing import WorkflowEnvironment

from activities.events import CapacityType, EventKind, InstanceState
from activities.fleet.control_state import ControlRepository
from activities.fleet.repository import FleetRepository, InstanceSpec
from activities.provider.interface import CreateRequest, ReservationRequest
from activities.provider.leases import fallback_owner, lease_name
from activities.provider.simulator import Latency, SimulatedCloud
from activities.reconciler.activities import ReconcilerActivities, reconciler_activities
from activities.reconciler.models import FleetEntry, ReconcileSnapshot
from contracts.pool_id import PoolId
from contracts.region import Region
from tests.support import control_harness
from tests.support.control_harness import region_worker
from workflows.reconciler.compare import plan_reconcile
from workflows.reconciler.models import ReconcilerConfig, ReconcileReport, ReconcilerInput
from workflows.reconciler.workflow import ReconcilerWorkflow


@dataclass
class Env:
    env: WorkflowEnvironment
    queue: str
    cloud: SimulatedCloud
    fleet: FleetRepository
    pool: ConnectionPool


@pytest.fixture
def scratch_fleet(region_r1: Region) -> Iterator[tuple[FleetRepository, ConnectionPool]]:
    with control_harness.scratch_fleet(region_r1) as (_, pool, repo):
        yield repo, pool


@pytest.fixture
async def env(
    workflow_env: WorkflowEnvironment,
    region_r1: Region,
    scratch_fleet: tuple[FleetRepository, ConnectionPool],
    tmp_path: Path,
) -> AsyncIterator[Env]:
    fleet, pool = scratch_fleet
    cloud = SimulatedCloud(
        region_r1, latency=Latency(boot_s=0.0), clock=asyncio.get_running_loop().time
    )
    acts = ReconcilerActivities(fleet, cloud)
    async with region_worker(
        workflow_env.client,
        cloud,
        fleet,
        ControlRepository(pool),
        bundle_dir=tmp_path / "cache",
        trust_dir=tmp_path / "trust",
        extra_workflows=[ReconcilerWorkflow],
        extra_activities=reconciler_activities(acts),
    ) as h:
        yield Env(workflow_env, h.queue, cloud, fleet, pool)


def _create(name: str, pool_id: str = "r1.A.gp.l") -> CreateRequest:
    pid = PoolId.parse(pool_id)
    return CreateRequest(name=name, region="r1", pool_id=pool_id, hall=pid.hall, flavor=pid.flavor)


def _register(fleet: FleetRepository, instance_id: str, provider_id: str, acq: str) -> None:
    fleet.record_acquire(
        InstanceSpec(
            instance_id=instance_id,
            region="r1",
            pool_id="r1.A.gp.l",
            capacity_type=CapacityType.COMMITTED,
            workload="w",
            tier=1,
            acquisition_id=acq,
        )
    )
    fleet.record_event(instance_id, EventKind.READY, provider_id=provider_id)


async def _scene(e: Env) -> dict[str, str]:
    """One of everything: a known instance in a fallback lease ending soon, an orphan
    server, an orphan lease, a ghost row."""
    acq = "acq-r1-w-0123456789"
    known = await e.cloud.create(_create(f"{acq}-0000"))
    _register(e.fleet, f"{acq}-0000", known.provider_id, acq)
    in_use = await e.cloud.create_reservation(
        ReservationRequest(
            name=lease_name("r1", "A", "gp.l", fallback_owner(acq)),
            region="r1",
            hall="A",
            flavor="gp.l",
            amount=1,
            end=datetime.now(UTC) + timedelta(hours=2),
        )
    )
    orphan = await e.cloud.create(_create("acq-r1-w-9999999999-0000"))  # fleet never knew it
    lost_lease = await e.cloud.create_reservation(
        ReservationRequest(
            name=lease_name("r1", "B", "gp.l", "floor-r1-gone-B-1"),
            region="r1",
            hall="B",
            flavor="gp.l",
            amount=2,
            end=datetime.now(UTC) + timedelta(hours=20),
        )
    )
    _register(e.fleet, "acq-r1-w-1111111111-0000", "sim-gone", "acq-r1-w-1111111111")
    return {
        "known": known.provider_id,
        "orphan": orphan.provider_id,
        "in_use": in_use.lease_id,
        "lost_lease": lost_lease.lease_id,
        "lost_lease_name": lost_lease.name,
    }


async def _once(e: Env, *, dry_run: bool, grace: float = 0.0) -> ReconcileReport:
    return await e.env.client.execute_workflow(
        ReconcilerWorkflow.run,
        ReconcilerInput(
            region="r1",
            config=ReconcilerConfig(grace_seconds=grace),
            dry_run=dry_run,
            once=True,
        ),
        id=f"reconciler-r1-once-{uuid.uuid4().hex[:6]}",
        task_queue=e.queue,
    )


def _decisions(pool: ConnectionPool) -> list[tuple[str, str]]:
    with pool.connection() as conn:
        rows = conn.execute(
            """SELECT payload->>'outcome', payload->>'reason' FROM outbox
               WHERE topic = 'sco.r1.decisions' AND payload->>'kind' = 'reconcile' ORDER BY id"""
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


async def test_a_dry_run_finds_everything_and_changes_nothing(env: Env) -> None:
    ids = await _scene(env)
    before = ({i.provider_id for i in await env.cloud.list_owned("r1")}, set(env.cloud._leases))
    report = await _once(env, dry_run=True)
    assert report.orphan_servers == [f"acq-r1-w-9999999999-0000 ({ids['orphan']})"]
    assert report.orphan_leases == [ids["lost_lease_name"]]
    assert report.ghosts == ["acq-r1-w-1111111111-0000"]
    assert (report.deleted_servers, report.deleted_leases, report.marked_lost) == (0, 0, 0)
    after = ({i.provider_id for i in await env.cloud.list_owned("r1")}, set(env.cloud._leases))
    assert after == before
    ghost = env.fleet.get_instance("acq-r1-w-1111111111-0000")
    assert ghost is not None and ghost.state is InstanceState.ACTIVE
    in_use = env.cloud._leases[ids["in_use"]].reservation
    assert in_use.end < datetime.now(UTC) + timedelta(hours=3)  # not renewed
    assert [o for o, _ in _decisions(env.pool)] == ["dry_run"]


async def test_orphans_are_deleted_ghosts_marked_lost_and_leases_in_use_renewed(
    env: Env,
) -> None:
    ids = await _scene(env)
    report = await _once(env, dry_run=False)
    assert (report.deleted_servers, report.deleted_leases, report.marked_lost) == (1, 1, 1)
    owned = {i.provider_id for i in await env.cloud.list_owned("r1")}
    assert owned == {ids["known"]}  # the orphan server went, the known one stayed
    assert set(env.cloud._leases) == {ids["in_use"]}  # the orphan lease went
    in_use = env.cloud._leases[ids["in_use"]].reservation
    assert in_use.end > datetime.now(UTC) + timedelta(hours=20)  # renewed by lease_hours
    ghost = env.fleet.get_instance("acq-r1-w-1111111111-0000")
    assert ghost is not None and ghost.state is InstanceState.DELETED
    with env.pool.connection() as conn:
        reason = conn.execute(
            """SELECT payload->>'reason' FROM outbox
               WHERE payload->>'instance_id' = %s AND payload->>'kind' = 'delete'""",
            ("acq-r1-w-1111111111-0000",),
        ).fetchone()
    assert reason is not None and reason[0].startswith("lost: the provider has no instance")
    ((outcome, why),) = _decisions(env.pool)
    assert outcome == "mended" and "1 orphan server(s), 1 orphan lease(s), 1 ghost(s)" in why
    again = await _once(env, dry_run=False)  # nothing left to mend
    assert not (again.orphan_servers or again.orphan_leases or again.ghosts)


async def test_young_orphans_wait_for_the_grace(env: Env) -> None:
    await _scene(env)
    report = await _once(env, dry_run=False, grace=3600)
    assert report.orphan_servers == [] and report.orphan_leases == []
    assert len(await env.cloud.list_owned("r1")) == 2


def test_an_in_flight_create_and_a_duplicate_are_told_apart() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    old = now - timedelta(hours=1)
    from activities.provider.interface import InstanceStatus, ProviderInstance

    def server(pid: str, name: str) -> ProviderInstance:
        return ProviderInstance(
            provider_id=pid,
            name=name,
            pool_id="r1.A.gp.l",
            hall="A",
            status=InstanceStatus.BUILD,
            created_at=old,
        )

    snap = ReconcileSnapshot(
        region="r1",
        taken_at=now,
        servers=[server("p1", "slot-1"), server("p2", "slot-1"), server("p3", "slot-2")],
        fleet=[
            FleetEntry(
                instance_id="slot-1",
                state=InstanceState.ACTIVE,
                provider_id="p1",
                state_changed_at=old,
            ),
            FleetEntry(instance_id="slot-2", state=InstanceState.REQUESTED, state_changed_at=old),
        ],
    )
    plan = plan_reconcile(snap, now, grace=timedelta(minutes=15), renew_before=timedelta(hours=6))
    # p2 is a duplicate of slot-1 (fleet knows p1); p3 is slot-2's create still in flight.
    assert [s.provider_id for s in plan.orphan_servers] == ["p2"]
    assert plan.ghosts == []
