"""What the simulation loop asks of a placement policy: estate/engine.py calls these hooks
and nothing else, the same for SCO and for every peer.

The engine owns the estate's physics (hall losses, boots, the trace's reclaims, spend and
the floor check); a policy decides what runs where, hears what happens to what it holds,
and measures what only it knows. One hook per moment the engine hands over:

- `probe`: each minute, the policy's own detection (a floor keeper's probes, estate.halls):
  True when a verdict changed, and the engine plans at once.
- `step`: plan, on the controller's tick, in a minute with reclaim notices, and in a
  minute `probe` said so.
- `on_hit`: the provider takes back slots of a pool (the trace's event), before any
  instance of ours in them is gone: a policy with a canary in the pool learns of it here.
- `on_reclaim`: an instance of ours got a reclaim notice (and is gone, replaced at the next
  step).
- `after_change`: the fleet changed this minute (spend against authority is measured then).
- `floor_units`: the units that count for a tier-1 contract's floor right now.
- `floor_by_hall`: the plotted floor's units per hall, or None: nothing to plot.
- `report`: the policy's own results, added to its region run.

`Policy` is that contract (a Protocol: the engine is typed against it); `PolicyBase` holds
the fleet and config and the defaults a policy may keep.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol

from estate.config import EstateConfig
from estate.fleet import Fleet
from estate.results import RegionRun
from estate.trace import RegionTrace


class Policy(Protocol):
    """The engine's whole view of a policy."""

    name: ClassVar[str]

    def step(self, minute: int, targets: Sequence[int]) -> None:
        """Plan for each tenant's demand in units (`targets`, by tenant index)."""
        ...

    def probe(self, minute: int) -> bool:
        """The policy's probes this minute; True: a verdict changed, plan now."""
        ...

    def on_hit(self, pool: int, slots: Sequence[int], minute: int) -> None:
        """The provider takes back `slots` (sorted) of `pool`; ours are the first
        `fleet.count(pool)` slots, still held when this is called."""
        ...

    def on_reclaim(self, pool: int, instance_id: str, minute: int) -> None:
        """An instance of ours in `pool` got a reclaim notice."""
        ...

    def after_change(self, minute: int) -> None:
        """Something in the fleet changed this minute."""
        ...

    def floor_units(self, tenant: int, minute: int) -> int:
        """Units that hold the tenant's floor now."""
        ...

    def floor_by_hall(self, minute: int) -> dict[str, int] | None:
        """The plotted floor's units per hall now; None: the policy has none to plot."""
        ...

    def report(self, out: RegionRun) -> None:
        """Add what only this policy measures to its region run."""
        ...


class PolicyBase:
    """What a policy holds, and the hooks it may leave as they are: deaf to hits and
    notices, nothing extra to measure or report, and a floor held by whatever of the
    tenant's own capacity is up (reclaimable or committed)."""

    name: ClassVar[str]

    def __init__(self, fleet: Fleet, cfg: EstateConfig, trace: RegionTrace) -> None:
        self.fleet = fleet
        self.cfg = cfg
        self.trace = trace

    def probe(self, minute: int) -> bool:
        return False

    def on_hit(self, pool: int, slots: Sequence[int], minute: int) -> None:
        pass

    def on_reclaim(self, pool: int, instance_id: str, minute: int) -> None:
        pass

    def after_change(self, minute: int) -> None:
        pass

    def floor_units(self, tenant: int, minute: int) -> int:
        fleet = self.fleet
        return fleet.ready_units[tenant] + fleet.committed_units(tenant, "committed", minute)

    def floor_by_hall(self, minute: int) -> dict[str, int] | None:
        return None

    def report(self, out: RegionRun) -> None:
        pass
