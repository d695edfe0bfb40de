"""Headroom in the contract: headroom_units and headroom_schedules (the budgets' cron +
duration shape) compile, bad ones are refused in one line, and what is asked at a time."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from contracts.compiler import compile_dir
from contracts.headroom import headroom_at
from contracts.model import Contract
from contracts.region import Region, load_regions
from tests.support.contract_fixtures import example, write_contracts
from tests.support.paths import REGIONS_DIR

# Weekdays 08:00-18:00 UTC: 24 units; Sundays all day: none; else headroom_units (8).
SCHEDULES: list[dict[str, Any]] = [
    {"schedule": "0 8 * * 1-5", "duration_minutes": 600, "units": 24},
    {"schedule": "0 0 * * 0", "duration_minutes": 1440, "units": 0},
]


@pytest.fixture(scope="module")
def regions() -> dict[str, Region]:
    return load_regions(REGIONS_DIR)


def compiled(tmp_path: Path, regions: dict[str, Region], doc: dict[str, Any]) -> Contract:
    result = compile_dir(write_contracts(tmp_path, {"c.yaml": doc}), regions)
    assert result.ok and result.findings == [], result.findings
    return result.contracts[0]


def findings(tmp_path: Path, regions: dict[str, Region], doc: dict[str, Any]) -> list[str]:
    src = write_contracts(tmp_path, {"c.yaml": doc})
    return [str(f).removeprefix(f"{src}/") for f in compile_dir(src, regions).findings]


@pytest.mark.parametrize(
    ("at", "units", "why"),
    [
        (datetime(2026, 12, 7, 9, 0, tzinfo=UTC), 24, "'0 8 * * 1-5'"),  # Monday 09:00
        (datetime(2026, 12, 7, 17, 59, tzinfo=UTC), 24, "open"),
        (datetime(2026, 12, 7, 18, 0, tzinfo=UTC), 8, "headroom_units 8"),  # closed again
        (datetime(2026, 12, 5, 12, 0, tzinfo=UTC), 8, "headroom_units 8"),  # Saturday
        (datetime(2026, 12, 6, 12, 0, tzinfo=UTC), 0, "'0 0 * * 0'"),  # Sunday
    ],
)
def test_a_schedule_replaces_headroom_units_while_open(
    tmp_path: Path, regions: dict[str, Region], at: datetime, units: int, why: str
) -> None:
    c = compiled(
        tmp_path,
        regions,
        example("spark-etl") | {"headroom_units": 8, "headroom_schedules": SCHEDULES},
    )
    got, said = headroom_at(c, at)
    assert got == units and why in said, said


def test_the_largest_open_window_wins_and_no_headroom_says_so(
    tmp_path: Path, regions: dict[str, Region]
) -> None:
    both = [
        {"schedule": "0 8 * * *", "duration_minutes": 600, "units": 4},
        {"schedule": "0 9 * * *", "duration_minutes": 60, "units": 12},
    ]
    c = compiled(tmp_path, regions, example("spark-etl") | {"headroom_schedules": both})
    assert headroom_at(c, datetime(2026, 12, 7, 9, 30, tzinfo=UTC))[0] == 12
    assert headroom_at(c, datetime(2026, 12, 7, 11, 0, tzinfo=UTC))[0] == 4
    assert headroom_at(c, datetime(2026, 12, 7, 20, 0, tzinfo=UTC)) == (0, "no headroom")


@pytest.mark.parametrize(
    ("schedules", "expected"),
    [
        (
            [{"schedule": "0 8 * * *", "duration_minutes": 60, "units": 401}],
            "headroom_schedules[0].units: 401 is over placement.max_units_per_region (400)",
        ),
        ([{"schedule": "0 25 * * *", "duration_minutes": 60, "units": 1}], "cron hour"),
        ([{"schedule": "0 8 * * *", "units": 1}], "duration_minutes"),
        ([{"schedule": "0 8 * * *", "duration_minutes": 60, "units": -1}], "units"),
        (
            [{"schedule": "0 8 * * *", "duration_minutes": 60, "units": 1, "size": 2}],
            "size",
        ),
    ],
)
def test_a_bad_schedule_is_one_line_naming_the_field(
    tmp_path: Path, regions: dict[str, Region], schedules: list[dict[str, Any]], expected: str
) -> None:
    lines = findings(tmp_path, regions, example("spark-etl") | {"headroom_schedules": schedules})
    assert len(lines) == 1, lines
    assert lines[0].startswith("c.yaml:") and "\n" not in lines[0]
    assert expected in lines[0], lines[0]


def test_old_bundle_bytes_without_schedules(tmp_path: Path, regions: dict[str, Region]) -> None:
    plain = compiled(tmp_path / "a", regions, example("spark-etl"))
    assert "headroom_schedules" not in json.dumps(plain.model_dump(mode="json"))
    with_ = compiled(
        tmp_path / "b", regions, example("spark-etl") | {"headroom_schedules": SCHEDULES}
    )
    dumped = with_.model_dump(mode="json")
    assert dumped["headroom_schedules"][0]["units"] == 24
    assert Contract.model_validate(dumped, strict=False) == with_
