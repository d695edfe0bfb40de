"""The agent with per-hall relay keys: a notice for its hall signed by another hall's key
is refused and counted like any refused notice; a rotated key verifies as soon as the
bundle that publishes it arrives (no restart), and a retired key stops verifying."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from nacl.encoding import HexEncoder
from nacl.signing import SigningKey

from agent.daemon import Agent
from agent.notices import SignedMessage
from contracts import bundle, keys
from contracts.cache import BundleCache
from contracts.keys import TrustStore
from contracts.notice import KeyScope, NoticePolicy, ReclaimNotice
from contracts.notice_signing import RefusalReason, sign
from contracts.source import read_contracts
from tests.support.agent_fakes import RecordingScheduler, agent_config
from tests.support.paths import EXAMPLES

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
