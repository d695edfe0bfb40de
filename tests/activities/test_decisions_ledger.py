"""Decisions in the ledger: stored once however often they are replayed, queried by
kind and subject, newest first."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from activities.decisions import Decision, DecisionKind
from activities.ledger import LedgerStore, decisions


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LedgerStore]:
    with LedgerStore(f"chdb://{tmp_path}/ledger") as ledger:
        ledger.ensure_schema()
        yield ledger


def test_a_replayed_decision_is_one_row_and_queries_filter(store: LedgerStore) -> None:
    now = datetime.now(UTC)
    approved = Decision(
        event_id=uuid.uuid4(),
        occurred_at=now,
        region="r1",
        kind=DecisionKind.FALLBACK,
        subject="llm-train",
        outcome="approved",
        actor="dana",
        reason="release night",
        amount_per_hour=41.5,
        units=8,
        workflow_id="acq-r1-llm-train-1",
    )
    released = Decision(
        occurred_at=now - timedelta(minutes=5),
        region="r1",
        kind=DecisionKind.RELEASE,
        subject="spark-etl",
        outcome="released",
    )
    store.insert_decisions([approved, released])
    store.insert_decisions([approved])  # the topic replayed
    rows = decisions(store, start=now - timedelta(hours=1), end=now + timedelta(seconds=1))
    assert [r.outcome for r in rows] == ["approved", "released"]
    only = decisions(
        store, start=now - timedelta(hours=1), end=now + timedelta(seconds=1), kind="fallback"
    )
    assert only == [approved.model_copy(update={"occurred_at": rows[0].occurred_at})]
    assert only[0].actor == "dana" and only[0].amount_per_hour == 41.5


def test_a_ledger_from_before_identities_gains_the_column(tmp_path: Path) -> None:
    with LedgerStore(f"chdb://{tmp_path}/old") as ledger:
        with ledger.session() as client:  # the decisions table as first released
            client.command("DROP TABLE decisions")
            client.command(
                "CREATE TABLE decisions (event_id UUID, occurred_at DateTime64(3, 'UTC'), "
                "region LowCardinality(String), kind LowCardinality(String), subject String, "
                "outcome LowCardinality(String), actor String, reason String, "
                "amount_per_hour Float64, units Int64, workflow_id String, "
                "inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)) "
                "ENGINE = ReplacingMergeTree ORDER BY event_id"
            )
        ledger.ensure_schema()
        now = datetime.now(UTC)
        paused = Decision(
            region="r1",
            kind=DecisionKind.ACQUISITION,
            subject="spark-etl",
            outcome="paused",
            actor="dana",
            identity="CN=dana,O=sco-operators",
            reason="maintenance",
        )
        ledger.insert_decisions([paused])
        rows = decisions(ledger, start=now - timedelta(minutes=1), end=now + timedelta(minutes=1))
    assert [(r.actor, r.identity) for r in rows] == [("dana", "CN=dana,O=sco-operators")]
