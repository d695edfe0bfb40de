"""The planner's arithmetic on plain numbers: restart cost and the caps.

Kept apart from the models so the tests and the benchmark state the constraints with the
very same rounding the planner uses (a cap that differs by one between the two would make
a correct plan look wrong, or the other way round).
"""

from __future__ import annotations

import math

from contracts.model import WorkloadKind

#: Hours of instance time a reclaim throws away, by workload kind: a Spark executor loses
#: its in-flight tasks (decommission saves the blocks), training falls back to its last
#: checkpoint, a CI job reruns from the start, a stateless service replica only restarts.
RESTART_COST_HOURS: dict[str, float] = {
    WorkloadKind.SPARK.value: 0.25,
    WorkloadKind.TRAINING.value: 1.0,
    WorkloadKind.CI.value: 0.5,
    WorkloadKind.SERVICE.value: 0.1,
}

# Caps are shares of whole numbers computed in floating point: 0.29 * 100 is
# 28.999999999999996, whose floor would silently cost a whole instance. Values within
# this distance of an integer are taken as that integer.
_EPS = 1e-9


def expected_cost(price_per_hour: float, reclaim_rate: float, kind: str) -> float:
    """Expected cost of one useful instance-hour: the price, plus the instance time that
    reclaims (``reclaim_rate`` per instance-hour) throw away and must be paid again."""
    return price_per_hour * (1.0 + reclaim_rate * RESTART_COST_HOURS[kind])


def owner_load_rate(free: int, size: int, full_rate: float, free_share: float) -> float:
    """Reclaims per instance-hour to expect from the owner's own load, from the pool's free
    share: none while at least ``free_share`` of the pool is free, rising linearly to
    ``full_rate`` when nothing is. The owner takes its capacity back from the pools it has
    filled, so the fullest pools are reclaimed next; a reclaim history learns that only
    after the notices, the free share says it before (Karpenter's price-capacity-optimized
    ranks pools by the same signal)."""
    if full_rate <= 0 or size <= 0:
        return 0.0
    share = min(1.0, max(0, free) / size)
    return full_rate * max(0.0, 1.0 - share / free_share)


def pool_share_cap(max_pool_share: float, reclaimable_units: int) -> int:
    """Instances (existing and new) one contract may hold in a pool."""
    return max(0, math.floor(max_pool_share * reclaimable_units + _EPS))


def spread_cap(spread_max_pool_fraction: float, group_target_units: int) -> int:
    """Units (existing and new) the members of one spread group may hold in one pool.

    At least 1, so a group whose members want almost nothing can still place something.
    """
    return max(1, math.ceil(spread_max_pool_fraction * group_target_units - _EPS))
