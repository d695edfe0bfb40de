"""Feasibility checks: can these contracts be honoured by these regions?

Pure functions over validated contracts and region models; every finding names the file,
the line and the field it is about.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Protocol

from contracts.disruption import DisruptionReason
from contracts.findings import Finding, Severity
from contracts.model import USUAL_DRAIN, Contract, KubernetesSelector
from contracts.region import Pool, Region
from contracts.source import ContractSource

#: No hall may hold more than this share of a floor (the seed's 40 % rule).
MAX_HALL_SHARE = 0.4
MIN_FLOOR_HALLS = 3
#: The week a blackout's schedule is sampled over (a Monday, UTC).
SAMPLE_WEEK = datetime(2026, 1, 5, tzinfo=UTC)


def check_all(sources: Sequence[ContractSource], regions: dict[str, Region]) -> list[Finding]:
    findings = _unique_names(sources)
    findings += _selector_overlaps(sources)
    for src in sources:
        findings += _regions_known(src, regions)
        for region_id in src.contract.regions:
            region = regions.get(region_id)
            if region is not None:
                findings += _placement(src, region)
                findings += _drain(src, region)
        findings += _kind_and_drain(src)
        findings += disruption_warnings(src)
    findings += _floors(sources, regions)
    return findings


def disruption_warnings(src: ContractSource) -> list[Finding]:
    """A disruption block that can never let a voluntary disruption through is legal but
    likely a mistake: a blackout open at every minute of a sample week, or an expiry that
    every unscheduled budget for it holds at 0."""
    d = src.contract.disruption
    if d is None:
        return []
    out = []
    week = [SAMPLE_WEEK + timedelta(minutes=m) for m in range(0, 7 * 24 * 60, 30)]
    for i, blackout in enumerate(d.blackouts):
        if blackout.schedule is not None and all(blackout.open_at(t) for t in week):
            out.append(
                Finding(
                    src.path,
                    src.line("disruption", "blackouts", i),
                    f"disruption.blackouts[{i}]",
                    "open all the time: no voluntary disruption would ever happen",
                    Severity.WARNING,
                )
            )
    if d.max_instance_age_hours is not None and any(
        DisruptionReason.EXPIRY in b.reasons and b.schedule is None and b.max_instances == 0
        for b in d.budgets
    ):
        out.append(
            Finding(
                src.path,
                src.line("disruption", "max_instance_age_hours"),
                "disruption.max_instance_age_hours",
                "a budget holds expiry at 0 instances at all times: no instance would expire",
                Severity.WARNING,
            )
        )
    return out


def _unique_names(sources: Sequence[ContractSource]) -> list[Finding]:
    first: dict[str, ContractSource] = {}
    out = []
    for src in sources:
        name = src.contract.name
        if name in first:
            out.append(
                Finding(
                    src.path,
                    src.line("name"),
                    "name",
                    f"{name!r} is already the name of {first[name].path}",
                )
            )
        else:
            first[name] = src
    return out


def _regions_known(src: ContractSource, regions: dict[str, Region]) -> list[Finding]:
    return [
        Finding(
            src.path,
            src.line("regions", i),
            f"regions[{i}]",
            f"unknown region {r!r}; known: {', '.join(sorted(regions))}",
        )
        for i, r in enumerate(src.contract.regions)
        if r not in regions
    ]


def _allowed_pools(contract: Contract, region: Region) -> list[Pool]:
    p = contract.placement
    return [
        pool
        for pool in region.pools
        if pool.sku in p.skus and pool.size in p.sizes and pool.hall in p.halls
    ]


class Resources(Protocol):
    """vCPUs, memory and GPUs: of one demand unit, or of one instance."""

    @property
    def vcpu(self) -> int: ...
    @property
    def memory_gib(self) -> int: ...
    @property
    def gpus(self) -> int: ...


def units_per_instance(unit: Resources, instance: Resources) -> int:
    """How many demand units of shape `unit` one instance holds (0: the unit does not fit).

    The one copy of this arithmetic: the feasibility check, the planner, the floor keeper
    and the Slurm resume plan must agree on it, or a plan the check calls feasible would
    not be the one the planner makes.
    """
    fits = [instance.vcpu // unit.vcpu, instance.memory_gib // unit.memory_gib]
    if unit.gpus:
        fits.append(instance.gpus // unit.gpus)
    return max(0, min(fits))


def _placement(src: ContractSource, region: Region) -> list[Finding]:
    c, p, out = src.contract, src.contract.placement, []
    skus = {s.name for s in region.skus}
    for i, sku in enumerate(p.skus):
        if sku not in skus:
            out.append(
                Finding(
                    src.path,
                    src.line("placement", "skus", i),
                    f"placement.skus[{i}]",
                    f"region {region.id} has no SKU {sku!r}",
                )
            )
    for i, hall in enumerate(p.halls):
        if hall not in region.halls:
            out.append(
                Finding(
                    src.path,
                    src.line("placement", "halls", i),
                    f"placement.halls[{i}]",
                    f"region {region.id} has no hall {hall!r}",
                )
            )
    if out:
        return out
    pools = _allowed_pools(c, region)
    reachable = sum(
        math.floor(pool.reclaimable_units * p.max_pool_share) * units_per_instance(c.unit, pool)
        for pool in pools
    )
    line = src.line("placement", "max_units_per_region")
    if reachable == 0:
        out.append(
            Finding(
                src.path,
                src.line("unit"),
                "unit",
                f"no allowed pool in {region.id} can hold one unit "
                f"({c.unit.vcpu} vCPU, {c.unit.memory_gib} GiB, {c.unit.gpus} GPU) "
                f"within max_pool_share {p.max_pool_share}",
            )
        )
    elif p.max_units_per_region > reachable:
        out.append(
            Finding(
                src.path,
                line,
                "placement.max_units_per_region",
                f"cap {p.max_units_per_region} can never be reached in {region.id}: "
                f"allowed pools at max_pool_share {p.max_pool_share} hold at most "
                f"{reachable} units",
                Severity.WARNING,
            )
        )
    return out


def _drain(src: ContractSource, region: Region) -> list[Finding]:
    grace = src.contract.drain.grace_seconds
    if grace <= region.notice_lead_seconds:
        return []
    return [
        Finding(
            src.path,
            src.line("drain", "grace_seconds"),
            "drain.grace_seconds",
            f"{grace} s is longer than the notice lead of {region.id} "
            f"({region.notice_lead_seconds} s): the drain could never finish in time",
        )
    ]


def _kind_and_drain(src: ContractSource) -> list[Finding]:
    c = src.contract
    usual = USUAL_DRAIN[c.kind]
    if c.drain.action is usual:
        return []
    return [
        Finding(
            src.path,
            src.line("drain", "action"),
            "drain.action",
            f"{c.kind.value} workloads usually drain by {usual.value}, not {c.drain.action.value}",
            Severity.WARNING,
        )
    ]


def _k8s_overlap(a: KubernetesSelector, b: KubernetesSelector) -> bool:
    """Some pod could match both: same namespace and no label required with two values."""
    if a.namespace != b.namespace:
        return False
    return all(b.labels.get(k, v) == v for k, v in a.labels.items())


def _selector_overlaps(sources: Sequence[ContractSource]) -> list[Finding]:
    out = []
    for i, a in enumerate(sources):
        for b in sources[i + 1 :]:
            ca, cb = a.contract, b.contract
            for j, sb in enumerate(cb.selectors.kubernetes):
                for sa in ca.selectors.kubernetes:
                    if _k8s_overlap(sa, sb):
                        out.append(
                            Finding(
                                b.path,
                                b.line("selectors", "kubernetes", j),
                                f"selectors.kubernetes[{j}]",
                                f"a pod in namespace {sb.namespace!r} could match both this "
                                f"contract and {ca.name!r} ({a.path}); add a distinguishing label",
                            )
                        )
            for j, jb in enumerate(cb.selectors.slurm):
                for ja in ca.selectors.slurm:
                    if (ja.account, ja.partition, ca.slurm_tag(ja)) == (
                        jb.account,
                        jb.partition,
                        cb.slurm_tag(jb),
                    ):
                        out.append(
                            Finding(
                                b.path,
                                b.line("selectors", "slurm", j),
                                f"selectors.slurm[{j}]",
                                f"a job of account {jb.account!r} on {jb.partition!r} tagged "
                                f"{cb.slurm_tag(jb)!r} could match both this contract and "
                                f"{ca.name!r} ({a.path})",
                            )
                        )
    return out


def spread_floor(units: int, halls: Sequence[str], free: dict[str, int]) -> dict[str, int] | None:
    """Place `units` over `halls`, at most 40 % (rounded down) in any hall, within `free`
    units per hall; as even as possible. None when it cannot be done."""
    cap = math.floor(units * MAX_HALL_SHARE)
    room = {h: min(cap, free.get(h, 0)) for h in halls}
    if sum(room.values()) < units:
        return None
    placed = dict.fromkeys(halls, 0)
    left = units
    while left:  # water-filling: one unit at a time to the emptiest hall with room
        hall = min((h for h in halls if placed[h] < room[h]), key=lambda h: (placed[h], h))
        placed[hall] += 1
        left -= 1
    return {h: n for h, n in placed.items() if n}


def _floors(sources: Sequence[ContractSource], regions: dict[str, Region]) -> list[Finding]:
    """All floors of a region must fit its committed capacity under the 40 % rule.

    Greedy, largest floor first, in committed vCPU, memory and GPUs; a greedy order can call
    a tight set infeasible that a cleverer packing would fit, never the other way round.
    """
    out = []
    by_region: dict[str, list[ContractSource]] = defaultdict(list)
    for src in sources:
        for region_id, units in src.contract.floor.items():
            if units and region_id in regions:
                by_region[region_id].append(src)
    for region_id, srcs in sorted(by_region.items()):
        region = regions[region_id]
        left = {h: [cap.vcpu, cap.memory_gib, cap.gpus] for h, cap in region.committed.items()}
        for src in sorted(srcs, key=lambda s: -s.contract.floor[region_id]):
            c = src.contract
            units = c.floor[region_id]
            need = [c.unit.vcpu, c.unit.memory_gib, c.unit.gpus]
            free = {h: min(left[h][k] // need[k] for k in range(3) if need[k]) for h in left}
            halls = [h for h in c.placement.halls if h in left]
            placed = spread_floor(units, halls, free)
            where = src.line("floor", region_id)
            if placed is None:
                out.append(
                    Finding(
                        src.path,
                        where,
                        f"floor.{region_id}",
                        f"{units} units do not fit committed capacity in {region_id} with at "
                        f"least {MIN_FLOOR_HALLS} halls and at most {MAX_HALL_SHARE:.0%} in one "
                        f"hall (room per hall after larger floors: "
                        f"{', '.join(f'{h}={free[h]}' for h in halls)})",
                    )
                )
                continue
            for hall, n in placed.items():
                for k in range(3):
                    left[hall][k] -= n * need[k]
    return out
