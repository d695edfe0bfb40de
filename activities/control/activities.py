"""Control-plane activities: what the region controller reads each tick, and what
acquisitions record about themselves and their decisions.

`snapshot` gathers one consistent-enough view for a controller partition: the contracts
(from the signed bundle, the same one nodes and admission use), demand, live instances,
open acquisitions, exclusions, provider free capacity and ledger reclaim rates.
`greedy_plan` plans it (the controller calls it as a local activity, so no workflow task
does the planner's CPU work: decision 0015), `exact_plan` improves on that under a time
budget.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from temporalio import activity

from activities.control.exact_plan import ExactPlanInput, ExactPlanResult, exact_plan_before
from activities.control.models import (
    ACQUISITION_PREFIX,
    ContractView,
    ControllerSnapshot,
    InstanceBrief,
    MarkSurplusInput,
    MarkSurplusOutput,
    SnapshotInput,
    partition_of,
)
from activities.decisions import Decision
from activities.events import CapacityType, InstanceState
from activities.fleet.control_state import AcquisitionRecord, AcquisitionRow, ControlRepository
from activities.fleet.repository import FleetRepository, InstanceRow
from activities.ledger.queries import reclaim_rate
from activities.ledger.store import LedgerStore, LedgerUnavailable
from activities.lifecycle.models import LIFECYCLE_PREFIX
from activities.plan_sources import PlanSources
from activities.provider.free_capacity import free_capacity
from activities.provider.interface import CloudProvider
from contracts.headroom import headroom_at
from contracts.region import Region
from planning.planner import (
    ContractDemand,
    Plan,
    PlanInput,
    contract_demand,
    plan,
    pool_input,
    units_per_instance,
)

log = logging.getLogger(__name__)

#: Instances that still cover demand. NOTICED/DRAINING ones are going away: their
#: replacement starts at the notice, not after the loss.
_COVERING = (InstanceState.REQUESTED, InstanceState.ACTIVE)
_RATE_CACHE_SECONDS = 300.0
#: Of an exact plan's activity time, what the solve leaves for its result's way back.
_RESULT_MARGIN_SECONDS = 2.0


class ControlActivities:
    def __init__(
        self,
        fleet: FleetRepository,
        control: ControlRepository,
        provider: CloudProvider,
        *,
        regions_dir: Path,
        bundle_cache_dir: Path,
        trust_dir: Path,
        ledger: LedgerStore | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        solver_threads: int = 1,
    ) -> None:
        """`solver_threads`: the threads exact plans are solved on (`worker.solver_threads`),
        apart from the worker's activity pool (see `exact_plan`)."""
        self._fleet = fleet
        self._control = control
        self._provider = provider
        self._sources = PlanSources(regions_dir, bundle_cache_dir, trust_dir)
        self._ledger = ledger
        self._clock = clock
        self._rates: dict[str, float] = {}
        self._rates_at = -math.inf
        self._rates_lock = threading.Lock()
        self._refreshing = False  # a refresh runs beside the ticks
        self._first_read = threading.Lock()
        # Threads start on the first solve, and are idle (not held) between ticks.
        self._solver = concurrent.futures.ThreadPoolExecutor(
            max_workers=solver_threads, thread_name_prefix="sco-solver"
        )

    # -- writes from acquisitions --------------------------------------------------------

    @activity.defn(name="control.record_acquisition")
    def record_acquisition(self, rec: AcquisitionRecord) -> None:
        self._control.record_acquisition(rec)

    @activity.defn(name="control.record_decision")
    def record_decision(self, decision: Decision) -> bool:
        return self._control.record_decision(decision)

    @activity.defn(name="control.mark_surplus")
    def mark_surplus(self, inp: MarkSurplusInput) -> MarkSurplusOutput:
        since = self._control.mark_surplus(inp.region, inp.workloads, inp.instance_ids)
        return MarkSurplusOutput(since=since)

    # -- the controller's view -----------------------------------------------------------

    @activity.defn(name="control.greedy_plan")
    def greedy_plan(self, problem: PlanInput) -> Plan:
        """The greedy plan of the tick's problem (pure, tens of milliseconds at a region's
        scale): the controller runs it as a local activity, off the workflow thread, and its
        history records the answer, so a later planner change cannot break a replay."""
        return plan(problem)

    @activity.defn(name="control.exact_plan")
    async def exact_plan(self, inp: ExactPlanInput) -> ExactPlanResult:
        """The exact plan within the input's time budget, or the greedy plan it carries.

        Solved on the solver's own threads, never on the worker's activity pool: HiGHS
        keeps state for each thread that ever called it (its task executor, 0.5 MB; with
        the thread's malloc arena about 1 MB: bench/solver_threads_bench.py) for that
        thread's life, so solves on whichever of the pool's 16 threads was free grew the
        worker each time one took its first (issue 33: the worker's creep; decision 0040).
        A solve that waits for a thread gets the activity's time left."""
        timeout = activity.info().start_to_close_timeout
        allowed = (
            timeout.total_seconds() - _RESULT_MARGIN_SECONDS
            if timeout is not None
            else inp.time_budget_seconds
        )
        return await asyncio.get_running_loop().run_in_executor(
            self._solver, exact_plan_before, inp, time.monotonic() + allowed
        )

    @activity.defn(name="control.snapshot")
    async def snapshot(self, inp: SnapshotInput) -> ControllerSnapshot:
        out = ControllerSnapshot(region=inp.region, partition=inp.partition)
        loaded = await self._sources.load(inp.region)
        if isinstance(loaded, str):
            return out.model_copy(update={"problem": loaded})
        region, bundle = loaded
        contracts = [
            c
            for c in bundle.content.contracts
            if inp.region in c.regions and partition_of(c.name, inp.partitions) == inp.partition
        ]
        names = [c.name for c in contracts]
        demand, live, open_acqs, excluded, declines, leaving = await asyncio.to_thread(
            self._fleet_view, inp.region, inp.partition, names
        )
        recorded = await asyncio.to_thread(
            self._control.recorded_instances, [a.acquisition_id for a in open_acqs]
        )
        now = self._clock()
        headroom = {c.name: headroom_at(c, now) for c in contracts}
        wanted = {c.name for c in contracts if demand.get(c.name, 0) + headroom[c.name][0] > 0}
        pool_ids = [
            region.pool_id(p)
            for p in region.pools
            if any(
                p.sku in c.placement.skus
                and p.size in c.placement.sizes
                and p.hall in c.placement.halls
                for c in contracts
                if c.name in wanted
            )
        ]
        free = await free_capacity(self._provider, pool_ids)
        rates = await asyncio.to_thread(self._reclaim_rates, region, inp.reclaim_window_hours)
        live_per_pool: dict[str, int] = {}
        for row in live:
            live_per_pool[row.pool_id] = live_per_pool.get(row.pool_id, 0) + 1
        pools = [
            pool_input(
                region,
                p,
                free=min(
                    free.get(region.pool_id(p), 0),
                    max(0, p.reclaimable_units - live_per_pool.get(region.pool_id(p), 0)),
                ),
                reclaim_rate=rates.get(region.pool_id(p), 0.0),
                excluded=region.pool_id(p) in excluded,
                load=inp.load_risk,
            )
            for p in region.pools
        ]
        views = []
        for c in contracts:
            # Instances with a hostname are Slurm CLOUD nodes: Slurm's power saving owns
            # them (ResumeProgram/SuspendProgram), so they neither cover nor count as surplus.
            # Instances with a planned reclaim (an early warning went out) are leaving:
            # they cover nothing, so the replacement starts now, make-before-break, within
            # the contract's caps and budget like any other demand. They still fill their
            # pool until they go (live_per_pool above).
            mine = [
                r
                for r in live
                if r.workload == c.name and r.hostname is None and r.instance_id not in leaving
            ]
            reclaimable = [r for r in mine if r.capacity_type is CapacityType.RECLAIMABLE]
            existing: dict[str, int] = {}
            for r in reclaimable:
                existing[r.pool_id] = existing.get(r.pool_id, 0) + 1
            fallback = [
                r
                for r in mine
                if r.capacity_type is CapacityType.COMMITTED
                and (r.acquisition_id or "").startswith(ACQUISITION_PREFIX)
            ]
            cd = contract_demand(c, inp.region, demand.get(c.name, 0), existing)
            outstanding = 0
            for a in open_acqs:
                if (
                    a.workload != c.name
                    or a.requested_instances <= 0
                    or not a.acquisition_id.startswith(ACQUISITION_PREFIX)
                ):
                    continue
                left = max(0, a.requested_instances - recorded.get(a.acquisition_id, 0))
                outstanding += math.ceil(a.requested_units * left / a.requested_instances)
            fallback_units = sum(_units(cd, region, r.pool_id) for r in fallback)
            views.append(
                ContractView(
                    demand=cd,
                    tier=c.tier,
                    authority_per_hour=c.max_fallback_spend_per_hour,
                    fallback_spend_per_hour=sum(r.price_per_hour for r in fallback),
                    fallback_units=fallback_units,
                    outstanding_units=outstanding,
                    awaiting_approval=any(
                        a.workload == c.name and a.state == "waiting_approval" for a in open_acqs
                    ),
                    fallback_declined_at=declines.get(c.name),
                    kubernetes=bool(c.selectors.kubernetes),
                    headroom_units=headroom[c.name][0],
                    headroom_why=headroom[c.name][1],
                    # The lifecycle workflow's replacements stand in for the controller's
                    # instances: released as surplus like them when demand drops.
                    instances=[
                        _brief(r)
                        for r in mine
                        if (r.acquisition_id or "").startswith(
                            (ACQUISITION_PREFIX, LIFECYCLE_PREFIX)
                        )
                    ],
                )
            )
        return out.model_copy(
            update={
                "bundle_serial": bundle.serial,
                "contracts": views,
                "pools": pools,
                "committed_rate": {
                    hall: cap.price_per_vcpu_hour for hall, cap in region.committed.items()
                },
            }
        )

    def _fleet_view(
        self, region: str, partition: int, names: list[str]
    ) -> tuple[
        dict[str, int],
        list[InstanceRow],
        list[AcquisitionRow],
        set[str],
        dict[str, datetime],
        set[str],
    ]:
        demand = self._control.demand_by_contract(region)
        wanted = set(names)
        live = [r for r in self._fleet.list_instances(region, _COVERING) if r.workload in wanted]
        open_acqs = [
            a for a in self._control.open_acquisitions(region, partition) if a.workload in wanted
        ]
        excluded = self._control.excluded_pools(region)
        declines = self._control.last_fallback_decline(region, names)
        leaving = {p.instance_id for p in self._fleet.planned_reclaims(region, workloads=names)}
        return demand, live, open_acqs, excluded, declines, leaving

    def _reclaim_rates(self, region: Region, window_hours: float) -> dict[str, float]:
        """The ledger's reclaim rates of the region's pools, read at most every
        `_RATE_CACHE_SECONDS`. The first read is waited for; after it, a tick that finds
        the rates stale plans with the last known ones while one refresh runs beside it
        (an embedded ledger is read by a child process, seconds on a loaded machine:
        activities/ledger/child.py), and the partitions' ticks never read it at once."""
        if self._ledger is None:
            return {}
        with self._rates_lock:
            if time.monotonic() - self._rates_at < _RATE_CACHE_SECONDS:
                return self._rates
            if self._rates_at != -math.inf:
                if not self._refreshing:
                    self._refreshing = True
                    threading.Thread(
                        target=self._refresh_rates,
                        args=(region, window_hours),
                        name="reclaim-rates",
                        daemon=True,
                    ).start()
                return self._rates
        with self._first_read:  # the others wait for the first read, then use it
            if self._rates_at == -math.inf:
                self._refresh_rates(region, window_hours)
            return self._rates

    def _refresh_rates(self, region: Region, window_hours: float) -> None:
        assert self._ledger is not None
        end = self._clock()
        try:
            try:
                rates = reclaim_rate(
                    self._ledger,
                    pool_ids=region.pool_ids(),
                    start=end - timedelta(hours=window_hours),
                    end=end,
                )
            except LedgerUnavailable as exc:
                # Planning without risk data beats not planning; the last rates stay in use.
                log.warning("reclaim rates unavailable, using the last known: %s", exc)
                rates = self._rates
            with self._rates_lock:
                self._rates, self._rates_at = rates, time.monotonic()
        finally:
            with self._rates_lock:
                self._refreshing = False


def _units(cd: ContractDemand, region: Region, pool_id: str) -> int:
    return units_per_instance(cd, pool_input(region, region.pool(pool_id), free=0))


def _brief(r: InstanceRow) -> InstanceBrief:
    return InstanceBrief(
        instance_id=r.instance_id,
        pool_id=r.pool_id,
        hall=r.hall,
        state=r.state,
        capacity_type=r.capacity_type,
        price_per_hour=r.price_per_hour,
        acquisition_id=r.acquisition_id,
        provider_id=r.provider_id,
    )
