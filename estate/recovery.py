"""Two more peers (issue 34): SkyPilot's default recovery and SpotHedge, each with the same
committed fallback, spend authority, warm start and measures as every other comparator
(estate.baselines.PerContract). A zone of theirs is a hall here; an instance type in a
zone is a pool.

``skypilot-recovery`` -- SkyPilot managed jobs' default recovery strategy, FAILOVER
(sky/jobs/recovery_strategy.py): a preempted cluster is relaunched with the same resources
in the same region/zone first; when that fails, the optimizer fails over to the cheapest
other location. ``skypilot-eager`` is EAGER_NEXT_REGION: the preempted zone is tried last.
Faithful: same location first (or last), else the cheapest, no memory of earlier
preemptions beyond the current relaunch. Simplified: a relaunch is per pool, not per
cluster (instances of one tenant are interchangeable), and a launch fails only for want of
free slots (no quota or API errors).

``spothedge`` -- SpotHedge (Mao et al., EuroSys '24; SkyServe's spot placement): replicas
spread evenly over the zones held *active*; a zone with a preemption moves to the
*preempted* list and back to active once a launch there succeeds (all preempted: all
active again); a few extra spot replicas over target (dynamic over-provisioning: the
preemptions of the last hour, at most ``OVERPROVISION`` of the target); on-demand fallback
for the target not covered by *ready* spot replicas, released as spot comes up.
Simplified: the extra replicas follow the last hour's preemptions instead of the paper's
fixed N_extra tuned offline; the on-demand fallback is the shared committed fallback
within the contract's authority; cheapest pool first within a zone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from estate import fallback
from estate.baselines import PerContract, fill, pool_inputs
from estate.config import EstateConfig
from estate.fleet import Fleet
from estate.trace import RegionTrace
from planning.models import PoolInput

#: SpotHedge's over-provisioning: at most this share of the target in extra replicas.
OVERPROVISION = 0.2


class SkyPilotRecovery(PerContract):
    name = "skypilot-recovery"
    eager_next_zone = False

    def __init__(self, fleet: Fleet, cfg: EstateConfig, trace: RegionTrace) -> None:
        super().__init__(fleet, cfg, trace)
        self.relaunch: dict[int, int] = {}  # preempted pool -> instances to relaunch

    def on_reclaim(self, pool: int, instance_id: str, minute: int) -> None:
        self.relaunch[pool] = self.relaunch.get(pool, 0) + 1

    def step(self, minute: int, targets: Sequence[int]) -> None:
        super().step(minute, targets)
        self.relaunch.clear()  # one relaunch attempt; then the optimizer's placement

    def order(self, t: int, minute: int) -> list[int]:
        cheapest = self.cheapest_first(t, minute)
        if not self.relaunch:
            return cheapest
        halls = {self.fleet.pools[p].hall for p in self.relaunch}
        if self.eager_next_zone:  # the preempted zone last
            return sorted(cheapest, key=lambda p: self.fleet.pools[p].hall in halls)
        same = [p for p in cheapest if p in self.relaunch]  # same type, same zone first
        return same + [p for p in cheapest if p not in self.relaunch]


class SkyPilotEager(SkyPilotRecovery):
    name = "skypilot-eager"
    eager_next_zone = True


class SpotHedge(PerContract):
    name = "spothedge"

    def __init__(self, fleet: Fleet, cfg: EstateConfig, trace: RegionTrace) -> None:
        super().__init__(fleet, cfg, trace)
        self.preempted: set[str] = set()  # zones (halls) on the preempted list
        self.recent: list[int] = []  # minutes of preemptions

    def on_reclaim(self, pool: int, instance_id: str, minute: int) -> None:
        self.preempted.add(self.fleet.pools[pool].hall)
        self.recent.append(minute)
        if self.preempted >= set(self.fleet.region.halls):
            self.preempted.clear()  # every zone preempted: all active again

    def step(self, minute: int, targets: Sequence[int]) -> None:
        fleet = self.fleet
        self.recent = [m for m in self.recent if m > minute - 60]
        for t, target in enumerate(targets):
            upi = max(fleet.tenants[t].upi, default=1)
            extra = min(len(self.recent) * upi, math.ceil(OVERPROVISION * target))
            self.place(t, minute, target + extra if target else 0)
        if self.cfg.baseline_fallback:
            pools: list[PoolInput] | None = None
            for t, target in enumerate(targets):  # on-demand for what spot has not *ready*
                short = max(0, target - fleet.ready_units[t])
                if short or fleet.committed_units(t, "fallback"):
                    pools = pools or pool_inputs(fleet, minute, self.cfg)
                    fallback.arbitrate(
                        fleet, self.cfg, t, short, pools, self.index, minute, self.fallback[t]
                    )

    def place(self, t: int, minute: int, target: int) -> None:
        fleet = self.fleet
        have = fleet.units(t)
        if have >= target:
            super().place(t, minute, target)
            return
        usable = self.cheapest_first(t, minute)
        active = [p for p in usable if fleet.pools[p].hall not in self.preempted]
        halls = sorted({fleet.pools[p].hall for p in active})
        need = target - have
        for i, hall in enumerate(halls):  # an even share per active zone
            if need <= 0:
                return
            share = math.ceil(need / (len(halls) - i))
            left = fill(fleet, self.cfg, t, share,
                        [p for p in active if fleet.pools[p].hall == hall], minute)  # fmt: skip
            need -= share - left
        if need > 0:  # the active zones cannot hold it: the preempted ones, cheapest first
            before = {p: fleet.held[p].get(t, 0) for p in usable}
            fill(fleet, self.cfg, t, need, usable, minute)
            for p in usable:
                if fleet.held[p].get(t, 0) > before[p]:
                    self.preempted.discard(fleet.pools[p].hall)  # a launch there succeeded
