"""Pure planning for the floor keeper: shape, spread, hall verdicts, what to release.

No I/O and no clock: the workflow calls these with a snapshot and its own state, so a
replay plans exactly what the original run planned.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from pydantic import BaseModel

from activities.events import InstanceState
from activities.floor.models import (
    FloorInstance,
    FloorShape,
    FloorSnapshot,
    HallCapacity,
    ProbeResult,
)
from planning.floor_spread import spread
from planning.hall_probe import ProbeRules, judge_halls
from workflows.floor.models import FloorConfig, HallLoss, generation_of, reservation_of


def choose_shape(
    shapes: Iterable[FloorShape], committed: Mapping[str, HallCapacity]
) -> FloorShape | None:
    """The cheapest committed shape per unit; ties go to the smaller instance (a lost
    instance takes fewer units with it), then to the name."""
    rate = max((c.price_per_vcpu_hour for c in committed.values()), default=1.0)
    return min(
        shapes,
        key=lambda s: (s.vcpu * rate / s.units_per_instance, s.vcpu, s.flavor),
        default=None,
    )


def room(shape: FloorShape, cap: HallCapacity | None, reserved: int) -> int:
    """Instances of the shape the floor could hold in a hall: what it has reserved there
    already plus what the hall's unreserved committed capacity fits."""
    if cap is None:
        return reserved
    fits = [cap.free_vcpu // shape.vcpu, cap.free_memory_gib // shape.memory_gib]
    if shape.gpus:
        fits.append(cap.free_gpus // shape.gpus)
    return reserved + max(0, min(fits))


class FloorPlan(BaseModel):
    shape: FloorShape | None = None
    floor_units: int = 0
    instances: int = 0  # instances of the shape the floor needs
    healthy: list[str] = []
    targets: dict[str, int] = {}
    held: dict[str, int] = {}  # ACTIVE instances per healthy hall
    launch: dict[str, int] = {}
    surplus: dict[str, int] = {}
    degraded: bool = False
    reason: str = ""

    @property
    def held_total(self) -> int:
        return sum(self.held.values())

    @property
    def whole(self) -> bool:
        """Every hall holds its target: the floor is met as planned."""
        return not self.launch and self.held_total >= sum(self.targets.values())

    def units(self, instances: Mapping[str, int]) -> dict[str, int]:
        per = self.shape.units_per_instance if self.shape else 1
        return {h: k * per for h, k in sorted(instances.items()) if k}


def held_by_hall(instances: Iterable[FloorInstance], halls: Iterable[str]) -> dict[str, int]:
    wanted = set(halls)
    out: dict[str, int] = {}
    for i in instances:
        if i.state is InstanceState.ACTIVE and i.hall in wanted:
            out[i.hall] = out.get(i.hall, 0) + 1
    return out


def plan_floor(snap: FloorSnapshot, lost: Iterable[str]) -> FloorPlan:
    lost = set(lost)
    shape = choose_shape(snap.shapes, snap.committed)
    healthy = [h for h in snap.halls if h not in lost]
    if shape is None:
        return FloorPlan(
            floor_units=snap.floor_units,
            healthy=healthy,
            degraded=snap.floor_units > 0,
            reason="no allowed shape holds one unit on committed capacity",
        )
    n = math.ceil(snap.floor_units / shape.units_per_instance)
    reserved: dict[str, int] = {}
    for r in snap.reservations:
        if r.flavor == shape.flavor and r.status not in ("ERROR", "TERMINATED"):
            reserved[r.hall] = reserved.get(r.hall, 0) + r.amount
    rooms = {
        h: room(shape, snap.committed.get(h), reserved.get(h, 0))
        # A hall the floor already holds more in than its room (capacity shrank) keeps them.
        for h in healthy
    }
    held = held_by_hall(snap.instances, healthy)
    rooms = {h: max(rooms[h], held.get(h, 0)) for h in healthy}
    s = spread(n, healthy, rooms)
    launch = {h: t - held.get(h, 0) for h, t in s.targets.items() if t > held.get(h, 0)}
    surplus = {h: k - s.targets.get(h, 0) for h, k in held.items() if k > s.targets.get(h, 0)}
    return FloorPlan(
        shape=shape,
        floor_units=snap.floor_units,
        instances=n,
        healthy=healthy,
        targets=s.targets,
        held=held,
        launch=launch,
        surplus=surplus,
        degraded=not s.within_rules,
        reason=s.reason,
    )


def newest_first(inst: FloorInstance) -> tuple[int, str, str]:
    """Sort key (reversed) for the newest reservation's instances: by the reservation's
    generation as a number. By the acquisition id's text alone generation 10 sorted
    before 9, so past nine reservations a release took an instance from an old
    reservation and left two half-empty ones holding committed slots nobody used."""
    _, _, gen = reservation_of(inst.acquisition_id).rpartition("-")
    return (int(gen) if gen.isdigit() else -1, inst.acquisition_id, inst.instance_id)


def _by_text(inst: FloorInstance) -> tuple[str, str]:
    return (inst.acquisition_id, inst.instance_id)


def to_release(
    plan: FloorPlan,
    instances: Iterable[FloorInstance],
    lost: Iterable[str],
    *,
    by_generation: bool = True,
) -> list[FloorInstance]:
    """What to release once the launches of a round are done (make-before-break): only
    when every healthy hall holds its target, the surplus above the targets (newest
    reservations first, so whole reservations empty out) and the instances in lost halls.
    The floor's ACTIVE instances never drop below its size. `by_generation=False` is the
    old textual order, kept for keepers whose history was recorded with it (replay)."""
    if not plan.whole:
        return []
    lost = set(lost)
    # A noticed or draining instance is the notice relay's to delete, after its drain.
    out = [
        i
        for i in instances
        if i.hall in lost and i.state in (InstanceState.REQUESTED, InstanceState.ACTIVE)
    ]
    keep_total = plan.held_total
    for hall, extra in sorted(plan.surplus.items()):
        mine = sorted(
            (i for i in instances if i.hall == hall and i.state is InstanceState.ACTIVE),
            key=newest_first if by_generation else _by_text,
            reverse=True,
        )
        for inst in mine[:extra]:
            if keep_total - 1 < plan.instances:
                break
            out.append(inst)
            keep_total -= 1
    return out


def max_generation(names: Iterable[str], prefix: str) -> int:
    return max((g for g in (generation_of(n, prefix) for n in names) if g is not None), default=0)


def live_by_reservation(instances: Iterable[FloorInstance]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in instances:
        name = reservation_of(i.acquisition_id)
        out[name] = out.get(name, 0) + 1
    return out


class Verdict(BaseModel):
    lost: dict[str, str] = {}  # hall -> why it is now lost
    restored: dict[str, str] = {}  # hall -> why it is back
    bad: dict[str, int] = {}
    clean: dict[str, int] = {}


def judge(
    probe: ProbeResult,
    lost: Mapping[str, HallLoss],
    bad: Mapping[str, int],
    clean: Mapping[str, int],
    cfg: FloorConfig,
) -> Verdict:
    """Hysteresis over probes: planning.hall_probe.judge_halls, the rule the estate
    simulator's keeper runs too (see the workflow module's docstring)."""
    v = judge_halls(
        probe.halls,
        {hall: loss.detected for hall, loss in lost.items()},
        bad,
        clean,
        ProbeRules(
            lost_fraction=cfg.lost_fraction,
            lost_probes=cfg.lost_probes,
            clean_probes=cfg.clean_probes,
        ),
    )
    return Verdict(lost=v.lost, restored=v.restored, bad=v.bad, clean=v.clean)
