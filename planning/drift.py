"""Drift: which of a contract's instances no longer conform to it, and why (pure).

An instance drifts when its contract changed under it (region, SKU, size or hall no
longer allowed; the contract removed) or when what it was booted from changed (image,
user-data). Drifted instances are replaced within the contract's disruption budget
(reason `drift`, planning/disruption_budget.py), make-before-break; this module only says
which and why. Instances already leaving (noticed, draining, gone) are not drift.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from contracts.model import Contract

#: Fleet-state states of an instance that is still expected to serve its contract.
SERVING_STATES = frozenset({"requested", "active"})


class InstanceFacts(Protocol):
    """What drift reads of a fleet-state row (activities' InstanceRow has these fields)."""

    @property
    def instance_id(self) -> str: ...
    @property
    def region(self) -> str: ...
    @property
    def workload(self) -> str: ...
    @property
    def sku(self) -> str: ...
    @property
    def size(self) -> str: ...
    @property
    def hall(self) -> str: ...


class Expected(BaseModel):
    """What instances should be booted from now; None: not tracked, never drift."""

    model_config = ConfigDict(frozen=True)

    image: str | None = None
    user_data_hash: str | None = None


class DriftVerdict(BaseModel):
    model_config = ConfigDict(frozen=True)

    instance_id: str
    contract: str
    drifted: bool
    # Every reason that applies, e.g. "sku gp no longer allowed (allowed: mem)"; empty when
    # the instance conforms.
    reasons: tuple[str, ...] = ()

    @property
    def why(self) -> str:
        return "; ".join(self.reasons)


def _state_value(row: object) -> str | None:
    state = getattr(row, "state", None)
    return None if state is None else str(getattr(state, "value", state))


def is_serving(row: object) -> bool:
    """Still expected to serve its contract (a row without a state counts as serving)."""
    state = _state_value(row)
    return state is None or state in SERVING_STATES


def instance_drift(
    contract: Contract | None,
    row: InstanceFacts,
    *,
    expected: Expected = Expected(),
    image: str | None = None,
    user_data_hash: str | None = None,
) -> DriftVerdict:
    """Whether one instance conforms to its contract (None: the contract is gone).

    `image` / `user_data_hash`: what the instance was booted from, when recorded; compared
    with `expected` only when both sides are known.
    """
    if contract is None:
        return DriftVerdict(
            instance_id=row.instance_id,
            contract=row.workload,
            drifted=True,
            reasons=("contract removed from the bundle",),
        )
    p = contract.placement
    why: list[str] = []
    if row.region not in contract.regions:
        why.append(f"region {row.region} no longer allowed ({', '.join(contract.regions)})")
    if row.sku not in p.skus:
        why.append(f"sku {row.sku} no longer allowed ({', '.join(p.skus)})")
    if row.size not in p.sizes:
        why.append(f"size {row.size} no longer allowed ({', '.join(p.sizes)})")
    if row.hall not in p.halls:
        why.append(f"hall {row.hall} no longer allowed ({', '.join(p.halls)})")
    if expected.image is not None and image is not None and image != expected.image:
        why.append(f"image {image} is not {expected.image}")
    if (
        expected.user_data_hash is not None
        and user_data_hash is not None
        and user_data_hash != expected.user_data_hash
    ):
        why.append("user-data changed")
    return DriftVerdict(
        instance_id=row.instance_id,
        contract=contract.name,
        drifted=bool(why),
        reasons=tuple(why),
    )


def fleet_drift(
    contracts: Iterable[Contract],
    rows: Iterable[InstanceFacts],
    *,
    expected: Expected = Expected(),
) -> dict[str, DriftVerdict]:
    """Verdicts by instance id for every serving instance in `rows` (rows in other states,
    e.g. draining or deleted, have no verdict: they are leaving anyway)."""
    by_name = {c.name: c for c in contracts}
    out: dict[str, DriftVerdict] = {}
    for row in rows:
        if not is_serving(row):
            continue
        out[row.instance_id] = instance_drift(
            by_name.get(row.workload),
            row,
            expected=expected,
            image=getattr(row, "image", None),
            user_data_hash=getattr(row, "user_data_hash", None),
        )
    return out
