"""Planned reclaims through the notice relay (real NATS JetStream, real PostgreSQL, the
simulated cloud): a signed early warning at once, the hard notice at reclaim time - lead,
both durable in fleet state."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from nats.aio.msg import Msg

from activities.events import InstanceState
from activities.fleet.repository import FleetRepository
from activities.provider.simulator import SimulatedCloud
from contracts.notice import ReclaimNotice, hall_notice_subjects
from contracts.reclaim import ReclaimRequest
from contracts.region import Region
from tests.activities.test_notice_relay import launch, relay_on_nats
from tests.support.wait import checked, eventually_async

LEAD = timedelta(seconds=120)


async def test_a_planned_reclaim_warns_early_then_notices_at_its_time_minus_lead(
    fleet_repo: FleetRepository, region_r1: Region
) -> None:
    cloud = SimulatedCloud(region_r1, clock=lambda: 0.0)
    planned_hook: list[ReclaimNotice] = []

    async def on_planned(n: ReclaimNotice) -> None:
        planned_hook.append(n)

    async with relay_on_nats(fleet_repo, cloud, "C", lead=LEAD, on_planned=on_planned) as (
        relay,
        nc,
    ):
        node, other = [await launch(cloud, fleet_repo, region_r1, "r1.C.cpu.l") for _ in range(2)]
        received: list[ReclaimNotice] = []

        async def collect(msg: Msg) -> None:
            received.append(ReclaimNotice.from_json(json.loads(msg.data)["notice"]))

        sub = await nc.subscribe(hall_notice_subjects("r1", "C"), cb=collect)
        at = (datetime.now(UTC) + timedelta(minutes=15)).replace(microsecond=0)
        [warning] = await relay.handle_request(
            ReclaimRequest(instances=[node], at=at, requested_by="alice")
        )
        assert warning.early and warning.deadline == at and warning.node == node
        assert planned_hook == [warning]  # the controller is told (queued by the service)
        row = fleet_repo.get_instance(node)
        assert row is not None and row.state is InstanceState.ACTIVE  # still fully usable
        # Asked again (or later, for a later time): the same warning, the earlier time stands.
        [again] = await relay.handle_request(
            ReclaimRequest(instances=[node], at=at + timedelta(minutes=5))
        )
        assert again.notice_id == warning.notice_id

        # Nothing hard before reclaim time - lead; a relay restart republishes the warning.
        assert await relay.notice_planned(now=at - LEAD - timedelta(seconds=1)) == []
        assert await relay.recover(now=at - LEAD - timedelta(seconds=1)) >= 1
        [hard] = await relay.notice_planned(now=at - LEAD)
        assert not hard.early and hard.node == node and hard.notice_id != warning.notice_id
        assert abs((hard.deadline - (datetime.now(UTC) + LEAD)).total_seconds()) < 30
        row = fleet_repo.get_instance(node)
        assert row is not None and row.state is InstanceState.NOTICED
        assert fleet_repo.planned_reclaims("r1", hall="C") == []  # done: swept once
        assert await relay.notice_planned(now=at) == []

        # A reclaim too close for an early warning is a hard notice now.
        [now_notice] = await relay.handle_request(
            ReclaimRequest(instances=[other], at=datetime.now(UTC) + LEAD / 2)
        )
        assert not now_notice.early

        await eventually_async(
            checked(lambda: {warning.notice_id, hard.notice_id} <= {n.notice_id for n in received}),
            timeout=30,
            what="the early warning and the hard notice received",
        )
        assert {warning.notice_id, hard.notice_id} <= {n.notice_id for n in received}
        await sub.unsubscribe()


async def test_a_lease_known_in_advance_becomes_an_early_warning(
    fleet_repo: FleetRepository, region_r1: Region
) -> None:
    cloud = SimulatedCloud(region_r1, clock=lambda: 0.0)
    async with relay_on_nats(fleet_repo, cloud, "B", lead=LEAD) as (relay, _):
        node = await launch(cloud, fleet_repo, region_r1, "r1.B.cpu.l")
        row = fleet_repo.get_instance(node)
        assert row is not None and row.provider_id is not None
        start = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
        cloud.plan_reclaim([row.provider_id], start, "Blazar lease starts on its host")
        [warning] = await relay.poll_provider()
        assert warning.early and warning.deadline == start
        assert await relay.poll_provider() == []  # told once
        planned = fleet_repo.planned_reclaim(node)
        assert planned is not None and planned.reclaim_at == start
