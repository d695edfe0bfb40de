"""The secure profile of the region in a box (`sco dev up --profile secure`), one region with
its processes: an acquisition runs end to end through the box's worker on Temporal behind
nginx's mutual TLS, NATS with mapped certificates and TLS-only PostgreSQL, and its events
reach Kafka through nginx's mutual TLS in front of tansu; every TLS listener refuses a
plaintext client, and NATS, Temporal, PostgreSQL and Kafka refuse a certificate of another CA
(and NATS one of the box's CA that maps to no user).

One box for the module: bringing it up is the expensive part (~15 s)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import struct
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient
from temporalio.client import Client
from temporalio.service import TLSConfig

from activities.kafka import ensure_topics, kafka_answers, producer_config
from tests.support.secure_box_env import (
    need_servers,
    operator_settings,
    sco_as_operator,
    secure_box_up,
)
from tests.support.wait import eventually, eventually_async
from workers.client_security import kafka_config, nats_options, postgres_conninfo
from workers.devbox.box import Box
from workers.devbox.pki import BoxCA, Issued, certificate_identity
from workers.devbox.process import DevboxError
from workers.devbox.secure import OPERATOR_KIND, SecureProfile
from workers.devbox.services import ChildProcessService
from workers.settings import Settings
from workers.temporal_connect import connect
from workflows.acquisition.models import AcquisitionInput, AcquisitionState, LaunchItem
from workflows.acquisition.workflow import AcquisitionWorkflow

pytestmark = [pytest.mark.devbox, pytest.mark.timeout(150)]


@dataclass(frozen=True)
class SecureBox:
    env: dict[str, str]
    profile: SecureProfile
    operator: Settings  # what `sco` uses: the operator's certificate
    operator_file: Path


@pytest.fixture(scope="module")
def secure_box() -> Iterator[SecureBox]:
    need_servers()
    with secure_box_up("secure-box", with_workers=True) as (box, env):
        assert box.secure is not None
        operator_file = Path(box.operator_settings_files()["r1"])
        yield SecureBox(env, box.secure, operator_settings(operator_file), operator_file)


def _sco(box: SecureBox, *args: str) -> str:
    return sco_as_operator(box.operator_file, *args, timeout=60)


def test_an_acquisition_runs_through_the_tls_temporal_and_status_names_each_listener(
    secure_box: SecureBox,
) -> None:
    status = {s["name"]: s for s in json.loads(_sco(secure_box, "dev", "status", "--json"))}
    assert all(s["healthy"] and s["profile"] == "secure" for s in status.values()), status
    for name in ("postgres", "nats", "temporal", "kafka"):
        assert status[name]["mode"] == "managed" and status[name]["transport"].startswith(
            "TLS only"
        ), status[name]
    # What is not TLS says so: the dev server and the tansu broker nginx passes to, both on
    # loopback (neither can serve TLS).
    for name in ("temporal-backend", "kafka-backend"):
        assert status[name]["mode"] == "managed", status[name]
        assert status[name]["transport"].startswith("plaintext, loopback"), status[name]

    async def acquire() -> tuple[AcquisitionState, int]:
        client = await connect(secure_box.operator, "r1")  # through nginx, with a certificate
        contract = f"sec-{uuid.uuid4().hex[:6]}"
        item = LaunchItem(pool_id="r1.A.gp.l", hall="A", flavor="gp.l", instances=2, units=2)
        handle = await client.start_workflow(
            AcquisitionWorkflow.run,
            AcquisitionInput(region="r1", contract=contract, tier=2, items=[item]),
            id=f"acq-{contract}",
            task_queue=secure_box.operator.temporal.task_queue("r1"),
        )
        result = await asyncio.wait_for(handle.result(), 60)
        return result.progress.state, result.progress.active

    state, active = asyncio.run(acquire())
    assert state is AcquisitionState.COMPLETED and active == 2

    # The box's outbox relay published the acquisition's events to Kafka over mutual TLS
    # (nginx in front of tansu): every outbox row is stamped sent, none dead-lettered.
    def relayed() -> tuple[int, int] | None:
        with psycopg.connect(postgres_conninfo(secure_box.operator)) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE sent_at IS NOT NULL), "
                "count(*) FILTER (WHERE sent_at IS NULL) FROM outbox"
            ).fetchone()
        assert row is not None
        return (int(row[0]), int(row[1])) if row[0] and not row[1] else None

    sent, unsent = eventually(relayed, timeout=30, what="the outbox relayed over TLS Kafka")
    assert sent > 0 and unsent == 0

    # ... and the box's ledger consumer read them back over mutual TLS into the ledger.
    (ledger,) = [
        s.targets[0].port
        for s in Box(Settings()).services(workers=True)
        if isinstance(s, ChildProcessService) and s.name == "ledger-consumer"
    ]

    def rows_written() -> float | None:
        with urllib.request.urlopen(f"http://127.0.0.1:{ledger}/metrics", timeout=5) as r:
            text = r.read().decode()
        n = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("sco_ledger_rows_written_total{")
        )
        return n or None

    assert eventually(rows_written, timeout=30, what="the ledger consumer's rows") > 0

    # The box's worker wrote fleet state over TLS with its certificate and the password file.
    with psycopg.connect(postgres_conninfo(secure_box.operator)) as conn:
        row = conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
    assert row == (True,)


def test_every_key_is_private_and_every_certificate_names_its_process(
    secure_box: SecureBox,
) -> None:
    pki = secure_box.profile.root / "pki"
    keys = sorted(pki.glob("*.key"))
    assert keys and all(k.stat().st_mode & 0o777 == 0o600 for k in keys), keys
    assert (secure_box.profile.root / "secrets" / "postgres.password").stat().st_mode & 0o777 == (
        0o600
    )
    worker_toml = secure_box.profile.root / "settings" / "r1-worker.toml"
    relay_toml = secure_box.profile.root / "settings" / "r1-notice-relay-A.toml"
    assert 'user = "control-r1"' in worker_toml.read_text()
    assert 'user = "relay-r1-A"' in relay_toml.read_text()
    assert certificate_identity(pki / "client-r1-worker.crt") == ["spiffe://sco/r1/worker"]
    assert certificate_identity(pki / "client-r1-notice-relay-A.crt") == [
        "spiffe://sco/r1/notice-relay/A"
    ]


def _raw_exchange(port: int, send: bytes) -> bytes:
    """What a plaintext client gets back for `send` until the server closes or goes quiet."""
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
        with contextlib.suppress(TimeoutError):
            got += sock.recv(4096)  # NATS greets first; the others wait for the client
        try:
            sock.sendall(send)
            while chunk := sock.recv(4096):
                got += chunk
        except (TimeoutError, ConnectionResetError, BrokenPipeError):
            pass
    return got


def _kafka_api_versions() -> bytes:
    """A Kafka ApiVersions v0 request, correlation id 7, as a plaintext client sends it."""
    body = struct.pack(">hhih", 18, 0, 7, 5) + b"probe"
    return struct.pack(">i", len(body)) + body


def _kafka_answered(got: bytes) -> bool:
    """A Kafka response to `_kafka_api_versions`: a size, then correlation id 7."""
    return len(got) >= 8 and got[4:8] == struct.pack(">i", 7)


def _listening_on(port: int) -> set[str]:
    """The local addresses a TCP socket listens on at `port` (/proc/net/tcp{,6})."""
    out: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, hexport = local.rsplit(":", 1)
                if state == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                    raw = bytes.fromhex(addr)
                    if len(raw) == 4:
                        out.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
                    else:  # four little-endian words
                        words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                        out.add(socket.inet_ntop(socket.AF_INET6, words))
    return out


def _kafka_port(box: SecureBox) -> int:
    return int(box.profile.kafka_address.rsplit(":", 1)[1])


def test_every_tls_listener_refuses_plaintext(secure_box: SecureBox) -> None:
    p = secure_box.profile
    # Kafka: nginx's TLS listener never passes a plaintext request on to tansu ...
    got = _raw_exchange(_kafka_port(secure_box), _kafka_api_versions())
    assert not _kafka_answered(got), got
    # ... which does answer that very request, on loopback only (nginx's upstream).
    assert _kafka_answered(_raw_exchange(p.kafka_backend_port, _kafka_api_versions()))
    assert _listening_on(p.kafka_backend_port) == {"127.0.0.1"}
    # A plaintext Kafka client gets no metadata.
    assert not kafka_answers(p.kafka_address, timeout=3)
    # NATS: the greeting demands TLS; a plaintext CONNECT never gets its PONG.
    got = _raw_exchange(p.nats_port, b"CONNECT {}\r\nPING\r\n")
    assert b'"tls_required":true' in got and b"PONG" not in got, got
    # Temporal's nginx: an HTTP/1 hello is answered with a refusal, never passed on.
    got = _raw_exchange(p.temporal_port, b"GET / HTTP/1.0\r\n\r\n")
    assert b"400" in got and b"plain HTTP request was sent to HTTPS port" in got, got
    # PostgreSQL: no TLS, no entry (the right password and all).
    plain = psycopg.conninfo.make_conninfo(
        postgres_conninfo(secure_box.operator), sslmode="disable", connect_timeout=5
    )
    with pytest.raises(psycopg.OperationalError, match="no encryption"):
        psycopg.connect(plain).close()
    # PostgreSQL: TLS but no client certificate.
    no_cert = psycopg.conninfo.make_conninfo(
        postgres_conninfo(secure_box.operator), sslcert="", sslkey="", connect_timeout=5
    )
    with pytest.raises(psycopg.OperationalError, match="certificate"):
        psycopg.connect(no_cert).close()

    async def insecure_grpc() -> None:
        await asyncio.wait_for(Client.connect(f"127.0.0.1:{p.temporal_port}"), 15)

    with pytest.raises(RuntimeError):
        asyncio.run(insecure_grpc())


def _stranger(tmp: Path, kind: str = "worker") -> tuple[Path, Issued]:
    """A certificate with the worker's very SPIFFE ID, from a CA the box never trusted."""
    other = BoxCA(tmp / "other-ca", name="not the box's CA")
    return other.ca_file, other.issue(kind, "r1")


async def _nats_with(box: SecureBox, cert: Issued) -> None:
    tls = ssl.create_default_context(cafile=str(box.profile.issuer.ca_file))
    tls.load_cert_chain(str(cert.cert_path), str(cert.key_path))

    async def quiet(_exc: Exception) -> None:
        """The refusal is asserted below; nats-py would log each attempt."""

    nc = await nats.connect(
        box.operator.nats_url,
        tls=tls,
        connect_timeout=3,
        allow_reconnect=False,
        max_reconnect_attempts=0,
        error_cb=quiet,
    )
    await nc.close()


def test_nats_temporal_and_postgres_refuse_another_cas_certificate(
    secure_box: SecureBox, tmp_path: Path
) -> None:
    _, stranger = _stranger(tmp_path)
    with pytest.raises(Exception) as refused:  # nats-py raises several unrelated types
        asyncio.run(_nats_with(secure_box, stranger))
    assert isinstance(refused.value, (OSError, nats.errors.Error)), repr(refused.value)

    tls = TLSConfig(
        server_root_ca_cert=secure_box.profile.issuer.ca_file.read_bytes(),
        domain="localhost",
        client_cert=stranger.cert_path.read_bytes(),
        client_private_key=stranger.key_path.read_bytes(),
    )

    async def temporal() -> None:
        client = await asyncio.wait_for(
            Client.connect(secure_box.operator.temporal.address, tls=tls), 15
        )
        await asyncio.wait_for(client.service_client.check_health(), 10)

    with pytest.raises(RuntimeError):
        asyncio.run(temporal())

    # PostgreSQL too: the right password, TLS, but a certificate the box's CA did not sign.
    stranger_pg = psycopg.conninfo.make_conninfo(
        postgres_conninfo(secure_box.operator),
        sslcert=str(stranger.cert_path),
        sslkey=str(stranger.key_path),
        connect_timeout=5,
    )
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(stranger_pg).close()

    # Kafka too: TLS, the box's CA trusted, but a certificate the box's CA did not sign.
    stranger_kafka = {
        **kafka_config(secure_box.operator.kafka),
        "ssl.certificate.location": str(stranger.cert_path),
        "ssl.key.location": str(stranger.key_path),
    }
    assert not kafka_answers(secure_box.profile.kafka_address, 3, security=stranger_kafka)

    # The operator's own certificate is let in, with the operator's permissions only.
    async def operator() -> None:
        nc = await nats.connect(
            secure_box.operator.nats_url,
            connect_timeout=3,
            allow_reconnect=False,
            **nats_options(secure_box.operator),
        )
        await nc.close()

    asyncio.run(operator())


def test_a_relays_certificate_gets_its_halls_permissions_only(secure_box: SecureBox) -> None:
    """The certificate's SPIFFE ID picks the NATS user: hall A's relay may publish hall A's
    notices, and the server refuses the same publish for hall B."""
    relay_a = secure_box.profile.issuer.issue("notice-relay/A", "r1")
    tls = ssl.create_default_context(cafile=str(secure_box.profile.issuer.ca_file))
    tls.load_cert_chain(str(relay_a.cert_path), str(relay_a.key_path))

    async def publish() -> list[str]:
        errors: list[str] = []

        async def seen(exc: Exception) -> None:
            errors.append(str(exc))

        nc = await nats.connect(
            secure_box.operator.nats_url, tls=tls, allow_reconnect=False, error_cb=seen
        )
        try:
            await nc.publish("sco.r1.notice.A.probe", b"{}")
            await nc.flush(timeout=5)
            assert errors == []
            await nc.publish("sco.r1.notice.B.probe", b"{}")
            await nc.flush(timeout=5)

            async def refused() -> bool:
                return bool(errors)  # the server's -ERR may come after its PONG

            await eventually_async(
                refused, timeout=5, what="the server's permissions violation", retrying=()
            )
        finally:
            await nc.close()
        return errors

    errors = asyncio.run(publish())
    assert any("permissions violation" in e.lower() for e in errors), errors


def test_nats_refuses_a_box_certificate_that_maps_to_no_user(secure_box: SecureBox) -> None:
    unmapped = secure_box.profile.issuer.issue("intruder", "r1")
    assert OPERATOR_KIND != "intruder"
    with pytest.raises(Exception) as refused:
        asyncio.run(_nats_with(secure_box, unmapped))
    assert isinstance(refused.value, (OSError, nats.errors.Error)), repr(refused.value)


def test_a_running_secure_box_keeps_its_profile(secure_box: SecureBox) -> None:
    with pytest.raises(DevboxError, match="runs the secure profile"):
        Box(Settings(), profile="default")
    assert Box(Settings()).profile == "secure"  # status and down read it from the state


def test_kafka_round_trip_over_mutual_tls_and_a_client_without_a_certificate_is_refused(
    secure_box: SecureBox,
) -> None:
    """A producer and a consumer with the operator's certificate, through nginx to tansu
    and back (tansu's metadata sends every broker call to nginx's TLS address); the same
    client without its certificate gets nothing."""
    k = secure_box.operator.kafka
    security = kafka_config(k)
    assert security["security.protocol"] == "SSL" and "ssl.certificate.location" in security
    bootstrap = k.bootstrap_servers
    topic = f"sco.tls-probe.{uuid.uuid4().hex[:8]}"
    assert ensure_topics(
        bootstrap, [topic], partitions=1, replication_factor=1, security=security
    ) == [topic]
    value = uuid.uuid4().bytes
    producer = Producer({**producer_config(bootstrap), **security})
    delivered: list[KafkaError | None] = []
    producer.produce(topic, key=b"k", value=value, on_delivery=lambda e, _m: delivered.append(e))
    assert producer.flush(15) == 0 and delivered == [None], delivered
    consumer = Consumer(
        {
            **security,
            "bootstrap.servers": bootstrap,
            "group.id": f"tls-probe-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    try:
        consumer.subscribe([topic])

        def received() -> bytes | None:
            msg = consumer.poll(1.0)
            return msg.value() if msg is not None and msg.error() is None else None

        assert eventually(received, timeout=40, what="the message back over TLS") == value
    finally:
        consumer.close()
    # Every broker the metadata names is nginx's TLS listener, never tansu's own port.
    brokers = (
        AdminClient({**security, "bootstrap.servers": bootstrap}).list_topics(timeout=10).brokers
    )
    assert {f"{b.host}:{b.port}" for b in brokers.values()} == {bootstrap}

    # The same client without a certificate: nginx refuses the handshake.
    no_cert = {
        key: v
        for key, v in security.items()
        if key not in ("ssl.certificate.location", "ssl.key.location")
    }
    assert not kafka_answers(bootstrap, timeout=3, security=no_cert)
    refused = Producer(
        {**producer_config(bootstrap, message_timeout_ms=3000), **no_cert, "log_level": 0}
    )
    errors: list[KafkaError | None] = []
    refused.produce(topic, value=b"x", on_delivery=lambda e, _m: errors.append(e))
    refused.flush(10)
    assert len(errors) == 1 and errors[0] is not None, errors
    del refused  # destroyed now: it would retry the refused handshake until collected
