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
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from contracts.records import RecordError, aware, json_datetime, read

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


@dataclass(frozen=True)
class ReclaimNotice:
    """One reclaim of one node. `notice_id` is stable: a repeat of the same reclaim has the
    same id, so agents act once. An early warning has its own id (the hard notice that
    follows is acted on separately).

    A hard notice serialises without `stage`, byte for byte what agents before early
    warnings sign-check and accept. An early warning carries `"stage": "early"`: an agent
    that predates it forbids the unknown field and refuses the notice as malformed (logged,
    never cordons or drains), then acts on the hard notice as it always did."""

    notice_id: str
    region: str
    hall: str
    node: str  # the instance name, which is the node's hostname
    pool_id: str
    issued_at: datetime
    deadline: datetime  # the instance is deleted at this time
    reason: str = ""
    stage: NoticeStage = NoticeStage.HARD

    def __post_init__(self) -> None:
        for name in ("notice_id", "region", "hall", "node", "pool_id", "reason"):
            if not isinstance(getattr(self, name), str):
                raise RecordError(name, "expected a string")
        for name in ("issued_at", "deadline"):
            if not isinstance(getattr(self, name), datetime):
                raise RecordError(name, "expected a date-time")
        object.__setattr__(self, "stage", NoticeStage(self.stage))

    @classmethod
    def from_json(cls, doc: object, where: str = "notice") -> ReclaimNotice:
        return read(
            doc,
            where,
            lambda r: cls(
                notice_id=r.text("notice_id"),
                region=r.text("region"),
                hall=r.text("hall"),
                node=r.text("node"),
                pool_id=r.text("pool_id"),
                issued_at=r.when("issued_at"),
                deadline=r.when("deadline"),
                reason=r.text("reason", ""),
                stage=r.choice("stage", NoticeStage, NoticeStage.HARD),
            ),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "notice_id": self.notice_id,
            "region": self.region,
            "hall": self.hall,
            "node": self.node,
            "pool_id": self.pool_id,
            "issued_at": json_datetime(self.issued_at),
            "deadline": json_datetime(self.deadline),
            "reason": self.reason,
        }
        if self.stage is not NoticeStage.HARD:
            out["stage"] = self.stage.value
        return out

    def replace(self, **changes: Any) -> ReclaimNotice:
        return replace(self, **changes)

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


@dataclass(frozen=True)
class KeyScope:
    """Which halls' notices one notice key may sign, and until when nodes accept it.

    `not_after`: the key is retired; a node refuses what it signed once its (corrected)
    clock is past this time. A rotation sets it to the time the new key took over plus
    the region's notice lead (and the clock skew margin): the old key's last notices are
    republished until their deadline, so they must verify until then."""

    halls: list[str]
    not_after: datetime | None = None

    def __post_init__(self) -> None:
        halls = self.halls
        if not isinstance(halls, list) or not all(isinstance(h, str) for h in halls):
            raise RecordError("halls", "expected a list of strings")
        if not halls:
            raise RecordError("halls", "List should have at least 1 item after validation, not 0")
        for hall in halls:
            try:
                _token(hall, "hall")
            except ValueError as exc:
                raise RecordError("halls", str(exc)) from None
        if len(set(halls)) != len(halls):
            raise RecordError("halls", f"{halls}: listed twice")
        object.__setattr__(self, "halls", sorted(halls))
        if self.not_after is not None:
            if not isinstance(self.not_after, datetime):
                raise RecordError("not_after", "expected a date-time")
            aware(self.not_after, "not_after")

    @classmethod
    def from_json(cls, doc: object, where: str = "") -> KeyScope:
        return read(
            doc, where, lambda r: cls(halls=r.texts("halls"), not_after=r.opt_when("not_after"))
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"halls": list(self.halls)}
        if self.not_after is not None:
            out["not_after"] = json_datetime(self.not_after)
        return out

    def replace(self, **changes: Any) -> KeyScope:
        return replace(self, **changes)


def _key_scope(doc: object, where: str) -> KeyScope:
    return KeyScope.from_json(doc, where)


@dataclass(frozen=True)
class NoticePolicy:
    """What a node of one region needs to check a notice, carried in the signed bundle:
    the public keys (key id -> hex Ed25519) that may sign its notices and its notice lead
    (a deadline further away than lead + margin is refused).

    `scopes` (key id -> KeyScope) makes the policy hall-scoped: a key signs only for the
    halls its scope lists, and a key without a scope signs for no hall. Without scopes (a
    bundle from before them, or a region whose keys name no halls) every key signs for
    every hall of the region, as before; the bytes are then those of such a bundle."""

    region: str
    lead_seconds: int
    keys: dict[str, str] = field(default_factory=dict)
    scopes: dict[str, KeyScope] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.region, str):
            raise RecordError("region", "expected a string")
        lead = self.lead_seconds
        if isinstance(lead, bool) or not isinstance(lead, int):
            raise RecordError("lead_seconds", "expected an integer")
        if lead <= 0:
            raise RecordError("lead_seconds", "Input should be greater than 0")
        stray = sorted(set(self.scopes) - set(self.keys))
        if stray:
            raise RecordError("", f"scopes of keys the policy does not list: {', '.join(stray)}")

    @classmethod
    def from_json(cls, doc: object, where: str = "") -> NoticePolicy:
        return read(
            doc,
            where,
            lambda r: cls(
                region=r.text("region"),
                lead_seconds=r.integer("lead_seconds"),
                keys=r.text_map("keys"),
                scopes=r.mapping("scopes", _key_scope),
            ),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "region": self.region,
            "lead_seconds": self.lead_seconds,
            "keys": dict(self.keys),
        }
        if self.scopes:
            out["scopes"] = {kid: scope.to_json() for kid, scope in self.scopes.items()}
        return out

    @property
    def hall_scoped(self) -> bool:
        return bool(self.scopes)
