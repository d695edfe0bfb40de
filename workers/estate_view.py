"""The estate at a glance (`sco estate status`): every region read at once, each from its
own fleet state and its own Temporal namespace, within a deadline per region.

A region that does not answer in time (or whose fleet database refuses) is reported as
such and the others still are: regions share nothing, so neither does reading them.
Nothing here writes anything.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pydantic import BaseModel

from activities.events import TERMINAL_STATES, CapacityType
from contracts.pool_id import PoolId
from workers.settings import Settings

if TYPE_CHECKING:
    from workflows.floor.models import FloorStatus

#: Acquisition states that are over (fleet state's `acquisitions.state`).
_FINISHED = {"completed", "cancelled", "failed", "declined"}
_WAITING_APPROVAL = "waiting_approval"


class HallView(BaseModel):
    hall: str
    floor_held_units: int = 0
    floor_target_units: int = 0
    reclaimable_instances: int = 0
    committed_instances: int = 0
    excluded_pools: list[str] = []
    open_acquisitions: int = 0
    approvals_waiting: int = 0
    spend_per_hour: float = 0.0


class FloorView(BaseModel):
    contract: str
    state: str
    floor_units: int
    held_units: int
    lost_halls: list[str] = []
    answering: bool = True


class RegionView(BaseModel):
    region: str
    #: False: the region did not answer within the deadline, or its fleet state refused.
    answered: bool
    error: str = ""
    #: Sources that failed while the rest answered ("temporal: ...").
    partial: list[str] = []
    halls: list[HallView] = []
    floors: list[FloorView] = []
    open_acquisitions: int = 0
    approvals_waiting: int = 0
    spend_per_hour: float = 0.0
    currency: str = ""
    seconds: float = 0.0


class EstateView(BaseModel):
    generated_at: datetime
    deadline_seconds: float
    regions: list[RegionView]


def region_settings(s: Settings, region: str) -> Settings:
    """The settings that read `region`: `estate.regions.<region>` over this process's."""
    o = s.estate.regions.get(region)
    if o is None:
        return s
    update: dict[str, object] = {}
    if o.postgres_dsn:
        update["postgres_dsn"] = o.postgres_dsn
    if o.temporal_address:
        update["temporal"] = s.temporal.model_copy(update={"address": o.temporal_address})
    return s.model_copy(update=update)


def read_estate(s: Settings, regions: list[str] | None = None) -> EstateView:
    """Every region at once; each region gets `estate.deadline_seconds` from the start."""
    regions = regions or list(s.regions)
    deadline = s.estate.deadline_seconds
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(regions))
    futures = {r: pool.submit(read_region, region_settings(s, r), r) for r in regions}
    start = time.monotonic()
    out = []
    for r, fut in futures.items():
        try:
            out.append(fut.result(timeout=max(0.0, deadline - (time.monotonic() - start))))
        except concurrent.futures.TimeoutError:
            out.append(
                RegionView(region=r, answered=False, error=f"no answer within {deadline:g} s")
            )
        except Exception as exc:  # one region's failure is shown, not raised
            out.append(RegionView(region=r, answered=False, error=_one_line(exc)))
    # A region still hanging is left to its thread: this process reports and moves on.
    pool.shutdown(wait=False, cancel_futures=True)
    return EstateView(generated_at=datetime.now(UTC), deadline_seconds=deadline, regions=out)


def read_region(s: Settings, region: str) -> RegionView:
    """One region: fleet state (instances, exclusions, acquisitions), then its floor
    keepers' status queries on Temporal. Fleet state failing fails the region; Temporal
    failing leaves the floors out and says so."""
    from activities.fleet.control_state import ControlRepository
    from activities.fleet.db import open_pool
    from activities.fleet.repository import FleetRepository
    from contracts.region import load_region

    started = time.monotonic()
    model = load_region(s.region_file(region))
    halls = {h: HallView(hall=h) for h in model.halls}
    view = RegionView(region=region, answered=True, currency=model.currency)
    pool = open_pool(s.postgres_dsn, min_size=1, max_size=1)
    try:
        instances = FleetRepository(pool).list_instances(region, None)
        control = ControlRepository(pool)
        excluded = control.excluded_pools(region)
        acquisitions = control.open_acquisitions(region)
    finally:
        pool.close()
    for i in instances:
        if i.state in TERMINAL_STATES or i.hall not in halls:
            continue
        h = halls[i.hall]
        if i.capacity_type == CapacityType.RECLAIMABLE:
            h.reclaimable_instances += 1
        else:
            h.committed_instances += 1
        h.spend_per_hour += i.price_per_hour
    for p in sorted(excluded):
        hall = PoolId.parse(p).hall
        if hall in halls:
            halls[hall].excluded_pools.append(p)
    for a in acquisitions:
        if a.state in _FINISHED:
            continue
        waiting = a.state == _WAITING_APPROVAL
        view.open_acquisitions += 1
        view.approvals_waiting += waiting
        for hall in sorted({PoolId.parse(p).hall for p in a.pool_ids} & set(halls)):
            halls[hall].open_acquisitions += 1
            halls[hall].approvals_waiting += waiting
    try:
        # Inside the region's deadline, so a Temporal that hangs (a namespace whose
        # worker is gone answers no query) still leaves the fleet-state part shown.
        budget = max(0.1, s.estate.deadline_seconds * 0.8 - (time.monotonic() - started))
        floors = asyncio.run(asyncio.wait_for(_floors(s, region), timeout=budget))
    except Exception as exc:  # Temporal down: the fleet-state part still shows
        floors = []
        view.partial.append(f"temporal: {_one_line(exc)}")
    for f, status in floors:
        view.floors.append(f)
        if status is None:
            continue
        for hall, units in status.held_units_by_hall.items():
            if hall in halls:
                halls[hall].floor_held_units += units
        for hall, units in status.target_units_by_hall.items():
            if hall in halls:
                halls[hall].floor_target_units += units
    view.halls = list(halls.values())
    for h in view.halls:
        h.spend_per_hour = round(h.spend_per_hour, 4)
    view.spend_per_hour = round(sum(h.spend_per_hour for h in view.halls), 4)
    view.seconds = round(time.monotonic() - started, 3)
    return view


async def _floors(s: Settings, region: str) -> list[tuple[FloorView, FloorStatus | None]]:
    """Each running floor keeper's status query (FloorView, FloorStatus or None)."""
    from temporalio.runtime import Runtime, TelemetryConfig
    from temporalio.service import RPCError

    from workers.temporal_connect import connect
    from workflows import search_attributes as sa
    from workflows.floor.models import STATUS_QUERY, FloorStatus

    client = await connect(s, region, runtime=Runtime(telemetry=TelemetryConfig(metrics=None)))
    query = (
        f'WorkflowType = "FloorKeeperWorkflow" AND {sa.REGION.name} = "{region}" '
        'AND ExecutionStatus = "Running"'
    )
    out: list[tuple[FloorView, FloorStatus | None]] = []
    async for wf in client.list_workflows(query):
        contract = wf.id.removeprefix(f"floor-{region}-")
        try:
            st = await client.get_workflow_handle(wf.id).query(
                STATUS_QUERY, result_type=FloorStatus
            )
        except RPCError:  # a wedged keeper answers no query
            out.append(
                (
                    FloorView(
                        contract=contract,
                        state="not answering",
                        floor_units=0,
                        held_units=0,
                        answering=False,
                    ),
                    None,
                )
            )
            continue
        held = sum(st.held_units_by_hall.values())
        out.append(
            (
                FloorView(
                    contract=st.contract,
                    state=str(st.state.value),
                    floor_units=st.floor_units,
                    held_units=held,
                    lost_halls=list(st.lost_halls),
                ),
                st,
            )
        )
    return sorted(out, key=lambda x: x[0].contract)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
