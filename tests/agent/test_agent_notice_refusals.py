"""The agent on real NATS JetStream refuses every notice it cannot trust: nothing drains,
each refusal is journalled with its reason."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from nacl.signing import SigningKey
from nats.aio.client import Client

from agent.config import AgentConfig
from agent.daemon import Agent
from agent.natslink import NatsLink, NatsOptionsError, nats_options
from agent.notices import SignedMessage
from agent.sources.nats import NatsNoticeSource
from contracts.cache import BundleCache
from contracts.keys import TrustStore
from contracts.notice import ReclaimNotice
from contracts.notice_signing import sign
from tests.support.agent_fakes import RecordingScheduler, agent_config, notice_key, signed_bundle
from tests.support.wait import checked, eventually_async
from tests.support.worker_nats import NATS_URL

NODE = "node-r1"
pytestmark = pytest.mark.timeout(50)


def notice(region: str, *, node: str = NODE, seconds: float = 60, tag: str = "") -> ReclaimNotice:
    now = datetime.now(UTC)
    return ReclaimNotice(
        notice_id=f"{tag}-{uuid.uuid4().hex[:8]}",
        region=region,
        hall="D",
        node=node,
        pool_id=f"{region}.D.cpu.l",
        issued_at=now,
        deadline=now + timedelta(seconds=seconds),
    )


async def wait_for(predicate: Callable[[], object], what: str, seconds: float = 30) -> None:
    """Until `predicate()` holds; the agent runs on this loop, so the wait must yield to it."""
    await eventually_async(checked(predicate), timeout=seconds, what=what)


async def test_untrusted_notices_never_drain_and_are_journalled(
    nats_region: tuple[Client, str], tmp_path: Path
) -> None:
    nc, region = nats_region
    raw, trust, _ = signed_bundle(tmp_path, notice_regions=[region])
    assert BundleCache(tmp_path / "cache", TrustStore.load(trust)).offer(raw).accepted
    relay_key = notice_key(tmp_path)  # the one key the bundle lists for the region
    config = agent_config(tmp_path, node=NODE, region=region, nats_urls=[NATS_URL])
    scheduler = RecordingScheduler()
    link = NatsLink([NATS_URL])
    source = NatsNoticeSource(link, region, "D", NODE)
    agent = Agent(config, scheduler=scheduler, sources=[source], link=link)
    stop = asyncio.Event()
    run = asyncio.create_task(agent.run(stop))
    js = nc.jetstream()
    subject = f"sco.{region}.notice.D.{NODE}"  # every one arrives on this node's subject
    try:
        await asyncio.wait_for(source.watching.wait(), 10)
        bad = [
            ("unknown_key", sign(notice(region, tag="forged"), SigningKey.generate())),
            ("unsigned", json.dumps(notice(region, tag="unsigned").to_json()).encode()),
            ("other_node", sign(notice(region, node="node-other", tag="other"), relay_key)),
            ("deadline_too_far", sign(notice(region, seconds=86400, tag="far"), relay_key)),
            ("expired", sign(notice(region, seconds=-5, tag="past"), relay_key)),
        ]
        for _, payload in bad:
            await js.publish(subject, payload)
        await wait_for(lambda: len(agent.refusals) == len(bad), "every bad notice refused")
        assert [r.reason.value for r in agent.refusals] == [reason for reason, _ in bad]
        assert scheduler.calls == [] and agent.reports == []  # nothing cordoned or drained

        # A good notice drains once; the same bytes again are a replay, refused.
        good = sign(notice(region, tag="good"), relay_key)
        await js.publish(subject, good)
        await wait_for(lambda: len(agent.reports) == 1, "the good notice drained")
        await js.publish(subject, good)
        await wait_for(lambda: len(agent.refusals) == len(bad) + 1, "the replay refused")
        assert agent.refusals[-1].reason.value == "replay"
        # sleep is the behaviour under test: nothing more is cordoned or drained meanwhile
        await asyncio.sleep(0.2)
        assert scheduler.ops() == [("cordon", NODE)] and len(agent.reports) == 1
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
    journal = [json.loads(line) for line in config.journal_path.read_text().splitlines()]
    refusals = [
        (e["reason"], e["notice_id"].split("-")[0])
        for e in journal
        if e["event"] == "notice_refused"
    ]
    assert refusals == [
        ("unknown_key", "forged"),
        ("unsigned", "unsigned"),
        ("other_node", "other"),
        ("deadline_too_far", "far"),
        ("expired", "past"),
        ("replay", "good"),
    ]
    assert [e["event"] for e in journal if e["event"] != "notice_refused"] == [
        "notice_received",
        "drain_finished",
    ]


async def test_without_notice_keys_in_the_bundle_a_relay_notice_is_refused(
    tmp_path: Path,
) -> None:
    """Fail closed: a bundle that names no signer for the region accepts no notice."""
    raw, trust, _ = signed_bundle(tmp_path)  # no notice_regions
    assert BundleCache(tmp_path / "cache", TrustStore.load(trust)).offer(raw).accepted
    agent = Agent(agent_config(tmp_path, node=NODE), scheduler=RecordingScheduler(), sources=[])
    await agent.submit(SignedMessage(sign(notice("r1"), notice_key(tmp_path)), "nats"))
    assert agent.queue.empty() and [r.reason.value for r in agent.refusals] == ["no_notice_keys"]


def test_nats_identity_settings_are_checked(tmp_path: Path) -> None:
    base = {"region": "r1", "hall": "D", "node_id": "n1"}
    with pytest.raises(ValueError, match="nats_user and nats_password_file go together"):
        AgentConfig.from_mapping({**base, "nats_user": "agent-r1-n1"})
    with pytest.raises(ValueError, match="one NATS identity"):
        AgentConfig.from_mapping(
            {**base, "nats_user": "u", "nats_password_file": "/p", "nats_creds_file": "/c"}
        )
    with pytest.raises(ValueError, match="nats_tls_cert and nats_tls_key go together"):
        AgentConfig.from_mapping({**base, "nats_tls_cert": "/c"})
    missing = AgentConfig.from_mapping(
        {**base, "nats_user": "u", "nats_password_file": str(tmp_path / "none")}
    )
    with pytest.raises(NatsOptionsError, match="nats_password_file"):
        nats_options(missing)
    (tmp_path / "pw").write_text("s3cret\n")
    ok = AgentConfig.from_mapping(
        {**base, "nats_user": "u", "nats_password_file": str(tmp_path / "pw")}
    )
    assert nats_options(ok) == {"inbox_prefix": "_INBOX_n1", "user": "u", "password": "s3cret"}
