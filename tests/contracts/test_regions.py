"""The region model and the shipped region files in deploy/regions/."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from contracts.region import (
    SIZES,
    Pool,
    Region,
    RegionFileError,
    load_region,
    load_regions,
)
from tests.support.paths import REGIONS_DIR

# --- the shipped files -------------------------------------------------------------------


@pytest.fixture(scope="module")
def regions() -> dict[str, Region]:
    return load_regions(REGIONS_DIR)


def test_shipped_regions_load(regions: dict[str, Region]) -> None:
    assert sorted(regions) == ["r1", "r2", "r3"]


@pytest.mark.parametrize("region_id", ["r1", "r2", "r3"])
def test_shipped_region_shape(regions: dict[str, Region], region_id: str) -> None:
    region = regions[region_id]
    assert region.id == region_id
    assert region.halls == ("A", "B", "C", "D")
    assert region.currency == "EUR"
    assert region.notice_lead_seconds > 0
    assert len(region.skus) == 9
    assert len(region.pools) == 144
    assert len(set(region.pool_ids())) == 144
    expected = {(sku.name, size) for sku in region.skus for size in SIZES}
    for hall in region.halls:
        assert {(p.sku, p.size) for p in region.pools_in_hall(hall)} == expected
        assert hall in region.committed
    bare_metal = {sku.name for sku in region.skus if sku.baremetal}
    assert bare_metal == {"bm-cpu", "bm-gpu"}


def test_shipped_regions_get_smaller_from_r1_to_r3(regions: dict[str, Region]) -> None:
    def lendable_vcpu(region: Region) -> int:
        return sum(p.vcpu * p.reclaimable_units for p in region.pools)

    assert (
        lendable_vcpu(regions["r1"]) > lendable_vcpu(regions["r2"]) > lendable_vcpu(regions["r3"])
    )


def test_pool_lookup_by_id(regions: dict[str, Region]) -> None:
    r1 = regions["r1"]
    pool = r1.pool("r1.B.gpu-a.2xl")
    assert (pool.hall, pool.sku, pool.size) == ("B", "gpu-a", "2xl")
    assert pool.flavor == "gpu-a.2xl"
    assert pool.availability_zone == "B"
    assert pool.gpus == 4
    assert pool.pool_id("r1") == r1.pool_id(pool) == "r1.B.gpu-a.2xl"
    for pool_id in r1.pool_ids():
        assert r1.pool_id(r1.pool(pool_id)) == pool_id


def test_unknown_pool_and_hall_raise_key_error(regions: dict[str, Region]) -> None:
    r1 = regions["r1"]
    with pytest.raises(KeyError, match=r"r1\.E\.gp\.l"):
        r1.pool("r1.E.gp.l")
    with pytest.raises(KeyError, match=r"r2\.A\.gp\.l"):
        r1.pool("r2.A.gp.l")  # a pool id of another region
    with pytest.raises(KeyError, match="'E'"):
        r1.pools_in_hall("E")


def test_models_are_frozen(regions: dict[str, Region]) -> None:
    pool = regions["r1"].pools[0]
    with pytest.raises(ValueError, match="frozen"):
        pool.vcpu = 1  # type: ignore[misc]  # the assignment the test proves is refused
    assert isinstance(pool, Pool)


# --- broken files --------------------------------------------------------------------------

VALID = """\
[region]
id = "rx"
halls = ["A", "B"]
notice_lead_seconds = 120
currency = "EUR"
skus = [
  { name = "gp", baremetal = false, description = "General purpose" },
  { name = "gpu-a", baremetal = false, gpu_model = "A100", description = "GPU VM" },
]
committed.A = { vcpu = 1024, memory_gib = 4096, gpus = 8, price_per_vcpu_hour = 0.022 }
pools = [
  { hall = "A", sku = "gp", size = "l", vcpu = 4, memory_gib = 16, price_per_hour = 0.032, reclaimable_units = 10 },
  { hall = "B", sku = "gp", size = "l", vcpu = 4, memory_gib = 16, price_per_hour = 0.032, reclaimable_units = 8 },
  { hall = "A", sku = "gp", size = "xl", vcpu = 8, memory_gib = 32, price_per_hour = 0.064, reclaimable_units = 4 },
  { hall = "A", sku = "gpu-a", size = "l", vcpu = 8, memory_gib = 96, gpus = 1, price_per_hour = 0.7, reclaimable_units = 2 },
]
"""  # noqa: E501


def edit(text: str, *replacements: tuple[str, str]) -> str:
    for old, new in replacements:
        assert text.count(old) == 1, f"{old!r} must occur exactly once"
        text = text.replace(old, new)
    return text


def write(tmp_path: Path, text: str, name: str = "rx.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems_of(path: Path) -> list[str]:
    with pytest.raises(RegionFileError) as info:
        load_region(path)
    assert str(info.value) == "\n".join(info.value.problems)
    return list(info.value.problems)


def test_valid_fixture_loads(tmp_path: Path) -> None:
    region = load_region(write(tmp_path, VALID))
    assert region.pool_ids() == ["rx.A.gp.l", "rx.B.gp.l", "rx.A.gp.xl", "rx.A.gpu-a.l"]
    assert region.pool("rx.A.gp.l").gpus == 0  # the default


def test_all_problems_of_a_file_are_listed(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        edit(
            VALID,
            # unknown field
            (
                'size = "l", vcpu = 4, memory_gib = 16, price_per_hour = 0.032, '
                "reclaimable_units = 10 }",
                'size = "l", vcpu = 4, memory_gib = 16, price_per_hour = 0.032, '
                'reclaimable_units = 10, colour = "red" }',
            ),
            # pool in an unknown hall
            ('{ hall = "B", sku = "gp", size = "l"', '{ hall = "E", sku = "gp", size = "l"'),
            # negative vcpu
            ("vcpu = 8, memory_gib = 32", "vcpu = -8, memory_gib = 32"),
            # duplicate pool (A.gp.l is pools[0])
            (
                '{ hall = "A", sku = "gpu-a", size = "l", vcpu = 8, memory_gib = 96, gpus = 1, '
                "price_per_hour = 0.7,",
                '{ hall = "A", sku = "gp", size = "l", vcpu = 4, memory_gib = 16, gpus = 0, '
                "price_per_hour = 0.032,",
            ),
        ),
    )
    problems = problems_of(path)
    assert len(problems) == 4, problems
    assert all(line.startswith(f"{path}: region.pools[") for line in problems), problems
    text = "\n".join(problems)
    assert f"{path}: region.pools[0].colour: unknown field" in text
    assert f"{path}: region.pools[1].hall: hall 'E' is not one of the region's halls" in text
    assert f"{path}: region.pools[2].vcpu: Input should be greater than 0 (got -8)" in text
    assert f"{path}: region.pools[3]: duplicate pool A.gp.l, already defined by pools[0]" in text


@pytest.mark.parametrize(
    ("old", "new", "field", "reason"),
    [
        ('id = "rx"', 'id = ""', "region.id", "must be a non-empty name"),
        ('id = "rx"', 'id = "r.x"', "region.id", "must be a non-empty name"),
        ('halls = ["A", "B"]', 'halls = ["A", "B", "A"]', "region.halls[2]", "duplicate hall 'A'"),
        ('halls = ["A", "B"]', "halls = []", "region.halls", "at least 1 item"),
        (
            "notice_lead_seconds = 120",
            "notice_lead_seconds = 0",
            "region.notice_lead_seconds",
            "greater than 0",
        ),
        (
            "notice_lead_seconds = 120",
            'notice_lead_seconds = "120"',
            "region.notice_lead_seconds",
            "valid integer",
        ),
        ('currency = "EUR"', 'currency = "eur"', "region.currency", "ISO 4217"),
        ('currency = "EUR"\n', "", "region.currency", "required field is missing"),
        (
            '{ name = "gp", baremetal = false',
            '{ name = "gp", baremetal = "no"',
            "region.skus[0].baremetal",
            "valid boolean",
        ),
        (
            'sku = "gp", size = "xl"',
            'sku = "gq", size = "xl"',
            "region.pools[2].sku",
            "SKU 'gq' is not declared",
        ),
        ('size = "xl"', 'size = "xxl"', "region.pools[2].size", "'l', 'xl', '2xl' or '4xl'"),
        (
            "price_per_hour = 0.064",
            "price_per_hour = -0.064",
            "region.pools[2].price_per_hour",
            "greater than 0",
        ),
        (
            "price_per_hour = 0.064",
            "price_per_hour = inf",
            "region.pools[2].price_per_hour",
            "finite number",
        ),
        (
            "price_per_hour = 0.064",
            "price_per_hour = 0.2",
            "region.pools[2].price_per_hour",
            "must be cheaper than committed",
        ),
        (
            "reclaimable_units = 4",
            "reclaimable_units = -1",
            "region.pools[2].reclaimable_units",
            "greater than or equal to 0",
        ),
        ("gpus = 1", "gpus = 0", "region.pools[3].gpus", "GPU SKU"),
        (
            "memory_gib = 32,",
            "memory_gib = 32, gpus = 2,",
            "region.pools[2].gpus",
            "has no gpu_model",
        ),
        ("committed.A", "committed.E", "region.committed.E", "not one of ['A', 'B']"),
        (
            "gpus = 8, price_per_vcpu_hour",
            "gpus = 8, price_per_vcpu_hour = 0.03, cost",
            "region.committed.A.cost",
            "unknown field",
        ),
    ],
)
def test_single_problem(tmp_path: Path, old: str, new: str, field: str, reason: str) -> None:
    path = write(tmp_path, edit(VALID, (old, new)))
    problems = problems_of(path)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{path}: {field}: "), problems
    assert reason in problems[0], problems


def test_toml_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, edit(VALID, ("notice_lead_seconds = 120", "notice_lead_seconds = ")))
    assert problems_of(path) == [f"{path}:4: TOML syntax error: Invalid value (column 23)"]


def test_file_without_region_table(tmp_path: Path) -> None:
    path = write(tmp_path, 'id = "rx"\n')
    assert problems_of(path) == [
        f"{path}: id: unknown top-level key (a region file holds one [region] table)",
        f"{path}: region: missing [region] table",
    ]


def test_load_regions_checks_file_names_and_lists_all_files(tmp_path: Path) -> None:
    good = write(tmp_path, VALID, "rx.toml")
    misnamed = write(tmp_path, VALID, "ry.toml")
    broken_text = edit(
        VALID,
        ('id = "rx"', 'id = "rz"'),
        (
            '{ hall = "A", sku = "gp", size = "l", vcpu = 4',
            '{ hall = "A", sku = "gp", size = "l", vcpu = 0',
        ),
    )
    broken = write(tmp_path, broken_text, "rz.toml")
    with pytest.raises(RegionFileError) as info:
        load_regions(tmp_path)
    problems = info.value.problems
    assert len(problems) == 2, problems
    assert problems[0] == (
        f"{misnamed}: region.id: region id 'rx' does not match the file name; "
        "the file must be named rx.toml"
    )
    assert problems[1].startswith(f"{broken}: region.pools[0].vcpu: Input should be greater")
    assert not any(str(good) in line for line in problems)

    misnamed.unlink()
    broken.unlink()
    assert list(load_regions(tmp_path)) == ["rx"]


def test_load_regions_of_an_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(RegionFileError, match=r"no \*\.toml region files"):
        load_regions(tmp_path)


def test_region_file_error_pickles(tmp_path: Path) -> None:
    error = RegionFileError(["a.toml: region.id: x", "a.toml: region.halls: y"])
    copy = pickle.loads(pickle.dumps(error))
    assert copy.problems == error.problems
    assert str(copy) == str(error)
    assert isinstance(copy, ValueError)
