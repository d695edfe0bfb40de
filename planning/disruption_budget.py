"""How many voluntary disruptions of a reason a contract may start now (pure).

The one gate every voluntary disruption (consolidation, drift, return from fallback,
expiry) passes through, in the region controller and the estate simulator alike. Hall-loss
rebuilds and provider reclaims are never voluntary: they are always allowed, never counted.

Rules (Karpenter's budgets, per contract):
- an open blackout stops every voluntary reason;
- each budget that names the reason and is active now (no schedule, or its cron window is
  open) caps the disruptions in flight *for the reasons it names*; a budget with a
  schedule outside its window does not apply;
- the tightest cap wins; when no budget applies the reason is unlimited (a contract that
  wants a limit outside its windows says so with a budget without a schedule);
- what is already in flight counts against the cap, so `allowed` is never negative.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from contracts.disruption import Disruption, DisruptionReason


class BudgetVerdict(BaseModel):
    """The answer, with the reason recorded in the ledger and shown by `sco explain`."""

    model_config = ConfigDict(frozen=True)

    reason: DisruptionReason
    # How many more may start now; None: not limited (involuntary, or no budget applies).
    allowed: int | None = Field(default=None, ge=0)
    why: str

    @property
    def blocked(self) -> bool:
        return self.allowed == 0


def allowed_disruptions(
    disruption: Disruption | None,
    reason: DisruptionReason,
    *,
    now: datetime,
    instances: int,
    in_flight: Mapping[DisruptionReason, int],
) -> BudgetVerdict:
    """Voluntary disruptions of `reason` the contract may start at `now`.

    `instances`: the contract's live instances in the region (the base of a percentage);
    `in_flight`: voluntary disruptions under way now, by reason (involuntary ones are
    ignored).
    """
    if not reason.voluntary:
        return BudgetVerdict(reason=reason, allowed=None, why=f"{reason.value} is never blocked")
    d = disruption if disruption is not None else Disruption()
    for i, blackout in enumerate(d.blackouts):
        if blackout.open_at(now):
            return BudgetVerdict(reason=reason, allowed=0, why=f"blackout {i} is open")
    best: tuple[int, str] | None = None
    for i, budget in enumerate(d.budgets):
        if reason not in budget.reasons or not budget.active_at(now):
            continue
        limit = budget.limit(max(instances, 0))
        busy = sum(max(in_flight.get(r, 0), 0) for r in budget.reasons)
        left = max(limit - busy, 0)
        if best is None or left < best[0]:
            what = (
                f"{budget.max_instances} instances"
                if budget.max_instances is not None
                else f"{budget.max_percent:g} % of {instances} = {limit}"
            )
            best = (left, f"budget {i} ({what}) has {busy} in flight")
    if best is None:
        return BudgetVerdict(reason=reason, allowed=None, why="no budget applies now")
    return BudgetVerdict(reason=reason, allowed=best[0], why=best[1])
