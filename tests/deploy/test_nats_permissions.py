"""The shipped NATS config (deploy/nats/sco-nats.conf + rendered users) on a real
nats-server with TLS: each role can do its job and nothing the issue forbids."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
from nacl.signing import SigningKey
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig

from agent.config import AgentConfig
from agent.daemon import Agent
from agent.natslink import NatsLink, nats_options
from agent.sources.nats import NatsNoticeSource
from contracts.cache import BundleCache
from contracts.distribution import OBJECT_NAME, NatsBundleSource, bucket_for
from contracts.holders import Holding, HoldingReporter, ensure_bucket, holder_key, holders_bucket
from contracts.keys import TrustStore
from contracts.notice import NOTICE_HOOKS_CONSUMER, notice_stream
from contracts.notice_signing import sign
from services.notice_relay.service import hooks_pending
from tests.agent.test_agent_notice_refusals import notice, wait_for
from tests.support import tools
from tests.support.agent_fakes import RecordingScheduler, agent_config, notice_key, signed_bundle
from tests.support.nats_sync import server_has_seen
from tests.support.paths import REPO
from tests.support.private_nats import (
    Conn,
    connect_recording,
    nats_server_binary,
    running_nats_server,
)
from tests.support.services import free_port
from tests.support.wait import eventually_async
from workers.nats_inboxes import agent_inbox, identity_inbox
from workers.nats_permissions import region_users, write_users

pytestmark = pytest.mark.timeout(60)
NODES = [("A", "node-a1"), ("A", "node-a2"), ("B", "node-b1")]


@dataclass(frozen=True)
class Server:
    url: str
    ca: Path
    secrets: Path


def _certs(d: Path) -> None:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=sco-ca")
    run("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=nats")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.crt", "-days", "1", "-extfile", "san.ext",
    )  # fmt: skip


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    binary = nats_server_binary()
    tools.require("openssl")
    d = tmp_path_factory.mktemp("nats-perm")
    _certs(d)
    shutil.copyfile(REPO / "deploy" / "nats" / "sco-nats.conf", d / "sco-nats.conf")
    write_users(d / "users.conf", region_users("r1", ["A", "B", "C", "D"], NODES), d / "secrets")
    port = free_port()
    env = {
        "SCO_NATS_TLS_CERT": str(d / "server.crt"),
        "SCO_NATS_TLS_KEY": str(d / "server.key"),
        "SCO_NATS_TLS_CA": str(d / "ca.crt"),
        "SCO_NATS_STORE_DIR": str(d / "js"),
    }
    with running_nats_server(binary, d / "sco-nats.conf", port, env=env):
        yield Server(f"tls://127.0.0.1:{port}", d / "ca.crt", d / "secrets")


def _tls(server: Server) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(server.ca))


async def connect(server: Server, user: str, **options: Any) -> Conn:
    if not user.startswith("agent-"):  # every other identity reads replies under its own
        options.setdefault("inbox_prefix", identity_inbox(user))
    return await connect_recording(
        server.url,
        user=user,
        password=(server.secrets / f"{user}.password").read_text().strip(),
        tls=_tls(server),
        **options,
    )


@pytest.fixture
async def conns(nats_server: Server) -> AsyncIterator[dict[str, Conn]]:
    made = {
        "control": await connect(nats_server, "control-r1"),
        "operator": await connect(nats_server, "operator-r1"),
        "relay-A": await connect(nats_server, "relay-r1-A"),
        "a1": await connect(nats_server, "agent-r1-node-a1", inbox_prefix=agent_inbox("node-a1")),
    }
    js = made["control"].nc.jetstream()
    try:
        await js.stream_info(notice_stream("r1"))
    except Exception:  # not there yet: this session's first test
        await js.add_stream(name=notice_stream("r1"), subjects=["sco.r1.notice.>"])
    yield made
    for c in made.values():
        await c.nc.close()


async def heard(conn: Conn, subject: str) -> list[Msg]:
    got: list[Msg] = []

    async def cb(msg: Msg) -> None:
        got.append(msg)

    await conn.nc.subscribe(subject, cb=cb)
    await server_has_seen(conn.nc)
    return got


async def settle(*conns: Conn) -> None:
    for c in conns:
        await server_has_seen(c.nc)
    # sleep is the behaviour under test: no more deliveries or -ERRs (they come async) meanwhile
    await asyncio.sleep(0.3)


async def test_plain_and_unauthenticated_connections_are_refused(nats_server: Server) -> None:
    plain = nats_server.url.replace("tls://", "nats://")
    with pytest.raises(Exception):  # noqa: B017 - nats-py raises several types here
        await nats.connect(
            plain, allow_reconnect=False, connect_timeout=2, max_reconnect_attempts=0
        )
    with pytest.raises(Exception):  # noqa: B017
        await nats.connect(
            nats_server.url,
            user="agent-r1-node-a1",
            password="wrong",
            tls=_tls(nats_server),
            allow_reconnect=False,
            connect_timeout=2,
            max_reconnect_attempts=0,
        )


async def test_an_agent_cannot_publish_a_notice(conns: dict[str, Conn]) -> None:
    agent, control = conns["a1"], conns["control"]
    got = await heard(control, "sco.r1.notice.>")
    forged = sign(notice("r1", node="node-a1"), SigningKey.generate())
    await agent.nc.publish("sco.r1.notice.A.node-a1", forged)
    with pytest.raises(Exception):  # noqa: B017 - no JetStream ack ever comes
        await agent.nc.jetstream().publish("sco.r1.notice.A.node-a2", forged, timeout=1)
    await wait_for(lambda: len(agent.violations()) >= 2, "both publish violations")
    await settle(agent, control)
    assert got == []
    assert len(agent.violations()) == 2
    assert all("for publish" in v for v in agent.violations())


async def test_an_agent_cannot_read_another_nodes_notices(conns: dict[str, Conn]) -> None:
    agent, relay = conns["a1"], conns["relay-A"]
    got = await heard(agent, "sco.r1.notice.A.node-a2")
    sniffed = await heard(agent, f"{agent_inbox('node-a2')}.>")
    await relay.nc.publish("sco.r1.notice.A.node-a2", b"for a2 only")
    await wait_for(
        lambda: len([v for v in agent.violations() if "for subscription" in v]) >= 2,
        "both subscription violations",
    )
    await settle(relay, agent)
    assert got == [] and sniffed == []
    assert len([v for v in agent.violations() if "for subscription" in v]) == 2
    # Nor may it make a JetStream consumer that filters on another node's subject.
    with pytest.raises(Exception):  # noqa: B017 - the create request is dropped: a timeout
        await agent.nc.jetstream().add_consumer(
            notice_stream("r1"),
            ConsumerConfig(name="sco-agent-node-a1", filter_subject="sco.r1.notice.A.node-a2"),
            timeout=1,
        )
    assert any("consumer.create" in v for v in agent.violations())


async def test_an_agent_cannot_publish_a_reclaim_request(conns: dict[str, Conn]) -> None:
    agent, operator, relay = conns["a1"], conns["operator"], conns["relay-A"]
    got = await heard(relay, "sco.r1.reclaim.A")
    await agent.nc.publish("sco.r1.reclaim.A", b'{"pool_id": "r1.A.cpu.l"}')
    await wait_for(
        lambda: any("sco.r1.reclaim.a" in v for v in agent.violations()), "the reclaim violation"
    )
    await settle(agent, relay)
    assert got == [] and any("sco.r1.reclaim.a" in v for v in agent.violations())
    await operator.nc.publish("sco.r1.reclaim.A", b'{"pool_id": "r1.A.cpu.l"}')
    await wait_for(lambda: len(got) >= 1, "the operator's reclaim request")
    await settle(operator, relay)
    assert len(got) == 1 and operator.violations() == []  # the operator's goes through


async def test_a_relay_cannot_publish_for_another_hall(conns: dict[str, Conn]) -> None:
    relay, control = conns["relay-A"], conns["control"]
    got = await heard(control, "sco.r1.notice.>")
    await relay.nc.publish("sco.r1.notice.B.node-b1", b"not my hall")
    await relay.nc.publish("sco.r1.notice.A.node-a1", b"my hall")
    # Both the delivery and the server's permissions error arrive asynchronously: wait for
    # both (bounded), then settle for anything extra.
    await wait_for(lambda: bool(got) and bool(relay.violations()), "the delivery and the error")
    await settle(relay, control)
    assert [m.subject for m in got] == ["sco.r1.notice.A.node-a1"]
    assert len(relay.violations()) == 1 and "sco.r1.notice.b.node-b1" in relay.violations()[0]


async def test_a_relay_reads_the_workers_notice_backlog_but_cannot_consume_it(
    conns: dict[str, Conn],
) -> None:
    """Decision 0030: the region worker (control) consumes the notice stream; a relay's
    answer to `sco reclaim` reads that consumer's backlog, and nothing more of it."""
    relay, control = conns["relay-A"], conns["control"]
    stream = notice_stream("r1")
    sub = await control.nc.jetstream().pull_subscribe(
        "sco.r1.notice.>", durable=NOTICE_HOOKS_CONSUMER, stream=stream
    )
    await relay.nc.jetstream().publish("sco.r1.notice.A.node-a1", b"a notice", timeout=5)
    pending = hooks_pending(relay.nc.jetstream(), "r1")

    async def counted() -> int | None:
        # 0 is also what a consumer-info request that timed out reads as (a loaded machine).
        return await pending() or None

    assert await eventually_async(counted, timeout=30, what="the backlog counted") >= 1
    assert relay.violations() == []
    await relay.nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{NOTICE_HOOKS_CONSUMER}", b"1")
    await wait_for(lambda: bool(relay.violations()), "the fetch's violation")
    await settle(relay, control)
    assert len(relay.violations()) == 1 and "consumer.msg.next" in relay.violations()[0]
    await sub.unsubscribe()


def a1_config(server: Server, tmp_path: Path) -> AgentConfig:
    """node-a1's agent settings with its own NATS user over TLS, as its node would have."""
    (tmp_path / "a1.password").write_text(
        (server.secrets / "agent-r1-node-a1.password").read_text()
    )
    return agent_config(
        tmp_path,
        node="node-a1",
        region="r1",
        hall="A",
        nats_urls=[server.url],
        nats_user="agent-r1-node-a1",
        nats_password_file=tmp_path / "a1.password",
        nats_tls_ca=server.ca,
    )


async def test_an_agent_with_its_own_identity_drains_a_relay_notice(
    nats_server: Server, conns: dict[str, Conn], tmp_path: Path
) -> None:
    """The permissions are enough for the real agent: bundle fetch, durable consumer,
    notice, drain report — all over TLS with the node's own user."""
    raw, trust, _ = signed_bundle(tmp_path, notice_regions=["r1"])
    control_js = conns["control"].nc.jetstream()
    store = await control_js.create_object_store(bucket_for("r1"))
    await store.put(OBJECT_NAME, raw)
    config = a1_config(nats_server, tmp_path)
    fetched = await NatsBundleSource(nats_server.url, "r1", nats_options(config)).fetch()
    assert fetched == raw
    assert BundleCache(tmp_path / "cache", TrustStore.load(trust)).offer(fetched).accepted
    reports = await heard(conns["control"], "sco.r1.drain.A.node-a1")
    link = NatsLink(config.nats_urls, nats_options(config))
    source = NatsNoticeSource(link, "r1", "A", "node-a1")
    scheduler = RecordingScheduler()
    agent = Agent(config, scheduler=scheduler, sources=[source], link=link)
    stop = asyncio.Event()
    run = asyncio.create_task(agent.run(stop))
    try:
        await asyncio.wait_for(source.watching.wait(), 10)
        n = notice("r1", node="node-a1")
        signed = sign(n.replace(hall="A"), notice_key(tmp_path))
        await conns["relay-A"].nc.jetstream().publish("sco.r1.notice.A.node-a1", signed, timeout=5)
        await asyncio.wait_for(agent.drained.wait(), 10)
        assert scheduler.ops() == [("cordon", "node-a1")]
        # Reported on its own subject (earlier tests' junk in the stream is refused there too).
        await wait_for(
            lambda: "drain_finished" in [json.loads(m.data)["event"] for m in reports],
            "drain_finished on the agent's subject",
        )
        events = [json.loads(m.data)["event"] for m in reports]
        assert {"notice_received", "drain_finished"} <= set(events)
        assert set(events) <= {"notice_received", "drain_finished", "notice_refused"}
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)


async def test_an_agent_reports_its_serial_under_its_own_key_only(
    nats_server: Server, conns: dict[str, Conn], tmp_path: Path
) -> None:
    """`sco contracts status`'s heartbeat: the node's own user may put its holding, never
    another node's."""
    await ensure_bucket(conns["control"].nc.jetstream(), "r1")
    config = a1_config(nats_server, tmp_path)
    own = HoldingReporter(config.nats_urls, "r1", "agent", "node-a1", nats_options(config))
    assert await own.report(4)
    other = HoldingReporter(config.nats_urls, "r1", "agent", "node-a2", nats_options(config))
    assert not await other.report(4)
    control = HoldingReporter(config.nats_urls, "r1", "control", "pod", nats_options(config))
    assert not await control.report(4)
    kv = await conns["control"].nc.jetstream().key_value(holders_bucket("r1"))
    entry = await kv.get(holder_key("agent", "node-a1"))
    assert entry.value is not None and Holding.from_json(entry.value).serial == 4
