"""Disruption budgets, expiry and headroom in the contract: compile accepts good ones,
refuses bad ones with one line naming file, field and reason, and keeps old bundle bytes."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from contracts.compiler import compile_dir
from contracts.disruption import DisruptionReason
from contracts.model import Contract
from contracts.region import Region, load_regions
from tests.support.contract_fixtures import example, write_contracts
from tests.support.paths import REGIONS_DIR

GOOD: dict[str, Any] = {
    "budgets": [
        {"reasons": ["consolidation", "return-from-fallback"], "max_percent": 20},
        {"reasons": ["drift"], "max_instances": 1},
        {"max_instances": 0, "schedule": "0 8 * * 1-5", "duration_minutes": 600},
    ],
    "blackouts": [
        {"schedule": "0 0 24 12 *", "duration_minutes": 4320},
        {"start": "2026-12-31T18:00:00Z", "end": "2027-01-01T06:00:00Z"},
    ],
    "max_instance_age_hours": 168,
}


@pytest.fixture(scope="module")
def regions() -> dict[str, Region]:
    return load_regions(REGIONS_DIR)


def compile_one(tmp_path: Path, regions: dict[str, Region], doc: dict[str, Any]) -> list[str]:
    src = write_contracts(tmp_path, {"c.yaml": doc})
    return [str(f).removeprefix(f"{src}/") for f in compile_dir(src, regions).findings]


def test_a_full_disruption_block_and_headroom_compile(
    tmp_path: Path, regions: dict[str, Region]
) -> None:
    doc = example("spark-etl") | {"disruption": GOOD, "headroom_units": 8}
    src = write_contracts(tmp_path, {"c.yaml": doc})
    result = compile_dir(src, regions)
    assert result.ok and result.findings == []
    c = result.contracts[0]
    assert c.headroom_units == 8
    assert c.disruption is not None and c.disruption.max_instance_age_hours == 168
    assert c.disruption.budgets[0].reasons == [
        DisruptionReason.CONSOLIDATION,
        DisruptionReason.RETURN_FROM_FALLBACK,
    ]
    dumped = c.model_dump(mode="json")
    assert Contract.model_validate(dumped, strict=False) == c


def test_unset_fields_keep_the_bundle_bytes(regions: dict[str, Region]) -> None:
    c = Contract.model_validate(example("spark-etl"), strict=False)
    dumped = c.model_dump(mode="json")
    assert "disruption" not in dumped and "headroom_units" not in dumped
    assert c.disruption_or_default.budgets[0].max_percent == 10


BAD: list[tuple[str, Any, str]] = [
    (
        "both limits",
        {"budgets": [{"max_instances": 1, "max_percent": 5}]},
        "disruption.budgets[0]: give exactly one of max_instances and max_percent",
    ),
    (
        "no limit",
        {"budgets": [{"reasons": ["drift"]}]},
        "disruption.budgets[0]: give exactly one of max_instances and max_percent",
    ),
    (
        "unknown reason",
        {"budgets": [{"reasons": ["boredom"], "max_instances": 1}]},
        "disruption.budgets[0].reasons[0]: Input should be 'consolidation', 'drift'",
    ),
    (
        "involuntary reason",
        {"budgets": [{"reasons": ["hall-loss"], "max_instances": 1}]},
        "disruption.budgets[0].reasons: hall-loss is never voluntary and cannot be budgeted",
    ),
    (
        "reason twice",
        {"budgets": [{"reasons": ["drift", "drift"], "max_instances": 1}]},
        "disruption.budgets[0].reasons: a reason is listed twice",
    ),
    (
        "percent over 100",
        {"budgets": [{"max_percent": 150}]},
        "disruption.budgets[0].max_percent: Input should be less than or equal to 100",
    ),
    (
        "bad cron",
        {"budgets": [{"max_instances": 1, "schedule": "0 25 * * *", "duration_minutes": 5}]},
        "disruption.budgets[0].schedule: cron hour '25': outside 0-23 or reversed",
    ),
    (
        "cron with four fields",
        {"blackouts": [{"schedule": "0 0 * *", "duration_minutes": 5}]},
        "disruption.blackouts[0].schedule: cron '0 0 * *': needs 5 fields",
    ),
    (
        "schedule without duration",
        {"budgets": [{"max_instances": 1, "schedule": "0 1 * * *"}]},
        "disruption.budgets[0]: schedule and duration_minutes go together",
    ),
    (
        "window longer than a week",
        {"blackouts": [{"schedule": "0 1 * * *", "duration_minutes": 20000}]},
        "disruption.blackouts[0].duration_minutes: Input should be less than or equal to 10080",
    ),
    (
        "blackout ending before it starts",
        {"blackouts": [{"start": "2026-12-02T00:00:00Z", "end": "2026-12-01T00:00:00Z"}]},
        "disruption.blackouts[0]: end must be after start",
    ),
    (
        "blackout with both forms",
        {
            "blackouts": [
                {"schedule": "0 1 * * *", "duration_minutes": 5, "start": "2026-12-02T00:00:00Z"}
            ]
        },
        "disruption.blackouts[0]: give either schedule + duration_minutes or start + end",
    ),
    (
        "naive blackout time",
        {"blackouts": [{"start": "2026-12-01T00:00:00", "end": "2026-12-02T00:00:00Z"}]},
        "disruption.blackouts[0].start: Input should have timezone info",
    ),
    (
        "zero max age",
        {"max_instance_age_hours": 0},
        "disruption.max_instance_age_hours: Input should be greater than 0",
    ),
    (
        "unknown field",
        {"budget": []},
        "disruption.budget: Extra inputs are not permitted",
    ),
]


@pytest.mark.parametrize(("block", "expected"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_a_bad_disruption_block_is_one_line(
    tmp_path: Path, regions: dict[str, Region], block: Any, expected: str
) -> None:
    lines = compile_one(tmp_path, regions, example("spark-etl") | {"disruption": block})
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("c.yaml:")
    assert expected in line, line


def test_headroom_over_the_region_cap_is_refused(
    tmp_path: Path, regions: dict[str, Region]
) -> None:
    lines = compile_one(tmp_path, regions, example("spark-etl") | {"headroom_units": 401})
    assert len(lines) == 1
    assert "headroom_units: 401 is over placement.max_units_per_region (400)" in lines[0]


def test_a_signed_bundle_carries_the_block_to_its_readers(tmp_path: Path) -> None:
    """Compiled, signed and verified as nodes and the control plane read it: the block
    survives JSON (enums and times as strings) unchanged."""
    from contracts import bundle, keys
    from contracts.compiler import compile_and_sign
    from contracts.disruption import Disruption

    _, private, public = keys.generate(tmp_path / "keys")
    trust = tmp_path / "trust"
    trust.mkdir()
    (trust / public.name).write_bytes(public.read_bytes())
    doc = example("spark-etl") | {"disruption": GOOD, "headroom_units": 8}
    src = write_contracts(tmp_path / "src", {"c.yaml": doc, "ci.yaml": example("ci-runners")})
    out = tmp_path / "bundle.json"
    result, serial = compile_and_sign(
        src, REGIONS_DIR, keys.load_signing_key(private), out, serial=1,
        created_at=datetime.now(UTC),
    )  # fmt: skip
    assert serial == 1, result.findings
    verified = bundle.verify(out.read_bytes(), keys.TrustStore.load(trust))
    spark = verified.content.contract("spark-etl")
    assert spark is not None and spark.headroom_units == 8
    assert spark.disruption == Disruption.model_validate(GOOD, strict=False)
    ci = verified.content.contract("ci-runners")
    assert ci is not None and ci.disruption is None
    signed = {c["name"]: c for c in json.loads(out.read_bytes())["content"]["contracts"]}
    assert "disruption" not in signed["ci-runners"]
    assert "headroom_units" not in signed["ci-runners"]
    assert signed["spark-etl"]["disruption"]["budgets"][0]["reasons"][1] == "return-from-fallback"


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        (
            {"blackouts": [{"schedule": "0 * * * *", "duration_minutes": 60}]},
            "disruption.blackouts[0]: open all the time: no voluntary disruption would ever "
            "happen [warning]",
        ),
        (
            {
                "budgets": [{"reasons": ["expiry"], "max_instances": 0}],
                "max_instance_age_hours": 24,
            },
            "disruption.max_instance_age_hours: a budget holds expiry at 0 instances at all "
            "times: no instance would expire [warning]",
        ),
    ],
)
def test_a_block_that_never_lets_anything_through_is_a_warning(
    tmp_path: Path, regions: dict[str, Region], block: Any, expected: str
) -> None:
    src = write_contracts(tmp_path, {"c.yaml": example("spark-etl") | {"disruption": block}})
    result = compile_dir(src, regions)
    assert result.ok
    assert [str(f).removeprefix(f"{src}/").split(": ", 1)[1] for f in result.findings] == [expected]


def test_a_weekday_blackout_is_no_warning(tmp_path: Path, regions: dict[str, Region]) -> None:
    block = {"blackouts": [{"schedule": "0 0 * * 1-5", "duration_minutes": 1440}]}
    src = write_contracts(tmp_path, {"c.yaml": example("spark-etl") | {"disruption": block}})
    assert compile_dir(src, regions).findings == []
