"""The contract sync process (`sco contracts sync --region R`): every
`contracts.sync_interval_seconds`, the contract repository's ref fetched from the first
remote that answers, each new commit checked, compiled, signed and published for the
region (contracts/gitsync.py), until SIGTERM/SIGINT.

No outage ends it: a step that fails (no remote answers, NATS down) is logged, counted and
tried again at the next interval; the published bundle stays what it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from contracts import keys
from contracts.gitrepo import GitError
from contracts.gitsync import (
    CommitResult,
    ContractSync,
    NatsSyncStore,
    SyncConfig,
    SyncReport,
)
from services.contract_sync import metrics
from workers.client_security import nats_options
from workers.endpoints import serve_health, start_metrics
from workers.nats_limits import limit_agent_streams
from workers.settings import Settings
from workers.shutdown import async_stop_event

log = logging.getLogger(__name__)


class SyncSettingsError(ValueError):
    """The settings do not describe a sync (no repository, no signing key)."""


def sync_for(settings: Settings, region: str) -> ContractSync:
    c = settings.contracts
    if not c.repo_url:
        raise SyncSettingsError("contracts.repo_url is empty: nothing to sync from")
    key_file = c.signing_key_file
    if key_file is None:
        # The region in a box signs with its local key (workers/devbox: ContractsService).
        box_keys = sorted((settings.data_dir / "contracts" / "keys").glob("*.key"))
        if not box_keys:
            raise SyncSettingsError("contracts.signing_key_file is empty: nothing to sign with")
        key_file = box_keys[0]
    config = SyncConfig(
        remotes=(c.repo_url, *c.mirror_urls),
        ref=c.ref,
        path=c.path,
        mirror_dir=c.mirror_dir or settings.data_dir / "contracts" / "git",
        trust_dir=settings.trust_dir,
        regions_dir=settings.regions_dir,
        signing_key=keys.load_signing_key(key_file),
        notice_keys_dir=c.notice_keys_dir,
    )
    store = NatsSyncStore(settings.nats_url, region, settings.trust_dir, nats_options(settings))
    return ContractSync(config, store)


def log_report(
    region: str, report: SyncReport, new: list[CommitResult], previous_remote: str | None
) -> None:
    """Each verdict once (`new`); a change of remote (to a mirror, or back) when it happens."""
    f = report.fetched
    if f is not None and f.remote != previous_remote:
        if f.index > 0:
            skipped = "; ".join(f"{u}: {why}" for u, why in f.skipped)
            log.warning("%s: fetching from mirror %s (%s)", region, f.remote, skipped)
        else:
            log.info("%s: fetching from the primary %s", region, f.remote)
    if report.behind and f is not None:
        log.info("%s: %s is behind the published commit; nothing to do", region, f.remote)
    for r in new:
        (log.info if r.outcome.value in ("published", "adopted") else log.error)(
            "%s: %s (from %s)",
            region,
            r.describe(),
            report.fetched.remote if report.fetched else "-",
        )


async def run(settings: Settings, region: str, *, stop: asyncio.Event | None = None) -> None:
    """Sync until stopped (`stop`, or SIGTERM/SIGINT)."""
    if stop is not None:
        await _run(settings, region, stop)
        return
    with async_stop_event() as signalled:
        await _run(settings, region, signalled)


async def _run(settings: Settings, region: str, stop: asyncio.Event) -> None:
    c = settings.contracts
    start_metrics(c.sync_metrics_port, setting="SCO_CONTRACTS__SYNC_METRICS_PORT")
    sync = sync_for(settings, region)
    healthy = [False]
    health = None
    if c.sync_health_port:
        health = await serve_health("0.0.0.0", c.sync_health_port, lambda: healthy[0])
    counted: set[str] = set()
    remote: str | None = None
    log.info(
        "contract sync for %s: %s (%s:%s) every %g s",
        region,
        ", ".join(sync.config.remotes),
        c.ref,
        c.path,
        c.sync_interval_seconds,
    )
    try:
        while not stop.is_set():
            try:
                # git runs in a thread: the loop keeps answering health probes meanwhile.
                report = await sync.step()
                if any(r.outcome.value == "published" for r in report.results):
                    await limit_agent_streams(settings, region)  # agents read the stream
                new = metrics.observe(region, report, time.time(), counted)
                log_report(region, report, new, remote)
                remote = report.fetched.remote if report.fetched else remote
                healthy[0] = True
            except (GitError, OSError, RuntimeError, TimeoutError) as exc:
                healthy[0] = False
                metrics.FAILURES.labels(region).inc()
                log.warning(
                    "contract sync for %s failed (%s); next try in %g s",
                    region,
                    exc,
                    c.sync_interval_seconds,
                )
            except Exception as exc:  # nats raises several unrelated types
                healthy[0] = False
                metrics.FAILURES.labels(region).inc()
                log.warning("contract sync for %s failed (%s: %s)", region, type(exc).__name__, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), c.sync_interval_seconds)
    finally:
        if health is not None:
            health.close()
