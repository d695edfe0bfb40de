"""The notice relay's answer to a reclaim request (`sco reclaim`), as JSON on the request's
NATS reply subject: what was noticed, or why nothing was. Both sides use this model, so the
CLI never parses the relay's prose."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel


class ReclaimReply(BaseModel):
    """`error` set: nothing was noticed (a bad request, or the relay is degraded)."""

    noticed: list[str] = []  # nodes given a hard notice
    warned_early: list[str] = []  # nodes warned ahead of a planned reclaim
    reclaim_at: datetime | None = None  # the planned reclaim's deadline (early warnings)
    lead_seconds: float = 0.0  # how long before the deadline the hard notice goes out
    hooks_pending: int = 0  # notices still queued to tell the pool's exclusion cycle
    # Committed instances (a floor's, a paid fallback's) left alone: the request had no force.
    refused_committed: list[str] = []
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def summary(self) -> str:
        """One line for the operator (and the audit trail's reason)."""
        if self.error is not None:
            return self.error
        if self.warned_early:
            at = (
                self.reclaim_at.astimezone(UTC).isoformat(timespec="seconds")
                if self.reclaim_at
                else "?"
            )
            line = (
                f"{len(self.warned_early)} warned early (reclaim at {at}, hard notice "
                f"{self.lead_seconds:.0f} s before): {', '.join(self.warned_early)}"
            )
        else:
            line = f"{len(self.noticed)} noticed: {', '.join(self.noticed)}"
        if self.refused_committed:
            line += (
                f"; {len(self.refused_committed)} committed refused without --force: "
                f"{', '.join(self.refused_committed)}"
            )
        if self.hooks_pending:
            line += f" (exclusion cycle: {self.hooks_pending} notices queued to tell it)"
        return line
