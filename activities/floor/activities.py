"""Floor keeper activities: what a floor keeper reads each tick, and its hall probes.

`snapshot` reads the contract's floor and unit shape from the installed signed bundle (the
one nodes and admission use, so a changed floor arrives as a new bundle), the region's
halls and committed capacity, the floor's live committed instances from fleet state and
the floor's Blazar reservations from the provider. Planning happens in the workflow.

`probe_halls` asks the provider how the floor's instances are doing, per hall: one
`list_owned` call (ERROR or absent counts as unhealthy) and one free-capacity question per
hall (a hall that reports no capacity of the floor's shape is not answering).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.events import CapacityType, InstanceState
from activities.fleet.repository import FleetRepository
from activities.floor.models import (
    FloorInstance,
    FloorShape,
    FloorSnapshot,
    FloorSnapshotInput,
    HallCapacity,
    HallProbe,
    ProbeInput,
    ProbeResult,
    floor_prefix,
)
from activities.plan_sources import PlanSources
from activities.provider.errors import ProviderError
from activities.provider.interface import CloudProvider, InstanceStatus, Reservation
from contracts.feasibility import units_per_instance
from contracts.region import Region

log = logging.getLogger(__name__)

# A noticed or draining instance still holds its reservation slot until it is deleted: it
# is in the snapshot (so a spare slot is not counted twice) but does not hold the floor.
_LIVE = (
    InstanceState.REQUESTED,
    InstanceState.ACTIVE,
    InstanceState.NOTICED,
    InstanceState.DRAINING,
)
_ENDED = ("ERROR", "TERMINATED")


class FloorActivities:
    def __init__(
        self,
        fleet: FleetRepository,
        provider: CloudProvider,
        *,
        regions_dir: Path,
        bundle_cache_dir: Path,
        trust_dir: Path,
    ) -> None:
        self._fleet = fleet
        self._provider = provider
        self._sources = PlanSources(regions_dir, bundle_cache_dir, trust_dir)

    @activity.defn(name="floor.snapshot")
    async def snapshot(self, inp: FloorSnapshotInput) -> FloorSnapshot:
        out = FloorSnapshot(region=inp.region, contract=inp.contract)
        loaded = await self._sources.load(inp.region)
        if isinstance(loaded, str):
            return out.model_copy(update={"problem": loaded})
        region, bundle = loaded
        contract = bundle.content.contract(inp.contract)
        if contract is None:
            # Not "floor 0": a bundle without the contract is more likely a mistake than a
            # decision to drop a tier-1 floor, so nothing is released on it.
            return out.model_copy(
                update={
                    "bundle_serial": bundle.serial,
                    "problem": f"contract {inp.contract!r} is not in bundle {bundle.serial}",
                }
            )
        halls = [h for h in contract.placement.halls if h in region.halls and h in region.committed]
        shapes: list[FloorShape] = []
        for sku in contract.placement.skus:
            for size in contract.placement.sizes:
                pools = [
                    p for p in region.pools if p.sku == sku and p.size == size and p.hall in halls
                ]
                if not pools:
                    continue
                upi = units_per_instance(contract.unit, pools[0])
                if upi < 1:
                    continue
                first = pools[0]
                shapes.append(
                    FloorShape(
                        sku=sku,
                        size=size,
                        flavor=first.flavor,
                        vcpu=first.vcpu,
                        memory_gib=first.memory_gib,
                        gpus=first.gpus,
                        units_per_instance=upi,
                        pool_ids={p.hall: region.pool_id(p) for p in pools},
                    )
                )
        try:
            leases = await self._provider.list_reservations(inp.region)
        except ProviderError as exc:
            raise exc.to_application_error() from exc
        prefix = floor_prefix(inp.region, inp.contract)
        rows = await asyncio.to_thread(self._fleet.list_instances, inp.region, _LIVE)
        instances = [
            FloorInstance(
                instance_id=r.instance_id,
                hall=r.hall,
                pool_id=r.pool_id,
                state=r.state,
                provider_id=r.provider_id,
                acquisition_id=r.acquisition_id or "",
            )
            for r in rows
            if r.workload == inp.contract
            and r.capacity_type is CapacityType.COMMITTED
            and (r.acquisition_id or "").startswith(prefix)
        ]
        return out.model_copy(
            update={
                "bundle_serial": bundle.serial,
                "tier": contract.tier,
                "floor_units": contract.floor.get(inp.region, 0) if contract.tier == 1 else 0,
                "halls": halls,
                "shapes": shapes,
                "committed": _unreserved(region, halls, leases),
                "instances": instances,
                "reservations": [r for r in leases if (r.owner or r.name).startswith(prefix)],
            }
        )

    @activity.defn(name="floor.probe_halls")
    async def probe_halls(self, inp: ProbeInput) -> ProbeResult:
        prefix = floor_prefix(inp.region, inp.contract)
        rows = await asyncio.to_thread(
            self._fleet.list_instances, inp.region, [InstanceState.ACTIVE]
        )
        mine = [
            r
            for r in rows
            if r.workload == inp.contract and (r.acquisition_id or "").startswith(prefix)
        ]
        try:
            owned = await self._provider.list_owned(inp.region)
        except ProviderError as exc:
            # No answer is no evidence: a provider API outage must not look like hall loss.
            raise ApplicationError(
                f"list_owned: {exc}", type="ProbeUnavailable", non_retryable=True
            ) from exc
        status = {i.provider_id: i.status for i in owned}
        out = ProbeResult(halls={h: HallProbe() for h in inp.pools})
        for r in mine:
            probe = out.halls.get(r.hall)
            if probe is None:
                continue
            probe.instances += 1
            if r.provider_id is None or status.get(r.provider_id) in (None, InstanceStatus.ERROR):
                probe.unhealthy += 1

        async def answering(pool_id: str) -> bool:
            try:
                return await self._provider.free_capacity(pool_id) > 0
            except ProviderError as exc:
                log.warning("free capacity of %s: %s", pool_id, exc)
                return False

        answers = await asyncio.gather(*(answering(p) for p in inp.pools.values()))
        for hall, ok in zip(inp.pools, answers, strict=True):
            out.halls[hall].answering = ok
        return out


def _unreserved(
    region: Region, halls: list[str], leases: list[Reservation]
) -> dict[str, HallCapacity]:
    """Committed capacity per hall minus every live reservation there (anyone's)."""
    out: dict[str, HallCapacity] = {}
    for hall in halls:
        cap = region.committed[hall]
        vcpu, mem, gpus = cap.vcpu, cap.memory_gib, cap.gpus
        flavors = {p.flavor: p for p in region.pools_in_hall(hall)}
        for lease in leases:
            pool = flavors.get(lease.flavor)
            if lease.hall != hall or lease.status in _ENDED or pool is None:
                continue
            vcpu -= pool.vcpu * lease.amount
            mem -= pool.memory_gib * lease.amount
            gpus -= pool.gpus * lease.amount
        out[hall] = HallCapacity(
            free_vcpu=max(0, vcpu),
            free_memory_gib=max(0, mem),
            free_gpus=max(0, gpus),
            price_per_vcpu_hour=cap.price_per_vcpu_hour,
        )
    return out
