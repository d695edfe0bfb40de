"""Wire format of the checkpoint protocol (see the package docstring); shared by both ends."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from contracts import bounded

VERSION = 1
#: `early_checkpoint` (an early warning): save now with the checkpoint callback and keep
#: running; a workload built before it answers "unknown op", which costs only the early save.
OPS = ("checkpoint", "early_checkpoint", "decommission", "ping")
MAX_LINE = 64 * 1024
#: The largest lost-work count a reply may carry (a billion steps or tasks): anything
#: beyond is not a count a workload lost but garbage, and the reply is refused.
MAX_COUNT = 10**9
#: Longest checkpoint path and error text kept from a reply.
MAX_TEXT = 4096
#: How deep a JSON value may nest: the protocol's objects are flat.
MAX_DEPTH = 4


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
    if isinstance(deadline, bool) or not math.isfinite(deadline):
        raise ProtocolError("deadline must be a finite number (Unix seconds)")
    return Request(
        str(op), str(doc.get("reason", "")), float(deadline), str(doc.get("notice_id", ""))
    )


def decode_reply(line: bytes) -> Reply:
    doc = _object(line)
    if doc.get("v") != VERSION:
        raise ProtocolError(f"unsupported protocol version {doc.get('v')!r}")
    ok = doc.get("ok")
    if ok is True:
        lost = {k: doc.get(k) for k in ("lost_steps", "lost_tasks")}
        for name, value in lost.items():
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise ProtocolError(f"{name} must be an integer count")
            if not 0 <= value <= MAX_COUNT:
                raise ProtocolError(f"{name} must be between 0 and {MAX_COUNT}")
        path = doc.get("path", "")
        if not isinstance(path, str) or len(path) > MAX_TEXT:
            raise ProtocolError(f"path must be a string of at most {MAX_TEXT} characters")
        return Reply(True, path=path, lost_steps=lost["lost_steps"], lost_tasks=lost["lost_tasks"])
    if ok is not False:
        raise ProtocolError("ok must be true or false")
    error = doc.get("error", "no reason given")
    return Reply(False, error=(error if isinstance(error, str) else repr(error))[:MAX_TEXT])


def _object(line: bytes) -> dict[str, Any]:
    # Bounded before parsing (size, nesting) and while (the digits of a number, no NaN):
    # the one bounded reader of everything that crosses a boundary (contracts/bounded.py).
    try:
        doc = bounded.loads(line, what="message", max_bytes=MAX_LINE, max_depth=MAX_DEPTH)
    except bounded.InputRejected as exc:
        raise ProtocolError(str(exc)) from exc
    if not isinstance(doc, dict):
        raise ProtocolError("not a JSON object")
    return doc
