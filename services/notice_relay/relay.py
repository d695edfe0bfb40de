"""The notice relay of one hall: reclaim decisions become notices with a deadline, and
instances still there at the deadline are deleted.

Durable by construction: the NOTICE is written to fleet state (with its lifecycle event)
before the notice is published, and the deadline is derived from that row. After a
restart the relay republishes the notices of its hall's noticed instances (same stable
notice id, so agents act once) and deletes those past their deadline.

Every notice goes out signed with the relay's key (contracts/notice_signing.py); nodes
accept only keys their signed contract bundle lists for the region and, once the bundle
scopes keys to halls, for this hall. Given a KeyFileSigner, the key is the one its file
holds at signing time (services/notice_relay/keyfile.py): rotation without a restart.

Reclaims known ahead (`sco reclaim --at`, a provider decision with a later `at`) are
planned: a `planned_reclaims` row, then a signed early warning (stage "early", deadline the
reclaim time), and the sweep sends the hard notice at reclaim time - lead. The plan lives
in fleet state beside the notices, not in a Temporal timer: the relay already depends on
PostgreSQL alone, so a control-plane outage delays neither stage. The region worker reads
the published warning from the notice stream and wakes the controllers
(workers/notice_hooks.py); they also read the rows every tick.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta

from nacl.signing import SigningKey
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError
from prometheus_client import Counter, Histogram

from activities.events import CapacityType, EventKind, InstanceState
from activities.fleet.repository import (
    CommittedCapacityRefused,
    FleetRepository,
    InstanceRow,
    PlannedReclaim,
)
from activities.provider.errors import ProviderError
from activities.provider.interface import CloudProvider
from contracts.notice import (
    NoticeStage,
    ReclaimNotice,
    notice_stream,
    region_notice_subjects,
)
from contracts.notice_signing import sign
from contracts.reclaim import ReclaimRequest
from services.notice_relay.keyfile import KeyFileSigner

log = logging.getLogger(__name__)

_PENDING = [InstanceState.NOTICED, InstanceState.DRAINING]

# The relay's process serves these (`notice_relay.metrics_port`); labels are the hall's.
NOTICES_PUBLISHED = Counter(
    "sco_notices_published", "Reclaim notices published (republishes too)", ["region", "hall"]
)
DEADLINE_DELETES = Counter(
    "sco_notice_deadline_deletes",
    "Instances deleted because they outlived their notice's deadline",
    ["region", "hall"],
)
PUBLISH_SLACK = Histogram(
    "sco_notice_publish_slack_seconds",
    "Time from a notice's publication to its deadline (what the node had to drain)",
    ["region", "hall"],
    buckets=(0, 5, 15, 30, 60, 90, 120, 180, 300, 600),
)


def _refuse(instance_id: str, refused: list[str] | None) -> None:
    log.warning(
        "reclaim of %s refused: committed capacity, and the request had no force", instance_id
    )
    if refused is not None:
        refused.append(instance_id)


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
        signing_key: SigningKey | KeyFileSigner,
        on_notice: Callable[[ReclaimNotice], Awaitable[None]] | None = None,
        on_planned: Callable[[ReclaimNotice], Awaitable[None]] | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.region, self.hall, self.lead = region, hall, lead
        self._repo = repo
        self._provider = provider
        self._js = js
        self._key = signing_key
        # Told after each notice went out (the pool exclusion cycle counts reclaims). Best
        # effort: a failure here is logged and never holds up a notice.
        self._on_notice = on_notice
        # Told after each early warning went out (the controller starts replacements).
        self._on_planned = on_planned
        self._clock = clock

    def _signing_key(self) -> SigningKey:
        return self._key.current() if isinstance(self._key, KeyFileSigner) else self._key

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
                subjects=[region_notice_subjects(self.region)],
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

    def early_warning_for(self, row: InstanceRow, planned: PlannedReclaim) -> ReclaimNotice:
        return ReclaimNotice(
            notice_id=ReclaimNotice.early_id(row.region, row.instance_id, planned.reclaim_at),
            region=row.region,
            hall=row.hall,
            node=row.instance_id,
            pool_id=row.pool_id,
            issued_at=planned.planned_at,
            deadline=planned.reclaim_at,
            reason=planned.reason or f"planned reclaim of {row.pool_id}",
            stage=NoticeStage.EARLY,
        )

    def hard_notice_at(self, planned: PlannedReclaim) -> datetime:
        return planned.reclaim_at - self.lead

    async def plan(
        self,
        instance_ids: Iterable[str],
        at: datetime,
        reason: str,
        *,
        allow_committed: bool = True,
        refused: list[str] | None = None,
    ) -> list[ReclaimNotice]:
        """Plan the reclaim of the given active instances of this hall at `at`: an early
        warning now, the hard notice from the sweep at `at` - lead. A reclaim too close for
        an early warning (its hard notice is due) is noticed now, as `reclaim` does.
        `allow_committed=False`: committed instances are left alone (added to `refused`)."""
        if at - self.lead <= self._clock():
            return await self.reclaim(
                instance_ids, reason, allow_committed=allow_committed, refused=refused
            )
        warnings = []
        for iid in instance_ids:
            row = self._repo.get_instance(iid)
            if row is None or row.hall != self.hall or row.region != self.region:
                log.warning("plan: %s is not an instance of %s/%s", iid, self.region, self.hall)
                continue
            if row.state is not InstanceState.ACTIVE:
                continue  # already noticed (or gone): its hard notice is what counts
            # An instance's capacity type is fixed when it is created: this row decides.
            if not allow_committed and row.capacity_type == CapacityType.COMMITTED:
                _refuse(iid, refused)
                continue
            planned = self._repo.plan_reclaim(iid, at, reason)
            if planned is None or planned.noticed_at is not None:
                continue
            warning = self.early_warning_for(row, planned)
            await self._publish(warning, self._on_planned, "planned")
            warnings.append(warning)
        return warnings

    async def _publish(
        self,
        notice: ReclaimNotice,
        hook: Callable[[ReclaimNotice], Awaitable[None]] | None = None,
        what: str = "",
    ) -> None:
        """Publish `notice`, then tell `hook` (named `what` in the log) if there is one."""
        # Msg-Id makes JetStream drop a republished notice within its dedupe window.
        await self._js.publish(
            notice.subject,
            sign(notice, self._signing_key()),
            headers={"Nats-Msg-Id": notice.notice_id},
        )
        NOTICES_PUBLISHED.labels(self.region, self.hall).inc()
        slack = (notice.deadline - datetime.now(UTC)).total_seconds()
        PUBLISH_SLACK.labels(self.region, self.hall).observe(max(slack, 0.0))
        if hook is not None:
            try:
                await hook(notice)
            except Exception as exc:  # reporting must never fail a notice
                log.warning("%s hook for %s failed: %s", what, notice.node, exc)

    async def reclaim(
        self,
        instance_ids: Iterable[str],
        reason: str,
        *,
        allow_committed: bool = True,
        refused: list[str] | None = None,
    ) -> list[ReclaimNotice]:
        """Notice the given instances of this hall that are active; others are skipped.
        `allow_committed=False` (an operator's request without force): a committed instance
        is refused in the transaction that would notice it, and added to `refused`."""
        notices = []
        for iid in instance_ids:
            row = self._repo.get_instance(iid)
            if row is None or row.hall != self.hall or row.region != self.region:
                log.warning("reclaim: %s is not an instance of %s/%s", iid, self.region, self.hall)
                continue
            if row.state is InstanceState.ACTIVE:
                try:
                    self._repo.record_event(
                        iid, EventKind.NOTICE, reason=reason, allow_committed=allow_committed
                    )
                except CommittedCapacityRefused:
                    _refuse(iid, refused)
                    continue
                row = self._repo.get_instance(iid)
            if row is None or row.state not in _PENDING:
                continue
            notice = self.notice_for(row)
            await self._publish(notice, self._on_notice, "notice")
            notices.append(notice)
        return notices

    async def handle_request(self, request: ReclaimRequest) -> list[ReclaimNotice]:
        return (await self.answer_request(request))[0]

    async def answer_request(
        self, request: ReclaimRequest
    ) -> tuple[list[ReclaimNotice], list[str]]:
        """An operator's reclaim: the notices sent, and the committed instances refused
        because the request had no `force`. The committed-capacity rule is applied here, per
        instance as it is acted on (a pool's instances are listed at action time, so one
        that appeared after the operator looked is checked too), whoever sent the request:
        the CLI's own check is only its early, friendlier answer."""
        ids = list(request.instances)
        if request.pool_id:
            ids += [
                r.instance_id
                for r in self._repo.list_instances(
                    self.region, [InstanceState.ACTIVE], hall=self.hall, pool_id=request.pool_id
                )
            ]
        by = f" by {request.requested_by}" if request.requested_by else ""
        refused: list[str] = []
        reason, force = f"{request.reason}{by}", request.force
        if request.at is not None:
            notices = await self.plan(
                ids, request.at, reason, allow_committed=force, refused=refused
            )
        else:
            notices = await self.reclaim(ids, reason, allow_committed=force, refused=refused)
        return notices, refused

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
            if decision.at is not None:
                notices += await self.plan([row.instance_id], decision.at, decision.reason)
            else:
                notices += await self.reclaim([row.instance_id], decision.reason)
        return notices

    async def recover(self, now: datetime | None = None) -> int:
        """After a restart: republish the notices of this hall's noticed instances whose
        deadline is still ahead (the sweep deletes the others; a republish past the
        deadline would also fall outside the stream's duplicate window)."""
        now = now or self._clock()
        rows = [
            row
            for row in self._repo.list_instances(self.region, _PENDING, hall=self.hall)
            if self.notice_for(row).deadline > now
        ]
        for row in rows:
            await self._publish(self.notice_for(row))
        # Early warnings of reclaims still ahead: an agent that was away hears them too.
        early = 0
        for planned in self._repo.planned_reclaims(self.region, hall=self.hall):
            live = self._repo.get_instance(planned.instance_id)
            ahead = self.hard_notice_at(planned) > now
            if live is not None and live.state is InstanceState.ACTIVE and ahead:
                await self._publish(self.early_warning_for(live, planned))
                early += 1
        return len(rows) + early

    async def notice_planned(self, now: datetime | None = None) -> list[ReclaimNotice]:
        """The hard notices of planned reclaims whose time (reclaim time - lead) has come."""
        now = now or self._clock()
        notices = []
        for planned in self._repo.planned_reclaims(self.region, hall=self.hall):
            if self.hard_notice_at(planned) > now:
                break  # soonest first
            notices += await self.reclaim([planned.instance_id], planned.reason)
            self._repo.mark_planned_noticed(planned.instance_id)
        return notices

    async def sweep(self, now: datetime | None = None) -> list[str]:
        """Delete instances whose deadline has passed; return their ids."""
        now = now or self._clock()
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
            DEADLINE_DELETES.labels(self.region, self.hall).inc()
            deleted.append(row.instance_id)
        return deleted
