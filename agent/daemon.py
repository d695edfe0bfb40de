"""The node agent: notice sources -> dedupe store -> bounded drain workers -> reports.

Runs until SIGTERM/SIGINT (or `stop` is set): then sources stop, drains in flight get up
to `STOP_GRACE_SECONDS` to finish, reports are flushed and systemd hears STOPPING=1.
Nothing here talks to the control plane: NATS (optional) and the scheduler are enough.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from agent import sdnotify
from agent.config import AgentConfig
from agent.dedupe import DedupeStore
from agent.drain import DrainEngine, DrainReport
from agent.firstbundle import fetch_first, fetcher
from agent.metrics import AgentMetrics
from agent.natslink import NatsLink, nats_options
from agent.notices import Notice, NoticeSource, SignedMessage
from agent.report import Reporter, drain_subject
from agent.scheduler import NodeScheduler
from agent.scheduler.kubernetes import KubernetesScheduler
from agent.scheduler.none import NoScheduler
from agent.scheduler.slurm import SlurmScheduler
from agent.sources.metadata import MetadataFileSource
from agent.sources.nats import NatsNoticeSource
from contracts.bundle import VerifiedBundle
from contracts.cache import BundleCache
from contracts.holders import HoldingReporter
from contracts.keys import KeyFileError, TrustStore
from contracts.notice_signing import Accepted, NodeIdentity, Refusal, RefusalReason, check

log = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 20.0
QUEUE_SIZE = 256


def make_scheduler(config: AgentConfig) -> NodeScheduler:
    if config.scheduler == "slurm":
        return SlurmScheduler(dry_run=config.dry_run)
    if config.scheduler == "kubernetes":
        return KubernetesScheduler(
            config.kubernetes_api_url,
            dry_run=config.dry_run,
            token_path=config.kubernetes_token_path,
            ca_path=config.kubernetes_ca_path,
        )
    return NoScheduler(config.socket_dir, dry_run=config.dry_run)


def make_bundle_cache(config: AgentConfig) -> tuple[BundleCache, str]:
    """The node's bundle cache, and why it can trust nothing ("" when it can)."""
    try:
        return BundleCache(config.cache_dir, TrustStore.load(config.trust_dir)), ""
    except KeyFileError as exc:
        # No keys: every bundle is refused, and drains run by the conservative default.
        untrusting = TrustStore(keys={}, revoked=frozenset())
        return BundleCache(config.cache_dir, untrusting), f"contract trust: {exc}"


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        *,
        scheduler: NodeScheduler | None = None,
        sources: Sequence[NoticeSource] | None = None,
        link: NatsLink | None = None,
    ) -> None:
        self.config = config
        self.link = link if link is not None else NatsLink(config.nats_urls, nats_options(config))
        self.scheduler = scheduler if scheduler is not None else make_scheduler(config)
        self.bundles, self._no_trust = make_bundle_cache(config)
        self.dedupe = DedupeStore(config.dedupe_path)
        self.engine = DrainEngine(
            self.scheduler,
            config.socket_dir,
            dry_run=config.dry_run,
            safety_margin_seconds=config.safety_margin_seconds,
        )
        self.reporter = Reporter(
            config.journal_path,
            self.link,
            drain_subject(config.region, config.hall, config.node_id),
            timeout=config.report_timeout_seconds,
        )
        if sources is None:
            sources = [NatsNoticeSource(self.link, config.region, config.hall, config.node_id)]
            if config.metadata_path is not None:
                sources = [
                    *sources,
                    MetadataFileSource(
                        config.metadata_path,
                        config.node_id,
                        poll_seconds=config.metadata_poll_seconds,
                    ),
                ]
        self.sources = list(sources)
        self.identity = NodeIdentity(config.region, config.hall, config.node_id)
        self.refusals: list[Refusal] = []  # this process's refused notices (bounded)
        self.metrics = AgentMetrics(config.metrics_textfile, config.node_id)
        self.queue: asyncio.Queue[Notice] = asyncio.Queue(QUEUE_SIZE)
        self.ready = asyncio.Event()
        self.reports: list[DrainReport] = []  # this process's drains, newest last (bounded)
        self.drained = asyncio.Event()  # set after every drain; a watcher clears it

    def verify(self, message: SignedMessage) -> Accepted | Refusal:
        """Check a relay notice against the bundle this node trusts (nothing else)."""
        verified = self.bundles.current()
        return check(
            message.raw,
            verified.content if verified is not None else None,
            self.identity,
            datetime.now(UTC),
            margin=timedelta(seconds=self.config.notice_deadline_margin_seconds),
        )

    def refuse(self, refusal: Refusal, source: str) -> None:
        """A refused notice is reported and journalled, and never cordons or drains."""
        log.error(
            "notice %s from %s REFUSED (%s): %s",
            refusal.notice_id or "(unnamed)",
            source,
            refusal.reason.value,
            refusal.detail,
        )
        self.refusals = [*self.refusals[-99:], refusal]
        self.metrics.notice_refused(refusal.reason.value)
        self.reporter.report(
            {
                "event": "notice_refused",
                "reason": refusal.reason.value,
                "detail": refusal.detail,
                "notice_id": refusal.notice_id,
                "key_id": refusal.key_id,
                "source": source,
                "at": datetime.now(UTC).isoformat(),
            }
        )

    async def submit(self, item: Notice | SignedMessage) -> None:
        """The sink every source feeds: one drain per notice id, ever. Relay notices
        (SignedMessage) drain only when their signature and content check out."""
        signed = isinstance(item, SignedMessage)
        if isinstance(item, SignedMessage):
            checked = self.verify(item)
            if isinstance(checked, Refusal):
                self.refuse(checked, item.source)
                return
            notice = Notice.from_reclaim(checked.notice, item.source)
        else:
            notice = item
        if notice.node != self.config.node_id:
            log.error("notice %s is for %s, not this node: ignored", notice.notice_id, notice.node)
            return
        if not self.dedupe.claim(notice.notice_id):
            if signed:  # a relay notice seen again: a replay, refused on the record
                self.refuse(
                    Refusal(RefusalReason.REPLAY, "already acted on", notice.notice_id),
                    notice.source,
                )
            else:  # local sources re-read the same file on every poll: not worth a line
                log.info("notice %s (%s) already handled", notice.notice_id, notice.source)
            return
        log.warning(
            "%s %s from %s: deadline %s",
            "early warning" if notice.early else "reclaim notice",
            notice.notice_id,
            notice.source,
            notice.deadline,
        )
        self.metrics.notice_received(notice.source)
        self.reporter.report(
            {
                "event": "notice_received",
                "notice_id": notice.notice_id,
                "source": notice.source,
                "deadline": notice.deadline.isoformat(),
                "at": datetime.now(UTC).isoformat(),
                **({"stage": "early"} if notice.early else {}),
            }
        )
        await self.queue.put(notice)

    async def _worker(self) -> None:
        while True:
            notice = await self.queue.get()
            try:
                await self._drain(notice)
            except Exception:  # a worker survives any one drain
                log.exception("drain of notice %s failed", notice.notice_id)
            finally:
                self.queue.task_done()

    def _bundle(self) -> VerifiedBundle | None:
        verified = self.bundles.current()
        if verified is None:
            log.critical(
                "NO VALID CONTRACT BUNDLE%s: drains use the conservative default (requeue)",
                f" ({self._no_trust})" if self._no_trust else "",
            )
        return verified

    async def _drain(self, notice: Notice) -> None:
        verified = self._bundle()
        act = self.engine.early if notice.early else self.engine.drain
        report = await act(
            notice,
            verified.content if verified is not None else None,
            verified.serial if verified is not None else None,
        )
        self.dedupe.finish(notice.notice_id)
        self.reports = [*self.reports[-99:], report]
        self.metrics.drain_finished(report)
        log.warning(
            "%s %s done in %.0f ms: %s",
            "early warning" if notice.early else "drain",
            notice.notice_id,
            report.finished_ms or 0,
            ", ".join(f"{w.workload}={w.result}" for w in report.workloads) or "no workloads",
        )
        self.reporter.report(report.as_event())
        self.drained.set()

    async def run(self, stop: asyncio.Event) -> None:
        # The cached bundle, else a fresh node's first one; says loudly when there is none.
        first = await self._first_bundle()
        self.link.start()
        workers = [
            asyncio.create_task(self._worker(), name=f"drain-{i}")
            for i in range(self.config.workers)
        ]
        for source in self.sources:
            await source.start(self.submit)
        refresh = asyncio.create_task(self._refresh_bundles(stop), name="bundle-refresh")
        watchdog = asyncio.create_task(self._watchdog(stop), name="watchdog")
        status = (
            f"watching for reclaim notices (bundle serial {first.serial})"
            if first is not None
            else "watching for reclaim notices; NO CONTRACT BUNDLE YET: draining conservatively"
        )
        sdnotify.notify(f"READY=1\nSTATUS={status}")
        self.ready.set()
        log.info(
            "sco-agent on %s (%s/%s, scheduler %s%s) ready",
            self.config.node_id,
            self.config.region,
            self.config.hall,
            self.scheduler.kind,
            ", DRY RUN" if self.config.dry_run else "",
        )
        await stop.wait()
        sdnotify.notify("STOPPING=1")
        log.info("stopping: %d notices queued or in flight", self.queue.qsize())
        for source in self.sources:
            await source.stop()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.queue.join(), STOP_GRACE_SECONDS)
        for task in [*workers, refresh, watchdog]:
            task.cancel()
        await asyncio.gather(*workers, refresh, watchdog, return_exceptions=True)
        await self.reporter.flush(self.config.report_timeout_seconds)
        await self.link.close()

    async def _refresh_bundles(self, stop: asyncio.Event) -> None:
        if not self.config.nats_urls or self._no_trust:
            return  # nothing to fetch from, or nothing it sent could be trusted

        def changed(bundle: VerifiedBundle) -> None:
            sdnotify.notify(f"STATUS=watching for reclaim notices (bundle serial {bundle.serial})")

        # The serial this node holds, for `sco contracts status` (its own key only).
        reporter = HoldingReporter(
            self.config.nats_urls,
            self.config.region,
            "agent",
            self.config.node_id,
            nats_options(self.config),
        )
        await self.bundles.refresh_forever(
            fetcher(self.config),
            stop,
            self.config.bundle_refresh_seconds,
            empty_interval=self.config.bundle_first_retry_seconds,
            on_change=changed,
            held=reporter.report,
        )

    async def _first_bundle(self) -> VerifiedBundle | None:
        """A fresh node fetches its first bundle before it serves (bounded); without one
        it still serves, draining conservatively, and says so."""
        verified = self.bundles.current()
        if verified is not None or not self.config.nats_urls or self._no_trust:
            return self._bundle()
        fetched = await fetch_first(self.bundles, self.config)
        if fetched.serial is not None:
            log.warning("fresh node: %s", fetched.detail)
            return self.bundles.current()
        log.critical(
            "NO CONTRACT BUNDLE YET (fresh node: %s): draining conservatively (requeue every "
            "workload) until one arrives; asking the distributor every %g s",
            fetched.detail,
            self.config.bundle_first_retry_seconds,
        )
        return None

    async def _watchdog(self, stop: asyncio.Event) -> None:
        interval = sdnotify.watchdog_interval()
        if interval is None:
            return
        while not stop.is_set():
            sdnotify.notify("WATCHDOG=1")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval)


async def run_until_signalled(agent: Agent) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await agent.run(stop)
