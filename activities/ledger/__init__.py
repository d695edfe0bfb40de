"""The ledger: lifecycle history and spend in ClickHouse (embedded chDB or a server)."""

from __future__ import annotations

from activities.ledger.queries import (
    GROUP_KEYS,
    ReclaimRow,
    SpendRow,
    decisions,
    instance_history,
    reclaim_rate,
    reclaims_per_pool,
    spend,
)
from activities.ledger.store import TABLE, LedgerStore, LedgerUnavailable

__all__ = [
    "GROUP_KEYS",
    "TABLE",
    "LedgerStore",
    "LedgerUnavailable",
    "ReclaimRow",
    "SpendRow",
    "decisions",
    "instance_history",
    "reclaim_rate",
    "reclaims_per_pool",
    "spend",
]
