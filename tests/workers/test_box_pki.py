"""The secure box's certificate issuer and the settings files it writes: no servers."""

from __future__ import annotations

import datetime as dt
import json
import tomllib
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from workers.devbox import pki
from workers.devbox.pki import BoxCA, CertificateIssuer, certificate_identity
from workers.devbox.process import DevboxError
from workers.devbox.secure import SecureProfile, nats_role
from workers.devbox.tls_servers import nats_tls_config
from workers.settings import Settings

pytestmark = pytest.mark.timeout(60)


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_a_client_certificate_carries_its_spiffe_id_and_keys_are_private(tmp_path: Path) -> None:
    issuer: CertificateIssuer = BoxCA(tmp_path / "pki")  # the interface OpenBao will fill
    issued = issuer.issue("notice-relay/A", "r1")
    assert certificate_identity(issued.cert_path) == ["spiffe://sco/r1/notice-relay/A"]
    cert = _cert(issued.cert_path)
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert cert.issuer == _cert(issuer.ca_file).subject
    for key in (tmp_path / "pki").glob("*.key"):
        assert key.stat().st_mode & 0o777 == 0o600, key
    assert (tmp_path / "pki").stat().st_mode & 0o777 == 0o700


def test_a_server_certificate_names_its_hosts(tmp_path: Path) -> None:
    issued = BoxCA(tmp_path).issue_server("nats", ["localhost", "127.0.0.1"])
    san = _cert(issued.cert_path).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert san.value.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in san.value.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_a_current_certificate_is_kept_and_one_near_expiry_is_issued_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = BoxCA(tmp_path)
    first = ca.issue("worker", "r1").cert_path.read_bytes()
    assert ca.issue("worker", "r1").cert_path.read_bytes() == first
    monkeypatch.setattr(pki, "RENEW_WITHIN", pki.LIFETIME + dt.timedelta(days=1))
    assert ca.issue("worker", "r1").cert_path.read_bytes() != first


def test_each_process_gets_a_settings_file_with_its_own_certificate_and_nats_user(
    tmp_path: Path,
) -> None:
    # The box CA as the source (no OpenBao here; OpenBao's: tests/workers/test_cert_renewal.py).
    settings = Settings(data_dir=tmp_path / "sco", box={"secure_cert_source": "box-ca"})
    profile = SecureProfile(settings)
    env = profile.child_env("notice-relay", "r1", "B")
    doc = tomllib.loads(Path(env["SCO_CONFIG"]).read_text())
    relay = Settings(**doc)  # the file alone is valid settings
    assert relay.nats_auth.user == "relay-r1-B" and relay.nats_auth.password_file is None
    assert relay.nats_tls.client_cert_file is not None
    assert certificate_identity(relay.nats_tls.client_cert_file) == [
        "spiffe://sco/r1/notice-relay/B"
    ]
    assert relay.temporal.tls.client_cert_file == relay.nats_tls.client_cert_file
    assert relay.postgres.sslmode == "verify-full" and relay.postgres.password_file is not None
    assert relay.postgres.password_file.stat().st_mode & 0o777 == 0o600
    assert relay.box.profile == "secure"


def test_nats_maps_each_identity_to_its_roles_permissions(tmp_path: Path) -> None:
    profile = SecureProfile(Settings(data_dir=tmp_path / "sco"))
    users = {u["user"]: u for u in profile.nats_users(["r1"])}
    assert users["spiffe://sco/r1/worker"]["permissions"] == nats_role("worker", "r1").permissions()
    relay_a = users["spiffe://sco/r1/notice-relay/A"]["permissions"]
    assert relay_a["publish"]["allow"][0] == "sco.r1.notice.A.>"
    assert users["spiffe://sco/r1/operator"]["permissions"]["publish"] == {
        "allow": ["sco.r1.reclaim.>"]
    }
    assert all("password" not in u for u in users.values())
    conf = json.loads(
        nats_tls_config(
            "127.0.0.1", 4223, tmp_path, tmp_path, tmp_path, tmp_path, list(users.values())
        )
    )
    assert conf["tls"]["verify_and_map"] is True
    assert len(conf["authorization"]["users"]) == len(users)


def test_a_simulator_prefix_the_permissions_do_not_allow_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DevboxError, match=r"^provider.simulator_prefix 'x'"):
        SecureProfile(Settings(data_dir=tmp_path, provider={"simulator_prefix": "x"}))
