"""The contract sync's Prometheus series (sco_contract_sync_*), and what alerts on them
(deploy/prometheus/rules/sco.yml: SCOContractCompileFailing, SCOContractCommitRefused,
SCOContractRewriteRefused, SCOContractSyncStale)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from contracts.gitsync import CommitResult, Outcome, SyncReport

COMMITS = Counter(
    "sco_contract_sync_commits",
    "Commits the contract sync handled, by outcome (published, adopted, refused-signature, "
    "compile-error, rewrite-refused)",
    ["region", "outcome"],
)
REFUSED = Counter(
    "sco_contract_sync_refused_commits",
    "Commits refused for their signature: why (unsigned, unknown signer, bad signature) and "
    "the signing key's fingerprint when there is one",
    ["region", "reason", "key"],
)
SERIAL = Gauge(
    "sco_contract_sync_serial", "The serial the region's published bundle has", ["region"]
)
COMPILE_FAILING = Gauge(
    "sco_contract_sync_compile_failing",
    "1 while the ref's head does not compile (the last good bundle stays published)",
    ["region"],
)
HEAD_REFUSED = Gauge(
    "sco_contract_sync_head_refused",
    "1 while the ref's head is refused (its signature, or a history rewrite not approved)",
    ["region"],
)
REMOTE = Gauge(
    "sco_contract_sync_remote_index",
    "Which remote the last fetch used: 0 the primary, 1.. the mirrors in order",
    ["region"],
)
LAST_SUCCESS = Gauge(
    "sco_contract_sync_last_success_timestamp_seconds",
    "When a sync step last fetched and handled the ref (Unix time)",
    ["region"],
)
FAILURES = Counter(
    "sco_contract_sync_failures",
    "Sync steps that failed (no remote answered, NATS down), retried at the next interval",
    ["region"],
)


def _reason_label(reason: str) -> str:
    for word in ("unsigned", "unknown signer", "bad signature", "nobody may sign"):
        if word in reason:
            return word.replace(" ", "-")
    return "other"


def observe(region: str, report: SyncReport, now: float, counted: set[str]) -> list[CommitResult]:
    """Count each commit's verdict once (`counted`: those this process counted already);
    the verdicts new in this report."""
    new = []
    for r in report.results:
        key = f"{r.commit}:{r.outcome}"
        if key in counted:
            continue
        counted.add(key)
        new.append(r)
        if r.outcome is Outcome.REFUSED_SIGNATURE:
            REFUSED.labels(region, _reason_label(r.reason), r.key or "-").inc()
    if report.held is not None:
        SERIAL.labels(region).set(report.held.serial)
    COMPILE_FAILING.labels(region).set(1 if report.compile_failing else 0)
    refused = bool(report.results) and report.results[-1].outcome in (
        Outcome.REFUSED_SIGNATURE,
        Outcome.REWRITE_REFUSED,
    )
    HEAD_REFUSED.labels(region).set(1 if refused else 0)
    if report.fetched is not None:
        REMOTE.labels(region).set(report.fetched.index)
    LAST_SUCCESS.labels(region).set(now)
    # The per-outcome counters last: a reader that saw a commit counted sees the round's
    # reasons and gauges too (a scrape between the lines saw a count without its gauge).
    for r in new:
        COMMITS.labels(region, r.outcome.value).inc()
    return new
