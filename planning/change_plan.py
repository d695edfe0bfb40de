"""What a contract change does to one region's estate (`sco contracts plan BASE HEAD`), as
a reviewer wants it in a pull request:

- contracts added, removed, and changed field by field;
- floors per hall before and after (the compiler's own greedy spread over committed
  capacity: >= 3 halls, <= 40 % in one) and the committed capacity they then need;
- caps and spend authority changed, with the committed fallback each contract runs now;
- instances that become non-conforming (drift: a pool the head no longer allows, or their
  contract gone) and the disruption their drains imply;
- the estimated cost per hour before and after: running instances at current prices, new
  ones where the planner (planning/planner.py) would put the remaining demand, floors and
  running fallback at the committed rate.

Infeasible (the CLI exits 2): the head does not compile, a floor does not fit committed
capacity, or a contract's spend authority falls below the committed fallback it runs now.

Pure: the contracts of both commits, the region file and a snapshot of the estate in, a
`ChangePlan` out; the same inputs give the same bytes (the golden files rely on it).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from contracts.feasibility import (
    MAX_HALL_SHARE,
    MIN_FLOOR_HALLS,
    spread_floor,
    units_per_instance,
)
from contracts.findings import Finding
from contracts.model import Contract
from contracts.pool_id import PoolId
from contracts.region import Region
from planning.costs import RESTART_COST_HOURS
from planning.models import PlanInput, contract_demand, pool_input
from planning.planner import plan as run_planner

Capacity = Literal["reclaimable", "floor", "fallback"]


class EstateInstance(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    contract: str
    pool_id: str  # r1.A.gpu-a.l
    capacity: Capacity = "reclaimable"
    # What a committed instance is charged (fleet state's rate); None: its vCPUs at the
    # hall's committed rate.
    price_per_hour: float | None = None


class EstateSnapshot(BaseModel):
    """What runs in one region now: its instances, each contract's demand in units, and the
    current prices and reclaim rates where they differ from the region file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str
    taken_at: str = ""
    demand: dict[str, int] = {}  # contract -> units wanted
    instances: list[EstateInstance] = []
    prices: dict[str, float] = {}  # pool id -> current price per instance-hour
    reclaim_rates: dict[str, float] = {}  # pool id -> reclaims per instance-hour


class FieldChange(BaseModel):
    field: str
    before: Any = None
    after: Any = None


class ContractChange(BaseModel):
    contract: str
    change: Literal["added", "removed", "changed"]
    fields: list[FieldChange] = []


class FloorHall(BaseModel):
    contract: str
    hall: str
    before: int
    after: int
    committed_vcpu_after: int  # what the contract's floor needs in the hall after
    committed_memory_gib_after: int
    committed_gpus_after: int


class HallRoom(BaseModel):
    hall: str
    floor_vcpu_before: int
    floor_vcpu_after: int
    committed_vcpu: int  # the hall's committed capacity


class LimitChange(BaseModel):
    contract: str
    limit: str  # max_units_per_region, max_pool_share, max_fallback_spend_per_hour, floor
    before: float | None
    after: float | None
    running_fallback_per_hour: float = 0.0
    note: str = ""


class Drift(BaseModel):
    contract: str
    pool_id: str
    instances: int
    units: int
    why: str
    drain: str  # the drain these instances go through (their contract's at BASE)
    grace_seconds: int
    lost_instance_hours: float  # instances x the kind's restart cost (planning/costs.py)


class Cost(BaseModel):
    reclaimable_running: float
    reclaimable_new: float  # where the planner puts the demand still uncovered
    floor_committed: float
    fallback_running: float
    shortfall_units: int  # demand neither running nor plannable on reclaimable capacity

    @property
    def total(self) -> float:
        return round(
            self.reclaimable_running
            + self.reclaimable_new
            + self.floor_committed
            + self.fallback_running,
            4,
        )


class ChangePlan(BaseModel):
    base: str
    head: str
    region: str
    currency: str
    contracts: list[ContractChange] = []
    floors: list[FloorHall] = []
    halls: list[HallRoom] = []
    limits: list[LimitChange] = []
    drift: list[Drift] = []
    cost_before: Cost
    cost_after: Cost
    head_findings: list[str] = []  # the compiler's errors at HEAD
    infeasible: list[str] = Field(default_factory=list)

    @property
    def feasible(self) -> bool:
        return not self.infeasible


# --- contracts, field by field ----------------------------------------------------------


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k in sorted(value):
            out.update(_flatten(value[k], f"{prefix}.{k}" if prefix else str(k)))
        return out or {prefix: {}}
    return {prefix: value}


def diff_contracts(base: Sequence[Contract], head: Sequence[Contract]) -> list[ContractChange]:
    b, h = {c.name: c for c in base}, {c.name: c for c in head}
    out = []
    for name in sorted(b.keys() | h.keys()):
        if name not in b:
            out.append(ContractChange(contract=name, change="added"))
        elif name not in h:
            out.append(ContractChange(contract=name, change="removed"))
        else:
            fb, fh = (
                _flatten(b[name].model_dump(mode="json")),
                _flatten(h[name].model_dump(mode="json")),
            )
            fields = [
                FieldChange(field=k, before=fb.get(k), after=fh.get(k))
                for k in sorted(fb.keys() | fh.keys())
                if fb.get(k) != fh.get(k)
            ]
            if fields:
                out.append(ContractChange(contract=name, change="changed", fields=fields))
    return out


# --- floors -----------------------------------------------------------------------------


def floor_placements(
    contracts: Sequence[Contract], region: Region
) -> dict[str, dict[str, int] | None]:
    """Each floor of `region` per hall, placed as the compiler checks them (largest first,
    greedy over committed capacity); None: it does not fit."""
    left = {h: [cap.vcpu, cap.memory_gib, cap.gpus] for h, cap in region.committed.items()}
    out: dict[str, dict[str, int] | None] = {}
    floors = [c for c in contracts if c.floor.get(region.id)]
    for c in sorted(floors, key=lambda c: (-c.floor[region.id], c.name)):
        need = [c.unit.vcpu, c.unit.memory_gib, c.unit.gpus]
        free = {h: min(left[h][k] // need[k] for k in range(3) if need[k]) for h in left}
        halls = [h for h in c.placement.halls if h in left]
        placed = spread_floor(c.floor[region.id], halls, free)
        out[c.name] = placed
        for hall, n in (placed or {}).items():
            for k in range(3):
                left[hall][k] -= n * need[k]
    return out


# --- the estate --------------------------------------------------------------------------


def _allowed(c: Contract, region: Region, pool: PoolId) -> str:
    """Why an instance of `c` in `pool` does not conform ("" when it does)."""
    p = c.placement
    if region.id not in c.regions:
        return f"region {region.id} no longer in the contract"
    if pool.hall not in p.halls:
        return f"hall {pool.hall} no longer allowed"
    if pool.sku not in p.skus:
        return f"SKU {pool.sku} no longer allowed"
    if pool.size not in p.sizes:
        return f"size {pool.size} no longer allowed"
    return ""


def _units(c: Contract, region: Region, pool_id: str) -> int:
    return units_per_instance(c.unit, region.pool(pool_id))


def _price(region: Region, snap: EstateSnapshot, pool_id: str) -> float:
    return snap.prices.get(pool_id, region.pool(pool_id).price_per_hour)


def _committed_price(region: Region, c: Contract, hall: str) -> float:
    """Committed cost of one floor unit in `hall` (its vCPUs at the hall's rate)."""
    cap = region.committed.get(hall)
    return c.unit.vcpu * cap.price_per_vcpu_hour if cap is not None else 0.0


def _fallback_spend(snap: EstateSnapshot, region: Region) -> dict[str, float]:
    spend: dict[str, float] = defaultdict(float)
    for i in snap.instances:
        if i.capacity == "fallback":
            if i.price_per_hour is not None:
                spend[i.contract] += i.price_per_hour
                continue
            pool = region.pool(i.pool_id)
            cap = region.committed.get(pool.hall)
            spend[i.contract] += pool.vcpu * (cap.price_per_vcpu_hour if cap else 0.0)
    return dict(spend)


def _cost(contracts: Sequence[Contract], region: Region, snap: EstateSnapshot) -> Cost:
    by_name = {c.name: c for c in contracts}
    running, existing = 0.0, defaultdict(lambda: defaultdict(int))  # type: ignore[var-annotated]
    for i in snap.instances:
        c = by_name.get(i.contract)
        if i.capacity != "reclaimable" or c is None:
            continue
        if _allowed(c, region, PoolId.parse(i.pool_id)):
            continue  # drained under this version: neither running nor counted as held
        running += _price(region, snap, i.pool_id)
        existing[c.name][i.pool_id] += 1
    held: dict[str, int] = defaultdict(int)
    for i in snap.instances:  # what the planner sees a contract hold: every capacity
        c = by_name.get(i.contract)
        if c is not None and i.capacity != "reclaimable":
            held[c.name] += _units(c, region, i.pool_id)
    demands = [
        contract_demand(
            c,
            region.id,
            max(0, snap.demand.get(c.name, 0) - held[c.name]),
            dict(existing[c.name]),
        )
        for c in sorted(contracts, key=lambda c: c.name)
    ]
    used: dict[str, int] = defaultdict(int)
    for i in snap.instances:
        if i.capacity == "reclaimable":
            used[i.pool_id] += 1
    pools = [
        pool_input(
            region,
            p,
            free=max(0, p.reclaimable_units - used[region.pool_id(p)]),
            reclaim_rate=snap.reclaim_rates.get(region.pool_id(p), 0.0),
        ).model_copy(update={"price_per_hour": _price(region, snap, region.pool_id(p))})
        for p in region.pools
    ]
    result = run_planner(PlanInput(contracts=demands, pools=pools))
    new = sum(_price(region, snap, a.pool_id) * a.instances for a in result.allocations)
    floor_cost = 0.0
    for name, placed in floor_placements(contracts, region).items():
        for hall, n in (placed or {}).items():
            floor_cost += n * _committed_price(region, by_name[name], hall)
    fallback = sum(v for k, v in _fallback_spend(snap, region).items() if k in by_name)
    return Cost(
        reclaimable_running=round(running, 4),
        reclaimable_new=round(new, 4),
        floor_committed=round(floor_cost, 4),
        fallback_running=round(fallback, 4),
        shortfall_units=sum(o.shortfall_units for o in result.outcomes),
    )


def _drift(
    base: Sequence[Contract], head: Sequence[Contract], region: Region, snap: EstateSnapshot
) -> list[Drift]:
    b, h = {c.name: c for c in base}, {c.name: c for c in head}
    groups: dict[tuple[str, str, str], int] = defaultdict(int)
    for i in snap.instances:
        if i.capacity != "reclaimable" or i.contract not in b:
            continue
        pool = PoolId.parse(i.pool_id)
        if _allowed(b[i.contract], region, pool):
            continue  # already drifted before this change: not this change's doing
        why = "contract removed" if i.contract not in h else _allowed(h[i.contract], region, pool)
        if why:
            groups[(i.contract, i.pool_id, why)] += 1
    out = []
    for (name, pool_id, why), n in sorted(groups.items()):
        c = b[name]
        out.append(
            Drift(
                contract=name,
                pool_id=pool_id,
                instances=n,
                units=n * _units(c, region, pool_id),
                why=why,
                drain=c.drain.action.value,
                grace_seconds=c.drain.grace_seconds,
                lost_instance_hours=round(n * RESTART_COST_HOURS[c.kind.value], 4),
            )
        )
    return out


def _limits(
    base: Sequence[Contract], head: Sequence[Contract], region: Region, snap: EstateSnapshot
) -> tuple[list[LimitChange], list[str]]:
    b, h = {c.name: c for c in base}, {c.name: c for c in head}
    fallback = _fallback_spend(snap, region)
    out, infeasible = [], []
    for name in sorted(b.keys() & h.keys()):
        cb, ch = b[name], h[name]
        spend = round(fallback.get(name, 0.0), 4)
        pairs: list[tuple[str, float | None, float | None]] = [
            (
                "max_units_per_region",
                cb.placement.max_units_per_region,
                ch.placement.max_units_per_region,
            ),
            ("max_pool_share", cb.placement.max_pool_share, ch.placement.max_pool_share),
            (
                "max_fallback_spend_per_hour",
                cb.max_fallback_spend_per_hour,
                ch.max_fallback_spend_per_hour,
            ),
            (f"floor.{region.id}", cb.floor.get(region.id), ch.floor.get(region.id)),
        ]
        for limit, before, after in pairs:
            if before == after:
                continue
            note = ""
            if limit == "max_fallback_spend_per_hour" and after is not None and spend > after:
                note = (
                    f"below the committed fallback {name} runs now ({spend:g}/h): "
                    "every further fallback waits for an operator, the running one "
                    "exceeds its authority"
                )
                infeasible.append(
                    f"{name}: spend authority {after:g}/h < running fallback {spend:g}/h"
                )
            out.append(
                LimitChange(
                    contract=name,
                    limit=limit,
                    before=before,
                    after=after,
                    running_fallback_per_hour=spend,
                    note=note,
                )
            )
    return out, infeasible


def plan_change(
    base_ref: str,
    head_ref: str,
    base: Sequence[Contract],
    head: Sequence[Contract],
    region: Region,
    snap: EstateSnapshot,
    head_findings: Sequence[Finding] = (),
) -> ChangePlan:
    infeasible = [f"HEAD does not compile: {f}" for f in head_findings]
    pb, ph = floor_placements(base, region), floor_placements(head, region)
    units_of = {c.name: c for c in [*base, *head]}
    head_by = {c.name: c for c in head}
    floors = []
    for name in sorted(pb.keys() | ph.keys()):
        before, after = pb.get(name) or {}, ph.get(name)
        if name in ph and after is None:
            c = head_by[name]
            infeasible.append(
                f"{name}: floor of {c.floor[region.id]} units in {region.id} does not fit "
                f"committed capacity with >= {MIN_FLOOR_HALLS} halls and <= "
                f"{MAX_HALL_SHARE:.0%} in one"
            )
        after = after or {}
        c = head_by.get(name, units_of[name])
        for hall in sorted(before.keys() | after.keys()):
            if before.get(hall, 0) == after.get(hall, 0):
                continue
            n = after.get(hall, 0)
            floors.append(
                FloorHall(
                    contract=name,
                    hall=hall,
                    before=before.get(hall, 0),
                    after=n,
                    committed_vcpu_after=n * c.unit.vcpu,
                    committed_memory_gib_after=n * c.unit.memory_gib,
                    committed_gpus_after=n * c.unit.gpus,
                )
            )
    halls = []
    for hall in sorted(region.committed):

        def vcpu(placed: Mapping[str, dict[str, int] | None], h: str = hall) -> int:
            return sum((p or {}).get(h, 0) * units_of[n].unit.vcpu for n, p in placed.items())

        vb, va = vcpu(pb), vcpu(ph)
        if vb != va:
            halls.append(
                HallRoom(
                    hall=hall,
                    floor_vcpu_before=vb,
                    floor_vcpu_after=va,
                    committed_vcpu=region.committed[hall].vcpu,
                )
            )
    limits, over = _limits(base, head, region, snap)
    return ChangePlan(
        base=base_ref,
        head=head_ref,
        region=region.id,
        currency=region.currency,
        contracts=diff_contracts(base, head),
        floors=floors,
        halls=halls,
        limits=limits,
        drift=_drift(base, head, region, snap),
        cost_before=_cost(base, region, snap),
        cost_after=_cost(head, region, snap) if not head_findings else _cost(base, region, snap),
        head_findings=[str(f) for f in head_findings],
        infeasible=infeasible + over,
    )


# --- rendering ----------------------------------------------------------------------------


def _v(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return "[" + ", ".join(str(x) for x in value) + "]"
    return str(value)


def to_json(p: ChangePlan) -> str:
    doc = p.model_dump(mode="json")
    doc["cost_before"]["total"] = p.cost_before.total
    doc["cost_after"]["total"] = p.cost_after.total
    doc["feasible"] = p.feasible
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def to_markdown(p: ChangePlan) -> str:
    cur = p.currency
    verdict = "**feasible**" if p.feasible else "**INFEASIBLE**"
    lines = [
        f"## Contract plan {p.base[:12]} → {p.head[:12]} ({p.region}): {verdict}",
        "",
    ]
    if p.infeasible:
        lines += [f"- ❌ {why}" for why in p.infeasible] + [""]
    lines += ["### Contracts", ""]
    if not p.contracts:
        lines.append("No contract changed.")
    for c in p.contracts:
        lines.append(f"- `{c.contract}`: {c.change}")
        for f in c.fields:
            lines.append(f"  - `{f.field}`: {_v(f.before)} → {_v(f.after)}")
    lines += ["", "### Floors per hall", ""]
    if p.floors:
        lines += [
            "| contract | hall | before | after | committed after (vCPU / GiB / GPU) |",
            "|---|---|---:|---:|---|",
        ]
        lines += [
            f"| {f.contract} | {f.hall} | {f.before} | {f.after} | {f.committed_vcpu_after} / "
            f"{f.committed_memory_gib_after} / {f.committed_gpus_after} |"
            for f in p.floors
        ]
        lines += [
            "",
            "| hall | floor vCPU before | after | committed vCPU |",
            "|---|---:|---:|---:|",
        ]
        lines += [
            f"| {h.hall} | {h.floor_vcpu_before} | {h.floor_vcpu_after} | {h.committed_vcpu} |"
            for h in p.halls
        ]
    else:
        lines.append("No floor moves.")
    lines += ["", "### Caps and spend authority", ""]
    if p.limits:
        lines += [
            "| contract | limit | before | after | running fallback /h | note |",
            "|---|---|---:|---:|---:|---|",
        ]
        lines += [
            f"| {x.contract} | {x.limit} | {_v(x.before)} | {_v(x.after)} | "
            f"{x.running_fallback_per_hour:g} | {x.note} |"
            for x in p.limits
        ]
    else:
        lines.append("No cap or spend authority changed.")
    lines += ["", "### Drift (instances that stop conforming) and disruption", ""]
    if p.drift:
        lines += [
            "| contract | pool | instances | units | why | drain | grace | lost instance-hours |",
            "|---|---|---:|---:|---|---|---:|---:|",
        ]
        lines += [
            f"| {d.contract} | {d.pool_id} | {d.instances} | {d.units} | {d.why} | {d.drain} | "
            f"{d.grace_seconds} s | {d.lost_instance_hours:g} |"
            for d in p.drift
        ]
        total = sum(d.instances for d in p.drift)
        lines += ["", f"{total} instance(s) drained to conform."]
    else:
        lines.append("No running instance stops conforming.")
    b, a = p.cost_before, p.cost_after
    lines += [
        "",
        f"### Estimated cost per hour ({cur})",
        "",
        "| | before | after |",
        "|---|---:|---:|",
        f"| reclaimable, running | {b.reclaimable_running:.2f} | {a.reclaimable_running:.2f} |",
        f"| reclaimable, planned | {b.reclaimable_new:.2f} | {a.reclaimable_new:.2f} |",
        f"| committed floors | {b.floor_committed:.2f} | {a.floor_committed:.2f} |",
        f"| committed fallback, running | {b.fallback_running:.2f} | {a.fallback_running:.2f} |",
        f"| **total** | **{b.total:.2f}** | **{a.total:.2f}** |",
        f"| demand short (units) | {b.shortfall_units} | {a.shortfall_units} |",
        "",
    ]
    if p.head_findings:
        lines += ["### HEAD does not compile", ""] + [f"- `{f}`" for f in p.head_findings] + [""]
    return "\n".join(lines)
