"""Committed fallback within a contract's spend authority: the product's arbiter
(planning.arbiter.price_fallback) picks the shape and spreads it over the halls, the same
for SCO and for every peer that falls back. Each instance is priced at the fleet's
committed price (estate.fleet.Fleet.committed_price); an offer over the authority is
declined whole (no operator approves in the simulation) or, with ``partial_fallback``,
launched as far as the authority goes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from estate.config import EstateConfig
from estate.fleet import Committed, Fleet
from planning.arbiter import price_fallback
from planning.models import PoolInput


@dataclass
class FallbackLog:
    max_spend: float = 0.0
    minutes_over: int = 0
    launched: int = 0
    declined: int = 0
    refused_units: int = 0
    reasons: list[str] = field(default_factory=list)


def release_committed(fleet: Fleet, t: int, role: str, surplus: int) -> None:
    upi = fleet.tenants[t].upi
    for g in reversed([g for g in fleet.committed if g.tenant == t and g.role == role]):
        n = min(surplus // upi[g.pool], g.count)
        if n:
            surplus -= n * upi[g.pool]
            fleet.uncommit(g, n)


def spend(fleet: Fleet, t: int) -> float:
    return sum(g.count * g.price for g in fleet.committed if g.tenant == t and g.role == "fallback")


def arbitrate(
    fleet: Fleet,
    cfg: EstateConfig,
    t: int,
    shortfall: int,
    pools: Sequence[PoolInput],
    index: dict[str, int],
    minute: int,
    log: FallbackLog,
) -> None:
    """Hold ``shortfall`` units of tenant ``t`` on committed fallback: release what is no
    longer short, buy what is, within the authority."""
    tenant = fleet.tenants[t]
    have = fleet.committed_units(t, "fallback")
    if have > shortfall:
        release_committed(fleet, t, "fallback", have - shortfall)
        return
    if have == shortfall:
        return
    current = spend(fleet, t)
    rates = {h: r for h, r in fleet.committed_rate.items() if h not in fleet.down}
    offer = price_fallback(
        tenant.demand,
        shortfall - have,
        pools,
        rates,
        authority_per_hour=tenant.authority,
        current_spend_per_hour=current,
    )
    if offer is None:
        return
    priced = [
        (
            item,
            index[item.pool_id],
            item.price_per_hour
            if not fleet.committed_markup
            else fleet.committed_price(index[item.pool_id], item.hall),
        )
        for item in offer.items
    ]
    total = current + sum(item.instances * price for item, _, price in priced)
    over = offer.needs_approval or total > tenant.authority + 1e-9
    if over and not cfg.partial_fallback:
        log.declined += 1
        log.refused_units += shortfall - have
        if len(log.reasons) < 3:
            log.reasons.append(offer.reason)
        return
    budget = tenant.authority - current
    bought = 0
    for item, pool, price in priced:
        n = min(item.instances, fleet.committed_room(item.hall, pool))
        if over:
            n = min(n, max(0, int((budget + 1e-9) // price)) if price > 0 else n)
        budget -= n * price
        fleet.commit(
            Committed(
                tenant=t,
                hall=item.hall,
                pool=pool,
                count=n,
                price=price,
                ready=minute + cfg.committed_boot_minutes,
                role="fallback",
            )
        )
        log.launched += n
        bought += n * tenant.upi[pool]
    if over:
        log.declined += 1
        log.refused_units += max(0, shortfall - have - bought)
        if len(log.reasons) < 3:
            log.reasons.append(offer.reason)


def watch(fleet: Fleet, logs: dict[int, FallbackLog]) -> None:
    """Fallback spend against authority, in a minute the fleet changed."""
    for t, log in logs.items():
        now = spend(fleet, t)
        log.max_spend = max(log.max_spend, now)
        if now > fleet.tenants[t].authority + 1e-9:
            log.minutes_over += 1
