"""The notice relay of one hall: reclaim decisions become notices with a deadline, and
instances still there at the deadline are deleted.

Durable by construction: the NOTICE is written to fleet state (with its lifecycle event)
before the notice is published, and the deadline is derived from that row. After a
restart the relay republishes the notices of its hall's noticed instances (same stable
notice id, so agents act once) and deletes those past their deadline.

Every notice goes out signed with the relay's key (contracts/notice_signing.py); nodes
accept only keys their signed contract bundle lists for the region.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta

from nacl.signing import SigningKey
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from activities.events import EventKind, InstanceState
from activities.fleet.repository import FleetRepository, InstanceRow
from activities.provider.errors import ProviderError
from activities.provider.interface import CloudProvider
from contracts.notice import ReclaimNotice, ReclaimRequest, notice_stream
from contracts.notice_signing import sign

log = logging.getLogger(__name__)

_PENDING = [InstanceState.NOTICED, InstanceState.DRAINING]


class NoticeRelay:
    def __init__(
        self,
        *,
        region: str,
        hall: str,
        lead: timedelta,
        repo: FleetRepository,
        provider: CloudProvider,
        js: JetStreamContext,
        signing_key: SigningKey,
        on_notice: Callable[[ReclaimNotice], Awaitable[None]] | None = None,
    ) -> None:
        self.region, self.hall, self.lead = region, hall, lead
        self._repo = repo
        self._provider = provider
        self._js = js
        self._key = signing_key
        # Told after each notice went out (the pool exclusion cycle counts reclaims). Best
        # effort: a failure here is logged and never holds up a notice.
        self._on_notice = on_notice

    @property
    def duplicate_window(self) -> float:
        """Seconds JetStream drops a republished notice id for: twice the lead (never under
        NATS's 2 min default). A notice is only republished while its instance is pending,
        i.e. before its deadline, so every republish falls inside the window."""
        return max(120.0, 2 * self.lead.total_seconds())

    async def ensure_stream(self) -> None:
        """The region's notice stream; notices are kept one day (far past any deadline).
        An existing stream whose duplicate window is shorter is widened."""
        name = notice_stream(self.region)
        try:
            info = await self._js.stream_info(name)
        except NotFoundError:
            await self._js.add_stream(
                name=name,
                subjects=[f"sco.{self.region}.notice.>"],
                max_age=86400,
                duplicate_window=self.duplicate_window,
            )
            return
        if (info.config.duplicate_window or 0) < self.duplicate_window:
            info.config.duplicate_window = self.duplicate_window
            await self._js.update_stream(info.config)

    def notice_for(self, row: InstanceRow) -> ReclaimNotice:
        noticed_at = row.state_changed_at
        return ReclaimNotice(
            notice_id=ReclaimNotice.stable_id(row.region, row.instance_id, noticed_at),
            region=row.region,
            hall=row.hall,
            node=row.instance_id,
            pool_id=row.pool_id,
            issued_at=noticed_at,
            deadline=noticed_at + self.lead,
            reason=f"reclaim notice for {row.pool_id}",
        )

    async def _publish(self, notice: ReclaimNotice) -> None:
        # Msg-Id makes JetStream drop a republished notice within its dedupe window.
        await self._js.publish(
            notice.subject,
            sign(notice, self._key),
            headers={"Nats-Msg-Id": notice.notice_id},
        )

    async def reclaim(self, instance_ids: Iterable[str], reason: str) -> list[ReclaimNotice]:
        """Notice the given instances of this hall that are active; others are skipped."""
        notices = []
        for iid in instance_ids:
            row = self._repo.get_instance(iid)
            if row is None or row.hall != self.hall or row.region != self.region:
                log.warning("reclaim: %s is not an instance of %s/%s", iid, self.region, self.hall)
                continue
            if row.state is InstanceState.ACTIVE:
                self._repo.record_event(iid, EventKind.NOTICE, reason=reason)
                row = self._repo.get_instance(iid)
            if row is None or row.state not in _PENDING:
                continue
            notice = self.notice_for(row)
            await self._publish(notice)
            notices.append(notice)
            if self._on_notice is not None:
                try:
                    await self._on_notice(notice)
                except Exception as exc:  # reporting must never fail a notice
                    log.warning("notice hook for %s failed: %s", notice.node, exc)
        return notices

    async def handle_request(self, request: ReclaimRequest) -> list[ReclaimNotice]:
        ids = list(request.instances)
        if request.pool_id:
            ids += [
                r.instance_id
                for r in self._repo.list_instances(
                    self.region, [InstanceState.ACTIVE], hall=self.hall, pool_id=request.pool_id
                )
            ]
        by = f" by {request.requested_by}" if request.requested_by else ""
        return await self.reclaim(ids, f"{request.reason}{by}")

    async def poll_provider(self) -> list[ReclaimNotice]:
        """Turn the provider's reclaim decisions for this hall into notices."""
        try:
            decisions = await self._provider.pending_reclaims(self.region, self.hall)
        except ProviderError as exc:
            log.warning("reclaim decisions unavailable, will retry: %s", exc)
            return []
        notices = []
        for decision in decisions:
            row = self._repo.get_instance_by_provider_id(decision.provider_id)
            if row is None:
                log.info("reclaim of %s: not an SCO instance in fleet state", decision.provider_id)
                continue
            notices += await self.reclaim([row.instance_id], decision.reason)
        return notices

    async def recover(self, now: datetime | None = None) -> int:
        """After a restart: republish the notices of this hall's noticed instances whose
        deadline is still ahead (the sweep deletes the others; a republish past the
        deadline would also fall outside the stream's duplicate window)."""
        now = now or datetime.now(UTC)
        rows = [
            row
            for row in self._repo.list_instances(self.region, _PENDING, hall=self.hall)
            if self.notice_for(row).deadline > now
        ]
        for row in rows:
            await self._publish(self.notice_for(row))
        return len(rows)

    async def sweep(self, now: datetime | None = None) -> list[str]:
        """Delete instances whose deadline has passed; return their ids."""
        now = now or datetime.now(UTC)
        deleted = []
        for row in self._repo.list_instances(self.region, _PENDING, hall=self.hall):
            if self.notice_for(row).deadline > now:
                continue
            try:
                if row.provider_id:
                    await self._provider.delete(row.provider_id)
            except ProviderError as exc:
                log.warning("sweep: deleting %s failed, will retry: %s", row.instance_id, exc)
                continue
            self._repo.record_event(row.instance_id, EventKind.DELETE, reason="reclaim deadline")
            deleted.append(row.instance_id)
        return deleted
