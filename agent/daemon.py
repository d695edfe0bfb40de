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
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from agent import sdnotify
from agent.checkpoint import jobdirs
from agent.clock import Clock, kernel_sync, measure_nats_offset
from agent.config import AgentConfig
from agent.dedupe import DedupeStore
from agent.drain import DrainEngine, DrainReport
from agent.firstbundle import fetch_first, fetcher
from agent.metrics import AgentMetrics
from agent.natslink import NatsLink, nats_options
from agent.notices import Notice, NoticeSource, SignedMessage
from agent.pinned import load_pinned
from agent.report import Reporter, drain_subject
from agent.scheduler import NodeScheduler, SchedulerError
from agent.scheduler.none import NoScheduler
from agent.scheduler.slurm import SlurmScheduler
from agent.sources.metadata import MetadataFileSource
from agent.sources.nats import NatsNoticeSource
from contracts.cache import BundleCache
from contracts.cert_renewal import follow_files
from contracts.distribution import bucket_for
from contracts.holders import HoldingReporter
from contracts.keys import KeyFileError, TrustStore
from contracts.node_bundle import NodeBundle, NodeVerifiedBundle
from contracts.notice import NoticePolicy
from contracts.notice_signing import Accepted, NodeIdentity, Refusal, RefusalReason, check

log = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 20.0
QUEUE_SIZE = 256
#: How long a start with `require_time_sync` waits for NATS to measure the clock.
TIME_SYNC_WAIT_SECONDS = 15.0
#: Refusals logged, journalled and reported in full per window; the rest are counted (the
#: metric counts every one) and summed up in one line when the window ends, so a flood of
#: garbage on the notice subject costs the agent counting, not a report per message.
REFUSALS_REPORTED_PER_WINDOW = 20
REFUSAL_WINDOW_SECONDS = 60.0


class TimeSyncRefused(RuntimeError):
    """`require_time_sync` is set and nothing vouches for this node's clock."""


def make_scheduler(config: AgentConfig) -> NodeScheduler:
    if config.scheduler == "slurm":
        return SlurmScheduler(dry_run=config.dry_run, cgroup_check=config.slurm_cgroup_check)
    if config.scheduler == "kubernetes":
        # Its HTTP client (urllib.request, http.client) loads on Kubernetes nodes only.
        from agent.scheduler.kubernetes import KubernetesScheduler

        return KubernetesScheduler(
            config.kubernetes_api_url,
            dry_run=config.dry_run,
            token_path=config.kubernetes_token_path,
            ca_path=config.kubernetes_ca_path,
        )
    return NoScheduler(config.socket_dir, dry_run=config.dry_run)


def make_bundle_cache(config: AgentConfig) -> tuple[BundleCache[NodeBundle], str]:
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
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self.link = link if link is not None else NatsLink(config.nats_urls, nats_options(config))
        self.scheduler = scheduler if scheduler is not None else make_scheduler(config)
        self.bundles, self._no_trust = make_bundle_cache(config)
        self.dedupe = DedupeStore(config.dedupe_path)
        self.clock = clock if clock is not None else Clock()
        self.engine = DrainEngine(
            self.scheduler,
            config.socket_dir,
            dry_run=config.dry_run,
            safety_margin_seconds=config.safety_margin_seconds,
            # The deadline is the relay's time: waits are judged on the corrected clock.
            clock=self.clock.now,
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
                        owner_uid=config.metadata_owner_uid,
                        max_ahead=timedelta(
                            seconds=config.notice_lead_seconds
                            + config.notice_deadline_margin_seconds
                        ),
                    ),
                ]
        self.sources = list(sources)
        self.identity = NodeIdentity(config.region, config.hall, config.node_id)
        self.refusals: list[Refusal] = []  # this process's refused notices (bounded)
        self._refusal_window_start = time.monotonic()
        self._refusals_in_window = 0
        self._refusals_suppressed = 0
        self.metrics = AgentMetrics(config.metrics_textfile, config.node_id)
        self.pinned: NoticePolicy | None = None
        self._pinned_revoked: frozenset[str] = frozenset()
        self.reload_notice_keys()
        self._too_old_serial: int | None = None  # the stale bundle already shouted about
        self.queue: asyncio.Queue[Notice] = asyncio.Queue(QUEUE_SIZE)
        self.ready = asyncio.Event()
        self.reports: list[DrainReport] = []  # this process's drains, newest last (bounded)
        self.drained = asyncio.Event()  # set after every drain; a watcher clears it

    def verify(self, message: SignedMessage) -> Accepted | Refusal:
        """Check a relay notice against what this node trusts (nothing else): the bundle's
        notice keys while the bundle is younger than its max age, the keys pinned in the
        install, minus every key revoked in either trust directory; times against the
        node's clock corrected by its measured offset."""
        verified = self.notice_bundle()
        return check(
            message.raw,
            verified.content if verified is not None else None,
            self.identity,
            self.clock.now(),
            margin=timedelta(seconds=self.config.notice_deadline_margin_seconds),
            pinned=self.pinned,
            revoked=self.bundles.trust.revoked | self._pinned_revoked,
        )

    def reload_notice_keys(self) -> None:
        """Read the install's pinned notice keys again (each bundle refresh): a key revoked
        there is refused from now on, without a restart."""
        self.pinned, self._pinned_revoked, problem = load_pinned(self.config)
        if problem:
            log.error("%s", problem)

    def notice_bundle(self) -> NodeVerifiedBundle | None:
        """The bundle held, if it may still vouch for notice keys: past
        `bundle_max_age_hours` it may not (a loud alert, once per serial, and a metric)."""
        verified = self.bundles.current()
        if verified is None:
            self.metrics.bundle(None, False)
            return None
        age = verified.age(self.clock.now())
        trusted = age <= timedelta(hours=self.config.bundle_max_age_hours)
        self.metrics.bundle(age.total_seconds(), trusted)
        if trusted:
            return verified
        if self._too_old_serial != verified.serial:
            self._too_old_serial = verified.serial
            log.critical(
                "BUNDLE TOO OLD FOR NOTICES: serial %s is %s old (max %g h): its notice keys "
                "are no longer trusted; only keys pinned in the install verify notices",
                verified.serial,
                age,
                self.config.bundle_max_age_hours,
            )
        return None

    def refuse(self, refusal: Refusal, source: str) -> None:
        """A refused notice is reported and journalled, and never cordons or drains. Past
        REFUSALS_REPORTED_PER_WINDOW in a window, refusals are only counted."""
        self.refusals = [*self.refusals[-99:], refusal]
        self.metrics.notice_refused(refusal.reason.value)
        now = time.monotonic()
        if now - self._refusal_window_start >= REFUSAL_WINDOW_SECONDS:
            self._end_refusal_window(now)
        self._refusals_in_window += 1
        if self._refusals_in_window > REFUSALS_REPORTED_PER_WINDOW:
            self._refusals_suppressed += 1
            return
        log.error(
            "notice %s from %s REFUSED (%s): %s",
            refusal.notice_id or "(unnamed)",
            source,
            refusal.reason.value,
            refusal.detail[:300],
        )
        self.reporter.report(
            {
                "event": "notice_refused",
                "reason": refusal.reason.value,
                "detail": refusal.detail[:300],
                "notice_id": refusal.notice_id,
                "key_id": refusal.key_id,
                "source": source,
                "at": datetime.now(UTC).isoformat(),
            }
        )

    def _end_refusal_window(self, now: float) -> None:
        if self._refusals_suppressed:
            log.error(
                "%d more notices REFUSED in the last %g s (counted in "
                "sco_agent_notices_refused_total, not logged one by one)",
                self._refusals_suppressed,
                REFUSAL_WINDOW_SECONDS,
            )
            self.reporter.report(
                {
                    "event": "notices_refused_suppressed",
                    "count": self._refusals_suppressed,
                    "at": datetime.now(UTC).isoformat(),
                }
            )
        self._refusal_window_start = now
        self._refusals_in_window = 0
        self._refusals_suppressed = 0

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

    def _bundle(self) -> NodeVerifiedBundle | None:
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
        try:
            await self._check_time_sync()
        except TimeSyncRefused:
            await self.link.close()
            raise
        workers = [
            asyncio.create_task(self._worker(), name=f"drain-{i}")
            for i in range(self.config.workers)
        ]
        for source in self.sources:
            await source.start(self.submit)
        refresh = asyncio.create_task(self._refresh_bundles(stop), name="bundle-refresh")
        watchdog = asyncio.create_task(self._watchdog(stop), name="watchdog")
        clock = asyncio.create_task(self._clock_loop(stop), name="clock")
        job_dirs = asyncio.create_task(self._job_dirs(stop), name="job-dirs")
        # The node's NATS certificate, renewed on disk by its issuer: the next (re)connect
        # presents the renewed one, no restart (contracts/cert_renewal.py).
        ctx, cert, key = self.link.tls_context, self.config.nats_tls_cert, self.config.nats_tls_key
        certs = (
            asyncio.create_task(
                follow_files(ctx, cert, key, stop, every_s=self.config.tls_reload_seconds),
                name="tls-reload",
            )
            if ctx is not None and cert is not None and key is not None
            else asyncio.create_task(stop.wait(), name="tls-reload")
        )
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
        for task in [*workers, refresh, watchdog, clock, job_dirs, certs]:
            task.cancel()
        await asyncio.gather(
            *workers, refresh, watchdog, clock, job_dirs, certs, return_exceptions=True
        )
        await self.reporter.flush(self.config.report_timeout_seconds)
        await self.link.close()

    async def _refresh_bundles(self, stop: asyncio.Event) -> None:
        if not self.config.nats_urls or self._no_trust:
            return  # nothing to fetch from, or nothing it sent could be trusted

        def changed(bundle: NodeVerifiedBundle) -> None:
            sdnotify.notify(f"STATUS=watching for reclaim notices (bundle serial {bundle.serial})")

        # The serial this node holds, for `sco contracts status` (its own key only).
        reporter = HoldingReporter(
            self.config.nats_urls,
            self.config.region,
            "agent",
            self.config.node_id,
            nats_options(self.config),
        )

        async def held(serial: int | None) -> None:
            # Every round: the pinned keys read again (a revocation without a restart),
            # the bundle's age against its max age, then the holding report.
            self.reload_notice_keys()
            self.notice_bundle()
            await reporter.report(serial)

        trust_dir = self.config.trust_dir
        await self.bundles.refresh_forever(
            fetcher(self.config),
            stop,
            self.config.bundle_refresh_seconds,
            empty_interval=self.config.bundle_first_retry_seconds,
            on_change=changed,
            held=held,
            reload_trust=lambda: TrustStore.load(trust_dir),
            fetch_reset=fetcher(self.config, reset=True),
            region=self.config.region,
        )

    async def measure_clock(self) -> bool:
        """One offset measurement against NATS, recorded and exported; False when none."""
        client = self.link.client
        kernel = kernel_sync()
        synced = kernel.synchronised if kernel is not None else None
        if client is None or not client.is_connected:
            self.metrics.clock(None, synced)
            return False
        try:
            sample = await measure_nats_offset(
                client, f"OBJ_{bucket_for(self.config.region)}", self.clock.local
            )
        except Exception as exc:  # no bucket yet, no permission, timeout
            log.warning("clock offset against NATS not measured: %s", exc)
            self.metrics.clock(None, synced)
            return False
        self.clock.record(sample)
        self.metrics.clock(sample.offset_seconds, synced)
        if abs(sample.offset_seconds) > self.config.notice_deadline_margin_seconds:
            log.critical(
                "CLOCK SKEW: this node's clock is %+.1f s off the NATS server's (bound %g s); "
                "notices are judged against the corrected clock",
                -sample.offset_seconds,
                self.config.notice_deadline_margin_seconds,
            )
        return True

    async def _check_time_sync(self) -> None:
        """Measure the offset once at start; with `require_time_sync`, refuse to start
        unless the kernel says the clock is synchronised or the measured offset (with its
        uncertainty) is within the skew bound."""
        if not self.config.require_time_sync:
            return  # measured in the background (_clock_loop): a start never waits on NATS
        if self.config.nats_urls:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.link.connected.wait(), TIME_SYNC_WAIT_SECONDS)
        measured = await self.measure_clock()
        kernel = kernel_sync()
        if kernel is not None and kernel.synchronised:
            return
        bound = self.config.notice_deadline_margin_seconds
        sample = self.clock.sample
        if (
            measured
            and sample is not None
            and abs(sample.offset_seconds) + sample.uncertainty_seconds <= bound
        ):
            return
        raise TimeSyncRefused(
            "require_time_sync: the kernel does not report NTP sync and the offset against "
            + (
                f"NATS is {sample.offset_seconds:+.1f} s (bound {bound:g} s)"
                if measured and sample is not None
                else "NATS could not be measured"
            )
        )

    async def _clock_loop(self, stop: asyncio.Event) -> None:
        if not self.config.nats_urls:
            kernel = kernel_sync()
            self.metrics.clock(None, kernel.synchronised if kernel is not None else None)
            return
        await self.link.connected.wait()
        while not stop.is_set():
            await self.measure_clock()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.config.clock_check_seconds)

    async def _first_bundle(self) -> NodeVerifiedBundle | None:
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

    async def sync_job_dirs(self) -> jobdirs.SyncResult | None:
        """One pass: a checkpoint directory for every job on the node whose user the
        scheduler names, none for the others (agent/checkpoint/jobdirs.py). None when the
        scheduler could not list the jobs (nothing is removed on a failed list)."""
        try:
            workloads = await self.scheduler.workloads(self.config.node_id)
        except SchedulerError as exc:
            log.warning("cannot list jobs for their checkpoint directories: %s", exc)
            return None
        # uid -1: squeue named no user; nothing is made for it, and nothing it made trusted.
        wanted = {w.socket_name: (None if w.uid == -1 else w.uid) for w in workloads}
        return await asyncio.to_thread(jobdirs.sync, self.config.socket_dir, wanted)

    async def _job_dirs(self, stop: asyncio.Event) -> None:
        if self.scheduler.kind == "none":
            return  # the jobs are the directories: nobody to make them for
        while not stop.is_set():
            try:
                await self.sync_job_dirs()
            except Exception:  # the next pass tries again; drains do not depend on it
                log.exception("checkpoint directory pass failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.config.job_dir_refresh_seconds)

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
