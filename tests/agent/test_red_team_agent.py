"""Red team: the node agent's trust in bundles and notices (issue 29, the agent's part).

Each test is one attack, named for it, with the attack in its docstring; each failed on the
code before this module (a crash, a lock-out, a drain on an untrusted notice, or a genuine
notice refused) and must be refused, or survived, now. Bundles and notices travel through a
real NATS server (tests/support/worker_nats.py) where the attack crosses it. New APIs are
imported inside the tests, so on older code each test fails on its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from nacl.encoding import HexEncoder
from nacl.signing import SigningKey
from nats.aio.client import Client
from typer.testing import CliRunner

from agent.config import AgentConfig
from agent.daemon import Agent
from agent.notices import SignedMessage
from agent.sources.metadata import MetadataFileSource
from contracts import bundle, keys
from contracts.bundle import BundleRejected
from contracts.cache import BundleCache
from contracts.distribution import publish
from contracts.keys import TrustStore
from contracts.notice import NoticePolicy, ReclaimNotice
from contracts.notice_signing import NodeIdentity, Refusal, RefusalReason, check, sign
from contracts.source import read_contracts
from tests.support.agent_fakes import (
    RecordingScheduler,
    agent_config,
    notice_key,
    signed_bundle,
)
from tests.support.paths import EXAMPLES, REGIONS_DIR, REPO
from tests.support.wait import checked, eventually_async
from tests.support.worker_nats import NATS_URL, drop_bundle_bucket, nats_answers

pytestmark = pytest.mark.timeout(60)

NODE = "node-red"
FIVE_THOUSAND_DIGITS = b'{"content":{"serial":' + b"9" * 5000 + b'},"key_id":"0","signature":"0"}'
DEEP = b"[" * 100_000 + b"]" * 100_000


# --- helpers -------------------------------------------------------------------------


@pytest.fixture
async def region() -> AsyncIterator[str]:
    """A region of our own on the test NATS: its bundle bucket dropped after."""
    if not await nats_answers():
        pytest.skip(f"no NATS at {NATS_URL}")
    name = f"t{uuid.uuid4().hex[:8]}"
    yield name
    await drop_bundle_bucket(name)


def _contracts() -> list[object]:
    sources, findings = read_contracts(EXAMPLES)
    assert not findings
    return [s.contract for s in sources]


def _bundle(
    key: SigningKey,
    serial: int,
    *,
    regions: tuple[str, ...] = (),
    relay: SigningKey | None = None,
    created_at: datetime | None = None,
) -> bytes:
    policies = (
        [
            NoticePolicy(
                region=r,
                lead_seconds=120,
                keys={keys.key_id(relay.verify_key): relay.verify_key.encode(HexEncoder).decode()},
            )
            for r in regions
        ]
        if relay is not None
        else []
    )
    return bundle.build(
        _contracts(),  # type: ignore[arg-type]
        serial=serial,
        created_at=created_at or datetime.now(UTC) - timedelta(minutes=1),
        key=key,
        notice_policies=policies,
    )


def _config(tmp: Path, **over: Any) -> AgentConfig:
    """The module's agent config: this node, its metrics textfile in the test directory."""
    return agent_config(tmp, node=NODE, metrics_textfile=tmp / "metrics.prom", **over)


def _with_serial(key: SigningKey, serial: int) -> bytes:
    """A bundle signed by `key` with any serial at all (the model's bound not applied): what
    a leaked key can sign."""
    content = json.loads(_bundle(key, 1))["content"]
    content["serial"] = serial
    return bundle.canonical_json(
        {
            "content": content,
            "key_id": keys.key_id(key.verify_key),
            "signature": HexEncoder.encode(
                key.sign(bundle.canonical_json(content)).signature
            ).decode(),
        }
    )


def _trust(tmp: Path, name: str = "trust") -> tuple[SigningKey, Path]:
    _, private, _ = keys.generate(tmp / name)
    return keys.load_signing_key(private), tmp / name


def _notice(
    region: str,
    *,
    node: str = NODE,
    now: datetime | None = None,
    seconds: float = 60,
    issued: datetime | None = None,
) -> ReclaimNotice:
    now = now or datetime.now(UTC)
    return ReclaimNotice(
        notice_id=f"red-{uuid.uuid4().hex[:10]}",
        region=region,
        hall="D",
        node=node,
        pool_id=f"{region}.D.cpu.l",
        issued_at=issued if issued is not None else now,
        deadline=now + timedelta(seconds=seconds),
    )


def _pin(tmp: Path, relay: SigningKey) -> Path:
    """The relay's public key as an install ships it (notice_keys_dir)."""
    pinned = tmp / "pinned-notice-keys"
    pinned.mkdir(exist_ok=True)
    kid = keys.key_id(relay.verify_key)
    (pinned / f"{kid}.pub").write_bytes(relay.verify_key.encode(HexEncoder) + b"\n")
    return pinned


async def _started(agent: Agent) -> tuple[asyncio.Event, asyncio.Task[None]]:
    """Run `agent` until ready; fails (never hangs) when its start crashes."""
    stop = asyncio.Event()
    run = asyncio.create_task(agent.run(stop))
    ready = asyncio.create_task(agent.ready.wait())
    await asyncio.wait({run, ready}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if run.done():
        ready.cancel()
        raise AssertionError(f"the agent's start ended: {run.exception()!r}")
    assert agent.ready.is_set(), "the agent did not become ready"
    return stop, run


async def _stopped(stop: asyncio.Event, run: asyncio.Task[None]) -> None:
    stop.set()
    await asyncio.wait_for(run, 30)


def _check_cli(tmp: Path, region: str, trust: Path) -> subprocess.CompletedProcess[str]:
    config = tmp / "agent.toml"
    config.write_text(
        textwrap.dedent(f"""\
            node_id = "{NODE}"
            region = "{region}"
            hall = "D"
            scheduler = "none"
            nats_urls = ["{NATS_URL}"]
            cache_dir = "{tmp / "cache"}"
            trust_dir = "{trust}"
            """)
    )
    return subprocess.run(
        [sys.executable, "-m", "agent", "--check", "--config", str(config)],
        capture_output=True, text=True, cwd=REPO, timeout=45,
    )  # fmt: skip


def _refused(result: object) -> RefusalReason:
    assert isinstance(result, Refusal), result
    return result.reason


# --- 1. verify before parse, bounded ---------------------------------------------------


@pytest.mark.parametrize("hostile", [FIVE_THOUSAND_DIGITS, DEEP], ids=["5000-digits", "deep"])
async def test_a_hostile_bundle_in_the_bucket_does_not_crash_the_agent(
    region: str, tmp_path: Path, hostile: bytes
) -> None:
    """A 5,000-digit number or 100,000-deep JSON put in the bundle bucket: every agent of the
    region crashed on start (and restart-looped); now it is refused and the agent serves."""
    _trust(tmp_path)  # the node's trust directory: what it would verify against
    await publish(NATS_URL, region, hostile)
    config = _config(tmp_path, region=region, nats_urls=[NATS_URL])
    agent = Agent(config, scheduler=RecordingScheduler(), sources=[])
    stop, run = await _started(agent)
    try:
        assert agent.bundles.current() is None
    finally:
        await _stopped(stop, run)


@pytest.mark.parametrize("hostile", [FIVE_THOUSAND_DIGITS, DEEP], ids=["5000-digits", "deep"])
async def test_a_hostile_bundle_in_the_bucket_does_not_crash_sco_agent_check(
    region: str, tmp_path: Path, hostile: bytes
) -> None:
    """The same bucket object under `sco-agent --check` (the unit's ExecStartPre): it died with
    a traceback; now it says, in one line, that the distributor's bundle was refused."""
    _, trust = _trust(tmp_path)
    await publish(NATS_URL, region, hostile)
    out = await asyncio.to_thread(_check_cli, tmp_path, region, trust)
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode == 0, out.stdout + out.stderr
    assert "refused: not a bundle" in out.stdout


@pytest.mark.parametrize("hostile", [FIVE_THOUSAND_DIGITS, DEEP], ids=["5000-digits", "deep"])
def test_a_hostile_bundle_file_in_the_cache_is_refused_not_raised(
    tmp_path: Path, hostile: bytes
) -> None:
    """A hostile bundle.json written into the node's cache: reading it raised out of the
    cache (ValueError, RecursionError); now the cache holds nothing and says why."""
    _, trust = _trust(tmp_path)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "bundle.json").write_bytes(hostile)
    cache = BundleCache(tmp_path / "cache", TrustStore.load(trust))
    assert cache.current() is None
    assert not cache.offer(hostile).accepted


def test_a_bundle_signed_over_hostile_content_is_refused_not_raised(tmp_path: Path) -> None:
    """A leaked key signs content with a 5,000-digit serial: parsing it after the signature
    check raised ValueError; the signed content is parsed with bounds too."""
    key, trust = _trust(tmp_path)
    content = b'{"serial":' + b"9" * 5000 + b"}"
    raw = (
        b'{"content":'
        + content
        + b',"key_id":"'
        + keys.key_id(key.verify_key).encode()
        + b'","signature":"'
        + HexEncoder.encode(key.sign(content).signature)
        + b'"}'
    )
    with pytest.raises(BundleRejected, match="5000 digits"):
        bundle.verify(raw, TrustStore.load(trust))


@pytest.mark.parametrize("hostile", [FIVE_THOUSAND_DIGITS, DEEP], ids=["5000-digits", "deep"])
def test_a_hostile_notice_is_refused_not_raised(hostile: bytes) -> None:
    """A 5,000-digit number or 100,000-deep JSON on the notice subject: the notice check
    raised (the message was never acked); now it is a MALFORMED refusal."""
    relay = SigningKey.generate()
    raw_bundle = _bundle(SigningKey.generate(), 1, regions=("r1",), relay=relay)
    content = bundle.BundleContent.model_validate(json.loads(raw_bundle)["content"], strict=False)
    result = check(hostile, content, NodeIdentity("r1", "D", NODE), datetime.now(UTC))
    assert _refused(result) is RefusalReason.MALFORMED


# --- 2. serials advance by a bounded step; a poisoned serial can be recovered ----------


def test_a_serial_of_10_to_the_30_does_not_lock_out_later_bundles(tmp_path: Path) -> None:
    """A trusted (later leaked) key signs serial 10**30: the node took it and refused every
    genuine bundle after, even after the key was revoked; now it is refused outright."""
    key, trust = _trust(tmp_path)
    cache = BundleCache(tmp_path / "cache", TrustStore.load(trust))
    assert cache.offer(_bundle(key, 1)).accepted
    poisoned = cache.offer(_with_serial(key, 10**30))
    assert not poisoned.accepted
    assert cache.offer(_bundle(key, 2)).changed


def test_a_fresh_node_refuses_a_serial_beyond_the_maximum(tmp_path: Path) -> None:
    """A fresh node (nothing held) is offered serial 10**30 first: it took it and was locked
    out for good; a serial above 2**53 is refused as not a bundle."""
    key, trust = _trust(tmp_path)
    cache = BundleCache(tmp_path / "cache", TrustStore.load(trust))
    assert not cache.offer(_with_serial(key, 10**30)).accepted
    assert cache.offer(_bundle(key, 1)).changed


def test_a_poisoned_serial_is_released_by_revoking_its_key(tmp_path: Path) -> None:
    """A leaked key pushes the serial up within the step (held + 900): after the key is
    revoked, the genuine bundle (held + 1, another key) was still a rollback; now the revoked
    key's serials drop out of the rollback record, with no restart."""
    genuine, trust = _trust(tmp_path)
    _, leaked_private, _ = keys.generate(trust)
    leaked = keys.load_signing_key(leaked_private)
    cache = BundleCache(tmp_path / "cache", TrustStore.load(trust))
    assert cache.offer(_bundle(genuine, 10)).changed
    assert cache.offer(_bundle(leaked, 910)).changed  # within the step: taken
    (trust / keys.REVOKED_FILE).write_text(f"{keys.key_id(leaked.verify_key)}\n")
    cache.set_trust(TrustStore.load(trust))  # what the agent's refresh does each round
    assert cache.current() is None  # the leaked key's bundle is no longer held
    assert cache.offer(_bundle(genuine, 11)).changed
    # A restarted node (a fresh cache on the same directory) agrees.
    again = BundleCache(tmp_path / "cache", TrustStore.load(trust))
    assert again.current() is not None and again.current().serial == 11  # type: ignore[union-attr]


async def test_an_operator_signed_serial_reset_recovers_a_poisoned_serial(
    region: str, tmp_path: Path
) -> None:
    """A poisoned serial (500, by a key still trusted) locks out the genuine serial 3: there
    was no way back but wiping every node; now `sco contracts reset-serial` signs a reset,
    published to the bucket (what its --publish does, less the ledger record), and the
    running agent applies it and takes serial 3."""
    from contracts.serial_reset import OBJECT_NAME
    from workers.cli.main import app

    key, trust = _trust(tmp_path)
    await publish(NATS_URL, region, _bundle(key, 500))
    config = _config(tmp_path, region=region, nats_urls=[NATS_URL], bundle_refresh_seconds=0.2)
    agent = Agent(config, scheduler=RecordingScheduler(), sources=[])
    stop, run = await _started(agent)
    try:
        assert agent.bundles.current().serial == 500  # type: ignore[union-attr]
        await publish(NATS_URL, region, _bundle(key, 3))
        key_file = next(trust.glob("*.key"))
        result = await asyncio.to_thread(
            CliRunner().invoke,
            app,
            ["contracts", "reset-serial", "--region", region, "--to", "3", "--key",
             str(key_file), "--out", str(tmp_path / "reset.json"),
             "--reason", "red team: poisoned serial"],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        reset = (tmp_path / "reset.json").read_bytes()
        await publish(NATS_URL, region, reset, name=OBJECT_NAME)
        await eventually_async(
            checked(lambda: (b := agent.bundles.current()) is not None and b.serial == 3),
            timeout=20,
            what="the agent holds serial 3 after the reset",
        )
    finally:
        await _stopped(stop, run)


def test_a_replayed_serial_reset_does_not_roll_a_node_back(tmp_path: Path) -> None:
    """An old serial reset replayed after the node moved on: applying it again would reopen
    rollbacks; a reset is applied once, and never to a bundle signed after it."""
    from contracts import serial_reset

    key, trust = _trust(tmp_path)
    cache = BundleCache(tmp_path / "cache", TrustStore.load(trust))
    assert cache.offer(_bundle(key, 500)).changed
    reset = serial_reset.sign(
        serial_reset.SerialReset(region="r1", to_serial=3, issued_at=datetime.now(UTC)), key
    )
    assert cache.apply_reset(reset, "r1").changed
    assert cache.offer(_bundle(key, 3)).changed
    assert cache.offer(_bundle(key, 4)).changed
    replay = cache.apply_reset(reset, "r1")
    assert not replay.changed
    assert not cache.offer(_bundle(key, 3)).accepted  # still a rollback
    other_region = cache.apply_reset(reset, "r2")
    assert not other_region.accepted and "for region r1" in other_region.reason


# --- 3. notices fail safe ----------------------------------------------------------------


async def test_a_fresh_node_without_a_bundle_verifies_a_genuine_notice(tmp_path: Path) -> None:
    """A fresh node, no bundle yet, gets a genuine relay-signed notice: it refused it
    (no_notice_keys) and the work was lost at deletion; the relay keys pinned in the
    install verify it, and the node drains."""
    relay = SigningKey.generate()
    config = _config(tmp_path, notice_keys_dir=_pin(tmp_path, relay))
    agent = Agent(config, scheduler=RecordingScheduler(), sources=[])
    await agent.submit(SignedMessage(sign(_notice("r1"), relay), "nats"))
    assert agent.refusals == [] and agent.queue.qsize() == 1


async def test_a_bundle_compiled_without_notice_keys_still_drains_on_a_genuine_notice(
    tmp_path: Path,
) -> None:
    """A bundle compiled without --notice-keys (the README's example): every genuine notice
    was refused; with the install's pinned relay keys it drains."""
    relay = SigningKey.generate()
    raw, trust, _ = signed_bundle(tmp_path)  # no notice policy
    assert BundleCache(tmp_path / "cache", TrustStore.load(trust)).offer(raw).accepted
    config = _config(tmp_path, notice_keys_dir=_pin(tmp_path, relay))
    agent = Agent(config, scheduler=RecordingScheduler(), sources=[])
    await agent.submit(SignedMessage(sign(_notice("r1"), relay), "nats"))
    assert agent.refusals == [] and agent.queue.qsize() == 1


def test_compile_refuses_a_bundle_without_notice_keys_for_a_region_with_relays(
    tmp_path: Path,
) -> None:
    """`sco contracts compile` without --notice-keys signed a bundle whose nodes refuse every
    genuine notice; now it refuses, one line naming the region, and writes nothing."""
    from workers.cli.main import app

    _, private, _ = keys.generate(tmp_path / "k")
    out = tmp_path / "bundle.json"
    result = CliRunner().invoke(
        app,
        ["contracts", "compile", str(EXAMPLES), "--regions", str(REGIONS_DIR), "--key",
         str(private), "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 1 and not out.exists()
    lines = [line for line in result.output.splitlines() if "region r1 has notice relays" in line]
    assert len(lines) == 1, result.output


@pytest.mark.parametrize("fast", [True, False], ids=["5-min-fast", "5-min-slow"])
async def test_a_node_clock_5_minutes_off_judges_deadlines_on_the_measured_offset(
    region: str, tmp_path: Path, fast: bool
) -> None:
    """A node clock 5 minutes fast refused a genuine notice as expired; 5 minutes slow it
    acted on one that had expired 4 minutes before. The agent measures its offset against
    the NATS server and judges deadlines on the corrected clock."""
    from agent.clock import Clock

    relay = SigningKey.generate()
    key, trust = _trust(tmp_path)
    await publish(NATS_URL, region, _bundle(key, 1, regions=(region,), relay=relay))
    skew = 300.0 if fast else -300.0
    config = _config(tmp_path, region=region, trust_dir=trust, nats_urls=[NATS_URL])
    agent = Agent(
        config,
        scheduler=RecordingScheduler(),
        sources=[],
        clock=Clock(local=lambda: time.time() + skew),
    )
    stop, run = await _started(agent)
    try:
        await eventually_async(
            checked(lambda: agent.clock.sample is not None),
            timeout=15,
            what="the clock offset measured against NATS",
        )
        assert abs(agent.clock.offset.total_seconds() + skew) < 5
        now = datetime.now(UTC)  # the true time (the relay's)
        if fast:  # genuine, due in 60 s: must drain
            await agent.submit(SignedMessage(sign(_notice(region, now=now), relay), "nats"))
            assert agent.refusals == [] and agent.queue.qsize() == 1
        else:  # expired 4 minutes ago: must not drain
            old = _notice(region, now=now, seconds=-240, issued=now - timedelta(seconds=360))
            await agent.submit(SignedMessage(sign(old, relay), "nats"))
            assert agent.queue.empty()
            assert [r.reason for r in agent.refusals] == [RefusalReason.EXPIRED]
        text = (tmp_path / "metrics.prom").read_text()
        assert "sco_agent_clock_offset_seconds" in text
    finally:
        await _stopped(stop, run)


def test_a_notice_issued_in_the_future_is_refused() -> None:
    """A notice whose issued_at is 10 minutes ahead of the node (a relay clock gone wrong,
    or a notice minted for later use) was accepted: issued_at was never checked."""
    relay = SigningKey.generate()
    raw_bundle = _bundle(SigningKey.generate(), 1, regions=("r1",), relay=relay)
    content = bundle.BundleContent.model_validate(json.loads(raw_bundle)["content"], strict=False)
    now = datetime.now(UTC)
    future = _notice("r1", now=now, issued=now + timedelta(minutes=10))
    result = check(sign(future, relay), content, NodeIdentity("r1", "D", NODE), now)
    assert _refused(result) is RefusalReason.ISSUED_IN_FUTURE


def test_a_notice_issued_too_long_ago_is_refused() -> None:
    """A genuine notice issued a day ago with a deadline still ahead (signed long before,
    held back, replayed): accepted; now older than lead + skew is refused."""
    relay = SigningKey.generate()
    raw_bundle = _bundle(SigningKey.generate(), 1, regions=("r1",), relay=relay)
    content = bundle.BundleContent.model_validate(json.loads(raw_bundle)["content"], strict=False)
    now = datetime.now(UTC)
    old = _notice("r1", now=now, issued=now - timedelta(days=1))
    result = check(sign(old, relay), content, NodeIdentity("r1", "D", NODE), now)
    assert _refused(result) is RefusalReason.ISSUED_TOO_LONG_AGO


async def test_require_time_sync_refuses_to_start_without_a_clock_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node with no time sync (kernel unsynchronised, NATS unreachable) started and judged
    deadlines on whatever its clock said; with require_time_sync it refuses to start."""
    import agent.daemon as daemon
    from agent.clock import KernelSync

    monkeypatch.setattr(daemon, "kernel_sync", lambda: KernelSync(False, 16.0))
    monkeypatch.setattr(daemon, "TIME_SYNC_WAIT_SECONDS", 1.0)
    config = _config(tmp_path, nats_urls=["nats://127.0.0.1:1"], require_time_sync=True)
    agent = Agent(config, scheduler=RecordingScheduler(), sources=[])
    with pytest.raises(daemon.TimeSyncRefused, match="require_time_sync"):
        await asyncio.wait_for(agent.run(asyncio.Event()), 20)
    assert not agent.ready.is_set()


async def test_a_400_day_old_bundle_is_not_trusted_for_notices(tmp_path: Path) -> None:
    """A 400-day-old bundle (a node cut off from the distributor, or an old bundle replayed
    into its cache) still vouched for notice keys; past bundle_max_age_hours it does not,
    with a metric an alert fires on."""
    relay = SigningKey.generate()
    key, trust = _trust(tmp_path)
    old = _bundle(
        key, 1, regions=("r1",), relay=relay, created_at=datetime.now(UTC) - timedelta(days=400)
    )
    assert BundleCache(tmp_path / "cache", TrustStore.load(trust)).offer(old).accepted
    config = _config(tmp_path, trust_dir=trust)
    agent = Agent(config, scheduler=RecordingScheduler(), sources=[])
    await agent.submit(SignedMessage(sign(_notice("r1"), relay), "nats"))
    assert agent.queue.empty()
    assert [r.reason for r in agent.refusals] == [RefusalReason.NO_POLICY]
    assert "sco_agent_bundle_trusted_for_notices{" in (tmp_path / "metrics.prom").read_text()
    assert (
        'sco_agent_bundle_trusted_for_notices{node="node-red"} 0'
        in (tmp_path / "metrics.prom").read_text()
    )


async def test_a_revoked_bundle_key_takes_effect_on_refresh_without_restart(
    region: str, tmp_path: Path
) -> None:
    """The key that signed the node's bundle is revoked (revoked.txt in the trust
    directory): the running agent kept that bundle and its notice keys until restarted; now
    the next refresh drops them and the relay's notices signed under it are refused."""
    relay = SigningKey.generate()
    key, trust = _trust(tmp_path)
    await publish(NATS_URL, region, _bundle(key, 1, regions=(region,), relay=relay))
    config = _config(
        tmp_path,
        region=region,
        trust_dir=trust,
        nats_urls=[NATS_URL],
        bundle_refresh_seconds=0.2,
    )
    agent = Agent(config, scheduler=RecordingScheduler(), sources=[])
    stop, run = await _started(agent)
    try:
        await agent.submit(SignedMessage(sign(_notice(region), relay), "nats"))
        assert agent.refusals == [] and agent.queue.qsize() == 1
        (trust / keys.REVOKED_FILE).write_text(f"{keys.key_id(key.verify_key)}\n")
        await eventually_async(
            checked(lambda: agent.bundles.current() is None),
            timeout=15,
            what="the bundle signed by the revoked key dropped",
        )
        await agent.submit(SignedMessage(sign(_notice(region), relay), "nats"))
        assert [r.reason for r in agent.refusals] == [RefusalReason.NO_POLICY]
    finally:
        await _stopped(stop, run)


async def test_a_notice_key_revoked_in_the_install_takes_effect_without_restart(
    tmp_path: Path,
) -> None:
    """A relay key pinned in the install is revoked there (revoked.txt): the agent kept
    trusting it; now its next refresh reads the revocation and refuses the key's notices."""
    relay = SigningKey.generate()
    pinned = _pin(tmp_path, relay)
    config = _config(tmp_path, notice_keys_dir=pinned)
    agent = Agent(config, scheduler=RecordingScheduler(), sources=[])
    (pinned / keys.REVOKED_FILE).write_text(f"{keys.key_id(relay.verify_key)}\n")
    agent.reload_notice_keys()  # what every refresh round does
    await agent.submit(SignedMessage(sign(_notice("r1"), relay), "nats"))
    assert agent.queue.empty()
    assert [r.reason for r in agent.refusals] == [RefusalReason.REVOKED_KEY]


# --- 4. the metadata file is root's ------------------------------------------------------


def _source(path: Path) -> MetadataFileSource:
    """The source as the agent makes it (root must own the file); run as another user, the
    test's own uid stands in for root."""
    if os.getuid() == 0:
        return MetadataFileSource(path, NODE)
    return MetadataFileSource(path, NODE, owner_uid=os.getuid())


def _metadata(tmp: Path, deadline: datetime, mode: int = 0o644) -> Path:
    path = tmp / "spot.json"
    path.write_text(json.dumps({"action": "terminate", "time": deadline.isoformat()}))
    path.chmod(mode)
    return path


def test_a_world_writable_metadata_file_does_not_drain(tmp_path: Path) -> None:
    """Any tenant writes a terminate into a world-writable metadata file: the node drained
    at once, no signature asked; now the file is refused."""
    path = _metadata(tmp_path, datetime.now(UTC) + timedelta(seconds=60), mode=0o666)
    assert _source(path).read() is None


@pytest.mark.skipif(os.getuid() != 0, reason="only root can give a file to another user")
def test_a_metadata_file_owned_by_another_user_does_not_drain(tmp_path: Path) -> None:
    """A tenant's own file at the metadata path (owned by uid 1000): the node drained; now
    only a root-owned file is read."""
    path = _metadata(tmp_path, datetime.now(UTC) + timedelta(seconds=60))
    os.chown(path, 1000, 1000)
    assert MetadataFileSource(path, NODE).read() is None


@pytest.mark.parametrize("year", [1970, 9999])
def test_a_metadata_deadline_in_1970_or_9999_does_not_drain(tmp_path: Path, year: int) -> None:
    """A metadata notice with a deadline in 1970 or 9999: both drained; now a deadline that
    passed or lies beyond the notice lead is refused."""
    path = _metadata(tmp_path, datetime(year, 1, 1, tzinfo=UTC))
    assert _source(path).read() is None


def test_a_genuine_root_owned_metadata_notice_still_drains(tmp_path: Path) -> None:
    """The local fallback still works: a root-owned, 0644 file with a near deadline."""
    path = _metadata(tmp_path, datetime.now(UTC) + timedelta(seconds=60))
    notice = _source(path).read()
    assert notice is not None and notice.node == NODE


# --- a flood on one node's notice subject ---------------------------------------------


@pytest.mark.timeout(180)
async def test_a_flood_of_malformed_notices_does_not_stop_a_genuine_drain(
    nats_region: tuple[Client, str], tmp_path: Path
) -> None:
    """10,000 malformed, hostile and oversized messages on one node's notice subject (what a
    compromised relay identity or a hostile publisher can send): each message the agent
    handled raised or was parsed unbounded; now each is one refusal, and a genuine notice
    sent after the flood still drains, in bounded time."""
    from agent.natslink import NatsLink
    from agent.sources.nats import NatsNoticeSource

    nc, region = nats_region
    raw, trust, _ = signed_bundle(tmp_path, notice_regions=[region])
    assert BundleCache(tmp_path / "cache", TrustStore.load(trust)).offer(raw).accepted
    relay = notice_key(tmp_path)  # the one key the bundle lists for the region
    config = _config(tmp_path, region=region, nats_urls=[NATS_URL])
    link = NatsLink([NATS_URL])
    source = NatsNoticeSource(link, region, "D", NODE)
    agent = Agent(config, scheduler=RecordingScheduler(), sources=[source], link=link)
    stop, run = await _started(agent)
    subject = f"sco.{region}.notice.D.{NODE}"
    hostile = [
        DEEP[:4_000] + DEEP[-4_000:],
        FIVE_THOUSAND_DIGITS,
        b'{"key_id":"' + b"0" * 16 + b'","notice":' + b"[" * 5000 + b',"signature":"00"}',
        b"\xff\xfe not utf-8",
    ]
    # Oversized (more than a notice may be): every 50th, so the flood is ~10 MB, not 100 MB
    # (a stream without a max_msg_size lets either in; the agent refuses both unparsed).
    oversized = b"x" * 50_000
    try:
        await asyncio.wait_for(source.watching.wait(), 10)
        started = time.monotonic()
        for i in range(10_000):
            await nc.publish(subject, oversized if i % 50 == 0 else hostile[i % len(hostile)])
            # The agent shares this test's event loop: a publisher that never waits keeps it
            # from reading its socket until NATS cuts it off as a slow consumer (seen on a
            # loaded machine), which a node's own process never sees. A flush every 500 (a
            # round trip) lets it read meanwhile, as its own process would.
            if i % 500 == 499:
                await nc.flush()
        await nc.flush()
        good = _notice(region)
        await nc.jetstream().publish(subject, sign(good, relay))
        await eventually_async(
            checked(lambda: any(r.notice_id == good.notice_id for r in agent.reports)),
            timeout=150,
            what="the genuine notice drained after the flood",
        )
        took = time.monotonic() - started
        assert run.done() is False  # the agent is still running
        assert all(r.reason is RefusalReason.MALFORMED for r in agent.refusals)
        assert took < 150
    finally:
        await _stopped(stop, run)
