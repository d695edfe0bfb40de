"""Revocation on every mutual-TLS listener of the secure box (decision 0038), on a real box:
`sco dev certs revoke` of a process's identity (its certificate from OpenBao) and of a
node's (from the box CA) puts their serials in their CAs' CRLs, and the box's PostgreSQL and
nginx (Temporal, and Kafka: decision 0036) reload them: a new connection with the revoked
certificate is refused by all three, while another identity's live connections keep working
and it connects anew. Revoking again changes nothing, and the CRL outlives a restart of the
box."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from temporalio.client import Client
from temporalio.service import TLSConfig

from activities.kafka import kafka_answers
from tests.support.secure_box_env import (
    need_servers,
    operator_settings,
    sco_as_operator,
    secure_box_up,
)
from workers.client_security import kafka_config, postgres_conninfo
from workers.devbox.box import Box
from workers.devbox.crl import box_ca_crl, issuer_cn, read_certificate, serial_text
from workers.devbox.pki import BoxCA, Issued
from workers.devbox.secure import SecureProfile
from workers.openbao.client import BaoClient, BaoRequestError
from workers.settings import Settings

pytestmark = [pytest.mark.devbox, pytest.mark.timeout(240)]
REVOKED = "spiffe://sco/r1/contract-sync"
OTHER = "drain-intake"


@dataclass
class CrlBox:
    profile: SecureProfile
    operator: Settings
    operator_file: Path


@pytest.fixture(scope="module")
def box() -> Iterator[CrlBox]:
    need_servers()
    with secure_box_up("crl-box") as (b, _):
        assert b.secure is not None
        operator_file = Path(b.operator_settings_files()["r1"])
        yield CrlBox(b.secure, operator_settings(operator_file), operator_file)


def _sco(box: CrlBox, *args: str) -> str:
    return sco_as_operator(box.operator_file, *args)


def _pg(box: CrlBox, cert: Issued) -> psycopg.Connection[tuple[object, ...]]:
    info = psycopg.conninfo.make_conninfo(
        postgres_conninfo(box.operator),
        dbname="postgres",
        sslcert=str(cert.cert_path),
        sslkey=str(cert.key_path),
        connect_timeout=5,
    )
    return psycopg.connect(info)


def _tls(box: CrlBox, cert: Issued) -> TLSConfig:
    return TLSConfig(
        server_root_ca_cert=box.profile.issuer.ca_file.read_bytes(),
        domain="localhost",
        client_cert=cert.cert_path.read_bytes(),
        client_private_key=cert.key_path.read_bytes(),
    )


async def _temporal(box: CrlBox, cert: Issued) -> Client:
    client = await asyncio.wait_for(
        Client.connect(box.operator.temporal.address, tls=_tls(box, cert)), 15
    )
    await asyncio.wait_for(client.service_client.check_health(), 10)
    return client


def _kafka_with(box: CrlBox, cert: Issued) -> bool:
    """Does Kafka's nginx (decision 0036) let `cert` in: metadata over mutual TLS."""
    security = {
        **kafka_config(box.operator.kafka),
        "ssl.certificate.location": str(cert.cert_path),
        "ssl.key.location": str(cert.key_path),
    }
    return kafka_answers(box.operator.kafka.bootstrap_servers, timeout=5, security=security)


def _refused_by_temporal(box: CrlBox, cert: Issued) -> None:
    with pytest.raises(RuntimeError):
        asyncio.run(_temporal(box, cert))


def test_a_revoked_certificate_is_refused_by_postgres_and_nginx_another_is_not(
    box: CrlBox,
) -> None:
    p = box.profile
    revoked = p.issuer.issue("contract-sync", "r1")  # from OpenBao: r1's intermediate
    other = p.issuer.issue(OTHER, "r1")
    cert = read_certificate(revoked.cert_path)
    assert cert is not None and "intermediate" in issuer_cn(cert)
    _pg(box, revoked).close()  # let in before
    assert _kafka_with(box, revoked)
    token_file = p.overrides("contract-sync", "r1")["openbao"]["token_file"]
    token = Path(token_file).read_text().strip()

    async def scenario() -> None:
        live_other = await _temporal(box, other)
        with _pg(box, other) as live_pg:
            t0 = time.monotonic()
            out = _sco(box, "dev", "certs", "revoke", REVOKED, "--reason", "test")
            print(f"sco dev certs revoke (NATS, PostgreSQL, nginx): {time.monotonic() - t0:.2f} s")
            assert "PostgreSQL (pid" in out and "nginx (pid" in out, out
            # New connections with the revoked certificate: refused by both.
            with pytest.raises(psycopg.OperationalError, match="revoked"):
                _pg(box, revoked).close()
            with pytest.raises(RuntimeError):
                await _temporal(box, revoked)
            assert not _kafka_with(box, revoked)  # and by Kafka's nginx
            assert "nginx for Kafka (pid" in " ".join(out.split()), out  # the console wraps
            # The other identity's live connections keep working; new ones too.
            assert live_pg.execute("SELECT 1").fetchone() == (1,)
            await asyncio.wait_for(live_other.service_client.check_health(), 10)
            _pg(box, other).close()
            await _temporal(box, other)
            assert _kafka_with(box, other)

    asyncio.run(scenario())

    # Its token is revoked too: its process can renew no more.
    assert not Path(token_file).exists()
    bao = BaoClient(box.operator.openbao.address, token=token, ca_file=p.issuer.bao_ca_file)  # type: ignore[attr-defined]
    with pytest.raises(BaoRequestError, match="HTTP 403"):
        bao.write("pki_r1/issue/contract-sync", {"uri_sans": REVOKED})

    listed = json.loads(_sco(box, "dev", "certs", "list", "--json"))
    row = next(r for r in listed["revoked"] if r["identity"] == REVOKED)
    assert serial_text(cert.serial_number) in {c["serial"] for c in row["certificates"]}, row

    # Again: nothing new to record, nothing to reload.
    again = _sco(box, "dev", "certs", "revoke", REVOKED)
    assert "PostgreSQL has this CRL" in again and "nginx has this CRL" in again, again
    assert json.loads(_sco(box, "dev", "certs", "list", "--json"))["revoked"] == listed["revoked"]
    with pytest.raises(psycopg.OperationalError, match="revoked"):
        _pg(box, revoked).close()

    # A node's certificate is the box CA's: its own CRL lists it.
    _sco(box, "dev", "certs", "node", "n9", "--hall", "A")
    node = p.issuer.issue("node/n9", "r1")
    _pg(box, node).close()
    _sco(box, "dev", "certs", "revoke", "spiffe://sco/r1/node/n9")
    with pytest.raises(psycopg.OperationalError, match="revoked"):
        _pg(box, node).close()
    _refused_by_temporal(box, node)
    status = {s["name"]: s for s in json.loads(_sco(box, "dev", "status", "--json"))}
    assert "2 revoked" in status["postgres"]["detail"], status["postgres"]
    # Refreshing the CRL with nothing new reloads nothing; a CRL for each CA of the bundle.
    refreshed = _sco(box, "dev", "certs", "crl")
    cas = p.issuer.ca_file.read_text().count("BEGIN CERTIFICATE")
    assert f"{cas} CAs, 2 revoked" in refreshed, refreshed
    assert "PostgreSQL has this CRL" in refreshed and "nginx has this CRL" in refreshed


def test_the_crl_outlives_a_restart(box: CrlBox) -> None:
    revoked = box.profile.certificate_files("contract-sync", "r1")
    other = box.profile.issuer.issue(OTHER, "r1")
    Box(Settings()).down()
    Box(Settings(), profile="secure").up()
    # Never issued anew: its settings name the revoked certificate and no OpenBao token.
    settings = box.profile.overrides("contract-sync", "r1")
    assert "identity" not in settings and "openbao" not in settings
    assert settings["postgres"]["sslcert_file"] == str(revoked.cert_path)
    with pytest.raises(psycopg.OperationalError, match="revoked"):
        _pg(box, revoked).close()
    _refused_by_temporal(box, revoked)
    _pg(box, other).close()
    asyncio.run(_temporal(box, other))


def _verify(ca: Path, crl: Path | None, cert: Path) -> str:
    """OpenSSL's verdict with CRL checks on the whole chain, as nginx and PostgreSQL ask."""
    args = ["openssl", "verify", "-CAfile", str(ca), str(cert)]
    if crl is not None:
        args[2:2] = ["-crl_check_all", "-CRLfile", str(crl)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=30)
    return out.stdout + out.stderr


def test_the_crl_file_holds_a_crl_for_every_ca_and_a_missing_one_refuses_all(
    tmp_path: Path,
) -> None:
    """Box CA only (no OpenBao): the node's certificate verifies with the CRL file, is
    revoked after `revoke`; a CRL file without its CA's CRL refuses it whatever it says."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl missing")
    p = SecureProfile(Settings(data_dir=tmp_path / "sco", box={"secure_cert_source": "box-ca"}))
    p.enrol_node("r1", "A", "n1")
    n1 = p.issuer.issue("node/n1", "r1")
    assert p.write_crl() is True and p.write_crl() is False  # the same CRL again
    assert _verify(p.issuer.ca_file, p.crl_file, n1.cert_path).strip().endswith("OK")
    other = tmp_path / "other-ca.crl"  # a CRL, but of another CA only
    other.write_bytes(box_ca_crl(BoxCA(tmp_path / "other"), [], None))
    assert "unable to get certificate CRL" in _verify(p.issuer.ca_file, other, n1.cert_path)
    p.revoke("spiffe://sco/r1/node/n1", "lost")
    assert "certificate revoked" in _verify(p.issuer.ca_file, p.crl_file, n1.cert_path)
    [row] = p.identities.revoked()
    cert = read_certificate(n1.cert_path)
    assert cert is not None
    assert [c.serial for c in row.certificates] == [serial_text(cert.serial_number)]
    assert "1 CAs, 1 revoked" in p.crl_detail()
