"""`sco explain`: why a contract is short, why an instance exists, what a pool is doing.

Every answer is read from what SCO recorded when it decided: the acquisitions the
controller recorded (state, shortfall and its detail, pools), the decisions in the ledger
(fallback, acquisition, release, exclusion, floor, operator actions), the exclusions rows
the pool cycles keep, fleet state, and the signed bundle (caps, budgets). Nothing here
re-plans: a contract short for a reason nobody recorded says so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from psycopg.rows import class_row
from psycopg_pool import ConnectionPool
from pydantic import BaseModel

from activities.decisions import Decision, DecisionKind
from activities.exclusion.activities import list_exclusions
from activities.exclusion.models import ExclusionRow
from activities.fleet.control_state import AcquisitionRow, ControlRepository
from activities.fleet.repository import FleetRepository, InstanceRow, PoolRow
from activities.ledger import queries
from activities.ledger.store import LedgerStore
from contracts.bundle import VerifiedBundle
from contracts.disruption import VOLUNTARY_REASONS
from contracts.feasibility import units_per_instance
from contracts.headroom import headroom_at
from contracts.model import Contract, UnitShape
from planning.choice import ChoiceRecord, PoolChoice
from planning.disruption_budget import allowed_disruptions
from planning.drift import fleet_drift

#: How far back decisions and acquisitions are read.
LOOKBACK = timedelta(days=7)
#: Decisions shown per answer, newest first.
MAX_DECISIONS = 10
SERVING = ("requested", "active")
LEAVING = ("noticed", "draining")


class DecisionLine(BaseModel):
    occurred_at: datetime
    kind: str
    subject: str
    outcome: str
    reason: str
    actor: str
    workflow_id: str

    @classmethod
    def of(cls, d: Decision) -> DecisionLine:
        return cls(
            occurred_at=d.occurred_at,
            kind=d.kind.value,
            subject=d.subject,
            outcome=d.outcome,
            reason=d.reason,
            actor=d.actor,
            workflow_id=d.workflow_id,
        )


class AcquisitionLine(BaseModel):
    acquisition_id: str
    state: str
    requested_units: int
    active: int
    shortfall_units: int
    detail: str
    pool_ids: list[str]
    updated_at: datetime


class BudgetLine(BaseModel):
    reason: str
    allowed: int | None
    why: str


class ContractExplanation(BaseModel):
    contract: str
    region: str
    in_bundle: bool
    demand_units: int = 0
    held_units: int = 0
    in_flight_units: int = 0
    short_units: int = 0
    max_units_per_region: int | None = None
    max_fallback_spend_per_hour: float | None = None
    headroom_units: int = 0  # asked now: headroom_units, or an open headroom schedule's
    headroom_why: str = ""
    headroom_short_units: int = 0  # of that headroom, not held now
    excluded_pools: list[str] = []
    allowed_pools: int = 0
    acquisitions: list[AcquisitionLine] = []
    waiting_approval: list[str] = []
    budgets: list[BudgetLine] = []
    drifted: dict[str, str] = {}
    decisions: list[DecisionLine] = []
    # The lifecycle workflow's latest word on each live instance: replacing, held and why.
    voluntary: list[DecisionLine] = []
    why: list[str] = []


class InstanceExplanation(BaseModel):
    instance_id: str
    found: bool
    row: InstanceRow | None = None
    made_by: str = ""
    acquisition: AcquisitionLine | None = None
    # Why its pool, and not the others: what the acquisition's maker recorded
    # (planning/choice.py); None: not recorded (before SCO kept it, or no acquisition).
    choice: ChoiceRecord | None = None
    chosen_over: list[str] = []  # one line per pool passed over, the most telling first
    drift: str = ""
    decisions: list[DecisionLine] = []
    history: list[str] = []
    why: list[str] = []
    released_by: list[str] = []


class PassedOverLine(BaseModel):
    acquisition_id: str
    contract: str
    at: datetime
    verdict: str
    why: str


class PoolExplanation(BaseModel):
    pool_id: str
    found: bool
    pool: PoolRow | None = None
    exclusion: ExclusionRow | None = None
    reclaims: int = 0
    reclaimed_instances: int = 0
    instances_by_workload: dict[str, int] = {}
    contracts_allowing: list[str] = []
    decisions: list[DecisionLine] = []
    # The newest acquisition whose maker passed this pool over, and why.
    last_passed_over: PassedOverLine | None = None
    why: list[str] = []


@dataclass
class ExplainSources:
    """Where answers come from; `ledger` None: the ledger is not reachable (said so)."""

    pg: ConnectionPool
    bundle: VerifiedBundle | None
    ledger: LedgerStore | None
    now: datetime

    @property
    def fleet(self) -> FleetRepository:
        return FleetRepository(self.pg)

    @property
    def control(self) -> ControlRepository:
        return ControlRepository(self.pg)

    def contract(self, name: str) -> Contract | None:
        return None if self.bundle is None else self.bundle.content.contract(name)

    def decisions(self, region: str, **filters: str) -> list[DecisionLine]:
        if self.ledger is None:
            return []
        found = queries.decisions(
            self.ledger,
            start=self.now - LOOKBACK,
            end=self.now + timedelta(minutes=1),
            region=region,
            **filters,
        )
        return [DecisionLine.of(d) for d in found[:MAX_DECISIONS]]

    def latest_about(self, region: str, kind: str, subjects: set[str]) -> list[DecisionLine]:
        """The newest `kind` decision about each of `subjects` (its instances, say)."""
        if self.ledger is None or not subjects:
            return []
        found = queries.decisions(
            self.ledger,
            start=self.now - LOOKBACK,
            end=self.now + timedelta(minutes=1),
            region=region,
            kind=kind,
        )
        latest: dict[str, Decision] = {}
        for d in found:  # newest first
            if d.subject in subjects:
                latest.setdefault(d.subject, d)
        return [DecisionLine.of(d) for d in list(latest.values())[:MAX_DECISIONS]]


def _acquisitions(
    pg: ConnectionPool, region: str, workload: str, since: datetime
) -> list[AcquisitionRow]:
    with pg.connection() as conn:
        cur = conn.cursor(row_factory=class_row(AcquisitionRow))
        return cur.execute(
            """SELECT * FROM acquisitions
               WHERE region = %s AND workload = %s AND updated_at >= %s
               ORDER BY updated_at DESC LIMIT 20""",
            (region, workload, since),
        ).fetchall()


def _line(a: AcquisitionRow) -> AcquisitionLine:
    return AcquisitionLine(
        acquisition_id=a.acquisition_id,
        state=a.state,
        requested_units=a.requested_units,
        active=a.active,
        shortfall_units=a.shortfall_units,
        detail=a.detail,
        pool_ids=a.pool_ids,
        updated_at=a.updated_at,
    )


def _last_passed_over(
    pg: ConnectionPool, region: str, pool_id: str, since: datetime
) -> PassedOverLine | None:
    """The newest acquisition whose recorded choice passed ``pool_id`` over."""
    with pg.connection() as conn:
        cur = conn.cursor(row_factory=class_row(AcquisitionRow))
        row = cur.execute(
            """SELECT * FROM acquisitions
               WHERE region = %s AND created_at >= %s
                 AND choice -> 'passed_over'
                     @> jsonb_build_array(jsonb_build_object('pool_id', %s::text))
               ORDER BY created_at DESC LIMIT 1""",
            (region, since, pool_id),
        ).fetchone()
    if row is None or row.choice is None:
        return None
    record = ChoiceRecord.model_validate(row.choice)
    passed = next(c for c in record.passed_over if c.pool_id == pool_id)
    return PassedOverLine(
        acquisition_id=row.acquisition_id,
        contract=row.workload,
        at=row.created_at,
        verdict=passed.verdict.value,
        why=passed.why,
    )


def _choice_lines(choice: ChoiceRecord | None, pool_id: str) -> tuple[list[str], list[str]]:
    """(why lines, "chosen over" lines) for an instance in ``pool_id`` from its
    acquisition's recorded choice."""
    if choice is None:
        return [
            "why this pool: not recorded (the acquisition was recorded before SCO kept the "
            "planner's reasons, or by a maker that keeps none)"
        ], []
    if choice.basis != "planner":
        return [f"why this pool: {choice.summary}"], []
    why: list[str] = []
    mine = [c for c in choice.chosen if c.pool_id == pool_id]
    why += [f"why {c.pool_id}: {c.why}" for c in mine]
    why += [
        f"chosen with it: {c.pool_id} ({_per_unit(c)}, rank {c.rank} of {choice.ranked}, "
        f"{c.instances} instance{'' if c.instances == 1 else 's'})"
        for c in choice.chosen
        if c.pool_id != pool_id
    ]
    if choice.chosen_elsewhere:
        why.append(
            f"the same plan chose {choice.chosen_elsewhere} more pools, recorded with its "
            "other acquisitions"
        )
    over = [f"{c.pool_id}: {c.why}" for c in choice.passed_over]
    if choice.left_off:
        over.append(f"{choice.left_off} more pools, not recorded (dearer or less telling)")
    if not over:
        over.append("no other pool: the contract may use no other")
    return why, over


def _per_unit(c: PoolChoice) -> str:
    return "?" if c.cost_per_unit_hour is None else f"{c.cost_per_unit_hour:.4f}/unit-h"


def _units(unit: UnitShape, pool: PoolRow | None) -> int:
    return 0 if pool is None else units_per_instance(unit, pool)


def _allowed(contract: Contract, pool: PoolRow) -> bool:
    p = contract.placement
    return pool.sku in p.skus and pool.size in p.sizes and pool.hall in p.halls


def explain_contract(src: ExplainSources, region: str, name: str) -> ContractExplanation:
    contract = src.contract(name)
    out = ContractExplanation(contract=name, region=region, in_bundle=contract is not None)
    control = src.control
    out.demand_units = control.demand_by_contract(region).get(name, 0)
    out.decisions = src.decisions(region, subject=name)
    if contract is None:
        out.why.append(
            "not in the installed bundle: nothing is planned for it"
            if src.bundle is not None
            else "no contract bundle installed: nothing can be planned"
        )
        return out
    pools = {p.pool_id: p for p in src.fleet.list_pools(region)}
    rows = [
        i
        for i in src.fleet.list_instances(region)
        if i.workload == name and i.state.value in SERVING
    ]
    out.held_units = sum(_units(contract.unit, pools.get(i.pool_id)) for i in rows)
    recent = _acquisitions(src.pg, region, name, src.now - LOOKBACK)
    open_ = [a for a in control.open_acquisitions(region) if a.workload == name]
    out.in_flight_units = sum(a.requested_units for a in open_)
    out.acquisitions = [_line(a) for a in (open_ or recent[:5])]
    out.waiting_approval = [a.acquisition_id for a in open_ if a.state == "waiting_approval"]
    out.max_units_per_region = contract.placement.max_units_per_region
    out.max_fallback_spend_per_hour = contract.max_fallback_spend_per_hour
    out.headroom_units, out.headroom_why = headroom_at(contract, src.now)
    allowed = [p for p in pools.values() if _allowed(contract, p)]
    out.allowed_pools = len(allowed)
    excluded = {
        e.pool_id: e for e in list_exclusions(src.pg, region) if e.state.value != "admitted"
    }
    out.excluded_pools = sorted(p.pool_id for p in allowed if p.pool_id in excluded)
    for reason in VOLUNTARY_REASONS:
        v = allowed_disruptions(
            contract.disruption, reason, now=src.now, instances=len(rows), in_flight={}
        )
        out.budgets.append(BudgetLine(reason=reason.value, allowed=v.allowed, why=v.why))
    out.drifted = {k: v.why for k, v in fleet_drift([contract], rows).items() if v.drifted}
    out.short_units = max(out.demand_units - out.held_units, 0)
    out.headroom_short_units = min(
        out.headroom_units, max(out.demand_units + out.headroom_units - out.held_units, 0)
    )
    _contract_reasons(out, contract, recent, excluded)
    if out.headroom_units:
        out.why.append(
            f"headroom: {out.headroom_units} units held ready beyond demand as cover "
            f"({out.headroom_why}); "
            + (
                f"{out.headroom_short_units} of them not held now (refilled at the next tick)"
                if out.headroom_short_units
                else "all held"
            )
        )
    out.voluntary = src.latest_about(
        region, DecisionKind.DISRUPTION.value, {i.instance_id for i in rows}
    )
    out.why += [
        f"voluntary disruption of {d.subject}: {d.outcome}: {d.reason}" for d in out.voluntary
    ]
    return out


def _contract_reasons(
    out: ContractExplanation,
    contract: Contract,
    recent: Sequence[AcquisitionRow],
    excluded: dict[str, ExclusionRow],
) -> None:
    why = out.why
    if out.short_units == 0:
        why.append(f"not short: holds {out.held_units} units for a demand of {out.demand_units}")
        return
    why.append(f"short by {out.short_units} units: holds {out.held_units} of {out.demand_units}")
    cap = contract.placement.max_units_per_region
    if out.demand_units > cap:
        why.append(f"cap: demand is over placement.max_units_per_region ({cap})")
    if out.excluded_pools:
        detail = ", ".join(
            f"{p} ({excluded[p].state.value}: {excluded[p].reason or 'no reason recorded'})"
            for p in out.excluded_pools
        )
        why.append(
            f"excluded pools: {len(out.excluded_pools)} of {out.allowed_pools} allowed: {detail}"
        )
    if out.allowed_pools and len(out.excluded_pools) == out.allowed_pools:
        why.append("every allowed pool is excluded")
    for waiting in out.waiting_approval:
        a_id = waiting
        why.append(
            f"waiting approval: {a_id} waits for an operator to approve fallback spend over "
            f"{contract.max_fallback_spend_per_hour:g}/h (sco acquisitions approve {a_id})"
        )
    for a in recent:
        if a.shortfall_units > 0:
            why.append(
                f"no free reclaimable capacity: acquisition {a.acquisition_id} ({a.state}) came up "
                f"{a.shortfall_units} units short" + (f" ({a.detail})" if a.detail else "")
            )
            break
    for a in recent:
        if a.state == "declined" or a.detail == "fallback:declined":
            why.append(f"fallback declined: {a.acquisition_id} ({a.detail or a.state})")
            break
    for a in recent:
        if a.state in ("starting", "running") and a.active < a.requested_units:
            why.append(
                f"in flight: {a.acquisition_id} ({a.state}) has {a.active} of "
                f"{a.requested_units} units active (launches wait for the region's token budget)"
            )
    for d in out.decisions:
        if d.kind in ("fallback", "acquisition") and d.outcome not in ("proceed", "completed"):
            why.append(f"decision {d.occurred_at:%Y-%m-%d %H:%M}: {d.kind} {d.outcome}: {d.reason}")
            break
    if len(why) == 1:
        why.append(
            "no reason recorded yet: the controller plans it at its next tick "
            "(control.tick_seconds)"
        )


def _made_by(row: InstanceRow) -> str:
    acq = row.acquisition_id or ""
    if acq.startswith("floor-"):
        return f"the floor keeper of {row.workload} (committed floor), acquisition {acq}"
    if acq.startswith("life-"):
        return (
            f"the lifecycle workflow, replacing an instance of {row.workload} (drift, return "
            f"from fallback or expiry), acquisition {acq}"
        )
    if acq.startswith("slurm-"):
        return f"Slurm power saving (ResumeProgram) for {row.workload}, acquisition {acq}"
    if acq.startswith("probe-") or row.workload.startswith("canary"):
        return f"the pool exclusion cycle's canary probe of {row.pool_id}"
    if acq:
        return f"the region controller's acquisition {acq} for {row.workload}'s demand"
    return "no acquisition recorded"


def explain_instance(src: ExplainSources, instance_id: str) -> InstanceExplanation:
    row = src.fleet.get_instance(instance_id)
    out = InstanceExplanation(instance_id=instance_id, found=row is not None, row=row)
    if row is None:
        out.why.append("not in fleet state")
        return out
    out.made_by = _made_by(row)
    acq = src.control.get_acquisition(row.acquisition_id) if row.acquisition_id else None
    if acq is not None:
        out.acquisition = _line(acq)
    contract = src.contract(row.workload)
    if row.state.value in SERVING:
        verdict = fleet_drift([contract] if contract else [], [row]).get(instance_id)
        out.drift = verdict.why if verdict is not None else ""
    decisions = src.decisions(row.region, subject=row.workload)
    decisions += src.decisions(row.region, subject=instance_id)
    out.decisions = sorted(
        (
            d
            for d in decisions
            if d.subject == instance_id or (acq is not None and d.workflow_id == acq.acquisition_id)
        ),
        key=lambda d: d.occurred_at,
        reverse=True,
    )
    if src.ledger is not None:
        out.history = [
            f"{e.occurred_at:%Y-%m-%d %H:%M:%S} {e.kind.value}"
            for e in queries.instance_history(src.ledger, instance_id)
        ]
    why = out.why
    why.append(f"made by {out.made_by}")
    if acq is not None:
        why.append(
            f"acquisition {acq.acquisition_id}: {acq.state}, {acq.requested_units} units "
            f"asked in {', '.join(acq.pool_ids) or row.pool_id}"
            + (f" ({acq.detail})" if acq.detail else "")
        )
        out.choice = None if acq.choice is None else ChoiceRecord.model_validate(acq.choice)
        chosen, out.chosen_over = _choice_lines(out.choice, row.pool_id)
        why += chosen
        why += [f"chosen over {line}" for line in out.chosen_over]
    why.extend(f"decision: {d.kind} {d.outcome}: {d.reason}" for d in out.decisions[:3])
    if out.drift:
        why.append(f"drifted: {out.drift}")
    out.released_by = _releases(row, contract)
    return out


def _releases(row: InstanceRow, contract: Contract | None) -> list[str]:
    state = row.state.value
    if state in ("deleted", "failed"):
        return [f"already {state}"]
    if state in LEAVING:
        return [f"already leaving ({state}): the notice's deadline deletes it"]
    if row.capacity_type.value == "committed":
        if (row.acquisition_id or "").startswith("floor-"):
            return [f"{row.workload}'s floor lowered in the bundle (a new serial)", "a hall loss"]
        return [
            f"{row.workload}'s reclaimable capacity returning (return-from-fallback, by the "
            "lifecycle workflow: make-before-break, within the disruption budget; "
            "`sco lifecycle status`)"
        ]
    out = []
    if row.surplus_since is not None:
        out.append(
            f"surplus since {row.surplus_since:%Y-%m-%d %H:%M}: released once idle for "
            "control.release_idle_seconds"
        )
    else:
        out.append(f"{row.workload}'s demand dropping below what it holds (surplus, then idle)")
    out.append(f"a reclaim of {row.pool_id} (the provider's or `sco reclaim`)")
    if contract is None:
        out.append("its contract is gone from the bundle (drift)")
    else:
        age = contract.disruption_or_default.max_instance_age_hours
        if age is not None:
            out.append(f"expiry at {row.created_at + timedelta(hours=age):%Y-%m-%d %H:%M}")
        out.append("drift, if its contract stops allowing its pool")
    return out


def explain_pool(src: ExplainSources, pool_id: str) -> PoolExplanation:
    region = pool_id.split(".", 1)[0]
    pools = {p.pool_id: p for p in src.fleet.list_pools(region)}
    pool = pools.get(pool_id)
    out = PoolExplanation(pool_id=pool_id, found=pool is not None, pool=pool)
    if pool is None:
        out.why.append(f"no pool {pool_id} in fleet state (sco pools sync --region {region})")
        return out
    out.exclusion = next((e for e in list_exclusions(src.pg, region) if e.pool_id == pool_id), None)
    live = [
        i
        for i in src.fleet.list_instances(region, pool_id=pool_id)
        if i.state.value in (*SERVING, *LEAVING)
    ]
    out.instances_by_workload = dict(sorted(Counter(i.workload for i in live).items()))
    if src.bundle is not None:
        out.contracts_allowing = sorted(
            c.name
            for c in src.bundle.content.contracts
            if region in c.regions and _allowed(c, pool)
        )
    out.decisions = src.decisions(region, subject=pool_id)
    if src.ledger is not None:
        for r in queries.reclaims_per_pool(
            src.ledger, start=src.now - LOOKBACK, end=src.now + timedelta(minutes=1), region=region
        ):
            if r.pool_id == pool_id:
                out.reclaims, out.reclaimed_instances = r.reclaims, r.instances
    e = out.exclusion
    why = out.why
    if e is None or e.state.value == "admitted":
        why.append("admitted: the planner may place new instances here")
    else:
        until = f" until {e.excluded_until:%Y-%m-%d %H:%M}" if e.excluded_until else ""
        why.append(
            f"{e.state.value}{until} (strike {e.strikes}, by {e.set_by}): "
            f"{e.reason or 'no reason recorded'}; the planner places nothing new here"
        )
    why.append(
        f"price {pool.price_per_hour:.3f}/h, {pool.reclaimable_units} reclaimable units, "
        f"{out.reclaims} reclaims of {out.reclaimed_instances} instances in 7 d"
    )
    users = ", ".join(f"{k} {v}" for k, v in out.instances_by_workload.items()) or "nobody"
    why.append(
        f"used by: {users}; allowed by: {', '.join(out.contracts_allowing) or 'no contract'}"
    )
    out.last_passed_over = _last_passed_over(src.pg, region, pool_id, src.now - LOOKBACK)
    if (p := out.last_passed_over) is not None:
        why.append(
            f"last passed over {p.at:%Y-%m-%d %H:%M} for {p.contract} "
            f"(acquisition {p.acquisition_id}): {p.why}"
        )
    return out
