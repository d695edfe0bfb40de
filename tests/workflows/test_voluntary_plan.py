"""planning/voluntary.py: drift and expiry replacements, cut to the disruption budget."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.disruption import DisruptionReason
from contracts.model import Contract
from planning.disruption_budget import allowed_disruptions
from planning.voluntary import expired, plan_voluntary
from tests.support.contract_fixtures import example

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)  # a Wednesday


@dataclass
class Row:
    instance_id: str
    sku: str = "gp"
    age_hours: float = 1.0
    state: str = "active"
    region: str = "r1"
    workload: str = "spark-etl"
    size: str = "xl"
    hall: str = "A"

    @property
    def created_at(self) -> datetime:
        return NOW - timedelta(hours=self.age_hours)


def contract(disruption: dict[str, Any] | None) -> Contract:
    doc = example("spark-etl")
    if disruption is not None:
        doc["disruption"] = disruption
    return Contract.model_validate(doc, strict=False)


def test_drift_first_then_the_oldest_expired_within_a_shared_budget() -> None:
    c = contract({"budgets": [{"max_instances": 2}], "max_instance_age_hours": 24})
    rows = [
        Row("young"),
        Row("old-30", age_hours=30),
        Row("old-50", age_hours=50),
        Row("cpu-old", sku="cpu", age_hours=80),  # drifted and old: drift
        Row("leaving", sku="cpu", state="draining"),
    ]
    plan = plan_voluntary(c, rows, now=NOW, in_flight={})
    assert [(d.instance_id, d.reason.value) for d in plan.disrupt] == [
        ("cpu-old", "drift"),
        ("old-50", "expiry"),
    ]
    assert [d.instance_id for d in plan.held_back] == ["old-30"]
    assert [d.instance_id for d, _ in expired(c, rows, NOW)] == ["cpu-old", "old-50", "old-30"]


def test_a_blackout_holds_everything_back() -> None:
    c = contract(
        {
            "blackouts": [{"schedule": "0 11 * * 3", "duration_minutes": 120}],
            "max_instance_age_hours": 1,
        }
    )
    plan = plan_voluntary(c, [Row("a", sku="cpu"), Row("b", age_hours=5)], now=NOW, in_flight={})
    assert plan.disrupt == [] and len(plan.held_back) == 2
    assert {v.why for v in plan.verdicts} == {"blackout 0 is open"}


def test_no_expiry_without_a_maximum_age() -> None:
    plan = plan_voluntary(contract(None), [Row("a", age_hours=10_000)], now=NOW, in_flight={})
    assert plan.disrupt == [] and plan.held_back == []


rows_st = st.lists(
    st.builds(
        Row,
        instance_id=st.uuids().map(str),
        sku=st.sampled_from(["gp", "mem", "cpu"]),
        age_hours=st.floats(0, 500),
        state=st.sampled_from(["active", "requested", "draining"]),
    ),
    max_size=40,
    unique_by=lambda r: r.instance_id,
)


@settings(max_examples=200, deadline=None)
@given(
    rows_st,
    st.integers(0, 5),
    st.one_of(st.none(), st.floats(0, 100, allow_nan=False)),
    st.integers(0, 3),
)
def test_the_plan_never_exceeds_the_budget(
    rows: list[Row], cap: int, pct: float | None, busy: int
) -> None:
    budget: dict[str, Any] = {"max_percent": pct} if pct is not None else {"max_instances": cap}
    c = contract({"budgets": [budget], "max_instance_age_hours": 100})
    in_flight = {DisruptionReason.DRIFT: busy}
    plan = plan_voluntary(c, rows, now=NOW, in_flight=in_flight)
    serving = sum(r.state != "draining" for r in rows)
    limit = allowed_disruptions(
        c.disruption, DisruptionReason.DRIFT, now=NOW, instances=serving, in_flight=in_flight
    ).allowed
    assert limit is not None and len(plan.disrupt) <= limit
    assert len({d.instance_id for d in plan.disrupt + plan.held_back}) == len(
        plan.disrupt + plan.held_back
    )
    assert all(r.state != "draining" for r in rows if r.instance_id in {
        d.instance_id for d in plan.disrupt
    })  # fmt: skip
