"""How many floor instances go to which hall: at least 3 halls, at most 40 % in one, within
each hall's committed room; when the halls cannot satisfy that, the most even placement
that fits, flagged with the reason.

Pure (no I/O, no clock): the floor keeper workflow plans with it, and the estate simulator
drives the very same function through a month of hall losses.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel

from contracts.feasibility import MAX_HALL_SHARE, MIN_FLOOR_HALLS, spread_floor


class Spread(BaseModel):
    targets: dict[str, int] = {}  # hall -> instances
    within_rules: bool = True
    reason: str = ""


def spread(n: int, halls: list[str], rooms: Mapping[str, int]) -> Spread:
    """`n` instances over `halls` by the floor rules (>= 3 halls, <= 40 % in one);
    when the halls cannot satisfy them, the most even placement that fits, flagged."""
    if n <= 0:
        return Spread()
    halls = sorted(halls)
    if len(halls) >= MIN_FLOOR_HALLS:
        placed = spread_floor(n, halls, dict(rooms))
        if placed is not None:
            return Spread(targets=placed)
    # Best available: as even as the room allows, no share cap.
    caps = {h: max(0, rooms.get(h, 0)) for h in halls}
    targets = dict.fromkeys(halls, 0)
    left = min(n, sum(caps.values()))
    while left:
        hall = min((h for h in halls if targets[h] < caps[h]), key=lambda h: (targets[h], h))
        targets[hall] += 1
        left -= 1
    targets = {h: k for h, k in targets.items() if k}
    if len(halls) < MIN_FLOOR_HALLS:
        why = (
            f"{len(halls)} healthy hall(s) ({', '.join(halls) or 'none'}): the floor needs "
            f">= {MIN_FLOOR_HALLS} halls with <= {MAX_HALL_SHARE:.0%} in each"
        )
    else:
        why = (
            f"committed capacity in {', '.join(halls)} cannot hold {n} instances with "
            f"<= {MAX_HALL_SHARE:.0%} in one hall"
        )
    short = n - sum(targets.values())
    if short:
        why += f"; {short} instance(s) short of the floor"
    return Spread(targets=targets, within_rules=False, reason=why)
