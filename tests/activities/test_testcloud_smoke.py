"""Smoke tests on the real OpenStack test cloud (``deploy/testcloud/up.sh``), via openstacksdk.

They find the cloud ``sco-testcloud`` in ``$OS_CLIENT_CONFIG_FILE``, else in the clouds.yaml
that up.sh writes (``$SCO_TESTCLOUD_DIR``, default ``.sco/testcloud``). Without it, or when
it does not answer, they skip; with ``SCO_REQUIRE_TESTCLOUD=1`` (CI) that is a failure.

The cloud is seeded from ``deploy/regions/r1.toml`` by ``deploy/testcloud/seed.py``: hall H
is availability zone H with the spot host ``hall-h`` and Blazar's reservable host
``hall-h-committed``; flavors are ``<sku>.<size>``; bare-metal pools are Ironic nodes.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator
from typing import Any

import openstack
import pytest

from contracts.region import Pool, Region, load_region
from tests.support import prep
from tests.support.paths import REPO
from tests.support.testcloud import CLOUD, clouds_yaml, unavailable
from tests.support.wait import eventually

pytestmark = [
    pytest.mark.testcloud,
    # openstacksdk's notices about its own future API changes, raised from inside the SDK
    pytest.mark.filterwarnings("ignore::openstack.warnings.RemovedInSDK50Warning"),
    pytest.mark.filterwarnings("ignore::openstack.warnings.RemovedInSDK60Warning"),
]


HALL = "B"
NETWORK = "sco-net"
IMAGE = "sco-image"
BOOT_TIMEOUT = 120
LEASE_TIMEOUT = 90  # Blazar's manager starts leases on a 10 s poll


@pytest.fixture(scope="module")
def conn() -> Iterator[Any]:
    if (failed := prep.outcome("testcloud")) is not None:
        unavailable(failed)
    path = clouds_yaml()
    if not path.is_file():
        unavailable(
            f"no clouds.yaml for {CLOUD!r} at {path} "
            "(start the test cloud with deploy/testcloud/up.sh, or set OS_CLIENT_CONFIG_FILE)"
        )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OS_CLIENT_CONFIG_FILE", str(path))
        try:
            c = openstack.connect(cloud=CLOUD)
            c.authorize()
        except openstack.exceptions.ConfigException as e:
            unavailable(f"{path}: {e}")
        except Exception as e:  # keystone down: connection refused, timeout, ...
            unavailable(f"test cloud {CLOUD!r} ({path}) does not answer: {type(e).__name__}: {e}")
        yield c
        c.close()


@pytest.fixture(scope="module")
def region() -> Region:
    return load_region(REPO / "deploy" / "regions" / "r1.toml")


def _vm_pool(region: Region, hall: str) -> Pool:
    """The hall's smallest non-bare-metal pool."""
    baremetal = {s.name for s in region.skus if s.baremetal}
    pools = [p for p in region.pools if p.hall == hall and p.sku not in baremetal]
    return min(pools, key=lambda p: (p.vcpu, p.memory_gib))


def _boot(c: Any, name: str, flavor_id: str, hall: str) -> Any:
    img = c.image.find_image(IMAGE, ignore_missing=False)
    net = c.network.find_network(NETWORK, ignore_missing=False)
    server = c.compute.create_server(
        name=name,
        flavor_id=flavor_id,
        image_id=img.id,
        networks=[{"uuid": net.id}],
        availability_zone=hall,
        # not "sco-region": that would make the server look like SCO's own to the provider
        metadata={"sco-test": "testcloud-smoke"},
    )
    return c.compute.wait_for_server(server, interval=0.5, wait=BOOT_TIMEOUT)


def _delete(c: Any, server: Any) -> None:
    c.compute.delete_server(server, ignore_missing=True)
    c.compute.wait_for_delete(server, interval=0.5, wait=BOOT_TIMEOUT)


def _name(what: str) -> str:
    return f"sco-smoke-{what}-{uuid.uuid4().hex[:8]}"


def test_halls_are_availability_zones(conn: Any, region: Region) -> None:
    zones = {z.name for z in conn.compute.availability_zones() if z.state["available"]}
    assert set(region.halls) <= zones


def test_flavors_match_region_pools(conn: Any, region: Region) -> None:
    flavors = {f.name: f for f in conn.compute.flavors(details=True)}
    baremetal = {s.name for s in region.skus if s.baremetal}
    for pool in region.pools:
        if pool.sku in baremetal:
            continue
        fl = flavors.get(pool.flavor)
        assert fl is not None, f"flavor {pool.flavor} missing"
        assert (fl.vcpus, fl.ram) == (pool.vcpu, pool.memory_gib * 1024), pool.flavor
        assert fl.extra_specs["sco:sku"] == pool.sku


def test_server_in_az_lands_on_its_hall_host_and_deletes(conn: Any, region: Region) -> None:
    pool = _vm_pool(region, HALL)
    flavor = conn.compute.find_flavor(pool.flavor, ignore_missing=False)
    server = None
    try:
        server = _boot(conn, _name("az"), flavor.id, pool.availability_zone)
        assert server.status == "ACTIVE", server.fault
        assert server.availability_zone == HALL
        assert server.compute_host == f"hall-{HALL.lower()}"  # the hall's spot host (seed.py)
        assert server.flavor.original_name == pool.flavor
        assert server.addresses.get(NETWORK), server.addresses  # a bound port, a fixed IP
    finally:
        if server is not None:
            _delete(conn, server)
    # wait_for_delete also returns on a DELETED status, which Nova may show for a moment
    # before the server is gone from its API (seen under load): gone, within the boot time.
    eventually(
        lambda: conn.compute.find_server(server.id, ignore_missing=True) is None,
        timeout=BOOT_TIMEOUT,
        what=f"server {server.id} gone from Nova",
    )


def _blazar(c: Any, method: str, url: str, **kw: Any) -> Any:
    resp = getattr(c.reservation, method)(url, **kw)
    assert resp.status_code < 400, f"{method.upper()} {url}: {resp.status_code} {resp.text[:500]}"
    return resp.json() if resp.content else None


def test_blazar_instance_reservation_becomes_active_and_boots(conn: Any, region: Region) -> None:
    pool = _vm_pool(region, HALL)
    end = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).strftime("%Y-%m-%d %H:%M")
    lease = _blazar(
        conn,
        "post",
        "/leases",
        json={
            "name": _name("lease"),
            "start_date": "now",
            "end_date": end,
            "reservations": [
                {
                    "resource_type": "virtual:instance",
                    "amount": 1,
                    "vcpus": pool.vcpu,
                    "memory_mb": pool.memory_gib * 1024,
                    "disk_gb": 10,
                    "affinity": None,
                    # the hall is an extra capability of Blazar's hosts (seed.py)
                    "resource_properties": json.dumps(["=", "$hall", HALL]),
                }
            ],
            "events": [],
        },
    )["lease"]
    server = None
    try:
        lease_id = lease["id"]

        def settled() -> dict[str, Any] | None:
            got: dict[str, Any] = _blazar(conn, "get", f"/leases/{lease_id}")["lease"]
            return got if got["status"] in ("ACTIVE", "ERROR") else None

        lease = eventually(
            settled, timeout=LEASE_TIMEOUT, what=f"lease {lease_id} active", every=1, retrying=()
        )
        assert lease["status"] == "ACTIVE", lease
        reservation = lease["reservations"][0]
        assert reservation["status"] == "active", reservation

        # Into an instance reservation by its flavor alone. The "reservation" scheduler hint is
        # for host reservations: with an instance reservation's id BlazarFilter rejects every
        # host (NoValidHost), since that reservation's aggregate has no blazar_ AZ.
        server = _boot(conn, _name("reserved"), reservation["flavor_id"], HALL)
        assert server.status == "ACTIVE", server.fault
        assert server.compute_host == f"hall-{HALL.lower()}-committed"
        assert server.availability_zone == HALL
    finally:
        if server is not None:
            _delete(conn, server)
        _blazar(conn, "delete", f"/leases/{lease['id']}")


def test_ironic_lists_seeded_nodes(conn: Any, region: Region) -> None:
    baremetal = {s.name for s in region.skus if s.baremetal}
    nodes = {n.name: n for n in conn.baremetal.nodes(details=True)}
    for pool in (p for p in region.pools if p.sku in baremetal):
        node = nodes.get(f"{pool.hall.lower()}-{pool.sku}-{pool.size}-1")
        assert node is not None, f"no Ironic node for pool {pool.pool_id(region.id)}"
        assert node.driver == "fake-hardware"
        assert node.resource_class == pool.flavor
        assert node.properties["sco_hall"] == pool.hall
        assert (node.properties["sco_sku"], node.properties["sco_size"]) == (pool.sku, pool.size)
        assert node.properties["cpus"] == pool.vcpu
        assert node.extra["sco_pool_id"] == pool.pool_id(region.id)
        assert node.provision_state in ("available", "active")
