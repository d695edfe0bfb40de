"""The agent with per-hall relay keys: a notice for its hall signed by another hall's key
is refused and counted like any refused notice; a rotated key verifies as soon as the
bundle that publishes it arrives (no restart), and a retired key stops verifying."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
import pytest
from nacl.encoding import HexEncoder
from nacl.signing import SigningKey

from activities.fleet.repository import FleetRepository
from activities.provider.simulator import SimulatedCloud
from agent.daemon import Agent
from agent.natslink import NatsLink
from agent.notices import SignedMessage
from agent.sources.nats import NatsNoticeSource
from contracts import bundle, keys
from contracts.cache import BundleCache
from contracts.keys import TrustStore
from contracts.notice import KeyScope, NoticePolicy, ReclaimNotice, notice_stream
from contracts.notice_signing import RefusalReason, sign
from contracts.region import Region
from contracts.source import read_contracts
from services.notice_relay.keyfile import KeyFileSigner
from services.notice_relay.relay import NoticeRelay
from tests.activities.test_notice_relay import launch
from tests.support.agent_fakes import RecordingScheduler, agent_config
from tests.support.paths import EXAMPLES
from tests.support.wait import checked, eventually_async
from tests.support.worker_nats import NATS_URL

NODE = "node-d1"  # agent_config's hall is D
pytestmark = pytest.mark.timeout(50)

HALL_D = SigningKey.generate()
HALL_D_NEXT = SigningKey.generate()
HALL_C = SigningKey.generate()


def kid(k: SigningKey) -> str:
    return keys.key_id(k.verify_key)


def publish_bundle(
    tmp: Path, serial: int, scopes: dict[SigningKey, KeyScope]
) -> tuple[bytes, Path]:
    """A bundle of the example contracts whose r1 notice keys are `scopes`, signed with
    the test's bundle key (made once, its .pub the agent's trust directory)."""
    trust = tmp / "trust"
    if not trust.is_dir():
        keys.generate(trust)
    signer = keys.load_signing_key(next(trust.glob("*.key")))
    sources, _ = read_contracts(EXAMPLES)
    policy = NoticePolicy(
        region="r1",
        lead_seconds=120,
        keys={kid(k): k.verify_key.encode(HexEncoder).decode() for k in scopes},
        scopes={kid(k): s for k, s in scopes.items()},
    )
    raw = bundle.build(
        [s.contract for s in sources],
        serial=serial,
        created_at=datetime.now(UTC) - timedelta(seconds=serial),
        key=signer,
        notice_policies=[policy],
    )
    return raw, trust


def notice_for_me(hall: str = "D") -> ReclaimNotice:
    now = datetime.now(UTC)
    return ReclaimNotice(
        notice_id=uuid.uuid4().hex[:24],
        region="r1",
        hall=hall,
        node=NODE,
        pool_id=f"r1.{hall}.cpu.l",
        issued_at=now,
        deadline=now + timedelta(seconds=60),
    )


def make_agent(tmp: Path, serial: int, scopes: dict[SigningKey, KeyScope]) -> Agent:
    raw, trust = publish_bundle(tmp, serial, scopes)
    assert BundleCache(tmp / "cache", TrustStore.load(trust)).offer(raw).accepted
    config = agent_config(tmp, node=NODE, metrics_textfile=tmp / "metrics.prom")
    return Agent(config, scheduler=RecordingScheduler(), sources=[])


def refusal_reasons(agent: Agent) -> list[str]:
    return [r.reason.value for r in agent.refusals]


async def test_a_notice_for_this_hall_signed_by_another_halls_key_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent = make_agent(tmp_path, 1, {HALL_D: KeyScope(halls=["D"]), HALL_C: KeyScope(halls=["C"])})
    with caplog.at_level(logging.ERROR, logger="agent.daemon"):
        await agent.submit(SignedMessage(sign(notice_for_me(), HALL_C), "nats"))
    assert refusal_reasons(agent) == [RefusalReason.WRONG_HALL.value]
    assert agent.queue.empty()  # nothing cordons or drains
    assert agent.metrics.refused[RefusalReason.WRONG_HALL.value] == 1
    [line] = [r.getMessage() for r in caplog.records if "REFUSED" in r.getMessage()]
    assert "(wrong_hall_key)" in line and "signs for hall C, not for hall D" in line
    assert "\n" not in line
    text = (tmp_path / "metrics.prom").read_text()
    assert 'reason="wrong_hall_key"} 1' in text
    # Its own hall's key: accepted, queued for the drain.
    await agent.submit(SignedMessage(sign(notice_for_me(), HALL_D), "nats"))
    assert agent.queue.qsize() == 1 and len(agent.refusals) == 1


async def test_an_unknown_key_is_refused(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, 1, {HALL_D: KeyScope(halls=["D"])})
    await agent.submit(SignedMessage(sign(notice_for_me(), SigningKey.generate()), "nats"))
    assert refusal_reasons(agent) == [RefusalReason.UNKNOWN_KEY.value]


async def test_rotation_without_a_restart_new_key_after_its_bundle_old_after_retirement(
    tmp_path: Path,
) -> None:
    agent = make_agent(tmp_path, 1, {HALL_D: KeyScope(halls=["D"])})
    # The next key signs before the nodes hold a bundle listing it: refused.
    await agent.submit(SignedMessage(sign(notice_for_me(), HALL_D_NEXT), "nats"))
    assert refusal_reasons(agent) == ["unknown_key"]

    # The bundle publishing the new key arrives (what the refresh loop hands the cache).
    raw, _ = publish_bundle(
        tmp_path, 2, {HALL_D: KeyScope(halls=["D"]), HALL_D_NEXT: KeyScope(halls=["D"])}
    )
    assert agent.bundles.offer(raw).accepted
    await agent.submit(SignedMessage(sign(notice_for_me(), HALL_D_NEXT), "nats"))
    await agent.submit(SignedMessage(sign(notice_for_me(), HALL_D), "nats"))  # both, meanwhile
    assert agent.queue.qsize() == 2 and len(agent.refusals) == 1

    # The old key retires (its not_after passed on the node's clock): refused from then on.
    retired = datetime.now(UTC) - timedelta(seconds=1)
    raw, _ = publish_bundle(
        tmp_path,
        3,
        {
            HALL_D: KeyScope(halls=["D"], not_after=retired),
            HALL_D_NEXT: KeyScope(halls=["D"]),
        },
    )
    assert agent.bundles.offer(raw).accepted
    await agent.submit(SignedMessage(sign(notice_for_me(), HALL_D), "nats"))
    assert refusal_reasons(agent) == ["unknown_key", "retired_key"]
    await agent.submit(SignedMessage(sign(notice_for_me(), HALL_D_NEXT), "nats"))
    assert agent.queue.qsize() == 3 and agent.metrics.refused["retired_key"] == 1


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


def test_the_check_says_when_no_key_signs_for_this_nodes_hall(tmp_path: Path) -> None:
    """`sco-agent --check` on a hall-scoped bundle counts only the keys of the node's hall."""
    from agent.check import _notice_keys

    agent = make_agent(tmp_path / "c", 1, {HALL_C: KeyScope(halls=["C"])})
    line = _notice_keys(agent.config, agent.bundles.current())
    assert not line.ok
    assert "none for r1/D" in line.detail and "hall-scoped: 0 sign for hall D" in line.detail
    assert "sco keys relay-new" in line.detail
    agent = make_agent(
        tmp_path / "d", 1, {HALL_D: KeyScope(halls=["D"]), HALL_C: KeyScope(halls=["C"])}
    )
    line = _notice_keys(agent.config, agent.bundles.current())
    assert line.ok and "1 key(s)" in line.detail and "1 sign for hall D" in line.detail
