"""A signed bundle installed as a worker reads it: the contracts of a directory compiled,
signed and offered to a bundle cache, in the layout every test and bench hands its worker
(`bundle_dir=base / "cache"`, `trust_dir=base / "trust"`)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from contracts import keys
from contracts.cache import BundleCache
from contracts.compiler import compile_and_sign
from tests.support.paths import REGIONS_DIR


def sign_and_install(src: Path, base: Path) -> int:
    """Compile the contracts in `src`, sign them into `base/compiled.json` with the key in
    `base/keys` (made the first time, `base/trust` trusting it; later bundles reuse it, so
    a worker that trusts the first takes them), and install the bundle in `base/cache`;
    its serial (the next one each time). A bundle that does not compile, or that the cache
    refuses, fails with what was wrong."""
    if not (base / "keys").exists():
        _, _, public = keys.generate(base / "keys")
        (base / "trust").mkdir(parents=True, exist_ok=True)
        (base / "trust" / public.name).write_bytes(public.read_bytes())
    private = next((base / "keys").glob("*.key"))
    out = base / "compiled.json"
    result, serial = compile_and_sign(
        src,
        REGIONS_DIR,
        keys.load_signing_key(private),
        out,
        serial=None,
        created_at=datetime.now(UTC),
    )
    if serial is None:
        raise AssertionError(f"{src} does not compile: {[str(f) for f in result.findings]}")
    trust = keys.TrustStore.load(base / "trust")
    offer = BundleCache(base / "cache", trust).offer(out.read_bytes())
    assert offer.accepted, offer
    return serial
