"""PoolId: the one reader and writer of `<region>.<hall>.<sku>.<size>`."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from contracts.pool_id import PoolId
from contracts.region import Region, load_region
from tests.support.paths import REGIONS_DIR


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("r1.A.gp.xl", ("r1", "A", "gp", "xl")),
        ("r1.B.gpu-a.2xl", ("r1", "B", "gpu-a", "2xl")),
        ("r3.D.bm_cpu.4xl", ("r3", "D", "bm_cpu", "4xl")),
        # The size is a name here; whether the region has it is the region file's say.
        ("r1.A.gp.m", ("r1", "A", "gp", "m")),
        ("9.9.9.9", ("9", "9", "9", "9")),
    ],
)
def test_parse_and_print_round_trip(text: str, parts: tuple[str, str, str, str]) -> None:
    pid = PoolId.parse(text)
    assert (pid.region, pid.hall, pid.sku, pid.size) == parts
    assert str(pid) == text
    assert pid.flavor == f"{parts[2]}.{parts[3]}"
    assert PoolId(*parts) == pid


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "1 dot-separated part(s), not 4"),
        ("r1", "1 dot-separated part(s), not 4"),
        ("r1.A.gp", "3 dot-separated part(s), not 4"),
        ("r1.A.gp.xl.extra", "5 dot-separated part(s), not 4"),
        ("r1.A.gp.x.l", "5 dot-separated part(s), not 4"),
        ("r1..gp.xl", "the hall is empty"),
        (".A.gp.xl", "the region is empty"),
        ("r1.A.gp.", "the size is empty"),
        ("r1.A..xl", "the sku is empty"),
        ("...", "the region is empty"),
        ("r1.A.g p.xl", "the sku 'g p' is not a name"),
        (" r1.A.gp.xl", "the region ' r1' is not a name"),
        ("r1.A.gp.xl\n", "the size 'xl\\n' is not a name"),
        ("r1.A.gp.xl\x00", "the size 'xl\\x00' is not a name"),
        ("r1.A/../..gp.xl", "7 dot-separated part(s), not 4"),
        ("r1.A/x.gp.xl", "the hall 'A/x' is not a name"),
        ("r1.A.gp;rm -rf.xl", "the sku 'gp;rm -rf' is not a name"),
        ("r1.A.-gp.xl", "the sku '-gp' is not a name"),
        ("r1.A._gp.xl", "the sku '_gp' is not a name"),
        ("r1.Ä.gp.xl", "the hall 'Ä' is not a name"),
        ("r1.A.gp.x\u0131", "the size 'x\u0131' is not a name"),
        ("r1.A.gp.\uff58l", "the size '\uff58l' is not a name"),
        ("r1.A.gp.*", "the size '*' is not a name"),
        ("r1.A.gp.xl" + "x" * 300, "more than 200"),
    ],
)
def test_parse_rejects_hostile_input_saying_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match="not a pool id") as caught:
        PoolId.parse(text)
    assert says in str(caught.value)


def test_parse_does_not_echo_a_huge_argument() -> None:
    with pytest.raises(ValueError) as caught:
        PoolId.parse("r1." * 10_000)
    assert len(str(caught.value)) < 300


@pytest.mark.parametrize("bad", [None, 12, b"r1.A.gp.xl", ["r1", "A", "gp", "xl"]])
def test_parse_rejects_what_is_not_a_string(bad: object) -> None:
    with pytest.raises(ValueError, match="a pool id is a string"):
        PoolId.parse(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("parts", "says"),
    [
        (("r1", "A", "gp", ""), "size '' is not a name"),
        (("r1", "A.B", "gp", "xl"), "hall 'A.B' is not a name"),
        (("r 1", "A", "gp", "xl"), "region 'r 1' is not a name"),
    ],
)
def test_construction_checks_the_parts(parts: tuple[str, str, str, str], says: str) -> None:
    # Otherwise a dotted part would print an id that parses back as another pool.
    with pytest.raises(ValueError, match=says):
        PoolId(*parts)


def test_frozen_hashable_and_picklable() -> None:
    pid = PoolId.parse("r1.A.gp.xl")
    with pytest.raises(dataclasses.FrozenInstanceError):
        pid.hall = "B"  # type: ignore[misc]
    assert {pid: 1}[PoolId("r1", "A", "gp", "xl")] == 1
    assert pickle.loads(pickle.dumps(pid)) == pid


def test_every_shipped_pool_id_round_trips() -> None:
    region: Region = load_region(REGIONS_DIR / "r1.toml")
    for pool in region.pools:
        pid = PoolId.parse(region.pool_id(pool))
        assert pid == pool.id_in("r1")
        assert (pid.hall, pid.flavor) == (pool.hall, pool.flavor)
        assert region.pool(str(pid)) is pool
