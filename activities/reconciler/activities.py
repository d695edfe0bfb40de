"""The reconciler's activities: one snapshot of both sides, and marking a ghost lost.

`snapshot` reads fleet state first and the provider second: an instance released between
the two reads then shows as neither orphan nor ghost (gone from both), never as a ghost.
`mark_lost` looks again before it writes: the provider must say NotFound and the row must
still be live with the same provider id, so a slow list never costs a running instance.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from temporalio import activity

from activities.events import TERMINAL_STATES, EventKind, InstanceState
from activities.fleet.repository import FleetRepository
from activities.provider.errors import NotFound, ProviderError
from activities.provider.interface import CloudProvider
from activities.reconciler.models import (
    FleetEntry,
    MarkLostInput,
    MarkLostResult,
    ReconcileSnapshot,
    ReconcileSnapshotInput,
)

_LIVE = [s for s in InstanceState if s not in TERMINAL_STATES]


class ReconcilerActivities:
    def __init__(self, fleet: FleetRepository, provider: CloudProvider) -> None:
        self._fleet = fleet
        self._provider = provider

    @activity.defn(name="reconciler.snapshot")
    async def snapshot(self, inp: ReconcileSnapshotInput) -> ReconcileSnapshot:
        rows = await asyncio.to_thread(self._fleet.list_instances, inp.region, _LIVE)
        try:
            servers = await self._provider.list_owned(inp.region)
            leases = await self._provider.list_reservations(inp.region)
        except ProviderError as exc:
            raise exc.to_application_error() from exc
        return ReconcileSnapshot(
            region=inp.region,
            taken_at=datetime.now(UTC),
            servers=servers,
            leases=leases,
            fleet=[
                FleetEntry(
                    instance_id=r.instance_id,
                    state=r.state,
                    provider_id=r.provider_id,
                    acquisition_id=r.acquisition_id or "",
                    state_changed_at=r.state_changed_at,
                )
                for r in rows
            ],
        )

    @activity.defn(name="reconciler.mark_lost")
    async def mark_lost(self, inp: MarkLostInput) -> MarkLostResult:
        try:
            await self._provider.get(inp.provider_id)
            return MarkLostResult(marked=False)  # it is there after all
        except NotFound:
            pass
        except ProviderError as exc:
            raise exc.to_application_error() from exc
        row = await asyncio.to_thread(self._fleet.get_instance, inp.instance_id)
        if row is None or row.state in TERMINAL_STATES or row.provider_id != inp.provider_id:
            return MarkLostResult(marked=False)
        event = await asyncio.to_thread(
            self._fleet.record_event, inp.instance_id, EventKind.DELETE, reason=inp.reason
        )
        return MarkLostResult(marked=event is not None)


def reconciler_activities(acts: ReconcilerActivities) -> list[Callable[..., Any]]:
    return [acts.snapshot, acts.mark_lost]
