"""The compiler: every schema and feasibility problem, as file:line: field: reason."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from contracts import keys
from contracts.compiler import compile_and_sign, compile_dir
from contracts.feasibility import spread_floor
from contracts.findings import Severity
from contracts.region import Region, load_regions
from tests.support.contract_fixtures import EXAMPLES, example, write_contracts
from tests.support.paths import REGIONS_DIR

WHEN = datetime(2026, 11, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def regions() -> dict[str, Region]:
    return load_regions(REGIONS_DIR)


def messages(src: Path, regions: dict[str, Region]) -> list[str]:
    return [str(f) for f in compile_dir(src, regions).findings]


def test_the_examples_compile_cleanly(regions: dict[str, Region]) -> None:
    result = compile_dir(EXAMPLES, regions)
    assert result.ok and result.findings == []
    assert {c.kind.value for c in result.contracts} == {"spark", "training", "ci", "service"}


def test_every_schema_error_is_reported_with_file_line_and_field(
    tmp_path: Path, regions: dict[str, Region]
) -> None:
    bad = example("spark-etl")
    bad["tier"] = 7
    bad["placement"]["colour"] = "red"
    bad["unit"]["vcpu"] = 0
    src = write_contracts(tmp_path, {"bad.yaml": bad, "ok.yaml": example("ci-runners")})
    lines = messages(src, regions)
    assert f"{src}/bad.yaml:3: tier: Input should be less than or equal to 3" in lines
    assert any(
        m.startswith(f"{src}/bad.yaml:") and ": placement.colour: Extra inputs" in m for m in lines
    )
    assert any(": unit.vcpu: Input should be greater than 0" in m for m in lines)
    assert len(lines) == 3


def test_yaml_syntax_and_non_mapping_documents(tmp_path: Path, regions: dict[str, Region]) -> None:
    (tmp_path / "a.yaml").write_text("name: [unclosed\n")
    (tmp_path / "b.yaml").write_text("- just\n- a list\n")
    lines = messages(tmp_path, regions)
    assert any(m.startswith(f"{tmp_path}/a.yaml:") and "YAML syntax error" in m for m in lines)
    assert f"{tmp_path}/b.yaml:1: (document): a contract is a mapping, not list" in lines


def test_feasibility_findings(tmp_path: Path, regions: dict[str, Region]) -> None:
    dup = example("ci-runners")
    dup["selectors"] = {"kubernetes": [{"namespace": "elsewhere"}]}
    slow = example("spark-etl")
    slow["name"] = "slow-drain"
    slow["drain"]["grace_seconds"] = 600
    slow["selectors"]["kubernetes"][0]["namespace"] = "slow"
    overlap = example("search-api")
    overlap["name"] = "search-api-canary"
    overlap["tier"] = 2
    del overlap["floor"]
    overlap["selectors"]["kubernetes"][0]["labels"] = {}  # same namespace, fewer labels
    greedy = example("llm-train")
    greedy["floor"] = {"r1": 100000}
    greedy["selectors"]["slurm"][0]["account"] = "other"
    greedy["selectors"]["kubernetes"][0]["namespace"] = "other"
    nowhere = example("spark-etl")
    nowhere["name"] = "nowhere"
    nowhere["regions"] = ["r9"]
    nowhere["selectors"]["kubernetes"][0]["namespace"] = "nowhere"
    src = write_contracts(
        tmp_path,
        {
            "ci-runners.yaml": example("ci-runners"),
            "dup.yaml": dup,
            "slow.yaml": slow,
            "search-api.yaml": example("search-api"),
            "overlap.yaml": overlap,
            "greedy.yaml": greedy,
            "nowhere.yaml": nowhere,
        },
    )
    text = "\n".join(messages(src, regions))
    assert (
        f"{src}/dup.yaml:1: name: 'ci-runners' is already the name of {src}/ci-runners.yaml" in text
    )
    assert (
        "slow.yaml" in text and "drain.grace_seconds: 600 s is longer than the notice lead" in text
    )
    assert "could match both this contract and 'search-api" in text  # on the later file
    assert "greedy.yaml" in text and "floor.r1: 100000 units do not fit committed capacity" in text
    assert "nowhere.yaml" in text and "regions[0]: unknown region 'r9'" in text


def test_unreachable_cap_is_a_warning_and_the_bundle_is_still_written(
    tmp_path: Path, regions: dict[str, Region]
) -> None:
    big = example("ci-runners")
    big["placement"]["max_units_per_region"] = 10**6
    src = write_contracts(tmp_path / "src", {"ci.yaml": big})
    result = compile_dir(src, regions)
    assert result.ok
    assert [f.severity for f in result.findings] == [Severity.WARNING] * 3  # r1, r2, r3
    assert "can never be reached" in str(result.findings[0])


def test_floor_spread_rule() -> None:
    free = {"A": 100, "B": 100, "C": 100, "D": 100}
    assert spread_floor(10, "ABCD", free) == {"A": 3, "B": 3, "C": 2, "D": 2}
    assert spread_floor(5, "ABC", free) == {"A": 2, "B": 2, "C": 1}
    assert spread_floor(2, "ABCD", free) is None  # 40 % of 2 is 0.8: no hall may hold one
    assert spread_floor(10, "AB", free) is None  # two halls can hold at most 80 %
    assert spread_floor(10, "ABCD", {"A": 4, "B": 4, "C": 1, "D": 0}) is None


def test_nothing_is_written_on_error_and_same_input_gives_same_bytes(
    tmp_path: Path,
) -> None:
    _kid, private, _ = keys.generate(tmp_path / "keys")
    key = keys.load_signing_key(private)
    out = tmp_path / "bundle.json"
    bad = write_contracts(tmp_path / "bad", {"x.yaml": {"name": "x"}})
    result, serial = compile_and_sign(bad, REGIONS_DIR, key, out, serial=None, created_at=WHEN)
    assert serial is None and not result.ok and not out.exists()

    _, serial = compile_and_sign(EXAMPLES, REGIONS_DIR, key, out, serial=7, created_at=WHEN)
    first = out.read_bytes()
    other = tmp_path / "again.json"
    compile_and_sign(EXAMPLES, REGIONS_DIR, key, other, serial=7, created_at=WHEN)
    assert serial == 7 and other.read_bytes() == first
    _, serial = compile_and_sign(EXAMPLES, REGIONS_DIR, key, out, serial=None, created_at=WHEN)
    assert serial == 8  # the serial only goes up
