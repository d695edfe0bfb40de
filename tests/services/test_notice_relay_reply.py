"""The notice relay answers `sco reclaim` with a ReclaimReply (JSON), which the CLI reads:
the noticed nodes, the early warnings with their deadline, or why nothing was noticed."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast

import pytest

from contracts.bounded import MAX_RECLAIM_REPLY_BYTES, InputRejected
from contracts.reclaim import ReclaimReply, ReclaimRequest, parse_reclaim_reply
from services.notice_relay.service import request_handler

AT = datetime(2026, 12, 4, 21, 0, tzinfo=UTC)


def test_summary_of_hard_notices_early_warnings_and_errors() -> None:
    assert ReclaimReply(noticed=["a1", "a2"]).summary() == "2 noticed: a1, a2"
    early = ReclaimReply(warned_early=["a1"], reclaim_at=AT, lead_seconds=120, hooks_pending=3)
    assert early.summary() == (
        "1 warned early (reclaim at 2026-12-04T21:00:00+00:00, hard notice 120 s before): a1"
        " (exclusion cycle: 3 notices still to tell it)"
    )
    failed = ReclaimReply(error="no such pool")
    assert not failed.ok and failed.summary() == "no such pool"


def test_round_trips_as_json_and_old_fields_default() -> None:
    reply = ReclaimReply(warned_early=["b3"], reclaim_at=AT, lead_seconds=60.0)
    assert ReclaimReply.model_validate_json(reply.model_dump_json()) == reply
    assert ReclaimReply.model_validate_json("{}").ok


def test_a_reply_off_the_wire_is_bounded_before_it_is_parsed() -> None:
    """What the CLI and the lifecycle activity read from NATS: a reply too big, too deep or
    of the wrong shape is one InputRejected line, never a traceback."""
    assert parse_reclaim_reply(b'{"noticed": ["a1"]}').noticed == ["a1"]
    hostile = [
        b"[" * 100 + b"]" * 100,
        b'{"noticed": "' + b"x" * MAX_RECLAIM_REPLY_BYTES + b'"}',
        b'{"noticed": 7}',
        b'{"lead_seconds": NaN}',
        b"\xff",
    ]
    for raw in hostile:
        with pytest.raises(InputRejected, match=r"^reclaim reply: ") as caught:
            parse_reclaim_reply(raw)
        assert "\n" not in str(caught.value) and len(str(caught.value)) < 400


@dataclass
class FakeMsg:
    data: bytes
    reply: str = "_INBOX.1"
    sent: list[bytes] = field(default_factory=list)

    async def respond(self, data: bytes) -> None:
        self.sent.append(data)


class FakeRelay:
    lead = timedelta(seconds=90)

    def __init__(self, outcome: list[Any] | Exception) -> None:
        self.outcome = outcome

    async def answer_request(self, req: ReclaimRequest) -> tuple[list[Any], list[str]]:
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome, []


async def ask(outcome: list[Any] | Exception, pending: int = 0) -> ReclaimReply:
    async def backlog() -> int:
        return pending

    handler = request_handler(cast(Any, FakeRelay(outcome)), backlog)
    msg = FakeMsg(
        ReclaimRequest(pool_id="r1.A.gp.l", reason="t", requested_by="u").model_dump_json().encode()
    )
    await handler(cast(Any, msg))
    (sent,) = msg.sent
    return ReclaimReply.model_validate_json(sent)


async def test_the_relay_answers_with_the_model() -> None:
    hard = SimpleNamespace(node="a1", early=False, deadline=AT)
    soon = SimpleNamespace(node="a2", early=True, deadline=AT)
    reply = await ask([hard, soon], pending=2)
    assert reply == ReclaimReply(
        noticed=["a1"], warned_early=["a2"], reclaim_at=AT, lead_seconds=90, hooks_pending=2
    )


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        (ValueError("pool r1.A.gp.l has no live instance"), "pool r1.A.gp.l has no live instance"),
        (TimeoutError("pool"), "notice relay degraded, nothing noticed: TimeoutError: pool"),
    ],
)
async def test_a_refusal_or_an_outage_is_an_error_reply(fault: Exception, says: str) -> None:
    reply = await ask(fault)
    assert reply.error == says and reply.noticed == [] and reply.warned_early == []
