"""A cancel deletes at once (issue 28): instances still booting are deleted without waiting
for their boots (up to the 900 s build bound), a create in flight is deleted as it lands, and
no slot is launched after the cancel. Time-skipping server, real PostgreSQL, the in-process
simulated cloud (boots that take ten minutes of real time, one create held by the test)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.events import InstanceState
from activities.fleet.control_state import ControlRepository
from activities.fleet.repository import FleetRepository
from activities.provider.interface import CreateRequest, ProviderInstance
from activities.provider.simulator import Latency, SimulatedCloud
from contracts.region import Region
from tests.support import histories
from tests.support.control_harness import Harness, acquisition_id, poll_until, region_worker
from workflows.acquisition.models import (
    AcquisitionState,
    OperatorInput,
)
from workflows.acquisition.workflow import AcquisitionWorkflow

#: Real seconds from create to ACTIVE: far longer than the test may take.
BOOT_S = 600.0


class HeldCreateCloud(SimulatedCloud):
    """A simulated cloud whose create of `held` waits for `release` (a create in flight);
    `holding` is set while it waits."""

    held = ""
    holding: asyncio.Event
    release: asyncio.Event

    async def create(self, request: CreateRequest) -> ProviderInstance:
        if request.name == self.held:
            self.holding.set()
            await asyncio.wait_for(self.release.wait(), timeout=20)
        return await super().create(request)


@pytest.fixture
async def harness(
    workflow_env: WorkflowEnvironment,
    region_r1: Region,
    fleet_repo: FleetRepository,
    tmp_path: Path,
) -> AsyncIterator[Harness]:
    cloud = HeldCreateCloud(
        region_r1, latency=Latency(boot_s=BOOT_S), clock=asyncio.get_running_loop().time
    )
    cloud.holding, cloud.release = asyncio.Event(), asyncio.Event()
    try:
        async with region_worker(
            workflow_env.client,
            cloud,
            fleet_repo,
            ControlRepository(fleet_repo._pool),
            bundle_dir=tmp_path / "cache",
            trust_dir=tmp_path / "trust",
        ) as h:
            yield h
    finally:
        cloud.release.set()


@pytest.mark.timeout(120)
async def test_cancel_deletes_booting_instances_at_once_and_creates_in_flight_as_they_land(
    harness: Harness, fleet_repo: FleetRepository
) -> None:
    cloud = harness.cloud
    assert isinstance(cloud, HeldCreateCloud)
    name = f"cancel-{uuid.uuid4().hex[:8]}"
    workflow_id = acquisition_id(name)
    cloud.held = f"{workflow_id}-0002"  # the third slot's create stays in flight
    # Four slots, three at a time: the fourth is never launched.
    handle = await harness.start_acquisition(name, instances=4, max_parallel=3)

    async def mine() -> list[ProviderInstance]:
        return [i for i in await cloud.list_owned("r1") if i.name.startswith(workflow_id)]

    async def two_booting_one_create_in_flight() -> bool:
        return len(await mine()) == 2 and cloud.holding.is_set()

    await poll_until(two_booting_one_create_in_flight, within=30, what="two boots under way")
    ack = await handle.execute_update(
        AcquisitionWorkflow.cancel, OperatorInput(operator="carol", reason="wrong pool")
    )
    assert ack.state is AcquisitionState.CANCELLING

    async def nothing_left() -> bool:
        return await mine() == []

    # The boots have minutes to go: before the fix nothing was deleted until they ended.
    await poll_until(nothing_left, within=15, what="the booting instances deleted")
    assert cloud.calls["create"] == 2  # the held create is still in flight
    cloud.release.set()

    async def held_one_landed_and_deleted() -> bool:
        return cloud.calls["delete"] >= 3 and await mine() == []

    await poll_until(held_one_landed_and_deleted, within=15, what="the landed create deleted")
    result = await asyncio.wait_for(handle.result(), timeout=30)
    await histories.record(handle, "acquisition_cancelled_at_once")
    p = result.progress
    assert p.state is AcquisitionState.CANCELLED
    assert (p.launched, p.deleted, p.active, p.failed) == (3, 3, 0, 0)
    assert result.instance_ids == []
    assert cloud.calls["create"] == 3  # no launch after the cancel
    assert await mine() == []
    rows = {r.instance_id: r.state for r in fleet_repo.list_instances("r1") if r.workload == name}
    assert rows == {
        f"{workflow_id}-0000": InstanceState.DELETED,
        f"{workflow_id}-0001": InstanceState.DELETED,
        f"{workflow_id}-0002": InstanceState.DELETED,
    }  # the fourth slot never started: no row
