from __future__ import annotations

import uuid

import psycopg
import pytest

from activities.events import CapacityType, EventKind, InstanceState
from activities.fleet.repository import (
    FleetRepository,
    FleetStateError,
    InstanceSpec,
    InvalidTransition,
    UnknownInstance,
)
from contracts.region import Region


def spec(region: Region, name: str | None = None) -> InstanceSpec:
    pool = region.pools[0]
    return InstanceSpec(
        instance_id=name or f"test-{uuid.uuid4().hex[:12]}",
        region=region.id,
        pool_id=region.pool_id(pool),
        capacity_type=CapacityType.RECLAIMABLE,
        workload="spark-etl",
        tier=2,
    )


def outbox_events(dsn: str, instance_id: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT payload->>'kind' FROM outbox WHERE key = %s ORDER BY id", (instance_id,)
        ).fetchall()
    return [r[0] for r in rows]


def test_a_full_lifecycle_writes_one_event_per_change(
    fleet_repo: FleetRepository, region_r1: Region, pg_dsn: str
) -> None:
    s = spec(region_r1)
    first = fleet_repo.record_acquire(s)
    assert first is not None and first.price_per_hour == region_r1.pools[0].price_per_hour
    for kind in (EventKind.READY, EventKind.NOTICE, EventKind.DRAIN, EventKind.DELETE):
        assert fleet_repo.record_event(s.instance_id, kind, provider_id="nova-1") is not None
    row = fleet_repo.get_instance(s.instance_id)
    assert row is not None and row.state is InstanceState.DELETED and row.provider_id == "nova-1"
    assert outbox_events(pg_dsn, s.instance_id) == ["acquire", "ready", "notice", "drain", "delete"]


def test_retries_write_nothing_twice(
    fleet_repo: FleetRepository, region_r1: Region, pg_dsn: str
) -> None:
    s = spec(region_r1)
    assert fleet_repo.record_acquire(s) is not None
    assert fleet_repo.record_acquire(s) is None
    assert fleet_repo.record_event(s.instance_id, EventKind.READY) is not None
    assert fleet_repo.record_event(s.instance_id, EventKind.READY) is None
    assert outbox_events(pg_dsn, s.instance_id) == ["acquire", "ready"]


def test_disallowed_transitions_are_refused_and_write_nothing(
    fleet_repo: FleetRepository, region_r1: Region, pg_dsn: str
) -> None:
    s = spec(region_r1)
    fleet_repo.record_acquire(s)
    fleet_repo.record_event(s.instance_id, EventKind.DELETE)
    with pytest.raises(InvalidTransition, match="ready is not allowed in state deleted"):
        fleet_repo.record_event(s.instance_id, EventKind.READY)
    with pytest.raises(UnknownInstance):
        fleet_repo.record_event("no-such-instance", EventKind.READY)
    assert outbox_events(pg_dsn, s.instance_id) == ["acquire", "delete"]


def test_an_unknown_pool_is_a_clear_error(fleet_repo: FleetRepository, region_r1: Region) -> None:
    bad = spec(region_r1).model_copy(update={"pool_id": "r1.Z.gp.l"})
    with pytest.raises(FleetStateError, match=r"pool 'r1\.Z\.gp\.l' is not in fleet state"):
        fleet_repo.record_acquire(bad)


def test_pool_sync_is_idempotent_and_lists_live_instances(
    fleet_repo: FleetRepository, region_r1: Region
) -> None:
    assert fleet_repo.sync_pools(region_r1) == 0
    pools = fleet_repo.list_pools("r1", hall="A")
    assert len(pools) == len(region_r1.pools_in_hall("A"))
    s = spec(region_r1)
    fleet_repo.record_acquire(s)
    live = {p.pool_id: p.live_instances for p in fleet_repo.list_pools("r1")}
    assert live[s.pool_id] >= 1


def test_an_acquisitions_choice_survives_its_progress_records(fleet_repo: FleetRepository) -> None:
    """The controller records why (planning/choice.py) when it records the acquisition;
    the acquisition's own progress records carry none and must not erase it."""
    from activities.fleet.control_state import AcquisitionRecord, ControlRepository
    from planning.choice import ChoiceRecord, PoolChoice, Verdict

    control = ControlRepository(fleet_repo._pool)
    acq = f"acq-r1-choice-{uuid.uuid4().hex[:6]}"
    why = ChoiceRecord(
        basis="planner",
        ranked=2,
        chosen=[PoolChoice(pool_id="r1.A.gp.xl", verdict=Verdict.CHOSEN, rank=1, why="chosen")],
        passed_over=[
            PoolChoice(pool_id="r1.B.gp.xl", verdict=Verdict.EXCLUDED, rank=2, why="excluded")
        ],
    )
    base = AcquisitionRecord(
        acquisition_id=acq,
        region="r1",
        workload="ci",
        partition=0,
        state="starting",
        requested_units=2,
        requested_instances=1,
    )
    # The record validates a ChoiceRecord into its JSON (model_copy would skip that).
    control.record_acquisition(AcquisitionRecord(**{**base.model_dump(), "choice": why}))
    control.record_acquisition(base.model_copy(update={"state": "running", "active": 1}))
    row = control.get_acquisition(acq)
    assert row is not None and row.state == "running"
    assert row.choice is not None and ChoiceRecord.model_validate(row.choice) == why
    control.record_acquisition(base.model_copy(update={"acquisition_id": acq + "-old"}))
    old = control.get_acquisition(acq + "-old")
    assert old is not None and old.choice is None  # recorded without: NULL, said so
