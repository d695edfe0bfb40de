"""Decisions: why SCO did what it did, as events the ledger keeps.

A fallback approved or declined, a pool excluded, a floor it could not hold: each is one
`Decision`, written to the outbox in the same transaction as any state it changes, carried
to Kafka (`sco.<region>.decisions`) and stored by the ledger consumer. The event id is made
by the deciding workflow (`workflow.uuid4()`), so a retried activity writes it once.
"""

from __future__ import annotations

import enum
import uuid
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field


class DecisionKind(enum.StrEnum):
    FALLBACK = "fallback"  # committed capacity for a reclaimable shortfall
    ACQUISITION = "acquisition"  # an acquisition's outcome (completed, cancelled, shortfall)
    RELEASE = "release"  # idle reclaimable capacity given back
    EXCLUSION = "exclusion"  # a pool excluded, probed or re-admitted
    FLOOR = "floor"  # a floor rebuilt, or not holdable
    # A voluntary replacement (drift, return from fallback, expiry) started, done or held
    # back, and the lifecycle workflow paused or resumed.
    DISRUPTION = "disruption"
    # Operator actions that are not a workflow's own decision (every one names its actor):
    DEMAND = "demand"  # `sco demand set`
    BUDGET = "budget"  # `sco budget set-rate`
    RECLAIM = "reclaim"  # `sco reclaim`: an instance or pool reclaimed by hand
    CONTRACTS = "contracts"  # `sco contracts install | publish`
    RECONCILE = "reconcile"  # orphans deleted and ghosts marked lost by the reconciler


class Decision(BaseModel):
    model_config = ConfigDict(frozen=True)

    event_id: uuid.UUID = Field(default_factory=uuid.uuid4)
    occurred_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    region: str
    kind: DecisionKind
    subject: str  # the contract, pool or instance decided about
    outcome: str  # e.g. proceed, awaiting_approval, approved, declined, excluded
    actor: str = "sco"  # "sco" or the operator who decided (their free-text `--by`)
    # The operator's authenticated identity where there is one: the subject of the client
    # certificate the command used for Temporal (e.g. "CN=dana,O=sco-operators").
    identity: str = ""
    reason: str = ""
    amount_per_hour: float = 0.0  # money per hour the decision commits
    units: int = 0
    workflow_id: str = ""

    def topic(self) -> str:
        return decisions_topic(self.region)

    @property
    def key(self) -> str:
        return self.subject


def decisions_topic(region: str) -> str:
    return f"sco.{region}.decisions"
