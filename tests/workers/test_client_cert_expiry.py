"""Every client that loads a client certificate exports its notAfter
(`sco_client_certificate_not_after_timestamp_seconds{setting}`), which
SCOClientCertificateExpiring compares with the renewal window; a renewed file shows at the
next client."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from prometheus_client import REGISTRY

from workers.client_security import kafka_config, nats_options, postgres_conninfo
from workers.settings import Settings
from workers.temporal_connect import temporal_tls

METRIC = "sco_client_certificate_not_after_timestamp_seconds"


def _self_signed(d: Path, hours: float) -> tuple[Path, Path, datetime]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sco-control-r1")])
    now = datetime.now(UTC).replace(microsecond=0)
    not_after = now + timedelta(hours=hours)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(not_after)
        .sign(key, hashes.SHA256())
    )
    d.mkdir(parents=True, exist_ok=True)
    (d / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return d / "tls.crt", d / "tls.key", not_after


def _tls(d: Path) -> dict[str, object]:
    return {
        "enabled": True,
        "ca_file": d / "ca.crt",
        "client_cert_file": d / "tls.crt",
        "client_key_file": d / "tls.key",
    }


def _value(setting: str) -> float | None:
    return REGISTRY.get_sample_value(METRIC, {"setting": setting})


def test_each_client_exports_its_certificates_not_after(tmp_path: Path) -> None:
    cert, key, not_after = _self_signed(tmp_path / "tls", hours=10)
    s = Settings(
        nats_tls=_tls(tmp_path / "tls"),
        temporal={"tls": _tls(tmp_path / "tls")},
        kafka={"tls": _tls(tmp_path / "tls")},
        postgres={"sslmode": "verify-full", "sslcert_file": cert, "sslkey_file": key},
    )
    nats_options(s)
    temporal_tls(s)
    kafka_config(s.kafka)
    postgres_conninfo(s)
    for setting in (
        "nats_tls.client_cert_file",
        "temporal.tls.client_cert_file",
        "kafka.tls.client_cert_file",
        "postgres.sslcert_file",
    ):
        assert _value(setting) == not_after.timestamp(), setting
    # cert-manager renews the file: the next client made shows the new notAfter.
    _, _, renewed = _self_signed(tmp_path / "tls", hours=24)
    nats_options(s)
    assert _value("nats_tls.client_cert_file") == renewed.timestamp()
