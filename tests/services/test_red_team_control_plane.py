"""Red team: the control plane's trust boundaries (issue 29), one test per attack.

Each attack runs as the attacker would: a compromised node's agent with its own NATS user, an
operator identity, a hall's relay, on a private nats-server carrying the users
`sco nats-users` renders (workers/nats_permissions.py), with the drain intake booking into
real embedded ClickHouse (chDB) and parking what it refuses in real PostgreSQL. Every test
failed on the code before issue 29 and passes after; the fuzzer and the flood test are at
the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig
from typer.testing import CliRunner

from activities.events import CapacityType, EventKind, InstanceState
from activities.fleet.repository import FleetRepository, InstanceSpec
from activities.ledger.holder import HolderSocket
from activities.ledger.lost_work import (
    MAX_LOST_SECONDS,
    MAX_LOST_STEPS,
    MAX_LOST_TASKS,
    DrainEventError,
    insert_drain,
    parse_event,
    rows_from_drain,
)
from activities.ledger.store import LedgerStore
from activities.provider.simulator import SimulatedCloud
from contracts import keys
from contracts.distribution import bucket_for
from contracts.notice import notice_subject, reclaim_subject
from contracts.reclaim import ReclaimReply, ReclaimRequest
from contracts.region import Region
from services.drain_intake.intake import (
    DEAD_LETTERS_PER_NODE,
    DURABLE,
    DrainIntake,
    drain_stream,
)
from services.notice_relay.relay import NoticeRelay
from services.notice_relay.service import request_handler
from tests.support.agent_fakes import signed_bundle
from tests.support.fuzz import examples
from tests.support.nats_sync import server_has_seen
from tests.support.paths import REGIONS_DIR
from tests.support.private_nats import (
    Conn,
    connect_recording,
    nats_server_binary,
    running_nats_server,
)
from tests.support.sco_process import Process, process_db, processes  # noqa: F401 - fixtures
from tests.support.services import free_port
from tests.support.wait import checked, eventually, eventually_async
from workers.cli.main import app
from workers.client_security import nats_options
from workers.nats_inboxes import agent_inbox, identity_inbox
from workers.nats_limits import BUNDLE_MAX_CONSUMERS
from workers.nats_permissions import region_users, write_users
from workers.settings import Settings

pytestmark = pytest.mark.timeout(120)
REGION = "r1"
NODES = [("A", "node-a1"), ("A", "node-a2"), ("B", "node-b1")]
POOL = "r1.A.stor.4xl"  # no other test uses it: a pool-wide reclaim touches only ours
runner = CliRunner()


@dataclass(frozen=True)
class PrivateNats:
    port: int
    secrets: Path

    def password(self, user: str) -> str:
        return (self.secrets / f"{user}.password").read_text().strip()

    def url(self, user: str | None = None) -> str:
        auth = f"{user}:{self.password(user)}@" if user else ""
        return f"nats://{auth}127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def private_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateNats]:
    """nats-server with JetStream and the region's generated per-role users (no TLS: the
    permissions are what is under test; tests/deploy covers TLS)."""
    binary = nats_server_binary()
    d = tmp_path_factory.mktemp("red-team-nats")
    write_users(d / "users.conf", region_users(REGION, ["A", "B", "C", "D"], NODES), d / "s")
    (d / "nats.conf").write_text(f'jetstream {{ store_dir: "{d / "js"}" }}\ninclude "users.conf"\n')
    port = free_port()
    with running_nats_server(binary, d / "nats.conf", port):
        yield PrivateNats(port, d / "s")


async def connect_as(server: PrivateNats, user: str) -> Conn:
    """`user`'s connection as its process makes it: an agent with `_INBOX_<node>`, every
    other identity with the prefix `nats_options` derives from its URL."""
    if user.startswith("agent-"):
        options: dict[str, Any] = {"inbox_prefix": agent_inbox(user.split("-", 2)[2])}
    else:
        options = nats_options(Settings(nats_url=server.url(user)))
    return await connect_recording(server.url(user), **options)


@asynccontextmanager
async def identities(server: PrivateNats, *users: str) -> AsyncIterator[list[Conn]]:
    conns = [await connect_as(server, u) for u in users]
    try:
        yield conns
    finally:
        for c in conns:
            await c.nc.close()


# --- the drain intake ---------------------------------------------------------------------


def report(notice_id: str, node: str | None, **workload: Any) -> dict[str, Any]:
    """A drain_finished report as the agent sends it, one workload."""
    body: dict[str, Any] = {
        "event": "drain_finished",
        "notice_id": notice_id,
        "source": "nats",
        "deadline": datetime.now(UTC).isoformat(),
        "finished_at": datetime.now(UTC).isoformat(),
        "workloads": [
            {
                "workload": "slurm-7",
                "contract": "llm-train",
                "action": "checkpoint",
                "result": "checkpointed",
                "lost_steps": 5,
                **workload,
            }
        ],
    }
    if node is not None:
        body["node"] = node
    return body


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()  # NaN and Infinity as Python writes them


@dataclass
class Intake:
    """The drain intake of r1 in a task, as `sco ledger book-drains` loops it."""

    intake: DrainIntake
    task: asyncio.Task[None]
    ledger: str
    pg_dsn: str
    #: Reads the ledger through this store (one holding it) instead of opening it.
    reader: LedgerStore | None = None

    def rows(self, notice_id: str) -> list[dict[str, Any]]:
        with (self.reader or LedgerStore(self.ledger)).session() as client:
            found = client.query(
                "SELECT node, lost_steps, lost_tasks, lost_seconds FROM lost_work FINAL "
                "WHERE notice_id = {n:String} ORDER BY node",
                parameters={"n": notice_id},
            )
            return list(found.named_results())

    def dead_letters(self, since: int) -> list[tuple[str, str]]:
        with psycopg.connect(self.pg_dsn) as conn:
            return [
                (r[0], r[1])
                for r in conn.execute(
                    "SELECT topic, reason FROM dead_letters WHERE source = 'drain' AND id > %s "
                    "ORDER BY id",
                    (since,),
                )
            ]

    def last_dead_letter(self) -> int:
        with psycopg.connect(self.pg_dsn) as conn:
            row = conn.execute("SELECT coalesce(max(id), 0) FROM dead_letters").fetchone()
            assert row is not None
            return int(row[0])

    async def booked(self, notice_id: str, node: str) -> list[dict[str, Any]]:
        """The ledger's rows of `notice_id` once `node`'s is there; the intake still runs."""

        async def there() -> list[dict[str, Any]] | None:
            assert not self.task.done(), f"the intake stopped: {self.task}"
            rows = await asyncio.to_thread(self.rows, notice_id)
            return rows if any(r["node"] == node for r in rows) else None

        return await eventually_async(
            there, timeout=60, what=f"{node}'s report {notice_id} booked", every=0.3
        )


@asynccontextmanager
async def drain_intake(server: PrivateNats, ledger: str, pg_dsn: str) -> AsyncIterator[Intake]:
    async with identities(server, f"control-{REGION}") as [control]:
        intake = DrainIntake(
            control.nc.jetstream(),
            lambda: LedgerStore(ledger),
            REGION,
            fetch_seconds=0.2,
            dead_letter_dsn=pg_dsn,
        )
        stop = asyncio.Event()

        async def loop() -> None:
            # As services/drain_intake/service.py: NATS faults are retried, anything else
            # ends the process (what the attacks below must never cause).
            while not stop.is_set():
                try:
                    await intake.step()
                except (nats.errors.Error, OSError, TimeoutError):
                    await intake.reset()

        await intake.ensure()
        task = asyncio.create_task(loop())
        try:
            yield Intake(intake, task, ledger, pg_dsn)
        finally:
            stop.set()
            await asyncio.wait({task}, timeout=30)
            intake.close()


@pytest.fixture(scope="module")
def ledger_dsn(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"chdb://{tmp_path_factory.mktemp('red-team-ledger') / 'ledger'}"


@pytest.fixture
async def intake(private_nats: PrivateNats, ledger_dsn: str, pg_dsn: str) -> AsyncIterator[Intake]:
    """r1's drain intake, running for the test."""
    async with drain_intake(private_nats, ledger_dsn, pg_dsn) as running:
        yield running


async def _no_backlog() -> int:
    return 0  # no region worker here tells the exclusion cycle


def notice_id() -> str:
    """A notice id of the test's own."""
    return f"n-{uuid.uuid4().hex[:8]}"


async def publish_as(conn: Conn, node: str, hall: str, *payloads: bytes) -> None:
    for data in payloads:
        await conn.nc.publish(f"sco.{REGION}.drain.{hall}.{node}", data)
    await server_has_seen(conn.nc)


async def test_a_node_cannot_book_forged_lost_work_for_another_node(
    private_nats: PrivateNats, intake: Intake
) -> None:
    """A node reports lost work naming another node (over its row): refused, dead-lettered."""
    notice = notice_id()
    async with identities(private_nats, "agent-r1-node-a1", "agent-r1-node-a2") as [a1, a2]:
        since = intake.last_dead_letter()
        await publish_as(a2, "node-a2", "A", encode(report(notice, "node-a2", lost_steps=5)))
        await intake.booked(notice, "node-a2")
        forged = report(notice, "node-a2", lost_steps=10**6)  # a2's notice, a2's workload
        after = f"{notice}-after"
        await publish_as(a1, "node-a1", "A", encode(forged), encode(report(after, "node-a1")))
        await intake.booked(after, "node-a1")  # the forged report was handled before it
        rows = await asyncio.to_thread(intake.rows, notice)
        assert rows == [
            {"node": "node-a2", "lost_steps": 5, "lost_tasks": None, "lost_seconds": None}
        ]
        letters = await asyncio.to_thread(intake.dead_letters, since)
        # Nor can it publish on a2's subject: the server refuses it.
        await a1.nc.publish(f"sco.{REGION}.drain.A.node-a2", encode(forged))
        await eventually_async(checked(a1.violations), timeout=10, what="the violation")
    assert len(letters) == 1 and letters[0][0] == "sco.r1.drain.A.node-a1", letters
    assert "names node 'node-a2' but was sent by 'node-a1'" in letters[0][1]


async def test_through_the_ledgers_holder_a_forged_report_is_refused_alike(
    private_nats: PrivateNats, pg_dsn: str, tmp_path: Path
) -> None:
    """With the consumer holding an embedded ledger, the intake books through it (decision
    0043): a genuine report is booked, a forged one refused for the same reason as when the
    intake books itself, and the intake never opens the ledger (nor loads chDB)."""
    dsn = f"chdb://{tmp_path / 'ledger'}"
    holder = LedgerStore(dsn, hold=True)
    holder.ensure_schema()
    reads = HolderSocket(holder)
    assert reads.start()
    notice = notice_id()
    try:
        async with (
            drain_intake(private_nats, dsn, pg_dsn) as intake,
            identities(private_nats, "agent-r1-node-a1", "agent-r1-node-a2") as [a1, a2],
        ):
            intake.reader = holder
            since = intake.last_dead_letter()
            await publish_as(a2, "node-a2", "A", encode(report(notice, "node-a2", lost_steps=5)))
            await intake.booked(notice, "node-a2")
            forged = report(notice, "node-a2", lost_steps=10**6)
            after = f"{notice}-after"
            await publish_as(a1, "node-a1", "A", encode(forged), encode(report(after, "node-a1")))
            await intake.booked(after, "node-a1")
            rows = await asyncio.to_thread(intake.rows, notice)
            letters = await asyncio.to_thread(intake.dead_letters, since)
            own = intake.intake._store
            assert own is not None and own._client is None, "the intake opened the ledger"
    finally:
        reads.close()
        holder.close()
    assert rows == [{"node": "node-a2", "lost_steps": 5, "lost_tasks": None, "lost_seconds": None}]
    assert len(letters) == 1 and "names node 'node-a2' but was sent by 'node-a1'" in letters[0][1]
    assert reads.answered == {"rates": 0, "drain": 3, "query": 0}


async def test_a_10_kb_nested_report_does_not_crash_the_intake(
    private_nats: PrivateNats, ledger_dsn: str, pg_dsn: str
) -> None:
    """A 10 kB deeply nested report neither crashes the intake nor comes back after a restart."""
    notice = notice_id()
    nested = b'{"event": "drain_finished", "workloads": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    assert len(nested) > 10_000
    async with identities(private_nats, "agent-r1-node-a1", "agent-r1-node-a2") as [a1, a2]:
        for restart in range(2):
            async with drain_intake(private_nats, ledger_dsn, pg_dsn) as intake:
                since = intake.last_dead_letter()
                if restart == 0:
                    await publish_as(a1, "node-a1", "A", nested)
                real = f"{notice}-{restart}"
                await publish_as(a2, "node-a2", "A", encode(report(real, "node-a2")))
                await intake.booked(real, "node-a2")
                letters = await asyncio.to_thread(intake.dead_letters, since)
                assert not intake.task.done()
            if restart == 0:
                assert [r[:29] for _, r in letters] == ["refused: nested 5001 deep > 8"]
            else:  # acknowledged once refused: the restart does not meet it again
                assert letters == []


async def test_a_workloads_lost_steps_of_2_pow_63_does_not_crash_the_intake(
    private_nats: PrivateNats, intake: Intake
) -> None:
    """A workload's lost_steps of 2**63 (no node compromised) is refused, not a crash."""
    notice = notice_id()
    async with identities(private_nats, "agent-r1-node-a1", "agent-r1-node-a2") as [a1, a2]:
        since = intake.last_dead_letter()
        await publish_as(a1, "node-a1", "A", encode(report(notice, "node-a1", lost_steps=2**63)))
        await publish_as(a2, "node-a2", "A", encode(report(notice, "node-a2")))
        await intake.booked(notice, "node-a2")
        letters = await asyncio.to_thread(intake.dead_letters, since)
        assert [r["node"] for r in await asyncio.to_thread(intake.rows, notice)] == ["node-a2"]
    assert len(letters) == 1 and "lost_steps" in letters[0][1], letters


async def test_negative_huge_and_nan_lost_work_is_refused_not_stored(
    private_nats: PrivateNats, intake: Intake
) -> None:
    """Negative, huge, NaN and infinite counts, and non-numbers, are refused, never stored."""
    hostile: list[dict[str, Any]] = [
        {"lost_steps": -1},
        {"lost_steps": 10**15},
        {"lost_tasks": -3},
        {"lost_tasks": 10**12},
        {"lost_seconds": -0.5},
        {"lost_seconds": 1e300},
        {"lost_seconds": math.nan},
        {"lost_seconds": math.inf},
        {"lost_steps": True},
        {"lost_steps": "5"},
        {"lost_steps": 1.5},
    ]
    notices = [notice_id() for _ in hostile]
    last = notice_id()
    async with identities(private_nats, "agent-r1-node-a1") as [a1]:
        since = intake.last_dead_letter()
        bodies = [encode(report(n, "node-a1", **h)) for n, h in zip(notices, hostile, strict=True)]
        await publish_as(a1, "node-a1", "A", *bodies, encode(report(last, "node-a1")))
        await intake.booked(last, "node-a1")
        stored = [await asyncio.to_thread(intake.rows, n) for n in notices]
        letters = await asyncio.to_thread(intake.dead_letters, since)
    assert stored == [[]] * len(hostile)
    assert len(letters) == len(hostile), letters


async def test_an_oversized_report_is_refused_before_it_is_parsed(
    private_nats: PrivateNats, intake: Intake
) -> None:
    """A 300 kB report is refused by the stream (and would be by the intake), never booked."""
    notice, last = notice_id(), notice_id()
    big = encode(report(notice, "node-a1", detail="x" * 300_000))
    async with identities(private_nats, "agent-r1-node-a1", f"control-{REGION}") as [a1, control]:
        await publish_as(a1, "node-a1", "A", big, encode(report(last, "node-a1")))
        await intake.booked(last, "node-a1")
        assert await asyncio.to_thread(intake.rows, notice) == []
        with pytest.raises(Exception, match="message size exceeds maximum"):
            await control.nc.jetstream().publish("sco.r1.drain.A.node-a1", big, timeout=5)
    with pytest.raises(DrainEventError, match="oversized"):
        parse_event(big)


# --- JetStream consumers and inboxes -------------------------------------------------------


async def published_bundle(server: PrivateNats, tmp_path: Path, pg_dsn: str) -> str:
    """The region's bundle published as `sco contracts publish` does; its stream's name."""
    raw, trust, _ = signed_bundle(tmp_path, notice_regions=[REGION])
    (tmp_path / "bundle.json").write_bytes(raw)
    result = await asyncio.to_thread(
        runner.invoke,
        app,
        ["contracts", "publish", str(tmp_path / "bundle.json"), "--trust", str(trust)],
        env={
            "SCO_NATS_URL": server.url(f"control-{REGION}"),
            "SCO_REGION": REGION,
            "SCO_POSTGRES_DSN": pg_dsn,  # the audit trail
        },
    )
    assert result.exit_code == 0, result.output
    return f"OBJ_{bucket_for(REGION)}"


async def test_an_agent_cannot_delete_another_consumer_on_the_bundle_stream(
    private_nats: PrivateNats, tmp_path: Path, pg_dsn: str
) -> None:
    """An agent deletes a consumer of the bundle stream it does not own: refused."""
    stream = await published_bundle(private_nats, tmp_path, pg_dsn)
    async with identities(private_nats, f"control-{REGION}", "agent-r1-node-a1") as [control, a1]:
        js = control.nc.jetstream()
        await js.add_consumer(stream, ConsumerConfig(durable_name="sco-control-watch"))
        request = a1.nc.request(f"$JS.API.CONSUMER.DELETE.{stream}.sco-control-watch", b"", 1)
        with pytest.raises(nats.errors.Error):  # no answer: the server dropped the request
            await request
        await eventually_async(checked(a1.violations), timeout=10, what="the violation")
        assert (await js.consumer_info(stream, "sco-control-watch")).name == "sco-control-watch"
        await js.delete_consumer(stream, "sco-control-watch")


async def test_an_agent_cannot_create_unbounded_durable_consumers_on_the_bundle_stream(
    private_nats: PrivateNats, tmp_path: Path, pg_dsn: str
) -> None:
    """An agent creates 200 named durable consumers on the bundle stream: none is made, and
    the stream's consumers are capped and dropped once idle."""
    stream = await published_bundle(private_nats, tmp_path, pg_dsn)
    async with identities(private_nats, f"control-{REGION}", "agent-r1-node-a1") as [control, a1]:
        js = control.nc.jetstream()
        before = (await js.stream_info(stream)).state.consumer_count
        for i in range(200):
            config = json.dumps({"stream_name": stream, "config": {"durable_name": f"evil-{i}"}})
            for subject in (
                f"$JS.API.CONSUMER.CREATE.{stream}.evil-{i}",
                f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.evil-{i}",
            ):
                await a1.nc.publish(subject, config.encode(), reply=f"{agent_inbox('node-a1')}.x")
        # The one create left to it (ephemeral, server-named) may not outlive its reader.
        lasting = {"stream_name": stream, "config": {"inactive_threshold": 10**15}}
        reply = await a1.nc.request(
            f"$JS.API.CONSUMER.CREATE.{stream}", json.dumps(lasting).encode(), timeout=5
        )
        await server_has_seen(a1.nc)
        info = await js.stream_info(stream)
    assert "error" in json.loads(reply.data), reply.data
    assert info.state.consumer_count == before
    assert info.config.max_consumers == BUNDLE_MAX_CONSUMERS
    assert len(a1.violations()) >= 400


async def test_a_relay_or_operator_cannot_read_others_replies_on_the_inbox(
    private_nats: PrivateNats,
) -> None:
    """A relay and an operator subscribe to `_INBOX.>` and to another's inbox: refused."""
    async with identities(
        private_nats, f"operator-{REGION}", f"relay-{REGION}-A", f"relay-{REGION}-B"
    ) as [operator, relay_a, relay_b]:
        sniffed: list[Msg] = []

        async def keep(msg: Msg) -> None:
            sniffed.append(msg)

        await relay_b.nc.subscribe("_INBOX.>", cb=keep)
        await relay_b.nc.subscribe(f"{identity_inbox(f'operator-{REGION}')}.>", cb=keep)
        await operator.nc.subscribe("_INBOX.>", cb=keep)

        async def answer(msg: Msg) -> None:
            await msg.respond(b"for the operator only")

        await relay_a.nc.subscribe(reclaim_subject(REGION, "A"), cb=answer)
        await server_has_seen(relay_a.nc)
        reply = await operator.nc.request(reclaim_subject(REGION, "A"), b"{}", timeout=5)
        await eventually_async(
            checked(lambda: len(relay_b.violations()) >= 2 and operator.violations()),
            timeout=10,
            what="the subscription violations",
        )
        await server_has_seen(relay_b.nc)
    assert reply.data == b"for the operator only"  # its own inbox works
    assert reply.subject.startswith(identity_inbox(f"operator-{REGION}") + ".")
    assert sniffed == []


# --- the committed-capacity guard -----------------------------------------------------------


def instance(repo: FleetRepository, capacity: CapacityType) -> str:
    name = f"sco-r1-rt-{uuid.uuid4().hex[:8]}"
    repo.record_acquire(
        InstanceSpec(
            instance_id=name,
            region=REGION,
            pool_id=POOL,
            capacity_type=capacity,
            workload="llm-serving" if capacity is CapacityType.COMMITTED else "ci-runners",
            tier=1 if capacity is CapacityType.COMMITTED else 3,
        )
    )
    repo.record_event(name, EventKind.READY, provider_id=f"p-{name}")
    return name


@asynccontextmanager
async def relay_answering(
    server: PrivateNats, repo: FleetRepository, region: Region
) -> AsyncIterator[NoticeRelay]:
    """Hall A's relay answering reclaim requests on its own identity, as the process does."""
    async with identities(server, f"relay-{REGION}-A") as [relay_c]:
        relay = NoticeRelay(
            region=REGION,
            hall="A",
            lead=timedelta(seconds=region.notice_lead_seconds),
            repo=repo,
            provider=SimulatedCloud(region, clock=lambda: 0.0),
            js=relay_c.nc.jetstream(),
            signing_key=SigningKey.generate(),
        )
        await relay.ensure_stream()  # as the relay process makes it, on its own identity
        await relay_c.nc.subscribe(
            reclaim_subject(REGION, "A"), cb=request_handler(relay, _no_backlog)
        )
        await server_has_seen(relay_c.nc)
        yield relay


async def test_an_operator_publishing_straight_to_reclaim_cannot_bypass_force(
    private_nats: PrivateNats, fleet_repo: FleetRepository, region_r1: Region
) -> None:
    """An operator identity publishes a reclaim of committed capacity without the CLI: refused."""
    committed = instance(fleet_repo, CapacityType.COMMITTED)
    async with (
        relay_answering(private_nats, fleet_repo, region_r1),
        identities(private_nats, f"operator-{REGION}") as [operator],
    ):
        raw = json.dumps({"instances": [committed], "reason": "straight to NATS"}).encode()
        msg = await operator.nc.request(reclaim_subject(REGION, "A"), raw, timeout=10)
        refused = ReclaimReply.model_validate_json(msg.data)
        assert refused.noticed == [], refused
        still = fleet_repo.get_instance(committed)
        assert still is not None and still.state is InstanceState.ACTIVE
        forced = ReclaimRequest(instances=[committed], reason="forced", force=True)
        msg = await operator.nc.request(
            reclaim_subject(REGION, "A"), forced.model_dump_json().encode(), timeout=10
        )
        noticed = ReclaimReply.model_validate_json(msg.data)
    assert refused.error is not None and "refused without --force" in refused.error
    assert refused.refused_committed == [committed]
    assert noticed.noticed == [committed]  # with force, it goes through
    row = fleet_repo.get_instance(committed)
    assert row is not None and row.state is InstanceState.NOTICED


async def test_a_pool_reclaim_checks_instances_that_appear_after_the_cli_looked(
    private_nats: PrivateNats, fleet_repo: FleetRepository, region_r1: Region
) -> None:
    """A committed instance lands in the pool between `sco reclaim --pool`'s check and the
    relay's action: the relay refuses it and reclaims only the reclaimable one."""
    for row in fleet_repo.list_instances(REGION, [InstanceState.ACTIVE], hall="A", pool_id=POOL):
        fleet_repo.record_event(row.instance_id, EventKind.NOTICE, reason="earlier test")
    spot = instance(fleet_repo, CapacityType.RECLAIMABLE)
    # What the CLI checked: nothing committed in the pool. Then a floor's instance lands.
    assert not [
        r
        for r in fleet_repo.list_instances(REGION, [InstanceState.ACTIVE], hall="A", pool_id=POOL)
        if r.capacity_type is CapacityType.COMMITTED
    ]
    late = instance(fleet_repo, CapacityType.COMMITTED)
    async with (
        relay_answering(private_nats, fleet_repo, region_r1),
        identities(private_nats, f"operator-{REGION}") as [operator],
    ):
        request = ReclaimRequest(pool_id=POOL, reason="pool", requested_by="alice")
        msg = await operator.nc.request(
            reclaim_subject(REGION, "A"), request.model_dump_json().encode(), timeout=10
        )
        reply = ReclaimReply.model_validate_json(msg.data)
    left = fleet_repo.get_instance(late)
    assert left is not None and left.state is InstanceState.ACTIVE, reply
    assert (reply.noticed, reply.refused_committed) == ([spot], [late]), reply


# --- the fuzzer ------------------------------------------------------------------------------

_hostile_numbers = st.one_of(
    st.none(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=5),
)
_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
_workload = st.fixed_dictionaries(
    {
        "workload": st.one_of(st.text(max_size=300), _values),
        "contract": st.one_of(st.none(), st.text(max_size=140)),
        "action": st.one_of(st.text(max_size=70), _values),
        "result": st.one_of(st.sampled_from(["requeued", "checkpointed", "forced"]), _values),
        "lost_steps": _hostile_numbers,
        "lost_tasks": _hostile_numbers,
        "lost_seconds": _hostile_numbers,
    }
)
_times = st.one_of(
    st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat()),
    st.just(datetime.now(UTC).isoformat()),
    st.text(max_size=30),
)
_report = st.fixed_dictionaries(
    {
        "event": st.sampled_from(["drain_finished", "drain_finished", "notice_received"]),
        "notice_id": st.one_of(st.text(min_size=1, max_size=300), _values),
        "node": st.one_of(st.just("node-a1"), st.text(max_size=10), _values),
        "finished_at": _times,
        "workloads": st.one_of(st.lists(_workload, max_size=5), _values),
    },
    optional={"extra": _values},
)


@pytest.fixture(scope="module")
def fuzz_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgerStore]:
    store = LedgerStore(f"chdb://{tmp_path_factory.mktemp('fuzz-ledger') / 'ledger'}")
    yield store
    store.close()


@settings(
    derandomize=True,
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(body=_report)
def test_fuzzed_drain_reports_are_booked_within_bounds_or_refused(
    body: dict[str, Any], fuzz_store: LedgerStore
) -> None:
    """Any drain report is either refused with a reason or booked within bounds by ClickHouse."""
    data = json.dumps(body).encode()
    try:
        event = parse_event(data)
        rows = rows_from_drain(event, REGION, node="node-a1")
    except DrainEventError as exc:
        assert str(exc) and exc.kind
        return
    for row in rows:
        steps, tasks, seconds = row[9], row[10], row[11]
        assert steps is None or 0 <= steps <= MAX_LOST_STEPS
        assert tasks is None or 0 <= tasks <= MAX_LOST_TASKS
        assert seconds is None or (math.isfinite(seconds) and 0 <= seconds <= MAX_LOST_SECONDS)
        assert row[3] == "node-a1"
    assert insert_drain(fuzz_store, event, REGION, node="node-a1") == len(rows)


# --- the flood -------------------------------------------------------------------------------

FLOOD = 10_000


def _garbage(i: int) -> bytes:
    """Message `i` of the flood: malformed in one of several ways, or oversized."""
    kinds: list[bytes] = [
        b"\xff\xfe not even UTF-8 " + str(i).encode(),
        b"[" * 4000 + b"]" * 4000,
        b'{"event": "drain_finished", "notice_id": ' + b"9" * 5000 + b"}",
        encode(report(f"flood-{i}", "node-a2", lost_steps=10**6)),  # forged
        encode(report(f"flood-{i}", "node-a1", lost_steps=2**63)),
        b'{"event": "drain_finished", "workloads": {"a": NaN}}',
        b"null",
    ]
    if i % 100 == 0:
        return b'{"event": "drain_finished", "pad": "' + b"x" * 300_000 + b'"}'
    return kinds[i % len(kinds)]


def _readyz(port: int) -> tuple[int, float]:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            status = r.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError:
        status = 0
    return status, time.monotonic() - started


def _booked_nodes(env: dict[str, str]) -> dict[str, Any] | None:
    rows = runner.invoke(
        app, ["ledger", "lost-work", "--window", "1d", "--by", "node", "--json"], env=env
    )
    if rows.exit_code == 1 and "held by another process" in rows.output:
        return None  # the intake is writing: ask again
    assert rows.exit_code == 0, rows.output
    return {r["key"]: r for r in json.loads(rows.output)}


@pytest.mark.timeout(600)
async def test_a_flood_of_10000_malformed_and_oversized_messages_stalls_no_service(
    private_nats: PrivateNats,
    process_db: str,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    processes: list[Process],  # noqa: F811 - the fixture imported above
) -> None:
    """One node floods its subjects with 10,000 malformed and oversized messages: every
    service stays ready and another node's drain is booked meanwhile."""
    _, secret, _ = keys.generate(tmp_path / "notice-keys")
    ports = {name: free_port() for name in ("intake", "relay", "sim")}
    base = {
        **os.environ,
        "SCO_REGIONS_DIR": str(REGIONS_DIR),
        "SCO_DATA_DIR": str(tmp_path / "data"),
        "SCO_POSTGRES_DSN": process_db,
        "SCO_LEDGER_DSN": f"chdb://{tmp_path / 'ledger'}",
        "SCO_NOTICES__SIGNING_KEY_FILE": str(secret),
        "SCO_TEMPORAL__ADDRESS": f"127.0.0.1:{free_port()}",  # none: no worker tells it
        "SCO_DRAIN_INTAKE_HEALTH_PORT": str(ports["intake"]),
        "SCO_NOTICE_RELAY__HEALTH_PORT": str(ports["relay"]),
        "SCO_PROVIDER__SIMULATOR_HEALTH_PORT": str(ports["sim"]),
    }

    def as_user(user: str) -> dict[str, str]:
        return {**base, "SCO_NATS_URL": private_nats.url(user)}

    control, relay = as_user(f"control-{REGION}"), as_user(f"relay-{REGION}-A")
    processes.append(Process(control, tmp_path / "sim.log", "sim", "serve", "--region", REGION))
    processes.append(
        Process(control, tmp_path / "intake.log", "ledger", "book-drains", "--region", REGION)
    )
    processes.append(
        Process(relay, tmp_path / "relay.log", "notice-relay", "--region", REGION, "--hall", "A")
    )

    def all_ready() -> bool:
        for p in processes:
            assert p.proc.poll() is None, p.output()[-3000:]
        return all(_readyz(port)[0] == 200 for port in ports.values())

    await asyncio.to_thread(
        eventually, all_ready, timeout=120, what="every service ready", retrying=()
    )
    samples: list[tuple[str, int, float]] = []
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            for name, port in ports.items():
                status, took = await asyncio.to_thread(_readyz, port)
                samples.append((name, status, took))
            with contextlib.suppress(TimeoutError):
                # sleep is the behaviour under test: readiness sampled every 100 ms
                await asyncio.wait_for(stop.wait(), 0.1)

    notice = notice_id()
    async with identities(private_nats, "agent-r1-node-a1", "agent-r1-node-a2") as [a1, a2]:
        watcher = asyncio.create_task(watch())
        started = time.monotonic()
        for i in range(FLOOD):
            subject = f"sco.{REGION}.drain.A.node-a1"
            if i % 50 == 1:  # its notice subject too: refused by the server
                subject = notice_subject(REGION, "A", "node-a1")
            await a1.nc.publish(subject, _garbage(i))
            if i == FLOOD // 2:  # a real drain on another node, in the middle of it
                await a2.nc.publish(
                    f"sco.{REGION}.drain.A.node-a2", encode(report(notice, "node-a2"))
                )
        await server_has_seen(a1.nc)
        await server_has_seen(a2.nc)
        published = time.monotonic() - started

        async def booked() -> dict[str, Any] | None:
            by = await asyncio.to_thread(_booked_nodes, base)
            return by if by is not None and "node-a2" in by else None

        by_node = await eventually_async(
            booked, timeout=240, what="node-a2's drain booked", every=0.5, retrying=()
        )
        booked_after = time.monotonic() - started
        async with identities(private_nats, f"control-{REGION}") as [ctl]:

            async def consumed() -> bool:
                info = await ctl.nc.jetstream().consumer_info(drain_stream(REGION), DURABLE)
                return bool(info.num_pending == 0 and info.num_ack_pending == 0)

            await eventually_async(consumed, timeout=240, what="the flood consumed", every=0.5)
        drained = time.monotonic() - started
        stop.set()
        await watcher
    with psycopg.connect(process_db) as conn:
        parked = conn.execute(
            "SELECT count(*) FROM dead_letters WHERE source = 'drain' AND key = 'node-a1'"
        ).fetchone()
    not_ready = [s for s in samples if s[1] != 200]
    worst = max(took for _, _, took in samples)
    figures = {
        "flood": FLOOD,
        "published_s": round(published, 2),
        "real_drain_booked_s": round(booked_after, 2),
        "flood_consumed_s": round(drained, 2),
        "readyz_samples": len(samples),
        "readyz_worst_ms": round(worst * 1000, 1),
        "dead_letters_parked": parked[0] if parked else None,
    }
    print(json.dumps(figures))  # the report's figures (pytest -s)
    assert not_ready == [], not_ready[:10]
    assert by_node["node-a2"]["lost_steps"] == 5 and "node-a1" not in by_node
    assert parked is not None and 0 < parked[0] <= DEAD_LETTERS_PER_NODE
    assert worst < 5.0, figures
    for p in processes:
        assert p.proc.poll() is None, p.output()[-3000:]
