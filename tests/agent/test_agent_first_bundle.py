"""A fresh node's first bundle, through the machine's real NATS object store: `--check`
(the unit's ExecStartPre) fetches it, or passes saying the node drains conservatively
until one arrives; the agent fetches it before serving and keeps asking while it has none."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent.daemon import Agent
from agent.notices import Notice
from agent.scheduler import Workload
from contracts.distribution import publish
from tests.support.agent_fakes import RecordingScheduler, agent_config, signed_bundle
from tests.support.paths import REPO
from tests.support.wait import checked, eventually_async
from tests.support.worker_nats import NATS_URL, drop_bundle_bucket, nats_answers

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def region() -> Iterator[str]:
    """A region of our own, its bundle bucket dropped after."""
    if not asyncio.run(nats_answers()):
        pytest.skip(f"no NATS at {NATS_URL}")
    name = f"t{uuid.uuid4().hex[:8]}"
    yield name
    asyncio.run(drop_bundle_bucket(name))


def _config_file(tmp: Path, region: str, trust: Path, nats_urls: str) -> Path:
    path = tmp / "agent.toml"
    path.write_text(
        textwrap.dedent(f"""\
            node_id = "fresh-1"
            region = "{region}"
            hall = "D"
            scheduler = "none"
            nats_urls = {nats_urls}
            cache_dir = "{tmp / "cache"}"
            trust_dir = "{trust}"
            """)
    )
    return path


def _check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent", "--check", "--config", str(path)],
        capture_output=True, text=True, cwd=REPO, timeout=45,
    )  # fmt: skip


def test_check_on_a_fresh_node_fetches_the_first_bundle(region: str, tmp_path: Path) -> None:
    raw, trust, _ = signed_bundle(tmp_path, serial=3, notice_regions=[region])
    asyncio.run(publish(NATS_URL, region, raw))
    path = _config_file(tmp_path, region, trust, f'["{NATS_URL}"]')
    assert not (tmp_path / "cache" / "bundle.json").exists()  # a fresh node
    out = _check(path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[ok] distributor: first bundle fetched from the distributor: accepted serial 3" in (
        out.stdout
    )
    assert "[ok] bundle: serial 3" in out.stdout and out.stdout.endswith("ready to drain\n")
    assert (tmp_path / "cache" / "bundle.json").read_bytes() == raw  # the agent starts with it


def test_check_with_nothing_published_lets_the_agent_start_and_says_conservative(
    region: str, tmp_path: Path
) -> None:
    _, trust, _ = signed_bundle(tmp_path, notice_regions=[region])
    out = _check(_config_file(tmp_path, region, trust, f'["{NATS_URL}"]'))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"[WAIT] bundle: none yet (fresh node: none published yet for region {region})" in (
        out.stdout
    )
    assert "ready to drain conservatively (requeue every workload)" in out.stdout


def test_check_with_the_distributor_down_says_why_and_still_passes(tmp_path: Path) -> None:
    _, trust, _ = signed_bundle(tmp_path, notice_regions=["r1"])
    out = _check(_config_file(tmp_path, "r1", trust, '["nats://127.0.0.1:1"]'))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[WAIT] bundle: none yet (fresh node: distributor unreachable" in out.stdout


def test_check_without_any_distributor_fails(tmp_path: Path) -> None:
    _, trust, _ = signed_bundle(tmp_path, notice_regions=["r1"])
    out = _check(_config_file(tmp_path, "r1", trust, "[]"))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "[FAIL] bundle:" in out.stdout and "no nats_urls configured" in out.stdout


def _notice(name: str) -> Notice:
    return Notice(name, "fresh-1", datetime.now(UTC) + timedelta(seconds=60), "test", "test")


async def _until(predicate: Callable[[], object], what: str, seconds: float = 30) -> None:
    await eventually_async(checked(predicate), timeout=seconds, what=what)


def _agent(tmp: Path, region: str) -> tuple[Agent, RecordingScheduler]:
    scheduler = RecordingScheduler(
        [Workload(id="7", socket_name="slurm_7", account="ci", partition="spot", comment="")]
    )
    config = agent_config(
        tmp,
        node="fresh-1",
        region=region,
        nats_urls=[NATS_URL],
        bundle_refresh_seconds=600,  # only the fresh-node retry can bring the bundle in time
        bundle_first_retry_seconds=0.2,
    )
    return Agent(config, scheduler=scheduler, sources=[]), scheduler


async def test_a_fresh_agent_fetches_its_first_bundle_before_it_serves(
    region: str, tmp_path: Path
) -> None:
    raw, _, _ = signed_bundle(tmp_path, serial=2, notice_regions=[region])
    await publish(NATS_URL, region, raw)
    agent, _ = _agent(tmp_path, region)
    stop = asyncio.Event()
    run = asyncio.create_task(agent.run(stop))
    try:
        await asyncio.wait_for(agent.ready.wait(), 30)
        held = agent.bundles.current()
        assert held is not None and held.serial == 2  # before any refresh interval
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)


async def test_a_fresh_agent_drains_conservatively_until_the_bundle_is_published(
    region: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    raw, _, _ = signed_bundle(tmp_path, serial=4, notice_regions=[region])
    agent, _ = _agent(tmp_path, region)
    stop = asyncio.Event()
    run = asyncio.create_task(agent.run(stop))
    try:
        await asyncio.wait_for(agent.ready.wait(), 30)  # it serves without a bundle
        assert "NO CONTRACT BUNDLE YET (fresh node: none published yet" in caplog.text
        await agent.submit(_notice("before"))
        await _until(lambda: len(agent.reports) == 1, "the first drain report")
        before = agent.reports[0]
        assert before.conservative and before.bundle_serial is None
        assert [w.result for w in before.workloads] == ["requeued"]

        await publish(NATS_URL, region, raw)
        # 0.2 s retries, not 600 s
        await _until(lambda: agent.bundles.current() is not None, "the first bundle")
        agent.scheduler.workloads_on_node.append(  # type: ignore[attr-defined]
            Workload(id="8", socket_name="slurm_8", account="ci", partition="spot", comment="")
        )
        await agent.submit(_notice("after"))
        await _until(lambda: len(agent.reports) == 2, "the second drain report")
        after = agent.reports[1]
        assert not after.conservative and after.bundle_serial == 4
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
