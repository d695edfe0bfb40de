"""Operators' reclaim requests to a hall's notice relay, and the relay's reply.

Apart from contracts/notice.py: a node agent reads notices, never these, and they are
pydantic models (the agent imports no pydantic, decision 0041).
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from contracts.bounded import MAX_RECLAIM_REPLY_BYTES, InputRejected, loads


class ReclaimRequest(BaseModel):
    """An operator's `sco reclaim`: instances by name, or every instance of a pool. With
    `at`, a planned reclaim: an early warning now, the hard notice at `at` - lead. (A relay
    that predates `at` refuses such a request as malformed: nothing is noticed early.)"""

    model_config = ConfigDict(frozen=True, extra="forbid")

    instances: list[str] = []
    pool_id: str | None = None
    reason: str = Field(default="operator reclaim", max_length=200)
    requested_by: str = ""
    at: datetime | None = None
    # Also reclaim committed capacity (`sco reclaim --force`); the relay refuses committed
    # instances without it, on the row it acts on. A relay that predates `force` refuses a
    # forced request as malformed: nothing committed is reclaimed by accident.
    force: bool = False

    @model_serializer(mode="wrap")
    def _now_without_at(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, object]:
        # A reclaim for now reads exactly as before, so relays of any age take it.
        out: dict[str, object] = handler(self)
        if self.at is None:
            out.pop("at", None)
        if not self.force:
            out.pop("force", None)
        return out


class ReclaimReply(BaseModel):
    """`error` set: nothing was noticed (a bad request, or the relay is degraded)."""

    noticed: list[str] = []  # nodes given a hard notice
    warned_early: list[str] = []  # nodes warned ahead of a planned reclaim
    reclaim_at: datetime | None = None  # the planned reclaim's deadline (early warnings)
    lead_seconds: float = 0.0  # how long before the deadline the hard notice goes out
    # Notices the region worker has still to tell Temporal of (exclusion cycle, controllers).
    hooks_pending: int = 0
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
            line += f" (exclusion cycle: {self.hooks_pending} notices still to tell it)"
        return line


def parse_reclaim_reply(raw: bytes) -> ReclaimReply:
    """A relay's answer as it came over NATS: bounded (size, depth, numbers) before it is
    parsed, then validated; InputRejected (a ValueError, one line) for anything else."""
    data = loads(raw, what="reclaim reply", max_bytes=MAX_RECLAIM_REPLY_BYTES)
    try:
        return ReclaimReply.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "reply"
        raise InputRejected(f"reclaim reply: {where}: {first['msg']}") from None
