"""Reclaim notices: what the notice relay publishes and the node agent acts on.

Subjects (one region never sees another's):
    sco.<region>.notice.<hall>.<node>     a notice for one node
    sco.<region>.notice.<hall>.>          everything for a hall (what a hall's agents watch)
    sco.<region>.reclaim.<hall>           operators' reclaim requests to that hall's relay
Notices are kept in the JetStream stream `SCO_NOTICES_<REGION>`, so an agent that was
disconnected still finds a notice whose deadline has not passed.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from enum import StrEnum

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from contracts.bounded import MAX_RECLAIM_REPLY_BYTES, InputRejected, loads

_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")


def _token(value: str, what: str) -> str:
    if not _TOKEN.match(value):
        raise ValueError(f"{what} {value!r} cannot be a NATS subject token")
    return value


def notice_subject(region: str, hall: str, node: str) -> str:
    return f"sco.{_token(region, 'region')}.notice.{_token(hall, 'hall')}.{_token(node, 'node')}"


def hall_notice_subjects(region: str, hall: str) -> str:
    return f"sco.{_token(region, 'region')}.notice.{_token(hall, 'hall')}.>"


def region_notice_subjects(region: str) -> str:
    """Every hall's notices of the region: the notice stream's subjects."""
    return f"sco.{_token(region, 'region')}.notice.>"


def reclaim_subject(region: str, hall: str) -> str:
    return f"sco.{_token(region, 'region')}.reclaim.{_token(hall, 'hall')}"


def notice_stream(region: str) -> str:
    return f"SCO_NOTICES_{_token(region, 'region').upper()}"


#: The region worker's durable consumer of the notice stream: it tells Temporal of each
#: notice (workers/notice_hooks.py, decision 0030); the relay reads its backlog.
NOTICE_HOOKS_CONSUMER = "exclusion-hooks"


class NoticeStage(StrEnum):
    """HARD: the node goes at `deadline`, within the region's notice lead: drain now.
    EARLY: a planned reclaim (`sco reclaim --at`, a Blazar lease known in advance) whose
    hard notice follows at deadline - lead; the node stays fully usable until then, and
    only contracts that opt in (`drain.early_warning`) act on it."""

    HARD = "hard"
    EARLY = "early"


class ReclaimNotice(BaseModel):
    """One reclaim of one node. `notice_id` is stable: a repeat of the same reclaim has the
    same id, so agents act once. An early warning has its own id (the hard notice that
    follows is acted on separately).

    A hard notice serialises without `stage`, byte for byte what agents before early
    warnings sign-check and accept. An early warning carries `"stage": "early"`: an agent
    that predates it forbids the unknown field and refuses the notice as malformed (logged,
    never cordons or drains), then acts on the hard notice as it always did."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    notice_id: str
    region: str
    hall: str
    node: str  # the instance name, which is the node's hostname
    pool_id: str
    issued_at: datetime
    deadline: datetime  # the instance is deleted at this time
    reason: str = ""
    stage: NoticeStage = NoticeStage.HARD

    @model_serializer(mode="wrap")
    def _hard_without_stage(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, object]:
        out: dict[str, object] = handler(self)
        if self.stage is NoticeStage.HARD:
            out.pop("stage", None)
        return out

    @staticmethod
    def stable_id(region: str, node: str, noticed_at: datetime) -> str:
        raw = f"{region}/{node}/{noticed_at.isoformat()}".encode()
        return hashlib.sha256(raw).hexdigest()[:24]

    @staticmethod
    def early_id(region: str, node: str, reclaim_at: datetime) -> str:
        """The early warning of one planned reclaim: stable across republishes."""
        raw = f"early/{region}/{node}/{reclaim_at.isoformat()}".encode()
        return hashlib.sha256(raw).hexdigest()[:24]

    @property
    def early(self) -> bool:
        return self.stage is NoticeStage.EARLY

    @property
    def subject(self) -> str:
        return notice_subject(self.region, self.hall, self.node)


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


class KeyScope(BaseModel):
    """Which halls' notices one notice key may sign, and until when nodes accept it.

    `not_after`: the key is retired; a node refuses what it signed once its (corrected)
    clock is past this time. A rotation sets it to the time the new key took over plus
    the region's notice lead (and the clock skew margin): the old key's last notices are
    republished until their deadline, so they must verify until then."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    halls: list[str] = Field(min_length=1)
    not_after: AwareDatetime | None = None

    @field_validator("halls")
    @classmethod
    def _hall_tokens(cls, halls: list[str]) -> list[str]:
        for hall in halls:
            _token(hall, "hall")
        if len(set(halls)) != len(halls):
            raise ValueError(f"halls {halls}: listed twice")
        return sorted(halls)

    @model_serializer(mode="wrap")
    def _without_empty(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, object]:
        out: dict[str, object] = handler(self)
        if self.not_after is None:
            out.pop("not_after", None)
        return out


class NoticePolicy(BaseModel):
    """What a node of one region needs to check a notice, carried in the signed bundle:
    the public keys (key id -> hex Ed25519) that may sign its notices and its notice lead
    (a deadline further away than lead + margin is refused).

    `scopes` (key id -> KeyScope) makes the policy hall-scoped: a key signs only for the
    halls its scope lists, and a key without a scope signs for no hall. Without scopes (a
    bundle from before them, or a region whose keys name no halls) every key signs for
    every hall of the region, as before; the bytes are then those of such a bundle."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    region: str
    lead_seconds: int = Field(gt=0)
    keys: dict[str, str] = {}
    scopes: dict[str, KeyScope] = {}

    @model_validator(mode="after")
    def _scopes_name_keys(self) -> NoticePolicy:
        stray = sorted(set(self.scopes) - set(self.keys))
        if stray:
            raise ValueError(f"scopes of keys the policy does not list: {', '.join(stray)}")
        return self

    @model_serializer(mode="wrap")
    def _without_scopes(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, object]:
        out: dict[str, object] = handler(self)
        if not self.scopes:
            out.pop("scopes", None)
        return out

    @property
    def hall_scoped(self) -> bool:
        return bool(self.scopes)


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
