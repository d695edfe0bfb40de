"""The shared renewer (contracts/cert_renewal.py) on its own: when it renews, what it
writes, what it reloads, how a failing source is retried. Certificates come from a CA
made here with short lifetimes; the real source (OpenBao) and the clients that reload are
tests/workers/test_cert_renewal.py's."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from contracts.cert_renewal import CertBundle, Renewer, follow_files, read_validity
from tests.support.wait import checked, eventually_async


class ShortLivedCA:
    """A source issuing `lifetime`-second certificates; `fail` makes the next fetches raise."""

    name = "test-ca"

    def __init__(self, lifetime: float) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.lifetime = dt.timedelta(seconds=lifetime)
        self.fetches = 0
        self.fail = False

    def fetch(self) -> CertBundle:
        self.fetches += 1
        if self.fail:
            raise RuntimeError("the CA is away")
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC).replace(microsecond=0)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"n{self.fetches}")])
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + self.lifetime)
            .sign(self.key, hashes.SHA256())
        )
        pem = cert.public_bytes(serialization.Encoding.PEM)
        return CertBundle(
            cert_pem=pem,
            key_pem=key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
            not_before=cert.not_valid_before_utc,
            not_after=cert.not_valid_after_utc,
            identity=f"spiffe://sco/r1/test/{self.fetches}",
        )


@pytest.mark.timeout(30)
def test_renews_at_two_thirds_writes_private_files_and_reloads(tmp_path: Path) -> None:
    ca = ShortLivedCA(lifetime=3)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    renewed: list[str] = []
    hooked: list[str] = []
    r = Renewer(ca, cert, key, on_renewed=lambda b: renewed.append(b.identity))

    async def hook(bundle: CertBundle) -> None:
        hooked.append(bundle.identity)

    r.add_hook(hook)

    async def scenario() -> None:
        await r.ensure_current()  # nothing on disk: fetched now
        assert r.renewals == 1 and cert.stat().st_mode & 0o777 == 0o600
        assert key.stat().st_mode & 0o777 == 0o600
        ctx = ssl.create_default_context()
        ctx.load_cert_chain(str(cert), str(key))
        r.add_context(ctx)
        first = read_validity(cert)
        assert first is not None and r.renew_at() == first[0] + (first[1] - first[0]) * (2 / 3)
        stop = asyncio.Event()
        task = asyncio.create_task(r.run(stop))
        await eventually_async(
            checked(lambda: (r.renewals >= 3) or None), timeout=10, what="3 renewals"
        )
        stop.set()
        await task
        # Each renewal came before the certificate in hand expired.
        now_valid = read_validity(cert)
        assert now_valid is not None and now_valid[1] > first[1]

    asyncio.run(scenario())
    assert renewed == hooked and len(renewed) >= 3 and r.failures == 0


@pytest.mark.timeout(30)
def test_a_current_certificate_is_kept_and_a_failing_source_is_retried(tmp_path: Path) -> None:
    ca = ShortLivedCA(lifetime=6)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    failed: list[str] = []
    r = Renewer(ca, cert, key, min_retry_s=0.2, on_failed=lambda e: failed.append(str(e)))

    async def scenario() -> None:
        await r.ensure_current()
        again = Renewer(ca, cert, key)
        await again.ensure_current()  # not yet due: the files in hand, no fetch
        assert ca.fetches == 1 and again.renewals == 0
        ca.fail = True
        stop = asyncio.Event()
        task = asyncio.create_task(r.run(stop))
        await eventually_async(
            checked(lambda: (r.failures >= 2) or None), timeout=10, what="2 failures"
        )
        ca.fail = False  # the CA is back before the certificate ends
        await eventually_async(
            checked(lambda: (r.renewals >= 2) or None), timeout=10, what="a renewal"
        )
        stop.set()
        await task

    asyncio.run(scenario())
    assert failed and all(f == "the CA is away" for f in failed)


def test_the_renewal_point_must_leave_time_to_retry(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"renew_fraction 1\.0: must be 0\.1 to 0\.95"):
        Renewer(ShortLivedCA(60), tmp_path / "c", tmp_path / "k", renew_fraction=1.0)


class CountingContext(ssl.SSLContext):
    """A client context that counts its loads (what a handshake would present is the last)."""

    loads: list[str]

    def load_cert_chain(
        self, certfile: object, keyfile: object = None, password: object = None
    ) -> None:
        super().load_cert_chain(certfile, keyfile)  # type: ignore[arg-type]
        self.loads.append(str(certfile))


@pytest.mark.timeout(30)
def test_a_node_reloads_its_context_when_its_issuer_renews_the_files(tmp_path: Path) -> None:
    """The agent's way (files renewed by the node's issuer): `follow_files` loads the new
    pair into the very context NATS reconnects with, once per change."""
    ca = ShortLivedCA(lifetime=60)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    writer = Renewer(ca, cert, key)
    ctx = CountingContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.loads = []

    async def scenario() -> None:
        await writer.renew()
        stop = asyncio.Event()
        task = asyncio.create_task(follow_files(ctx, cert, key, stop, every_s=0.1))
        await writer.renew()  # the issuer writes a new pair
        await eventually_async(checked(lambda: ctx.loads or None), timeout=5, what="a reload")
        stop.set()
        await task

    asyncio.run(scenario())
    assert ctx.loads == [str(cert)]
