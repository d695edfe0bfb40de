"""Per-hall relay keys end to end on the machine's NATS and PostgreSQL: a hall's relay
process logic (NoticeRelay with its key file) publishes, node agents verify."""

from __future__ import annotations

import asyncio
import contextlib
import os
from datetime import timedelta
from pathlib import Path

import nats
import pytest
from nacl.encoding import HexEncoder

from activities.fleet.repository import FleetRepository
from activities.provider.simulator import SimulatedCloud
from agent.daemon import Agent
from agent.natslink import NatsLink
from agent.sources.nats import NatsNoticeSource
from contracts.cache import BundleCache
from contracts.keys import TrustStore
from contracts.notice import KeyScope, notice_stream
from contracts.region import Region
from services.notice_relay.keyfile import KeyFileSigner
from services.notice_relay.relay import NoticeRelay
from tests.activities.test_notice_relay import launch
from tests.agent.test_agent_hall_keys import (
    HALL_C,
    HALL_D,
    HALL_D_NEXT,
    publish_bundle,
    refusal_reasons,
)
from tests.support.agent_fakes import RecordingScheduler, agent_config
from tests.support.wait import checked, eventually_async
from tests.support.worker_nats import NATS_URL

pytestmark = pytest.mark.timeout(50)


async def test_relay_to_agent_on_real_nats_wrong_halls_key_refused_then_rotated_key_drains(
    fleet_repo: FleetRepository, region_r1: Region, tmp_path: Path
) -> None:
    """Hall D's relay on the machine's NATS and PostgreSQL, with its key file holding hall
    C's key by mistake: node 1's agent refuses the notice. The file is replaced with hall
    D's new key, which bundle serial 2 published: the same relay, not restarted, signs
    node 2's notice with it and node 2's agent, not restarted either, drains."""
    try:
        nc = await nats.connect(NATS_URL, connect_timeout=2, max_reconnect_attempts=0)
    except Exception as exc:
        pytest.skip(f"no NATS at {NATS_URL}: {exc}")
    cloud = SimulatedCloud(region_r1, clock=lambda: 0.0)
    nodes = [await launch(cloud, fleet_repo, region_r1, "r1.D.cpu.l") for _ in range(2)]
    key_file = tmp_path / "relay" / "hall-D.key"
    key_file.parent.mkdir()
    key_file.write_bytes(HALL_C.encode(HexEncoder))
    relay = NoticeRelay(
        region="r1",
        hall="D",
        lead=timedelta(seconds=120),
        repo=fleet_repo,
        provider=cloud,
        js=nc.jetstream(),
        signing_key=KeyFileSigner(key_file, region="r1", hall="D"),
    )
    await relay.ensure_stream()
    scopes = {HALL_D: KeyScope(halls=["D"]), HALL_C: KeyScope(halls=["C"])}
    agents, stop, runs = [], asyncio.Event(), []
    for node in nodes:
        home = tmp_path / node
        raw, trust = publish_bundle(home, 1, scopes)
        assert BundleCache(home / "cache", TrustStore.load(trust)).offer(raw).accepted
        link = NatsLink([NATS_URL])
        source = NatsNoticeSource(link, "r1", "D", node)
        config = agent_config(home, node=node, region="r1", nats_urls=[NATS_URL])
        agent = Agent(config, scheduler=RecordingScheduler(), sources=[source], link=link)
        agents.append((agent, source, home))
        runs.append(asyncio.create_task(agent.run(stop)))
    try:
        for _, source, _ in agents:
            await asyncio.wait_for(source.watching.wait(), 10)
        first, second = agents
        await relay.reclaim([nodes[0]], "test: hall C's key on hall D's relay")
        await eventually_async(
            checked(lambda: refusal_reasons(first[0]) == ["wrong_hall_key"]),
            timeout=20,
            what="node 1 refuses hall C's key",
        )
        assert first[0].reports == []  # nothing drained

        # Rotation: the bundle with hall D's new key reaches node 2, then the relay's key
        # file is replaced (renamed over, as a Secret update does).
        raw, _ = publish_bundle(second[2], 2, {**scopes, HALL_D_NEXT: KeyScope(halls=["D"])})
        assert second[0].bundles.offer(raw).accepted
        staged = key_file.with_suffix(".new")
        staged.write_bytes(HALL_D_NEXT.encode(HexEncoder))
        os.replace(staged, key_file)
        [sent] = await relay.reclaim([nodes[1]], "test: rotated key")
        await eventually_async(
            checked(lambda: len(second[0].reports) == 1),
            timeout=20,
            what="node 2 drains on the rotated key's notice",
        )
        assert second[0].reports[0].notice_id == sent.notice_id
        assert second[0].refusals == []
    finally:
        stop.set()
        await asyncio.gather(*runs, return_exceptions=True)
        js = nc.jetstream()
        for node in nodes:
            with contextlib.suppress(Exception):
                await js.delete_consumer(notice_stream("r1"), f"sco-agent-{node}")
        await nc.close()
