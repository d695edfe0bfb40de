"""A lifecycle event of one reclaimable cpu pool (r1.A.cpu.l, tier 3, 0.1 an hour), as the
ledger's tests and benches feed it: only the instance, kind and workload vary."""

from __future__ import annotations

from typing import Any

from activities.events import CapacityType, EventKind, LifecycleEvent


def cpu_event(
    instance_id: str,
    *,
    kind: EventKind = EventKind.READY,
    workload: str = "ci-runners",
    **fields: Any,
) -> LifecycleEvent:
    return LifecycleEvent(
        kind=kind,
        instance_id=instance_id,
        region="r1",
        pool_id="r1.A.cpu.l",
        hall="A",
        sku="cpu",
        size="l",
        capacity_type=CapacityType.RECLAIMABLE,
        workload=workload,
        tier=3,
        price_per_hour=0.1,
        **fields,
    )
