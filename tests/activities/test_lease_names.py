"""The one lease naming scheme, and free committed capacity counted once per lease."""

from __future__ import annotations

from datetime import UTC, datetime

from activities.floor.activities import _unreserved
from activities.provider.interface import Reservation
from activities.provider.leases import (
    fallback_acquisition,
    fallback_owner,
    lease_name,
    parse_lease_name,
)
from contracts.region import Region
from workflows.floor.models import floor_lease_name, reservation_key


def test_every_lease_name_parses_back_to_hall_flavor_and_owner() -> None:
    floor = floor_lease_name("r1", "llm-train", "B", "gpu-a.4xl", 3)
    assert floor == "sco-r1-B-gpu-a.4xl-floor-r1-llm-train-B-3"
    parsed = parse_lease_name(floor, "r1")
    assert parsed is not None
    assert (parsed.hall, parsed.flavor, parsed.owner) == (
        "B",
        "gpu-a.4xl",
        "floor-r1-llm-train-B-3",
    )
    fb = lease_name("r1", "A", "cpu.xl", fallback_owner("acq-r1-web-0123456789"))
    owner = parse_lease_name(fb, "r1")
    assert owner is not None and fallback_acquisition(owner.owner) == "acq-r1-web-0123456789"
    assert parse_lease_name(fb, "r2") is None  # another region's
    assert parse_lease_name("floor-r1-llm-train-B-3") is None  # the old floor names
    assert parse_lease_name("someone-elses-lease") is None


def _lease(hall: str, flavor: str, amount: int, owner: str, status: str = "ACTIVE") -> Reservation:
    return Reservation(
        reservation_id=f"res-{owner}",
        lease_id=f"lease-{owner}",
        name=lease_name("r1", hall, flavor, owner),
        hall=hall,
        flavor=flavor,
        amount=amount,
        status=status,
        end=datetime(2030, 1, 1, tzinfo=UTC),
        owner=owner,
    )


def test_free_committed_capacity_subtracts_each_live_lease_once(region_r1: Region) -> None:
    leases = [
        _lease("A", "gp.l", 10, "floor-r1-x-A-1"),  # 40 vCPU, 160 GiB
        _lease("A", "gpu-l.l", 2, fallback_owner("acq-r1-y-1")),  # 16 vCPU, 128 GiB, 2 GPUs
        _lease("A", "gp.l", 50, "floor-r1-x-A-2", status="TERMINATED"),  # ended: free again
        _lease("B", "gp.l", 5, "floor-r1-x-B-1"),
    ]
    free = _unreserved(region_r1, ["A", "B"], leases)
    a, b = region_r1.committed["A"], region_r1.committed["B"]
    assert (free["A"].free_vcpu, free["A"].free_memory_gib, free["A"].free_gpus) == (
        a.vcpu - 56,
        a.memory_gib - 288,
        a.gpus - 2,
    )
    assert free["B"].free_vcpu == b.vcpu - 20
    assert reservation_key(leases[0]) == "floor-r1-x-A-1"
