"""Seed the SCO test cloud from a region file. Idempotent: a second run changes nothing.

Run by up.sh with the project venv's python (it imports ``contracts.region``; the test
cloud's own venv has no pydantic):

    .venv/bin/python deploy/testcloud/seed.py hosts [--region deploy/regions/r1.toml]
    OS_CLIENT_CONFIG_FILE=.sco/testcloud/clouds.yaml \\
        .venv/bin/python deploy/testcloud/seed.py seed [--region deploy/regions/r1.toml]

What the region becomes (see README.md in this folder):
- per hall H, two fake compute hosts: ``hall-h`` (reclaimable capacity, where SCO's spot
  instances land) and ``hall-h-committed`` (Blazar's reservable host for committed
  capacity); both are in the host aggregate ``hall-H`` whose availability zone is ``H``;
- per non-bare-metal SKU x size, a public flavor ``<sku>.<size>`` with the pool's vCPU and
  RAM, 10 GB disk per vCPU and ``sco:*`` extra specs (GPUs are recorded, not emulated);
- image ``sco-image`` (1 KiB raw), shared network ``sco-net`` with subnet ``sco-subnet``;
- Blazar: the ``freepool`` aggregate, each ``hall-h-committed`` enrolled as a reservable
  host with the extra capability ``hall=H`` (instance reservations select a hall with
  ``resource_properties='["=", "$hall", "H"]'``);
- Ironic: per hall, per bare-metal SKU x size, fake-hardware nodes named
  ``<h>-<sku>-<size>-<n>`` with resource class ``<sku>.<size>`` (Nova's
  ``CUSTOM_<SKU>_<SIZE>``, e.g. ``CUSTOM_BM_CPU_L``), properties naming hall, SKU and size,
  moved to ``available``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from contracts.region import Pool, Region, load_region  # noqa: E402

CLOUD = "sco-testcloud"
IMAGE = "sco-image"
NETWORK = "sco-net"
SUBNET = "sco-subnet"
# RFC 2544 benchmarking range: a database record only, nothing is ever sent to it.
SUBNET_CIDR = "198.18.0.0/16"
FREEPOOL = "freepool"  # Blazar's aggregate of reservable hosts (its default name)
DISK_GB_PER_VCPU = 10
IRONIC_NODES_PER_POOL = int(os.environ.get("SCO_TESTCLOUD_IRONIC_NODES_PER_POOL", "1"))
DEFAULT_REGION = REPO / "deploy" / "regions" / "r1.toml"


def spot_host(hall: str) -> str:
    """The compute host of a hall's reclaimable capacity (SCO's spot instances)."""
    return f"hall-{hall.lower()}"


def committed_host(hall: str) -> str:
    """The hall's Blazar reservable host (committed capacity)."""
    return f"hall-{hall.lower()}-committed"


def hall_aggregate(hall: str) -> str:
    return f"hall-{hall}"


def node_name(pool: Pool, n: int) -> str:
    return f"{pool.hall.lower()}-{pool.sku}-{pool.size}-{n}"


@dataclass
class Tally:
    what: str
    total: int = 0
    created: int = 0
    updated: int = 0

    def count(self, change: str) -> None:
        """One more item; ``change`` is "created", "updated" or "" (unchanged)."""
        self.total += 1
        self.created += change == "created"
        self.updated += change == "updated"

    def __str__(self) -> str:
        changes = [f"{n} {w}" for n, w in ((self.created, "created"), (self.updated, "updated"))]
        changed = ", ".join(c for c in changes if not c.startswith("0 ")) or "unchanged"
        return f"{self.total} {self.what} ({changed})"


def flavor_shapes(region: Region) -> dict[str, Pool]:
    """One pool per flavor name for the non-bare-metal SKUs; every hall must agree on it."""
    baremetal = {s.name for s in region.skus if s.baremetal}
    shapes: dict[str, Pool] = {}
    for pool in region.pools:
        if pool.sku in baremetal:
            continue
        seen = shapes.setdefault(pool.flavor, pool)
        if (seen.vcpu, seen.memory_gib, seen.gpus) != (pool.vcpu, pool.memory_gib, pool.gpus):
            raise SystemExit(f"flavor {pool.flavor}: halls {seen.hall} and {pool.hall} differ")
    return shapes


def flavor_spec(region: Region, pool: Pool) -> tuple[dict[str, int], dict[str, str]]:
    sku = next(s for s in region.skus if s.name == pool.sku)
    spec = {
        "vcpus": pool.vcpu,
        "ram": pool.memory_gib * 1024,
        "disk": pool.vcpu * DISK_GB_PER_VCPU,
    }
    extra = {"sco:sku": pool.sku, "sco:size": pool.size, "sco:gpus": str(pool.gpus)}
    if sku.gpu_model:
        extra["sco:gpu_model"] = sku.gpu_model
    return spec, extra


# ----------------------------------------------------------------------------- steps


def seed_aggregates(c: Any, region: Region) -> Tally:
    t = Tally("availability zones")
    aggs = {a.name: a for a in c.compute.aggregates()}
    for hall in region.halls:
        t.total += 1
        agg = aggs.get(hall_aggregate(hall))
        if agg is None:
            agg = c.compute.create_aggregate(name=hall_aggregate(hall), availability_zone=hall)
            t.created += 1
        elif agg.availability_zone != hall:
            raise SystemExit(
                f"aggregate {agg.name} has AZ {agg.availability_zone!r}, want {hall!r}"
            )
        changed = False
        for host in (spot_host(hall), committed_host(hall)):
            if host not in (agg.hosts or []):
                agg = c.compute.add_host_to_aggregate(agg, host)
                changed = True
        if changed and agg.name in aggs:
            t.updated += 1
    return t


def seed_flavors(c: Any, region: Region) -> Tally:
    t = Tally("flavors")
    existing = {f.name: f for f in c.compute.flavors(details=True, is_public=None)}
    for name, pool in sorted(flavor_shapes(region).items()):
        spec, extra = flavor_spec(region, pool)
        fl = existing.get(name)
        change = ""
        if fl is not None and (fl.vcpus, fl.ram, fl.disk) != (
            spec["vcpus"],
            spec["ram"],
            spec["disk"],
        ):
            # A flavor cannot be resized; servers keep an embedded copy, so replace it.
            c.compute.delete_flavor(fl)
            fl, change = None, "updated"
        if fl is None:
            fl = c.compute.create_flavor(name=name, is_public=True, **spec)
            change = change or "created"
        current = dict(fl.extra_specs or {})
        if any(current.get(k) != v for k, v in extra.items()):
            c.compute.create_flavor_extra_specs(fl, extra)
            change = change or "updated"
        t.count(change)
    return t


def seed_image(c: Any) -> Tally:
    t = Tally("images")
    img = next(iter(c.image.images(name=IMAGE)), None)
    change = ""
    if img is not None and img.status != "active":
        c.image.delete_image(img)  # an upload that was interrupted
        img, change = None, "updated"
    if img is None:
        c.image.create_image(
            name=IMAGE,
            data=b"\0" * 1024,
            disk_format="raw",
            container_format="bare",
            visibility="public",
        )
        change = change or "created"
    t.count(change)
    return t


def seed_network(c: Any) -> Tally:
    t = Tally("networks")
    net = c.network.find_network(NETWORK)
    change = ""
    if net is None:
        net = c.network.create_network(name=NETWORK, is_shared=True)
        change = "created"
    if c.network.find_subnet(SUBNET) is None:
        c.network.create_subnet(
            name=SUBNET,
            network_id=net.id,
            ip_version=4,
            cidr=SUBNET_CIDR,
            gateway_ip=None,
            is_dhcp_enabled=False,
        )
        change = change or "updated"
    t.count(change)
    return t


def _blazar(c: Any, method: str, url: str, **kw: Any) -> Any:
    resp = getattr(c.reservation, method)(url, **kw)
    if resp.status_code >= 400:
        raise SystemExit(f"blazar {method.upper()} {url}: {resp.status_code} {resp.text[:300]}")
    return resp.json() if resp.content else None


def seed_blazar(c: Any, region: Region) -> Tally:
    t = Tally("Blazar reservable hosts")
    # Blazar moves enrolled hosts into this aggregate; without it enrolment fails and leaves a
    # placement provider behind that makes every retry fail with 409.
    if c.compute.find_aggregate(FREEPOOL) is None:
        c.compute.create_aggregate(name=FREEPOOL)
    have = {h["hypervisor_hostname"]: h for h in _blazar(c, "get", "/os-hosts")["hosts"]}
    for hall in region.halls:
        t.total += 1
        host = committed_host(hall)
        if host not in have:
            # extra keys become the host's extra capabilities (resource_properties)
            _blazar(c, "post", "/os-hosts", json={"name": host, "hall": hall})
            t.created += 1
        elif have[host].get("hall") != hall:
            _blazar(c, "put", f"/os-hosts/{have[host]['id']}", json={"hall": hall})
            t.updated += 1
    return t


def seed_ironic(c: Any, region: Region) -> Tally:
    t = Tally("Ironic nodes")
    baremetal = {s.name: s for s in region.skus if s.baremetal}
    nodes = {n.name: n for n in c.baremetal.nodes(details=True)}
    for pool in region.pools:
        if pool.sku not in baremetal:
            continue
        for n in range(1, IRONIC_NODES_PER_POOL + 1):
            t.total += 1
            name = node_name(pool, n)
            if name in nodes:
                continue
            props: dict[str, Any] = {
                "cpus": pool.vcpu,
                "memory_mb": pool.memory_gib * 1024,
                "local_gb": pool.vcpu * DISK_GB_PER_VCPU,
                "cpu_arch": "x86_64",
                "capabilities": f"sco_hall:{pool.hall},sco_sku:{pool.sku},sco_size:{pool.size}",
                "sco_hall": pool.hall,
                "sco_sku": pool.sku,
                "sco_size": pool.size,
                "gpus": pool.gpus,
            }
            if baremetal[pool.sku].gpu_model:
                props["gpu_model"] = baremetal[pool.sku].gpu_model
            nodes[name] = c.baremetal.create_node(
                name=name,
                driver="fake-hardware",
                resource_class=pool.flavor,
                properties=props,
                extra={"sco_pool_id": pool.pool_id(region.id)},
            )
            t.created += 1
    _make_available(c, [n for n in nodes.values() if n.name in _wanted_nodes(region)])
    return t


def _wanted_nodes(region: Region) -> set[str]:
    baremetal = {s.name for s in region.skus if s.baremetal}
    return {
        node_name(p, n)
        for p in region.pools
        if p.sku in baremetal
        for n in range(1, IRONIC_NODES_PER_POOL + 1)
    }


def _make_available(c: Any, nodes: list[Any]) -> None:
    """enroll -> manageable -> available, all nodes at once; other states are left alone."""
    for state, verb, target in (
        ("enroll", "manage", "manageable"),
        ("manageable", "provide", "available"),
    ):
        batch = [n for n in nodes if n.provision_state == state]
        for n in batch:
            c.baremetal.set_node_provision_state(n, verb)
        if batch:
            waited = c.baremetal.wait_for_nodes_provision_state(batch, target, timeout=300)
            done = {n.id: n for n in waited}
            nodes = [done.get(n.id, n) for n in nodes]


# ----------------------------------------------------------------------------- main


def cmd_hosts(region: Region) -> None:
    for hall in region.halls:
        print(spot_host(hall), hall, "spot")
        print(committed_host(hall), hall, "committed")


def cmd_seed(region: Region, cloud: str) -> None:
    import openstack

    c = openstack.connect(cloud=cloud)
    steps: list[Callable[[], Tally]] = [
        lambda: seed_aggregates(c, region),
        lambda: seed_flavors(c, region),
        lambda: seed_image(c),
        lambda: seed_network(c),
        lambda: seed_blazar(c, region),
        lambda: seed_ironic(c, region),
    ]
    for step in steps:
        t0 = time.monotonic()
        tally = step()
        print(f"seed: {tally} [{time.monotonic() - t0:.1f}s]", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["hosts", "seed"])
    ap.add_argument("--region", type=Path, default=DEFAULT_REGION)
    ap.add_argument("--cloud", default=os.environ.get("OS_CLOUD", CLOUD))
    args = ap.parse_args(argv)
    region = load_region(args.region)
    if args.command == "hosts":
        cmd_hosts(region)
    else:
        cmd_seed(region, args.cloud)


if __name__ == "__main__":
    main()
