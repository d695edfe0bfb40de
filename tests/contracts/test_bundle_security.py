"""Signed bundles: every attack is refused and the node keeps its last good bundle."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from contracts import bundle, keys
from contracts.cache import BundleCache
from contracts.distribution import NatsBundleSource, publish
from contracts.model import Contract
from contracts.source import read_contracts
from tests.support.contract_fixtures import EXAMPLES
from tests.support.wait import checked, eventually_async
from tests.support.worker_nats import NATS_URL

WHEN = datetime(2026, 11, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def contracts() -> list[Contract]:
    sources, findings = read_contracts(EXAMPLES)
    assert not findings
    return [s.contract for s in sources]


@pytest.fixture
def signer(tmp_path: Path) -> tuple[SigningKey, Path]:
    trust = tmp_path / "trust"
    _, private, _ = keys.generate(trust)
    return keys.load_signing_key(private), trust


def make(contracts: list[Contract], key: SigningKey, serial: int) -> bytes:
    return bundle.build(contracts, serial=serial, created_at=WHEN, key=key)


def test_any_single_changed_byte_is_refused(
    contracts: list[Contract], signer: tuple[SigningKey, Path]
) -> None:
    key, trust = signer
    store = keys.TrustStore.load(trust)
    raw = make(contracts, key, 1)
    bundle.verify(raw, store, now=WHEN)
    accepted = []
    for i in range(len(raw)):
        for replacement in {raw[i] ^ 0x01, ord("0") if raw[i] != ord("0") else ord("1")}:
            tampered = raw[:i] + bytes([replacement]) + raw[i + 1 :]
            try:
                bundle.verify(tampered, store, now=WHEN)
                accepted.append(i)
            except bundle.BundleRejected:
                pass
    assert accepted == [], f"tampered bytes accepted at offsets {accepted[:10]}"


def test_unknown_and_revoked_keys_are_refused(
    contracts: list[Contract], signer: tuple[SigningKey, Path], tmp_path: Path
) -> None:
    key, trust = signer
    _, stranger_key, _ = keys.generate(tmp_path / "stranger")
    foreign = make(contracts, keys.load_signing_key(stranger_key), 1)
    with pytest.raises(bundle.BundleRejected, match="unknown key"):
        bundle.verify(foreign, keys.TrustStore.load(trust), now=WHEN)
    (trust / keys.REVOKED_FILE).write_text(
        f"# compromised 2026-11-02\n{keys.key_id(key.verify_key)}\n"
    )
    with pytest.raises(bundle.BundleRejected, match="revoked key"):
        bundle.verify(make(contracts, key, 1), keys.TrustStore.load(trust), now=WHEN)


def test_the_cache_keeps_the_last_good_bundle(
    contracts: list[Contract], signer: tuple[SigningKey, Path], tmp_path: Path
) -> None:
    key, trust = signer
    cache = BundleCache(tmp_path / "cache", keys.TrustStore.load(trust), clock=lambda: WHEN)
    assert cache.current() is None
    v1, v2, v3 = (make(contracts, key, n) for n in (1, 2, 3))
    assert cache.offer(v2).changed
    assert cache.offer(v2).accepted and not cache.offer(v2).changed  # a repeat is a no-op

    replay = cache.offer(v1)
    assert not replay.accepted and "rollback" in replay.reason
    tampered = cache.offer(v3.replace(b'"tier":2', b'"tier":1'))
    assert not tampered.accepted
    _, other, _ = keys.generate(tmp_path / "other")
    foreign = cache.offer(make(contracts, keys.load_signing_key(other), 9))
    assert not foreign.accepted and "unknown key" in foreign.reason
    same_serial = cache.offer(make(contracts[:1], key, 2))
    assert not same_serial.accepted and "different content" in same_serial.reason

    held = cache.current()
    assert held is not None and held.serial == 2 and cache.path.read_bytes() == v2
    assert cache.offer(v3).changed and cache.current().serial == 3  # type: ignore[union-attr]
    assert sorted(p.name for p in cache.path.parent.iterdir()) == [
        "bundle.json",
        "serial",
    ]  # no temp


def test_a_cached_file_altered_on_disk_is_not_trusted(
    contracts: list[Contract], signer: tuple[SigningKey, Path], tmp_path: Path
) -> None:
    key, trust = signer
    cache = BundleCache(tmp_path / "cache", keys.TrustStore.load(trust), clock=lambda: WHEN)
    v4 = make(contracts, key, 4)
    cache.offer(v4)
    cache.path.write_bytes(cache.path.read_bytes().replace(b'"tier":3', b'"tier":1'))
    # A reader that never saw it verify (the control plane, a restarted node) has nothing;
    # the cache that did keeps the last good bundle.
    fresh = BundleCache(cache.path.parent, keys.TrustStore.load(trust), clock=lambda: WHEN)
    assert fresh.current() is None
    held = cache.current()
    assert held is not None and held.raw == v4
    # With the file damaged nothing valid is on disk, yet an older bundle is still a
    # rollback, to the fresh reader too (the serial record), and the good one repairs it.
    for reader in (cache, fresh):
        older = reader.offer(make(contracts, key, 3))
        assert not older.accepted and "rollback" in older.reason
    repaired = fresh.offer(v4)
    assert repaired.accepted and repaired.changed and cache.path.read_bytes() == v4


def test_an_old_bundle_is_stale_but_valid(
    contracts: list[Contract], signer: tuple[SigningKey, Path]
) -> None:
    key, trust = signer
    later = WHEN + timedelta(days=3)
    v = bundle.verify(
        make(contracts, key, 1), keys.TrustStore.load(trust), now=later, max_age=timedelta(hours=24)
    )
    assert v.stale and v.content.contract("llm-train") is not None


def test_published_bundles_reach_a_node_cache_through_nats(
    contracts: list[Contract], signer: tuple[SigningKey, Path], tmp_path: Path
) -> None:
    key, trust = signer
    region = f"t{uuid.uuid4().hex[:8]}"
    url = NATS_URL
    source = NatsBundleSource(url, region)
    cache = BundleCache(tmp_path / "cache", keys.TrustStore.load(trust), clock=lambda: WHEN)

    async def scenario() -> None:
        assert await source.fetch() is None  # nothing published yet: not an error
        await publish(url, region, make(contracts, key, 5))
        stop = asyncio.Event()
        task = asyncio.create_task(cache.refresh_forever(source.fetch, stop, interval=0.05))
        await eventually_async(
            checked(cache.current), timeout=30, what="serial 5 in the cache", every=0.05
        )
        await publish(url, region, make(contracts, key, 4))  # an older serial: refused
        # sleep is the behaviour under test: several refreshes see serial 4 and keep serial 5
        await asyncio.sleep(0.3)
        stop.set()
        await task

    # Bounded: a hang here must fail this test, not stall the session for later ones.
    asyncio.run(asyncio.wait_for(scenario(), 60))
    held = cache.current()
    assert held is not None and held.serial == 5
