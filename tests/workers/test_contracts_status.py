"""`sco contracts status` on the machine's real NATS: control-plane pods that pull with
`sco contracts pull` and an agent's refresher report the serial they hold; the status shows
who holds the published serial and who lags behind, says nothing is wrong only when nobody
does (`--check`), and marks a consumer that stopped reporting."""

from __future__ import annotations

import asyncio
import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from contracts import bundle, keys
from contracts.cache import BundleCache
from contracts.distribution import NatsBundleSource, publish
from contracts.holders import Holding, HoldingReporter, State, read_holdings, state
from contracts.keys import TrustStore
from tests.support.contract_fixtures import example
from tests.support.paths import REPO
from tests.support.services import run_sco
from tests.support.worker_nats import NATS_URL as NATS

pytestmark = pytest.mark.timeout(240)


def _bundle(key_path: Path, serial: int, region: str) -> bytes:
    from contracts.model import Contract

    doc = example("llm-train")
    doc.update(regions=[region], floor={}, tier=2)
    return bundle.build(
        [Contract.model_validate(doc, strict=False)],
        serial=serial,
        created_at=datetime.now(UTC),
        key=keys.load_signing_key(key_path),
    )


def _env(tmp_path: Path, region: str, pod: str) -> dict[str, str]:
    return {
        **os.environ,
        "SCO_REGION": region,
        "SCO_NATS_URL": NATS,
        "SCO_DATA_DIR": str(tmp_path / pod),
        "SCO_CONTRACTS__TRUST_DIR": str(tmp_path / "trust"),
        "SCO_CONFIG": str(tmp_path / "none.toml"),
        "HOSTNAME": pod,  # what Kubernetes sets in a pod: its name
    }


async def test_status_shows_the_serial_each_consumer_holds_and_who_lags(tmp_path: Path) -> None:
    region = f"r{uuid.uuid4().int % 10**9}"
    _, key_path, _ = keys.generate(tmp_path / "trust")
    (tmp_path / "none.toml").write_text("")
    await publish(NATS, region, _bundle(key_path, 1, region))

    # Two control-plane pods pull serial 1 (an init container's `sco contracts pull`).
    for pod in ("sco-worker-0-aaaa", "sco-worker-0-bbbb"):
        code, out = await run_sco(_env(tmp_path, region, pod), "contracts", "pull", cwd=REPO)
        assert code == 0, out
    # A node's agent refreshes the way its daemon does: BundleCache + its own reporter.
    agent_cache = BundleCache(tmp_path / "node" / "cache", TrustStore.load(tmp_path / "trust"))
    reporter = HoldingReporter([NATS], region, "agent", "node-a1.example")
    stop = asyncio.Event()
    source = NatsBundleSource(NATS, region)

    async def fetch_then_stop() -> bytes | None:
        stop.set()
        return await source.fetch()

    await agent_cache.refresh_forever(fetch_then_stop, stop, 0.1, held=reporter.report)

    code, out = await run_sco(
        _env(tmp_path, region, "cli"), "contracts", "status", "--check", cwd=REPO
    )
    assert code == 0, out
    assert "published serial 1 (verified)" in out

    # Serial 2 goes out; only one pod pulls it again.
    await publish(NATS, region, _bundle(key_path, 2, region))
    env_a = _env(tmp_path, region, "sco-worker-0-aaaa")
    code, out = await run_sco(env_a, "contracts", "pull", cwd=REPO)
    assert code == 0, out

    holdings = {h.name: h for h in await read_holdings(NATS, region)}
    assert {n: (h.kind, h.serial) for n, h in holdings.items()} == {
        "sco-worker-0-aaaa": ("control", 2),
        "sco-worker-0-bbbb": ("control", 1),
        "node-a1.example": ("agent", 1),
    }
    code, out = await run_sco(
        _env(tmp_path, region, "cli"), "contracts", "status", "--check", cwd=REPO
    )
    assert code == 1, out
    assert "published serial 2 (verified)" in out
    names = ("sco-worker-0-aaaa", "sco-worker-0-bbbb", "node-a1.example")
    lines = {n: next(line for line in out.splitlines() if n in line) for n in names}
    assert "current" in lines["sco-worker-0-aaaa"]
    assert "old serial" in lines["sco-worker-0-bbbb"]
    assert "old serial" in lines["node-a1.example"]


async def test_status_reads_the_serial_without_trust_keys_and_says_so(tmp_path: Path) -> None:
    region = f"r{uuid.uuid4().int % 10**9}"
    _, key_path, _ = keys.generate(tmp_path / "signer")
    (tmp_path / "none.toml").write_text("")
    await publish(NATS, region, _bundle(key_path, 3, region))
    code, out = await run_sco(_env(tmp_path, region, "cli"), "contracts", "status", cwd=REPO)
    assert code == 0, out
    assert "published serial 3 (unverified" in out
    assert "no consumer has reported a bundle yet" in out


def test_a_consumer_is_silent_old_without_or_current() -> None:
    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    minute = timedelta(minutes=1)

    def held(serial: int | None, ago: timedelta) -> Holding:
        return Holding("agent", "n1", serial, now - ago)

    assert state(held(2, minute), 2, now, 5 * minute) is State.CURRENT
    assert state(held(1, minute), 2, now, 5 * minute) is State.OLD
    assert state(held(None, minute), 2, now, 5 * minute) is State.NONE
    # What a silent consumer last said may no longer be true: silent wins.
    assert state(held(2, 6 * minute), 2, now, 5 * minute) is State.SILENT
    # Nothing published: any serial held is as good as it gets.
    assert state(held(1, minute), None, now, 5 * minute) is State.CURRENT
    assert Holding.from_json(held(7, minute).to_json()) == held(7, minute)


async def test_every_reported_holding_is_read_back_straight_after_the_reports() -> None:
    """The read lists keys from the bucket's stream: a watcher-based key list could end
    before the first delivered key was read and answer that nobody reported."""
    region = f"r{uuid.uuid4().int % 10**9}"
    names = [f"node-{i}.example" for i in range(60)]
    reporters = [HoldingReporter([NATS], region, "agent", n, create_bucket=True) for n in names]
    assert await reporters[0].report(4)  # makes the bucket, as a publish would
    assert all(await asyncio.gather(*(r.report(4) for r in reporters[1:])))
    for _ in range(5):
        holdings = await read_holdings(NATS, region)
        assert sorted(h.name for h in holdings) == sorted(names)
        assert {h.serial for h in holdings} == {4}
