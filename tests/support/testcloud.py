"""The real OpenStack test cloud for workflow tests and benchmarks: the provider (or a skip
naming why there is none), a signed bundle with a chosen floor, and what SCO holds there,
counted with openstacksdk directly (not through SCO's provider)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
from pathlib import Path
from typing import Any, NoReturn

import pytest

from activities.provider.errors import Transient
from activities.provider.openstack import OpenStackProvider
from tests.support import prep
from tests.support.paths import REPO
from tests.support.signed_bundle import sign_and_install
from tests.support.wait import eventually_async

CLOUD = "sco-testcloud"


class TestCloudMissing(Exception):
    """No test cloud to run on (the message says why)."""


def clouds_yaml() -> Path:
    if os.environ.get("OS_CLIENT_CONFIG_FILE"):
        return Path(os.environ["OS_CLIENT_CONFIG_FILE"])
    base = Path(os.environ.get("SCO_TESTCLOUD_DIR") or REPO / ".sco" / "testcloud")
    return base / "clouds.yaml"


def connect_provider() -> OpenStackProvider:
    """The OpenStack provider on the test cloud; TestCloudMissing when it is not there."""
    if (failed := prep.outcome("testcloud")) is not None:
        raise TestCloudMissing(failed)
    path = clouds_yaml()
    if not path.is_file():
        raise TestCloudMissing(f"no test cloud ({path} missing; run make testcloud-up)")
    try:  # clouds.yaml outlives down.sh: Keystone must also answer
        socket.create_connection(("127.0.0.1", 5000), timeout=2).close()
    except OSError as exc:
        raise TestCloudMissing("the test cloud is down (Keystone does not answer)") from exc
    os.environ["OS_CLIENT_CONFIG_FILE"] = str(path)
    return OpenStackProvider.from_cloud(CLOUD, image="sco-image", network="none")


def provider_or_skip() -> OpenStackProvider:
    try:
        return connect_provider()
    except TestCloudMissing as exc:
        unavailable(str(exc))


def unavailable(reason: str) -> NoReturn:
    """Skip, or fail under SCO_REQUIRE_TESTCLOUD=1 (CI: every test must run)."""
    if os.environ.get("SCO_REQUIRE_TESTCLOUD") == "1":
        pytest.fail(f"SCO_REQUIRE_TESTCLOUD=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def install_bundle(base: Path, floors: dict[str, int] | None = None) -> tuple[Path, Path]:
    """Compile and sign the example contracts, `floors` (contract -> r1 floor units)
    changed; return (bundle cache dir, trust dir)."""
    src = base / "contracts"
    shutil.copytree(REPO / "contracts" / "examples", src)
    for contract, units in (floors or {}).items():
        path = src / f"{contract}.yaml"
        text = re.sub(r"floor: \{r1: \d+", f"floor: {{r1: {units}", path.read_text())
        path.write_text(text)
    sign_and_install(src, base)
    return base / "cache", base / "trust"


def sco_servers(conn: Any, region: str = "r1") -> dict[str, Any]:
    """SCO's servers on the cloud (by metadata), by server id."""
    return {
        s.id: s
        for s in conn.compute.servers(details=True)
        if (s.metadata or {}).get("sco-region") == region
    }


def floor_on_cloud(conn: Any, contract: str) -> dict[str, int]:
    """`contract`'s ACTIVE floor servers per hall, on Blazar's hosts, read from Nova itself
    (a floor server on a spot host fails the assertion)."""
    out: dict[str, int] = {}
    for s in sco_servers(conn).values():
        meta = s.metadata or {}
        if meta.get("sco-workload") == contract and s.status == "ACTIVE":
            assert s.compute_host == f"hall-{s.availability_zone.lower()}-committed"
            out[s.availability_zone] = out.get(s.availability_zone, 0) + 1
    return dict(sorted(out.items()))


def sco_leases(conn: Any, region: str = "r1") -> list[dict[str, Any]]:
    """SCO's Blazar leases (by name), straight from Blazar's API."""
    resp = conn.reservation.get("/leases")
    resp.raise_for_status()
    return [lease for lease in resp.json()["leases"] if lease["name"].startswith(f"sco-{region}-")]


async def delete_lease(provider: OpenStackProvider, lease_id: str, within: float = 120) -> None:
    """Delete a Blazar lease, waiting out the states Blazar refuses a delete in (a lease
    starting or ending answers 500 "Invalid lease status" until its manager moves on)."""

    async def deleted() -> bool:
        await provider.delete_reservation(lease_id)
        return True

    await eventually_async(
        deleted, timeout=within, what=f"lease {lease_id} deleted", every=2, retrying=(Transient,)
    )


async def leave_as_found(
    provider: OpenStackProvider, servers_before: set[str], leases_before: set[str]
) -> None:
    """Delete every SCO server and lease made since `*_before`, all of them concurrently:
    one lease Blazar is slow to let go (a loaded machine) no longer stops the rest being
    deleted, which left leases a later test's floor keeper adopted. Raises at the end,
    naming what did not go."""
    conn = provider.connection
    servers = set(await asyncio.to_thread(sco_servers, conn)) - servers_before
    leases = [x["id"] for x in await asyncio.to_thread(sco_leases, conn)]
    done = await asyncio.gather(
        *(provider.delete(sid) for sid in sorted(servers)),
        *(delete_lease(provider, lid) for lid in leases if lid not in leases_before),
        return_exceptions=True,
    )
    failed = [repr(x) for x in done if isinstance(x, BaseException)]
    if failed:
        raise AssertionError(f"the test cloud was not left as found: {failed}")
