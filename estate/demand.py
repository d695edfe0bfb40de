"""Thirty days of demand for the four workload kinds, as a share of each contract's
``max_units_per_region``, piecewise constant over 15-minute blocks.

- CI: diurnal on weekdays (office hours peak), a low weekend.
- Spark: nightly batch (00:00-06:00) and a smaller midday run.
- Training: long jobs; the level changes every three days.
- Services: steady with a mild daily swing, never below the floor.
"""

from __future__ import annotations

import math
import random

from contracts.model import Contract, WorkloadKind

BLOCK_MINUTES = 15


def _noise(seed: int, name: str, region: str, block: int, spread: float) -> float:
    return 1.0 + spread * (2.0 * random.Random(f"{seed}:{name}:{region}:{block}").random() - 1.0)


def _office(hour: float) -> float:
    """0 outside 07:00-20:00, a smooth bump peaking at 13:30 inside."""
    if not 7.0 <= hour < 20.0:
        return 0.0
    return math.sin(math.pi * (hour - 7.0) / 13.0)


def share(kind: WorkloadKind, minute: int, noise: float) -> float:
    day, in_day = divmod(minute, 1440)
    hour = in_day / 60.0
    weekend = day % 7 in (5, 6)
    if kind is WorkloadKind.CI:
        level = 0.1 + (0.15 if weekend else 0.8) * _office(hour)
    elif kind is WorkloadKind.SPARK:
        level = 0.85 if hour < 6.0 else (0.35 if 12.0 <= hour < 14.0 else 0.05)
    elif kind is WorkloadKind.TRAINING:
        level = (0.6, 0.9, 0.75, 1.0)[(day // 3) % 4]
    else:
        level = 0.55 + 0.3 * _office(hour)
    return max(0.0, min(1.0, level * noise))


def demand_units(contract: Contract, name: str, region: str, minute: int, seed: int) -> int:
    """Units ``name`` (a tenant of ``contract``) wants in ``region`` at ``minute``."""
    cap = contract.placement.max_units_per_region if region in contract.regions else 0
    block = minute // BLOCK_MINUTES
    spread = 0.05 if contract.kind is WorkloadKind.TRAINING else 0.15
    units = round(cap * share(contract.kind, minute, _noise(seed, name, region, block, spread)))
    return max(units, contract.floor.get(region, 0)) if cap else 0
