"""Lifecycle activities: what the lifecycle workflow reads each round, and telling a drain.

`snapshot` reads the signed bundle's contracts for the region, their demand (every
source's, summed: what consolidation must keep covered), their live instances from
fleet state (only what SCO's controller and the lifecycle workflow acquired: a floor's
instances are its keeper's, a Slurm node's are Slurm's, an instance with a planned
reclaim is leaving anyway) and, for contracts that hold instances, their allowed
reclaimable pools with the free capacity the provider reports (never more than the pool
lends minus what runs there). Deciding is the workflow's pure code (planning/lifecycle.py).

`instance` reads one instance's row (a replacement to release). `unused_fallback_leases`
names the Blazar leases a replaced fallback instance leaves with nothing booted into them
(the workflow deletes them, budgeted: the fallback spend stops with the instance, not
when the reconciler finds the orphan a quarter of an hour later). `tell_drain` asks the
hall's notice relay, over NATS, to notice one instance (the request `sco reclaim --force`
sends): the relay records the NOTICE, signs and publishes the notice, and the node's agent
drains by the contract's drain action before the deadline. The agent hears it with the
control plane down too; the relay deletes what outlives its deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import nats
from nats.aio.client import Client as NatsClient
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from activities.events import CapacityType, InstanceState
from activities.fleet.control_state import ControlRepository
from activities.fleet.repository import FleetRepository, InstanceRow
from activities.lifecycle.models import (
    LIFECYCLE_PREFIX,
    REQUESTED_BY,
    DrainInput,
    DrainTold,
    FallbackLeaseInput,
    FallbackLeases,
    InstanceLookup,
    InstanceRef,
    LifecycleSnapshot,
    LifecycleSnapshotInput,
)
from activities.plan_sources import PlanSources
from activities.provider.free_capacity import free_capacity
from activities.provider.interface import CloudProvider
from activities.provider.leases import fallback_acquisition
from contracts.bounded import InputRejected
from contracts.feasibility import units_per_instance
from contracts.headroom import headroom_at
from contracts.model import Contract
from contracts.notice import reclaim_subject
from contracts.reclaim import ReclaimRequest, parse_reclaim_reply
from contracts.region import Region
from planning.costs import pool_share_cap
from planning.lifecycle import (
    ContractLife,
    LifeInstance,
    LifePool,
    SpreadMember,
    spread_rooms,
)

#: Acquisitions whose instances the lifecycle may replace: the controller's and its own.
_REPLACEABLE = ("acq-", LIFECYCLE_PREFIX)
_LIVE = (InstanceState.REQUESTED, InstanceState.ACTIVE)


class LifecycleActivities:
    def __init__(
        self,
        fleet: FleetRepository,
        control: ControlRepository,
        provider: CloudProvider,
        *,
        regions_dir: Path,
        bundle_cache_dir: Path,
        trust_dir: Path,
        nats_connect: Callable[[], Awaitable[NatsClient]] | None = None,
        request_seconds: float = 10.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        spread_max_pool_fraction: float = 0.25,
    ) -> None:
        """`nats_connect`: a fresh connection to the region's NATS (closed after each
        request); None: no NATS here, every drain is refused as unavailable.
        `spread_max_pool_fraction`: the controller's (control.spread_max_pool_fraction),
        so replacements keep to the spread groups its acquisitions keep to."""
        self._fleet = fleet
        self._control = control
        self._provider = provider
        self._sources = PlanSources(regions_dir, bundle_cache_dir, trust_dir)
        self._nats_connect = nats_connect
        self._request_seconds = request_seconds
        self._clock = clock
        self._spread_fraction = spread_max_pool_fraction

    @activity.defn(name="lifecycle.snapshot")
    async def snapshot(self, inp: LifecycleSnapshotInput) -> LifecycleSnapshot:
        out = LifecycleSnapshot(region=inp.region)
        loaded = await self._sources.load(inp.region)
        if isinstance(loaded, str):
            return out.model_copy(update={"problem": loaded})
        region, bundle = loaded
        contracts = [c for c in bundle.content.contracts if inp.region in c.regions]
        rows, leaving, excluded, demand = await asyncio.to_thread(
            self._fleet_view, inp.region, [c.name for c in contracts]
        )
        live_per_pool: dict[str, int] = {}
        for r in rows:
            live_per_pool[r.pool_id] = live_per_pool.get(r.pool_id, 0) + 1
        views: list[ContractLife] = []
        now = self._clock()
        # Each contract's demand as consolidation keeps it covered: what the controller
        # plans for (with headroom), before it nets out fallback and open acquisitions.
        target = {c.name: demand.get(c.name, 0) + headroom_at(c, now)[0] for c in contracts}
        groups = spread_rooms(
            [_spread_member(region, c, target[c.name], rows, leaving) for c in contracts],
            self._spread_fraction,
        )
        for c in contracts:
            mine = [
                r
                for r in rows
                if r.workload == c.name
                and r.hostname is None
                and r.instance_id not in leaving
                and (r.acquisition_id or "").startswith(_REPLACEABLE)
            ]
            if not mine:
                continue
            views.append(
                ContractLife(
                    contract=c,
                    tier=c.tier,
                    # The controller holds the headroom beyond demand as cover: consolidation
                    # keeps it too, or the controller would buy back what it removed.
                    demand_units=target[c.name],
                    instances=[_instance(region, c, r) for r in mine],
                    pools=_allowed_pools(region, c, excluded),
                    spread=[groups[g] for g in sorted(set(c.placement.spread_groups))],
                )
            )
        wanted = sorted({p.pool_id for v in views for p in v.pools if not p.excluded})
        free = await free_capacity(self._provider, wanted)
        for v in views:
            for p in v.pools:
                lends = region.pool(p.pool_id).reclaimable_units - live_per_pool.get(p.pool_id, 0)
                p.free = max(0, min(free.get(p.pool_id, 0), lends))
        return out.model_copy(
            update={
                "bundle_serial": bundle.serial,
                "lead_seconds": float(region.notice_lead_seconds),
                "contracts": views,
            }
        )

    def _fleet_view(
        self, region: str, names: list[str]
    ) -> tuple[list[InstanceRow], set[str], set[str], dict[str, int]]:
        rows = [r for r in self._fleet.list_instances(region, _LIVE) if r.workload in names]
        leaving = {p.instance_id for p in self._fleet.planned_reclaims(region, workloads=names)}
        excluded = self._control.excluded_pools(region)
        return rows, leaving, excluded, self._control.demand_by_contract(region)

    @activity.defn(name="lifecycle.instance")
    async def instance(self, inp: InstanceLookup) -> InstanceRef:
        """One instance's fleet-state row (a replacement's provider id, to release it)."""
        row = await asyncio.to_thread(self._fleet.get_instance, inp.instance_id)
        if row is None:
            return InstanceRef(instance_id=inp.instance_id)
        return InstanceRef(
            instance_id=row.instance_id,
            found=True,
            state=row.state.value,
            pool_id=row.pool_id,
            provider_id=row.provider_id,
            price_per_hour=row.price_per_hour,
        )

    @activity.defn(name="lifecycle.unused_fallback_leases")
    async def unused_fallback_leases(self, inp: FallbackLeaseInput) -> FallbackLeases:
        """The leases of the instance's fallback acquisition in its hall and flavor, when
        no live instance of that acquisition is left there (a lease of 2 with one instance
        still booted into it stays)."""
        row = await asyncio.to_thread(self._fleet.get_instance, inp.instance_id)
        if row is None or row.capacity_type is not CapacityType.COMMITTED:
            return FallbackLeases()
        acq = row.acquisition_id or ""
        flavor = f"{row.sku}.{row.size}"

        def users() -> int:
            rows = self._fleet.list_instances(inp.region, _LIVE, pool_id=row.pool_id)
            return sum(1 for r in rows if r.acquisition_id == acq)

        if not acq or await asyncio.to_thread(users) > 0:
            return FallbackLeases()
        leases = await self._provider.list_reservations(inp.region)
        return FallbackLeases(
            lease_ids=sorted(
                x.lease_id
                for x in leases
                if fallback_acquisition(x.owner) == acq
                and x.hall == row.hall
                and x.flavor == flavor
                and x.status not in ("TERMINATED", "DELETED")
            )
        )

    @activity.defn(name="lifecycle.tell_drain")
    async def tell_drain(self, inp: DrainInput) -> DrainTold:
        """Notice one instance through its hall's relay. Transport trouble (NATS away, no
        relay for the hall, no answer in time) raises a retryable `DrainUnavailable`; a
        relay's answer is returned, noticed or not."""
        if self._nats_connect is None:
            raise ApplicationError(
                "no NATS connection configured for drains",
                type="DrainUnavailable",
                non_retryable=True,
            )
        request = ReclaimRequest(
            instances=[inp.instance_id],
            reason=inp.reason[:200],
            requested_by=REQUESTED_BY,
            # Return from fallback drains committed capacity: the lifecycle means it.
            force=True,
        )
        subject = reclaim_subject(inp.region, inp.hall)
        try:
            nc = await self._nats_connect()
        except (nats.errors.Error, OSError) as exc:
            raise _unavailable(f"NATS does not answer: {exc or type(exc).__name__}") from exc
        try:
            msg = await nc.request(
                subject, request.model_dump_json().encode(), timeout=self._request_seconds
            )
            reply = parse_reclaim_reply(msg.data)
        except InputRejected as exc:
            raise _unavailable(f"the notice relay for {inp.region}/{inp.hall}: {exc}") from exc
        except nats.errors.NoRespondersError as exc:
            raise _unavailable(f"no notice relay runs for {inp.region}/{inp.hall}") from exc
        except (nats.errors.TimeoutError, TimeoutError) as exc:
            raise _unavailable(
                f"the notice relay for {inp.region}/{inp.hall} did not answer in "
                f"{self._request_seconds:g} s"
            ) from exc
        finally:
            await nc.close()
        if reply.error is not None:
            return DrainTold(told=False, why=f"the relay refused: {reply.error}")
        if inp.instance_id not in reply.noticed:
            return DrainTold(told=False, why=f"{inp.instance_id} is no longer active")
        row = await asyncio.to_thread(self._fleet.get_instance, inp.instance_id)
        return DrainTold(
            told=True,
            lead_seconds=reply.lead_seconds,
            noticed_at=row.state_changed_at if row is not None else datetime.now(UTC),
        )


def _unavailable(message: str) -> ApplicationError:
    # Expected while a relay restarts: retried by the workflow's policy, logged quietly.
    return ApplicationError(
        message, type="DrainUnavailable", category=ApplicationErrorCategory.BENIGN
    )


def _instance(region: Region, contract: Contract, row: InstanceRow) -> LifeInstance:
    try:
        units = units_per_instance(contract.unit, region.pool(row.pool_id))
    except KeyError:
        units = 0  # a pool gone from the region file: any replacement covers it
    committed = row.capacity_type is CapacityType.COMMITTED
    return LifeInstance(
        instance_id=row.instance_id,
        region=row.region,
        workload=row.workload,
        pool_id=row.pool_id,
        hall=row.hall,
        sku=row.sku,
        size=row.size,
        state=row.state.value,
        committed=committed,
        fallback=committed and (row.acquisition_id or "").startswith("acq-"),
        created_at=row.created_at,
        price_per_hour=row.price_per_hour,
        units=units,
        provider_id=row.provider_id,
    )


def _spread_member(
    region: Region, contract: Contract, wanted: int, rows: list[InstanceRow], leaving: set[str]
) -> SpreadMember:
    """The contract's part in its spread groups as the controller's planner counts it: its
    target, and the units of its live reclaimable instances per pool (a Slurm node or one
    with a planned reclaim is not counted: activities/control/activities.py)."""
    used: dict[str, int] = {}
    for r in rows:
        if (
            r.workload != contract.name
            or r.hostname is not None
            or r.instance_id in leaving
            or r.capacity_type is not CapacityType.RECLAIMABLE
        ):
            continue
        try:
            units = units_per_instance(contract.unit, region.pool(r.pool_id))
        except KeyError:
            continue  # a pool gone from the region file
        used[r.pool_id] = used.get(r.pool_id, 0) + units
    cap = contract.placement.max_units_per_region
    return SpreadMember(
        groups=list(contract.placement.spread_groups), target_units=min(wanted, cap), used=used
    )


def _allowed_pools(region: Region, contract: Contract, excluded: set[str]) -> list[LifePool]:
    p = contract.placement
    out = []
    for pool in region.pools:
        if pool.sku not in p.skus or pool.size not in p.sizes or pool.hall not in p.halls:
            continue
        units = units_per_instance(contract.unit, pool)
        if units < 1:
            continue
        pid = region.pool_id(pool)
        out.append(
            LifePool(
                pool_id=pid,
                hall=pool.hall,
                flavor=pool.flavor,
                price_per_hour=pool.price_per_hour,
                units=units,
                excluded=pid in excluded,
                share_cap=pool_share_cap(p.max_pool_share, pool.reclaimable_units),
            )
        )
    return out
