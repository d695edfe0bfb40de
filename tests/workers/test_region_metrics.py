"""The region worker's collector on the real fleet state: open acquisitions by state,
excluded pools, and each lifecycle event observed once in the latency histograms (the
events before the collector started are history, never observed)."""

from __future__ import annotations

import uuid
from typing import cast

import psycopg
from prometheus_client import REGISTRY
from temporalio.client import Client

from activities.events import CapacityType, EventKind
from activities.fleet.db import open_pool
from activities.fleet.repository import FleetRepository, InstanceSpec
from contracts.region import Region
from services.region_worker.metrics import RegionCollector
from workers.settings import Settings


def _count(name: str) -> float:
    return REGISTRY.get_sample_value(f"{name}_count", {"region": "r1"}) or 0.0


def _instance(repo: FleetRepository, region: Region, iid: str) -> None:
    repo.record_acquire(
        InstanceSpec(
            instance_id=iid,
            region=region.id,
            pool_id=region.pool_ids()[0],
            capacity_type=CapacityType.RECLAIMABLE,
            workload="ci-runners",
            tier=3,
        )
    )


def test_gauges_and_each_event_observed_once(
    fleet_repo: FleetRepository, region_r1: Region, pg_dsn: str
) -> None:
    prefix = f"rm-{uuid.uuid4().hex[:8]}"
    _instance(fleet_repo, region_r1, f"{prefix}-old")
    fleet_repo.record_event(f"{prefix}-old", EventKind.READY)  # before the collector: history
    pool = open_pool(pg_dsn, max_size=2)
    try:
        # Only the fleet-state part runs here: the Temporal client is never called.
        collector = RegionCollector(Settings(), "r1", cast(Client, None), pool)
        collector.collect_fleet_state()  # sets the marks
        ready_before = _count("sco_instance_create_to_active_seconds")
        deleted_before = _count("sco_instance_notice_to_delete_seconds")

        iid = f"{prefix}-new"
        _instance(fleet_repo, region_r1, iid)
        for kind in (EventKind.READY, EventKind.NOTICE, EventKind.DRAIN, EventKind.DELETE):
            fleet_repo.record_event(iid, kind)
        with psycopg.connect(pg_dsn) as conn:
            conn.execute(
                "INSERT INTO acquisitions (acquisition_id, region, state, requested_units) "
                "VALUES (%s, 'r1', 'running', 4)",
                (f"{prefix}-acq",),
            )
        collector.collect_fleet_state()
        collector.collect_fleet_state()  # nothing new: nothing observed twice

        assert _count("sco_instance_create_to_active_seconds") == ready_before + 1
        assert _count("sco_instance_notice_to_delete_seconds") == deleted_before + 1
        running = REGISTRY.get_sample_value(
            "sco_acquisitions_open", {"region": "r1", "state": "running"}
        )
        assert running is not None and running >= 1
        halls = {
            h: REGISTRY.get_sample_value("sco_pools_excluded", {"region": "r1", "hall": h})
            for h in region_r1.halls
        }
        assert all(v is not None for v in halls.values()), halls  # every hall, 0 or more
    finally:
        pool.close()
