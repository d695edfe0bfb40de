"""The notice relay on real NATS JetStream and real PostgreSQL, with the simulated cloud."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import nats
import psycopg
from nacl.signing import SigningKey
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from activities.events import CapacityType, EventKind, InstanceState
from activities.fleet.repository import FleetRepository, InstanceSpec
from activities.provider.errors import NotFound
from activities.provider.interface import CreateRequest
from activities.provider.simulator import ReclaimModel, SimulatedCloud
from contracts.keys import key_id
from contracts.notice import ReclaimNotice, hall_notice_subjects, notice_stream
from contracts.reclaim import ReclaimRequest
from contracts.region import Region
from services.notice_relay.relay import NoticeRelay
from tests.support.wait import checked, eventually_async
from tests.support.worker_nats import NATS_URL

KEY = SigningKey.generate()


async def launch(cloud: SimulatedCloud, repo: FleetRepository, region: Region, pool_id: str) -> str:
    name = f"sco-r1-{uuid.uuid4().hex[:10]}"
    pool = region.pool(pool_id)
    inst = await cloud.create(
        CreateRequest(name=name, region="r1", pool_id=pool_id, hall=pool.hall, flavor=pool.flavor)
    )
    repo.record_acquire(
        InstanceSpec(
            instance_id=name,
            region="r1",
            pool_id=pool_id,
            capacity_type=CapacityType.RECLAIMABLE,
            workload="ci-runners",
            tier=3,
        )
    )
    repo.record_event(name, EventKind.READY, provider_id=inst.provider_id)
    return name


@asynccontextmanager
async def relay_on_nats(
    repo: FleetRepository,
    cloud: SimulatedCloud,
    hall: str,
    *,
    lead: timedelta = timedelta(seconds=120),
    **extra: Any,
) -> AsyncIterator[tuple[NoticeRelay, NatsClient]]:
    """r1's relay for `hall`, its stream ensured, on a NATS connection of its own (closed
    afterwards)."""
    nc = await nats.connect(NATS_URL)
    try:
        relay = NoticeRelay(
            region="r1",
            hall=hall,
            lead=lead,
            repo=repo,
            provider=cloud,
            js=nc.jetstream(),
            signing_key=KEY,
            **extra,
        )
        await relay.ensure_stream()
        yield relay, nc
    finally:
        await nc.close()


async def test_a_reclaim_notices_the_node_then_deletes_it_after_the_deadline(
    fleet_repo: FleetRepository, region_r1: Region, pg_dsn: str
) -> None:
    cloud = SimulatedCloud(region_r1, clock=lambda: 0.0)
    async with relay_on_nats(fleet_repo, cloud, "D") as (relay, nc):
        pool_id = "r1.D.cpu.l"
        nodes = [await launch(cloud, fleet_repo, region_r1, pool_id) for _ in range(3)]
        received: list[ReclaimNotice] = []

        async def collect(msg: Msg) -> None:
            envelope = json.loads(msg.data)  # every notice goes out signed by the relay
            assert envelope["key_id"] == key_id(KEY.verify_key)
            received.append(ReclaimNotice.from_json(envelope["notice"]))

        sub = await nc.subscribe(hall_notice_subjects("r1", "D"), cb=collect)

        notices = await relay.handle_request(
            ReclaimRequest(instances=[nodes[0]], requested_by="alice")
        )
        assert [n.node for n in notices] == [nodes[0]]
        notice = notices[0]
        assert notice.deadline - notice.issued_at == timedelta(seconds=120)
        assert "by alice" in notice_reason(pg_dsn, nodes[0])  # who asked is on the record
        # A repeated request neither records nor changes the notice: same stable id.
        again = await relay.handle_request(ReclaimRequest(instances=[nodes[0]]))
        assert again[0].notice_id == notice.notice_id
        # A pool-wide reclaim notices the rest of the pool.
        pool_wide = await relay.handle_request(ReclaimRequest(pool_id=pool_id))
        assert {n.node for n in pool_wide} >= set(nodes[1:])
        await eventually_async(
            checked(lambda: {n.node for n in received} >= set(nodes)),
            timeout=30,
            what="a notice for every node",
        )
        assert {n.node for n in received} >= set(nodes)
        assert all(n.subject.startswith("sco.r1.notice.D.") for n in received)
        await sub.unsubscribe()

        # After a restart the relay republishes what is still pending.
        assert await relay.recover() >= 3
        assert await relay.sweep(now=notice.issued_at + timedelta(seconds=60)) == []
        gone = await relay.sweep(now=notice.deadline + timedelta(seconds=1))
        assert set(nodes) <= set(gone)
        row = fleet_repo.get_instance(nodes[0])
        assert row is not None and row.state is InstanceState.DELETED
        try:
            await cloud.get(row.provider_id or "")
            raise AssertionError("the instance should be gone")
        except NotFound:
            pass


def notice_reason(dsn: str, instance_id: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT payload->>'reason' FROM outbox WHERE key = %s AND payload->>'kind' = 'notice'",
            (instance_id,),
        ).fetchone()
    return str(row[0]) if row else ""


async def test_provider_reclaim_decisions_become_notices(
    fleet_repo: FleetRepository, region_r1: Region
) -> None:
    now = [0.0]
    cloud = SimulatedCloud(
        region_r1,
        clock=lambda: now[0],
        reclaims=ReclaimModel(base_per_instance_hour=3600.0, bursts_per_pool_hour=0.0),
    )
    async with relay_on_nats(fleet_repo, cloud, "A") as (relay, _):
        node = await launch(cloud, fleet_repo, region_r1, "r1.A.mem.xl")
        assert await relay.poll_provider() == []  # starts the reclaim clock
        now[0] += 60.0  # at one reclaim per instance-second, a minute reclaims it
        notices = await relay.poll_provider()
        assert [n.node for n in notices] == [node]
        assert await relay.poll_provider() == []  # each decision is acted on once
        row = fleet_repo.get_instance(node)
        assert row is not None and row.state is InstanceState.NOTICED


async def test_the_notice_streams_duplicate_window_covers_the_lead(
    fleet_repo: FleetRepository, region_r1: Region
) -> None:
    region = f"dw{uuid.uuid4().hex[:8]}"
    nc = await nats.connect(NATS_URL)
    js = nc.jetstream()
    try:
        # A stream made before this rule, with a window shorter than a notice's life.
        await js.add_stream(
            name=notice_stream(region), subjects=[f"sco.{region}.notice.>"], duplicate_window=60
        )
        relay = NoticeRelay(
            region=region,
            hall="A",
            lead=timedelta(seconds=300),
            repo=fleet_repo,
            provider=SimulatedCloud(region_r1, clock=lambda: 0.0),
            js=js,
            signing_key=KEY,
        )
        await relay.ensure_stream()
        info = await js.stream_info(notice_stream(region))
        assert info.config.duplicate_window == 600
        subject = f"sco.{region}.notice.A.n1"
        first = await js.publish(subject, b"{}", headers={"Nats-Msg-Id": "same"})
        again = await js.publish(subject, b"{}", headers={"Nats-Msg-Id": "same"})
        assert not first.duplicate and again.duplicate
    finally:
        await js.delete_stream(notice_stream(region))
        await nc.close()


async def test_a_relay_down_past_the_deadline_republishes_nothing_stale(
    fleet_repo: FleetRepository, region_r1: Region
) -> None:
    cloud = SimulatedCloud(region_r1, clock=lambda: 0.0)
    async with relay_on_nats(fleet_repo, cloud, "C") as (relay, _):
        node = await launch(cloud, fleet_repo, region_r1, "r1.C.cpu.l")
        [notice] = await relay.reclaim([node], "test")
        assert await relay.recover(now=notice.issued_at) >= 1
        # Back after the deadline: outside any duplicate window, so the sweep deletes it
        # instead of a second copy reaching the node.
        assert await relay.recover(now=notice.deadline + timedelta(days=365)) == 0
        assert node in await relay.sweep(now=notice.deadline + timedelta(seconds=1))
