"""The agent's bundle, config and independence from the control plane."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent.config import ConfigError, load_config
from agent.daemon import Agent
from agent.notices import Notice
from agent.scheduler import Workload
from contracts.cache import BundleCache
from contracts.keys import TrustStore
from tests.support.agent_fakes import (
    WORKLOAD_SCRIPT,
    RecordingScheduler,
    agent_config,
    signed_bundle,
    wait_for_path,
)
from tests.support.paths import REPO

pytestmark = pytest.mark.timeout(50)


def notice(node: str, name: str = "n1") -> Notice:
    return Notice(name, node, datetime.now(UTC) + timedelta(seconds=60), "test", "test")


async def drain(agent: Agent, n: Notice) -> None:
    await agent.submit(n)
    await agent._drain(agent.queue.get_nowait())


async def test_a_bundle_tampered_on_disk_is_refused_and_the_last_good_one_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    raw, trust, _ = signed_bundle(tmp_path, serial=3)
    cache = BundleCache(tmp_path / "cache", TrustStore.load(trust))
    assert cache.offer(raw).accepted
    scheduler = RecordingScheduler(
        [
            Workload(
                id="5",
                socket_name="x",
                account="mlr",
                partition="spot",
                comment="sco-contract=llm-train",
            )
        ]
    )
    agent = Agent(agent_config(tmp_path, node="n"), scheduler=scheduler, sources=[])
    assert agent.bundles.current() is not None  # loaded at start
    # Someone edits the cached file: llm-train becomes "requeue".
    cache.path.write_bytes(raw.replace(b'"action":"checkpoint"', b'"action":"requeue"'))
    # Then the distributor offers a tampered bundle, and a rolled-back one.
    tampered = raw.replace(b'"grace_seconds":100', b'"grace_seconds":900')
    assert "bad signature" in agent.bundles.offer(tampered).reason
    older, _, _ = signed_bundle(tmp_path, serial=2)
    assert "rollback" in agent.bundles.offer(older).reason
    with caplog.at_level(logging.ERROR):
        await drain(agent, notice("n"))
    report = agent.reports[0]
    assert report.bundle_serial == 3 and not report.conservative
    # The last good bundle says checkpoint: no socket, so it was forced, not just requeued.
    assert [(w.contract, w.action, w.result) for w in report.workloads] == [
        ("llm-train", "checkpoint", "forced")
    ]
    assert "not trusted" in caplog.text and "last good serial 3" in caplog.text


async def test_without_a_bundle_every_job_is_requeued_and_it_says_so_loudly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = RecordingScheduler(
        [
            Workload(
                id="9",
                socket_name="x",
                account="mlr",
                partition="spot",
                comment="sco-contract=llm-train",
            )
        ]
    )
    agent = Agent(agent_config(tmp_path, node="n"), scheduler=scheduler, sources=[])
    with caplog.at_level(logging.CRITICAL):
        await drain(agent, notice("n"))
    report = agent.reports[0]
    assert report.conservative and report.bundle_serial is None
    assert [(w.contract, w.result) for w in report.workloads] == [(None, "requeued")]
    assert scheduler.ops() == [("cordon", "n"), ("requeue", "9")]
    assert any(
        r.levelno == logging.CRITICAL and "NO VALID CONTRACT BUNDLE" in r.getMessage()
        for r in caplog.records
    )


async def test_dry_run_mutates_nothing(tmp_path: Path) -> None:
    from agent.scheduler.slurm import SlurmScheduler

    calls: list[tuple[str, ...]] = []

    class Spy(SlurmScheduler):
        async def _run(self, *args: str) -> str:
            calls.append(args)
            job = "42|42|ci|spot|RUNNING|1700000000|1000|1000|sco-contract=ci\n"
            return job if args[0] == "squeue" else ""

    agent = Agent(
        agent_config(tmp_path, node="n", dry_run=True),
        scheduler=Spy(dry_run=True),
        sources=[],
    )
    await drain(agent, notice("n"))
    assert [c[0] for c in calls] == ["squeue"]  # listing only, no scontrol
    assert [w.result for w in agent.reports[0].workloads] == ["dry-run"]


def test_a_bad_config_names_file_field_and_reason(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('region = "r1"\nhall = "D"\nscheduler = "pbs"\n')
    with pytest.raises(ConfigError) as err:
        load_config(path, {})
    assert err.value.field == "scheduler" and str(path) in str(err.value)
    path.write_text('region = "r1"\nhall = "D"\nsafety_margin = 3\n')
    with pytest.raises(ConfigError, match="safety_margin: unknown key"):
        load_config(path, {})
    path.write_text('region = "r1"\nhall = "D"\n')
    with pytest.raises(ConfigError, match="SCO_AGENT_WORKERS"):
        load_config(path, {"SCO_AGENT_WORKERS": "lots"})
    config = load_config(
        path,
        {
            "SCO_AGENT_DRY_RUN": "true",
            "SCO_AGENT_NATS_URLS": "nats://a:4222, nats://b:4222",
            "SCO_AGENT_NODE_ID": "gpu-17",
        },
    )
    assert config.dry_run and config.node_id == "gpu-17"
    assert config.nats_urls == ["nats://a:4222", "nats://b:4222"]
    with pytest.raises(ConfigError, match="not valid TOML"):
        path.write_text("region = \n")
        load_config(path, {})


def test_check_exits_0_with_a_valid_bundle_and_1_without(tmp_path: Path) -> None:
    raw, trust, _ = signed_bundle(tmp_path, notice_regions=["r1"])
    path = tmp_path / "agent.toml"
    path.write_text(
        textwrap.dedent(f"""\
            node_id = "n1"
            region = "r1"
            hall = "D"
            scheduler = "none"
            nats_urls = []
            cache_dir = "{tmp_path / "cache"}"
            trust_dir = "{trust}"
            """)
    )
    cmd = [sys.executable, "-m", "agent", "--check", "--config", str(path)]
    bad = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=30)
    assert bad.returncode == 1 and "[FAIL] bundle" in bad.stdout, bad.stdout + bad.stderr
    assert BundleCache(tmp_path / "cache", TrustStore.load(trust)).offer(raw).accepted
    good = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=30)
    assert good.returncode == 0 and "ready to drain" in good.stdout, good.stdout + good.stderr
    assert "ci-runners" in good.stdout and "[ok] notice keys: 1 key(s)" in good.stdout


_CONTROL_PLANE_DOWN = """
import asyncio, json, sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from agent.config import load_config
from agent.daemon import Agent
from tests.support.wait import checked, eventually_async

async def main() -> None:
    agent = Agent(load_config(Path(sys.argv[1])))
    stop = asyncio.Event()
    run = asyncio.create_task(agent.run(stop))
    meta = Path(sys.argv[2])
    deadline = (datetime.now(UTC) + timedelta(seconds=30)).isoformat()
    meta.write_text(json.dumps({"time": deadline}))
    await eventually_async(checked(lambda: agent.reports), timeout=25, what="the drain report")
    stop.set()
    await run
    r = agent.reports[0]
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in
                    {"temporalio", "workflows", "activities", "workers"})
    print(json.dumps({"results": [w.result for w in r.workloads], "loaded": loaded}))

asyncio.run(main())
"""


def test_a_drain_needs_nothing_of_the_control_plane(tmp_path: Path) -> None:
    """A separate process with only the agent: no Temporal, no workers, NATS unreachable
    (port 1): the metadata notice still drains the one registered workload."""
    sockets = tmp_path / "sockets"
    server = subprocess.Popen(
        [sys.executable, "-c", WORKLOAD_SCRIPT, str(sockets / "job-1/sock"), "0"], cwd=REPO
    )
    try:
        wait_for_path(sockets / "job-1/sock")
        path = tmp_path / "agent.toml"
        path.write_text(
            textwrap.dedent(f"""\
                node_id = "n1"
                region = "r1"
                hall = "D"
                scheduler = "none"
                nats_urls = ["nats://127.0.0.1:1"]
                cache_dir = "{tmp_path / "cache"}"
                trust_dir = "{tmp_path / "trust"}"
                journal_path = "{tmp_path / "journal.jsonl"}"
                socket_dir = "{sockets}"
                metadata_path = "{tmp_path / "meta.json"}"
                metadata_poll_seconds = 0.05
                """)
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCO_")}
        out = subprocess.run(
            [sys.executable, "-c", _CONTROL_PLANE_DOWN, str(path), str(tmp_path / "meta.json")],
            capture_output=True, text=True, cwd=REPO, timeout=30, env=env,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result == {"results": ["requeued"], "loaded": []}
        assert "NO VALID CONTRACT BUNDLE" in out.stderr  # no trust dir: conservative
    finally:
        server.terminate()
        server.wait(10)
