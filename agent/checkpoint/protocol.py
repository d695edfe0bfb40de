"""Wire format of the checkpoint protocol (see the package docstring); shared by both ends."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

VERSION = 1
#: `early_checkpoint` (an early warning): save now with the checkpoint callback and keep
#: running; a workload built before it answers "unknown op", which costs only the early save.
OPS = ("checkpoint", "early_checkpoint", "decommission", "ping")
MAX_LINE = 64 * 1024


@dataclass(frozen=True)
class Request:
    op: str
    reason: str
    deadline: float  # Unix time, seconds
    notice_id: str = ""

    def encode(self) -> bytes:
        doc = {
            "v": VERSION,
            "op": self.op,
            "reason": self.reason,
            "deadline": self.deadline,
            "notice_id": self.notice_id,
        }
        return json.dumps(doc).encode() + b"\n"


@dataclass(frozen=True)
class Saved:
    """What a callback may return instead of a bare path: the work its save does not keep
    (training steps since the saved state, Spark tasks that will have to run again)."""

    path: str
    lost_steps: int | None = None
    lost_tasks: int | None = None


@dataclass(frozen=True)
class Reply:
    ok: bool
    path: str = ""
    error: str = ""
    lost_steps: int | None = None  # optional in v1: absent means the workload did not say
    lost_tasks: int | None = None

    def encode(self) -> bytes:
        doc: dict[str, Any] = {"v": VERSION, "ok": self.ok}
        if self.ok:
            doc["path"] = self.path
            for name in ("lost_steps", "lost_tasks"):
                if (value := getattr(self, name)) is not None:
                    doc[name] = value
        else:
            doc["error"] = self.error
        return json.dumps(doc).encode() + b"\n"


class ProtocolError(ValueError):
    """The other end spoke something that is not protocol v1."""


def decode_request(line: bytes) -> Request:
    doc = _object(line)
    if doc.get("v") != VERSION:
        raise ProtocolError(f"unsupported protocol version {doc.get('v')!r} (speak v{VERSION})")
    op = doc.get("op")
    if op not in OPS:
        raise ProtocolError(f"unknown op {op!r}")
    deadline = doc.get("deadline", 0.0)
    if not isinstance(deadline, int | float):
        raise ProtocolError("deadline must be a number (Unix seconds)")
    return Request(
        str(op), str(doc.get("reason", "")), float(deadline), str(doc.get("notice_id", ""))
    )


def decode_reply(line: bytes) -> Reply:
    doc = _object(line)
    if doc.get("v") != VERSION:
        raise ProtocolError(f"unsupported protocol version {doc.get('v')!r}")
    if doc.get("ok") is True:
        lost = {k: doc.get(k) for k in ("lost_steps", "lost_tasks")}
        for name, value in lost.items():
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ProtocolError(f"{name} must be a count >= 0")
        return Reply(
            True,
            path=str(doc.get("path", "")),
            lost_steps=lost["lost_steps"],
            lost_tasks=lost["lost_tasks"],
        )
    return Reply(False, error=str(doc.get("error", "no reason given")))


def _object(line: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ProtocolError("not a JSON object")
    return doc
