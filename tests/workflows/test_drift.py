"""Drift (planning/drift.py): which instances stop conforming to their contract, and why."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from contracts.model import Contract
from planning.drift import Expected, fleet_drift, instance_drift
from tests.support.contract_fixtures import example


@dataclass
class Row:
    instance_id: str
    region: str
    workload: str
    sku: str
    size: str
    hall: str
    state: str = "active"
    image: str | None = None
    user_data_hash: str | None = None


SPARK = Contract.model_validate(example("spark-etl"), strict=False)  # gp|mem, xl|2xl, A-D, r1 r2


@pytest.mark.parametrize(
    ("row", "reasons"),
    [
        (Row("i0", "r1", "spark-etl", "gp", "xl", "A"), ()),
        (Row("i1", "r1", "spark-etl", "cpu", "xl", "A"), ("sku cpu no longer allowed (gp, mem)",)),
        (Row("i2", "r1", "spark-etl", "gp", "l", "B"), ("size l no longer allowed (xl, 2xl)",)),
        (
            Row("i3", "r3", "spark-etl", "gp", "4xl", "A"),
            ("region r3 no longer allowed (r1, r2)", "size 4xl no longer allowed (xl, 2xl)"),
        ),
    ],
)
def test_placement_drift(row: Row, reasons: tuple[str, ...]) -> None:
    v = instance_drift(SPARK, row)
    assert v.drifted is bool(reasons) and v.reasons == reasons


def test_hall_dropped_from_the_contract() -> None:
    doc = example("spark-etl")
    doc["placement"]["halls"] = ["A", "B", "C"]
    c = Contract.model_validate(doc, strict=False)
    v = instance_drift(c, Row("i", "r1", "spark-etl", "mem", "2xl", "D"))
    assert v.why == "hall D no longer allowed (A, B, C)"


def test_image_and_user_data_only_when_both_sides_are_known() -> None:
    want = Expected(image="sco-node-2026-12", user_data_hash="abc")
    old = Row("i", "r1", "spark-etl", "gp", "xl", "A", image="sco-node-2026-11")
    unknown = Row("j", "r1", "spark-etl", "gp", "xl", "A")
    ud = Row("k", "r1", "spark-etl", "gp", "xl", "A", user_data_hash="def")
    got = fleet_drift([SPARK], [old, unknown, ud], expected=want)
    assert got["i"].why == "image sco-node-2026-11 is not sco-node-2026-12"
    assert not got["j"].drifted
    assert got["k"].why == "user-data changed"


def test_removed_contract_drifts_and_leaving_instances_are_not_judged() -> None:
    rows = [
        Row("gone", "r1", "old-contract", "gp", "xl", "A"),
        Row("leaving", "r1", "spark-etl", "cpu", "xl", "A", state="draining"),
        Row("dead", "r1", "spark-etl", "cpu", "xl", "A", state="deleted"),
    ]
    got = fleet_drift([SPARK], rows)
    assert set(got) == {"gone"}
    assert got["gone"].drifted and got["gone"].why == "contract removed from the bundle"
