"""FloorKeeperWorkflow: committed capacity for one tier-1 contract in one region, forever.

Id `floor-<region>-<contract>`. Each tick (60 s), or at once after a signal or a probe's
verdict, one *round*: read a snapshot (the floor from the signed bundle, committed capacity,
the floor's instances and reservations), plan with pure code (`plan.py`: the cheapest
committed shape per unit, `spread_floor` over the healthy halls: >= 3 halls, <= 40 % in
one), then per hall with a deficit, *all halls in parallel*: use spare slots of the floor's
reservations there, reserve the rest (a Blazar lease whose owner, `leases.py`, is the
reservation key `floor-<region>-<contract>-<hall>-<gen>`; idempotent on the name), wait
until ACTIVE and boot into it with a child AcquisitionWorkflow (id `<key>-<nonce>`,
ABANDON, recorded first under partition -1 so the region controller never counts it).
A rebuild therefore costs one reservation plus one boot, not a sum over halls.

Hall loss. An operator declares it (`hall_lost`) or probes detect it. Probes run every
`probe_seconds` (15 s): for each hall, the floor's ACTIVE instances there and how many the
provider reports ERROR or does not know. Rule, with hysteresis:
- lost when >= 50 % (`lost_fraction`) of the hall's floor instances are unhealthy on 2
  (`lost_probes`) probes in a row (a single bad answer is not a loss);
- a *detected* loss is lifted after 3 (`clean_probes`) clean probes in a row (no unhealthy
  instance left there and the provider reports capacity of the floor's shape in the hall),
  or by an operator's `hall_restored`; an *operator's* loss is lifted only by an operator.
A lost hall counts for nothing; its share is rebuilt in the surviving halls in a round
that starts at once. When the survivors cannot hold the floor by the rules (fewer than 3
halls, or not enough committed capacity), the keeper takes the best available spread and
says so: a FLOOR decision `degraded` with the reason, SCOState `degraded` and the status
query's `state`/`reason`. Instances in a lost hall are released (and their reservations
deleted) only once the floor is whole elsewhere.

Recovery, make-before-break. After `hall_restored` the plan targets the restored hall
again: the round first launches there and waits for ACTIVE; only then, from a fresh
snapshot and only if every hall holds its target, it releases the surplus elsewhere
(newest reservations first: delete instances, then delete reservations left empty). The
floor's ACTIVE instances never drop below its size; a failed launch keeps the surplus.

Reservations within `renew_before_hours` of their end are extended by `lease_hours`.
Wake-ups come from the keeper's own timers (a probe timer, a tick timer restarted by every
round), so what a wake-up does follows from history alone. Continue-as-new after
`wakeups_per_run` wake-ups, `max_history_events` events or when Temporal suggests it, carrying
the lost halls, probe streaks, reservation generation and budget counter.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timedelta
from functools import partial
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.budget import TOKENS_GRANTED_SIGNAL, TokenGrant
    from activities.control.activities import ControlActivities
    from activities.decisions import Decision, DecisionKind
    from activities.events import CapacityType, EventKind
    from activities.fleet.activities import FleetActivities, RecordEventInput
    from activities.fleet.control_state import AcquisitionRecord
    from activities.floor.activities import FloorActivities
    from activities.floor.models import (
        FloorInstance,
        FloorShape,
        FloorSnapshot,
        FloorSnapshotInput,
        ProbeInput,
        ProbeResult,
        floor_prefix,
    )
    from activities.provider.activities import (
        ExtendReservationInput,
        LeaseRef,
        ProviderActivities,
    )
    from activities.provider.interface import Reservation, ReservationRequest
    from planning.choice import ChoiceRecord
    from workflows import search_attributes as sa
    from workflows.acquisition.models import (
        AcquisitionInput,
        AcquisitionState,
        LaunchItem,
    )
    from workflows.budget.client import BudgetClient
    from workflows.child_acquisition import gather, run_child_acquisition
    from workflows.floor.models import (
        FLOOR_PARTITION,
        HALL_LOST_SIGNAL,
        HALL_RESTORED_SIGNAL,
        STATUS_QUERY,
        FloorInput,
        FloorState,
        FloorStatus,
        HallEvent,
        HallLoss,
        floor_lease_name,
        reservation_key,
    )
    from workflows.floor.plan import (
        FloorPlan,
        judge,
        live_by_reservation,
        max_generation,
        plan_floor,
        to_release,
    )
    from workflows.metrics import count
    from workflows.provider_calls import delete_instance, reserve

T = TypeVar("T")

_RETRY = RetryPolicy(maximum_attempts=10, maximum_interval=timedelta(seconds=30))

#: Wake-ups decided by the keeper's own timers instead of the clock (issue 37).
WAKEUPS_FROM_TIMERS = "floor-wakeups-from-timers"
#: Surplus released newest reservation first by its generation as a number, not as text.
RELEASE_BY_GENERATION = "floor-release-by-generation"


def _timer(seconds: float) -> asyncio.Task[None]:
    """A durable timer as a task: done when its TimerFired event is in history."""
    return asyncio.ensure_future(asyncio.sleep(seconds))


@workflow.defn
class FloorKeeperWorkflow:
    @workflow.init
    def __init__(self, inp: FloorInput) -> None:
        self._inp = inp
        self._cfg = inp.config
        self._id = workflow.info().workflow_id
        self._prefix = floor_prefix(inp.region, inp.contract)
        self._budget = BudgetClient(start_counter=inp.budget_counter)
        self._lost: dict[str, HallLoss] = dict(inp.lost)
        self._bad = dict(inp.bad_probes)
        self._clean = dict(inp.clean_probes)
        self._generation = inp.generation
        self._rebuild_since: datetime | None = inp.rebuild_since
        self._rebalancing = inp.state is FloorState.REBALANCING
        self._recorded_degraded = inp.recorded_degraded
        self._dirty = True  # plan at once after a start or continue-as-new
        self._pools: dict[str, str] = {}  # hall -> pool of the floor's shape (for probes)
        self._decisions: list[Decision] = []  # from signal handlers, recorded by the loop
        self._status = FloorStatus(
            contract=inp.contract,
            region=inp.region,
            state=inp.state,
            reason=inp.reason,
            last_rebuild_seconds=inp.last_rebuild_seconds,
            lost_halls=sorted(self._lost),
            losses=list(self._lost.values()),
            rounds=inp.rounds,
        )

    # -- messages ------------------------------------------------------------------------

    @workflow.signal(name=HALL_LOST_SIGNAL)
    def hall_lost(self, ev: HallEvent) -> None:
        known = self._lost.get(ev.hall)
        if known is not None and not known.detected:
            return  # already declared by an operator: nothing new
        self._lose(
            HallLoss(
                hall=ev.hall,
                detected=False,
                by=ev.operator,
                reason=ev.reason or "declared lost",
                since=known.since if known else workflow.now(),
                identity=ev.identity,
            )
        )

    @workflow.signal(name=HALL_RESTORED_SIGNAL)
    def hall_restored(self, ev: HallEvent) -> None:
        if ev.hall not in self._lost:
            return
        self._restore(ev.hall, ev.operator, ev.reason or "declared restored", ev.identity)

    @workflow.signal(name=TOKENS_GRANTED_SIGNAL)
    def tokens_granted(self, grant: TokenGrant) -> None:
        self._budget.on_grant(grant)

    @workflow.query(name=STATUS_QUERY)
    def status(self) -> FloorStatus:
        """Read-only: a copy with the derived fields filled, the keeper's state untouched
        (a query runs between and during tasks, on any worker, and is not in history)."""
        return self._status.model_copy(
            update={
                "pending": self._dirty,
                "lost_halls": sorted(self._lost),
                "losses": [self._lost[h] for h in sorted(self._lost)],
            },
            deep=True,
        )

    def _lose(self, loss: HallLoss) -> None:
        self._lost[loss.hall] = loss
        self._bad.pop(loss.hall, None)
        self._clean.pop(loss.hall, None)
        if self._rebuild_since is None:
            self._rebuild_since = workflow.now()
        self._rebalancing = False
        self._status.state = FloorState.REBUILDING
        self._status.reason = f"hall {loss.hall} lost ({loss.by}): {loss.reason}"
        self._decisions.append(
            self._decision(
                "hall_lost",
                self._status.reason,
                actor=loss.by,
                subject=loss.hall,
                identity=loss.identity,
            )
        )
        self._dirty = True

    def _restore(self, hall: str, by: str, reason: str, identity: str = "") -> None:
        del self._lost[hall]
        self._bad.pop(hall, None)
        self._clean.pop(hall, None)
        self._rebalancing = True
        self._status.reason = f"hall {hall} restored ({by}): {reason}"
        self._decisions.append(
            self._decision(
                "hall_restored", self._status.reason, actor=by, subject=hall, identity=identity
            )
        )
        self._dirty = True

    # -- the loop ------------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: FloorInput) -> None:
        workflow.upsert_search_attributes(
            [
                sa.REGION.value_set(inp.region),
                sa.WORKLOAD.value_set(inp.contract),
                sa.STATE.value_set(self._status.state.value),
            ]
        )
        if workflow.patched(WAKEUPS_FROM_TIMERS):
            await self._wake_on_timers()
        else:
            await self._wake_on_clock()  # a run that started before the patch, unchanged
        await workflow.wait_condition(workflow.all_handlers_finished)
        await self._flush_decisions()
        workflow.continue_as_new(
            inp.model_copy(
                update={
                    "lost": self._lost,
                    "bad_probes": self._bad,
                    "clean_probes": self._clean,
                    "generation": self._generation,
                    "budget_counter": self._budget.counter,
                    "rounds": self._status.rounds,
                    "state": self._status.state,
                    "reason": self._status.reason,
                    "last_rebuild_seconds": self._status.last_rebuild_seconds,
                    "rebuild_since": self._rebuild_since,
                    "recorded_degraded": self._recorded_degraded,
                }
            )
        )

    async def _wake_on_timers(self) -> None:
        """What each wake-up does is decided by which of its own timers fired (an event in
        history), never by reading the clock. The old loop compared `workflow.now()` with
        deadlines computed from it: a worker restarted between a timer firing and the next
        task decided on a clock that had not moved (it started timer 270 with the 6.932 s
        of timer 269 again), while replay decided on the task's recorded time (a round's
        activity): the nondeterminism that wedged floor-r1-llm-train (issue 37)."""
        cfg = self._cfg
        probe = _timer(cfg.probe_seconds)
        tick: asyncio.Task[None] | None = None  # None: a round is due now
        for _ in range(cfg.wakeups_per_run):
            await workflow.wait_condition(partial(self._woken, probe, tick))
            if probe.done():
                probe = _timer(cfg.probe_seconds)
                await self._probe()
            if self._dirty or tick is None or tick.done():
                self._dirty = False
                if tick is not None:
                    tick.cancel()  # every round restarts the tick, as the old loop did
                tick = _timer(cfg.tick_seconds)
                await self._round()
            if self._history_full():
                break

    def _woken(self, probe: asyncio.Task[None], tick: asyncio.Task[None] | None) -> bool:
        return self._dirty or probe.done() or tick is None or tick.done()

    def _history_full(self) -> bool:
        """Continue-as-new well below Temporal's warning level (10,240 events), as the
        controller does: the wedged keeper was at 3,659 events."""
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= self._cfg.max_history_events
        )

    async def _wake_on_clock(self) -> None:
        """The loop before WAKEUPS_FROM_TIMERS, kept verbatim so that runs which started
        under it replay as they ran."""
        cfg = self._cfg
        now = workflow.now()
        next_tick, next_probe = now, now + timedelta(seconds=cfg.probe_seconds)
        for _ in range(cfg.wakeups_per_run):
            wait = min(next_tick, next_probe) - workflow.now()
            if not self._dirty and wait > timedelta(0):
                with contextlib.suppress(TimeoutError):
                    await workflow.wait_condition(lambda: self._dirty, timeout=wait)
            now = workflow.now()
            if now >= next_probe:
                next_probe = now + timedelta(seconds=cfg.probe_seconds)
                await self._probe()
            if self._dirty or now >= next_tick:
                self._dirty = False
                next_tick = now + timedelta(seconds=cfg.tick_seconds)
                await self._round()
            if workflow.info().is_continue_as_new_suggested():
                break

    async def _probe(self) -> None:
        if not self._pools:
            return  # no shape planned yet: nothing to probe
        try:
            result: ProbeResult = await workflow.execute_activity_method(
                FloorActivities.probe_halls,
                ProbeInput(region=self._inp.region, contract=self._inp.contract, pools=self._pools),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(maximum_attempts=2),
            )
        except ActivityError as exc:
            workflow.logger.warning("floor probe failed, no verdict: %s", exc.cause)
            return
        v = judge(result, self._lost, self._bad, self._clean, self._cfg)
        self._bad, self._clean = v.bad, v.clean
        for hall, why in v.lost.items():
            self._lose(
                HallLoss(hall=hall, detected=True, by="sco", reason=why, since=workflow.now())
            )
        for hall, why in v.restored.items():
            self._restore(hall, "sco", why)

    async def _snapshot(self) -> FloorSnapshot:
        snap: FloorSnapshot = await workflow.execute_activity_method(
            FloorActivities.snapshot,
            FloorSnapshotInput(region=self._inp.region, contract=self._inp.contract),
            start_to_close_timeout=timedelta(seconds=120),
            retry_policy=_RETRY,
        )
        return snap

    async def _round(self) -> None:
        await self._flush_decisions()
        self._status.rounds += 1
        snap = await self._snapshot()
        self._status.bundle_serial = snap.bundle_serial
        if snap.problem:
            self._status.reason = snap.problem
            workflow.logger.warning("floor %s: %s", self._id, snap.problem)
            return
        self._generation = max(
            self._generation,
            max_generation((reservation_key(r) for r in snap.reservations), self._prefix),
        )
        lost = set(self._lost)
        plan = plan_floor(snap, lost)
        self._show(plan)
        if plan.shape is not None:
            self._pools = {h: p for h, p in plan.shape.pool_ids.items() if h in snap.halls}
        if plan.launch and plan.shape is not None:
            if self._rebuild_since is None and self._rebalancing:
                self._set_state(FloorState.REBALANCING)
            elif self._status.state is not FloorState.DEGRADED or self._rebuild_since:
                self._set_state(FloorState.REBUILDING)
            shape = plan.shape
            await gather(
                [
                    self._hold_hall(hall, n, shape, snap, plan)
                    for hall, n in sorted(plan.launch.items())
                ]
            )
            snap = await self._snapshot()
            if snap.problem:
                return
            plan = plan_floor(snap, lost)
            self._show(plan)
        released = await self._release(plan, snap, lost)
        await self._renew(snap)
        await self._conclude(plan, released)

    def _show(self, plan: FloorPlan) -> None:
        self._status.floor_units = plan.floor_units
        self._status.flavor = plan.shape.flavor if plan.shape else ""
        self._status.held_units_by_hall = plan.units(plan.held)
        self._status.target_units_by_hall = plan.units(plan.targets)
        workflow.upsert_search_attributes([sa.HALL.value_set(sorted(plan.held))])

    async def _conclude(self, plan: FloorPlan, released: int) -> None:
        short = max(0, plan.instances - plan.held_total)
        if plan.whole and short == 0:
            if self._rebuild_since is not None:
                took = (workflow.now() - self._rebuild_since).total_seconds()
                self._status.last_rebuild_seconds = took
                self._rebuild_since = None
                lost = ", ".join(sorted(self._lost)) or "none"
                await self._decide(
                    self._decision(
                        "rebuilt",
                        f"floor whole again in {took:.0f} s (lost halls: {lost})",
                        units=plan.floor_units,
                    )
                )
            if self._rebalancing and not plan.degraded:
                self._rebalancing = False
                await self._decide(
                    self._decision(
                        "rebalanced",
                        f"spread {plan.units(plan.targets)}; {released} instance(s) released",
                        units=plan.floor_units,
                    )
                )
        if plan.degraded or short or not plan.whole:
            reason = (
                plan.reason
                or (
                    f"{short} instance(s) short of the floor"
                    if short
                    else "spread not met: launches failed"
                )
                + "; retried every tick"
            )
            self._set_state(FloorState.DEGRADED, reason)
            if reason != self._recorded_degraded:
                self._recorded_degraded = reason
                count(
                    "sco_floor_degraded",
                    "Times a floor keeper could not hold its floor by the rules",
                    region=self._inp.region,
                )
                await self._decide(self._decision("degraded", reason, units=plan.floor_units))
            return
        self._recorded_degraded = ""
        self._set_state(FloorState.HOLDING, "")

    def _set_state(self, state: FloorState, reason: str | None = None) -> None:
        self._status.state = state
        if reason is not None:
            self._status.reason = reason
        workflow.upsert_search_attributes([sa.STATE.value_set(state.value)])

    # -- holding a hall ------------------------------------------------------------------

    async def _hold_hall(
        self, hall: str, n: int, shape: FloorShape, snap: FloorSnapshot, plan: FloorPlan
    ) -> int:
        """Launch `n` instances of the shape in one hall: spare reservation slots first,
        a new reservation for the rest. Returns how many became ACTIVE."""
        live = live_by_reservation(snap.instances)
        batches: list[tuple[Reservation, int]] = []
        left = n
        for res in sorted(snap.reservations, key=reservation_key):
            spare = res.amount - live.get(reservation_key(res), 0)
            if res.hall != hall or res.flavor != shape.flavor or res.status != "ACTIVE":
                continue
            if spare > 0 and left > 0:
                batches.append((res, min(spare, left)))
                left -= min(spare, left)
        if left:
            self._generation += 1
            made = await self._reserve(hall, shape, left, self._generation)
            if made is not None:
                batches.append((made, left))
        price = (
            snap.committed[hall].price_per_vcpu_hour * shape.vcpu
            if hall in snap.committed
            else None
        )
        results = await gather([self._launch(res, k, shape, price) for res, k in batches])
        return sum(results)

    async def _reserve(
        self, hall: str, shape: FloorShape, amount: int, generation: int
    ) -> Reservation | None:
        inp = self._inp
        request = ReservationRequest(
            name=floor_lease_name(inp.region, inp.contract, hall, shape.flavor, generation),
            region=inp.region,
            hall=hall,
            flavor=shape.flavor,
            amount=amount,
            end=workflow.now() + timedelta(hours=self._cfg.lease_hours),
        )
        return await reserve(self._budget, request, poll_seconds=self._cfg.reservation_poll_seconds)

    async def _launch(
        self, res: Reservation, instances: int, shape: FloorShape, price: float | None
    ) -> int:
        inp = self._inp
        acq_id = f"{reservation_key(res)}-{workflow.uuid4().hex[:6]}"
        pool_id = shape.pool_ids[res.hall]
        result = await run_child_acquisition(
            AcquisitionRecord(
                acquisition_id=acq_id,
                region=inp.region,
                workload=inp.contract,
                partition=FLOOR_PARTITION,
                state=AcquisitionState.STARTING.value,
                requested_units=instances * shape.units_per_instance,
                requested_instances=instances,
                pool_ids=[pool_id],
                detail=f"floor:{reservation_key(res)}",
                choice=ChoiceRecord(
                    basis="floor",
                    summary=f"committed floor of {inp.contract} in hall {res.hall}: "
                    f"{instances} instances of {shape.flavor}, the cheapest committed shape per "
                    "unit, spread over the healthy halls"
                    + (
                        f" (rebuilding while hall {', '.join(sorted(self._lost))} is lost)"
                        if self._lost
                        else ""
                    ),
                ),
            ),
            AcquisitionInput(
                region=inp.region,
                partition=FLOOR_PARTITION,
                contract=inp.contract,
                tier=1,
                items=[
                    LaunchItem(
                        pool_id=pool_id,
                        hall=res.hall,
                        flavor=shape.flavor,
                        instances=instances,
                        units=instances * shape.units_per_instance,
                        capacity_type=CapacityType.COMMITTED,
                        price_per_hour=price,
                        reservation_id=res.reservation_id,
                    )
                ],
                poll_seconds=self._cfg.poll_seconds,
                build_timeout_seconds=self._cfg.build_timeout_seconds,
            ),
            record_retry=_RETRY,
            what="floor",
        )
        return result.progress.active if result is not None else 0

    # -- releasing -----------------------------------------------------------------------

    async def _release(self, plan: FloorPlan, snap: FloorSnapshot, lost: set[str]) -> int:
        """Make-before-break: called after the round's launches, on a fresh snapshot."""
        gone = to_release(
            plan, snap.instances, lost, by_generation=workflow.patched(RELEASE_BY_GENERATION)
        )
        done = await gather([self._release_one(i, lost) for i in gone])
        released = {i.instance_id for i, ok in zip(gone, done, strict=True) if ok}
        for inst in gone:
            if inst.instance_id in released and inst.hall in plan.held:
                plan.held[inst.hall] -= 1
        plan.held = {h: k for h, k in plan.held.items() if k}
        self._show(plan)
        left = [i for i in snap.instances if i.instance_id not in released]
        live = live_by_reservation(left)
        for res in snap.reservations:
            if live.get(reservation_key(res), 0):
                continue
            # An empty reservation in a hall still short of its target is kept: the next
            # round boots into its spare slots.
            if res.hall not in lost and plan.launch.get(res.hall, 0) > 0:
                continue
            await self._budget.take(self._inp.region, 1)
            try:
                await workflow.execute_activity_method(
                    ProviderActivities.delete_reservation,
                    LeaseRef(lease_id=res.lease_id),
                    start_to_close_timeout=timedelta(seconds=60),
                    retry_policy=RetryPolicy(maximum_attempts=3),
                )
            except ActivityError as exc:
                workflow.logger.warning("deleting reservation %s: %s", res.name, exc.cause)
        return len(released)

    async def _release_one(self, inst: FloorInstance, lost: set[str]) -> bool:
        why = (
            f"floor: hall {inst.hall} lost, rebuilt elsewhere"
            if inst.hall in lost
            else f"floor: surplus in hall {inst.hall} after rebalancing"
        )
        # Three attempts; an instance not released is tried again next round.
        if inst.provider_id is not None and not await delete_instance(
            self._budget, self._inp.region, inst.provider_id, attempts=3
        ):
            return False
        await workflow.execute_activity_method(
            FleetActivities.record_event,
            RecordEventInput(instance_id=inst.instance_id, kind=EventKind.DELETE, reason=why),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=_RETRY,
        )
        return True

    async def _renew(self, snap: FloorSnapshot) -> None:
        now = workflow.now()
        due = now + timedelta(hours=self._cfg.renew_before_hours)
        for res in snap.reservations:
            if res.end > due or res.hall in self._lost:
                continue
            await self._budget.take(self._inp.region, 1)
            try:
                await workflow.execute_activity_method(
                    ProviderActivities.extend_reservation,
                    ExtendReservationInput(
                        lease_id=res.lease_id, end=now + timedelta(hours=self._cfg.lease_hours)
                    ),
                    start_to_close_timeout=timedelta(seconds=60),
                    retry_policy=RetryPolicy(maximum_attempts=3),
                )
            except ActivityError as exc:
                workflow.logger.warning("extending reservation %s: %s", res.name, exc.cause)

    # -- decisions -----------------------------------------------------------------------

    def _decision(
        self,
        outcome: str,
        reason: str,
        *,
        actor: str = "sco",
        subject: str = "",
        units: int = 0,
        identity: str = "",
    ) -> Decision:
        return Decision(
            event_id=workflow.uuid4(),
            occurred_at=workflow.now(),
            region=self._inp.region,
            kind=DecisionKind.FLOOR,
            subject=f"{self._inp.contract}/{subject}" if subject else self._inp.contract,
            outcome=outcome,
            actor=actor,
            identity=identity,
            reason=reason,
            units=units,
            workflow_id=self._id,
        )

    async def _flush_decisions(self) -> None:
        while self._decisions:
            await self._decide(self._decisions.pop(0))

    async def _decide(self, decision: Decision) -> None:
        await workflow.execute_activity_method(
            ControlActivities.record_decision,
            decision,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=_RETRY,
        )
