"""Which instances to voluntarily replace now: drift and expiry, within the budget (pure).

The step a replacement workflow takes each round: the candidates (drifted instances, then
instances past the contract's `max_instance_age_hours`, oldest first), each reason cut to
what `allowed_disruptions` lets start now. One instance is disrupted for one reason only
(drift first: a drifted instance that is also old is replaced as drift).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from contracts.disruption import DisruptionReason
from contracts.model import Contract
from planning.disruption_budget import BudgetVerdict, allowed_disruptions
from planning.drift import InstanceFacts, fleet_drift, is_serving


class AgedInstance(InstanceFacts, Protocol):
    @property
    def created_at(self) -> datetime: ...


class Disrupt(BaseModel):
    model_config = ConfigDict(frozen=True)

    instance_id: str
    reason: DisruptionReason
    why: str


class VoluntaryPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    contract: str
    disrupt: list[Disrupt] = []
    # Candidates the budget holds back now, and the verdict for each reason.
    held_back: list[Disrupt] = []
    verdicts: list[BudgetVerdict] = []


def expired(
    contract: Contract, rows: Sequence[AgedInstance], now: datetime
) -> list[tuple[AgedInstance, timedelta]]:
    """Serving instances older than the contract's maximum age, oldest first, with age."""
    d = contract.disruption
    if d is None or d.max_instance_age_hours is None:
        return []
    limit = timedelta(hours=d.max_instance_age_hours)
    old = [
        (r, now - r.created_at)
        for r in rows
        if r.workload == contract.name and is_serving(r) and now - r.created_at > limit
    ]
    return sorted(old, key=lambda p: (-p[1], p[0].instance_id))


def plan_voluntary(
    contract: Contract,
    rows: Sequence[AgedInstance],
    *,
    now: datetime,
    in_flight: Mapping[DisruptionReason, int],
) -> VoluntaryPlan:
    """Drift and expiry replacements to start now for `contract`, within its budget.

    `rows`: the contract's instances in one region (fleet state); `in_flight`: voluntary
    disruptions already under way, by reason. Each started replacement counts against
    every budget that names its reason, so drift and expiry share a common budget fairly.
    """
    mine = [r for r in rows if r.workload == contract.name]
    serving = [r for r in mine if is_serving(r)]
    drift = fleet_drift([contract], serving)
    candidates: list[Disrupt] = [
        Disrupt(instance_id=i, reason=DisruptionReason.DRIFT, why=v.why)
        for i, v in sorted(drift.items())
        if v.drifted
    ]
    taken = {c.instance_id for c in candidates}
    for row, age in expired(contract, serving, now):
        if row.instance_id not in taken:
            hours = age.total_seconds() / 3600
            candidates.append(
                Disrupt(
                    instance_id=row.instance_id,
                    reason=DisruptionReason.EXPIRY,
                    why=f"{hours:.1f} h old, over max_instance_age_hours",
                )
            )
    busy = dict(in_flight)
    disrupt: list[Disrupt] = []
    held: list[Disrupt] = []
    verdicts: dict[DisruptionReason, BudgetVerdict] = {}
    for c in candidates:
        v = allowed_disruptions(
            contract.disruption, c.reason, now=now, instances=len(serving), in_flight=busy
        )
        verdicts.setdefault(c.reason, v)
        if v.allowed is None or v.allowed > 0:
            disrupt.append(c)
            busy[c.reason] = busy.get(c.reason, 0) + 1
        else:
            held.append(c)
            verdicts[c.reason] = v
    return VoluntaryPlan(
        contract=contract.name, disrupt=disrupt, held_back=held, verdicts=list(verdicts.values())
    )
