"""Pure comparison of what the provider holds for SCO with fleet state (no I/O, no clock:
the workflow passes `now`, so a replay decides what the original run decided).

- orphan server: an SCO server (by metadata) no live fleet instance knows by provider id,
  and not the in-flight create of a REQUESTED instance (same name); older than the grace.
  A duplicate for one slot is an orphan too: fleet state knows only one of the two.
- ghost: a live ACTIVE/NOTICED/DRAINING instance whose provider id the provider does not
  list, its state older than the grace.
- orphan lease: an SCO lease (by name) no live instance boots into, older than the grace.
  A floor's lease is in use by instances of acquisitions `<owner>-<nonce>`, a fallback's by
  instances of its acquisition.
- renewal: a fallback lease in use whose end is within `renew_before` (a floor keeper
  renews its own leases).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel

from activities.events import InstanceState
from activities.provider.interface import ProviderInstance, Reservation
from activities.provider.leases import fallback_acquisition
from activities.reconciler.models import FleetEntry, ReconcileSnapshot

_RUNNING = (InstanceState.ACTIVE, InstanceState.NOTICED, InstanceState.DRAINING)


class Ghost(BaseModel):
    instance_id: str
    provider_id: str


class ReconcilePlan(BaseModel):
    orphan_servers: list[ProviderInstance] = []
    orphan_leases: list[Reservation] = []
    ghosts: list[Ghost] = []
    renew: list[Reservation] = []

    @property
    def empty(self) -> bool:
        return not (self.orphan_servers or self.orphan_leases or self.ghosts or self.renew)

    def summary(self) -> str:
        return (
            f"{len(self.orphan_servers)} orphan server(s), {len(self.orphan_leases)} orphan "
            f"lease(s), {len(self.ghosts)} ghost(s), {len(self.renew)} lease(s) to renew"
        )


def _old(at: datetime | None, now: datetime, grace: timedelta) -> bool:
    return at is None or now - at >= grace


def lease_users(lease: Reservation, fleet: list[FleetEntry]) -> int:
    acq = fallback_acquisition(lease.owner)
    if acq is not None:
        return sum(1 for e in fleet if e.acquisition_id == acq)
    key = lease.owner or lease.name
    return sum(1 for e in fleet if e.acquisition_id.startswith(f"{key}-"))


def plan_reconcile(
    snap: ReconcileSnapshot,
    now: datetime,
    *,
    grace: timedelta,
    renew_before: timedelta,
) -> ReconcilePlan:
    known = {e.provider_id for e in snap.fleet if e.provider_id}
    in_flight = {e.instance_id for e in snap.fleet if e.state is InstanceState.REQUESTED}
    held = {s.provider_id for s in snap.servers}
    plan = ReconcilePlan()
    for s in sorted(snap.servers, key=lambda s: (s.name, s.provider_id)):
        if s.provider_id in known or s.name in in_flight:
            continue
        if _old(s.created_at, now, grace):
            plan.orphan_servers.append(s)
    for e in sorted(snap.fleet, key=lambda e: e.instance_id):
        if (
            e.state in _RUNNING
            and e.provider_id
            and e.provider_id not in held
            and _old(e.state_changed_at, now, grace)
        ):
            plan.ghosts.append(Ghost(instance_id=e.instance_id, provider_id=e.provider_id))
    for lease in sorted(snap.leases, key=lambda r: r.name):
        if lease.status in ("ERROR", "TERMINATED", "DELETED"):
            if _old(lease.created_at, now, grace):
                plan.orphan_leases.append(lease)
            continue
        users = lease_users(lease, snap.fleet)
        if users == 0:
            if _old(lease.created_at, now, grace):
                plan.orphan_leases.append(lease)
        elif fallback_acquisition(lease.owner) is not None and lease.end - now <= renew_before:
            plan.renew.append(lease)
    return plan
