"""The neutral trace format (docs/estate/traces.md): what the estate's provider does,
recorded or generated, in one JSON document per region, independent of any policy.

    {"format": "sco-estate-trace/1", "region": "r1", "minutes": 4320, "source": "...",
     "owner_preempts": true,
     "pools": {"r1.A.gp.l": {"available": [[0, 120], [5, 118]],
                             "reclaims": [[17, 1], [903, 6]],
                             "prices": [[0, 0.031], [1440, 0.033]]}},
     "halls": {"B": {"outages": [[2000, 2180]]}}}

Every series is [minute, value] pairs, minutes strictly increasing; ``available`` and
``prices`` are steps (the value holds until the next) and start at minute 0. A pool with
no ``available`` has the region file's ``reclaimable_units`` free of the owner; one with
no ``prices`` keeps its list price. ``reclaims``: that many of the pool's slots are taken
back in that minute (the slots drawn uniformly, so a policy holding k of n slots loses
k/n of them on average). With ``owner_preempts`` a fall of ``available`` below what the
simulated policy holds reclaims the difference.

A bad document fails with one line naming the file, the field and why (TraceFileError).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from contracts.model import Contract
from contracts.region import Region
from estate.config import EstateConfig
from estate.trace import HallLoss, Hit, RegionTrace, drop_hits, region_trace

FORMAT = "sco-estate-trace/1"


class TraceFileError(ValueError):
    """A trace document that cannot be used; the message is one line."""


def _fail(where: str, field: str, why: str) -> TraceFileError:
    return TraceFileError(f"{where}: {field}: {why}")


def _series(
    where: str, field: str, raw: object, horizon: int, *, integer: bool, starts: bool
) -> list[tuple[int, Any]]:
    if not isinstance(raw, list):
        raise _fail(where, field, "not a list of [minute, value] pairs")
    out: list[tuple[int, Any]] = []
    for i, pair in enumerate(raw):
        at = f"{field}[{i}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise _fail(where, at, "not a [minute, value] pair")
        minute, value = pair
        if isinstance(minute, bool) or not isinstance(minute, int):
            raise _fail(where, at, f"minute {minute!r} is not a whole number")
        if not 0 <= minute < horizon:
            raise _fail(where, at, f"minute {minute} outside 0..{horizon - 1}")
        if out and minute <= out[-1][0]:
            raise _fail(where, at, f"minute {minute} not after {out[-1][0]}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _fail(where, at, f"value {value!r} is not a number")
        if integer and (not isinstance(value, int) or value < 0):
            raise _fail(where, at, f"value {value!r} is not a whole number >= 0")
        if not integer and not value > 0:
            raise _fail(where, at, f"value {value!r} is not > 0")
        out.append((minute, value))
    if starts and out and out[0][0] != 0:
        raise _fail(where, f"{field}[0]", f"starts at minute {out[0][0]}, not 0")
    return out


def parse_trace(doc: object, region: Region, where: str, seed: int = 0) -> RegionTrace:
    """A region's trace from a parsed document; ``where`` names it in errors."""
    if not isinstance(doc, dict):
        raise _fail(where, "(top)", "not a JSON object")
    if doc.get("format") != FORMAT:
        raise _fail(where, "format", f"{doc.get('format')!r}, expected {FORMAT!r}")
    if doc.get("region") != region.id:
        raise _fail(where, "region", f"{doc.get('region')!r}, expected {region.id!r}")
    horizon = doc.get("minutes")
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon <= 0:
        raise _fail(where, "minutes", f"{horizon!r} is not a whole number > 0")
    preempts = doc.get("owner_preempts", False)
    if not isinstance(preempts, bool):
        raise _fail(where, "owner_preempts", f"{preempts!r} is not true or false")
    pools = doc.get("pools", {})
    halls = doc.get("halls", {})
    if not isinstance(pools, dict):
        raise _fail(where, "pools", "not an object keyed by pool id")
    if not isinstance(halls, dict):
        raise _fail(where, "halls", "not an object keyed by hall")
    index = {region.pool_id(p): i for i, p in enumerate(region.pools)}
    rng = random.Random(f"trace:{seed}:{region.id}:{doc.get('source', '')}")
    trace = RegionTrace(
        region=region.id,
        bad_pools=frozenset(),
        rates=[0.0] * len(region.pools),
        background=[(0.0, 0.0)] * len(region.pools),
        source=str(doc.get("source", where)),
    )
    for pool_id, entry in sorted(pools.items()):
        field = f"pools.{pool_id}"
        if pool_id not in index:
            raise _fail(where, field, f"no such pool in region {region.id}")
        if not isinstance(entry, dict):
            raise _fail(where, field, "not an object")
        unknown = sorted(set(entry) - {"available", "reclaims", "prices"})
        if unknown:
            raise _fail(where, f"{field}.{unknown[0]}", "unknown field")
        i = index[pool_id]
        cap = region.pools[i].reclaimable_units
        if "available" in entry:
            steps = _series(
                where, f"{field}.available", entry["available"], horizon, integer=True,
                starts=True,
            )  # fmt: skip
            over = next((j for j, (_, v) in enumerate(steps) if v > cap), None)
            if over is not None:
                raise _fail(
                    where,
                    f"{field}.available[{over}]",
                    f"{steps[over][1]} slots > the {cap} the pool has",
                )
            trace.available[i] = steps
            if preempts:
                for minute, hit in drop_hits(i, steps, rng):
                    trace.hits.setdefault(minute, []).append(hit)
        if "reclaims" in entry:
            events = _series(
                where, f"{field}.reclaims", entry["reclaims"], horizon, integer=True,
                starts=False,
            )  # fmt: skip
            for minute, n in events:
                k = min(n, cap)
                if k <= 0:
                    continue
                slots = tuple(sorted(rng.sample(range(cap), k)))
                draws = tuple(rng.random() for _ in slots)
                trace.hits.setdefault(minute, []).append(Hit(i, slots, draws, burst=k > 1))
        if "prices" in entry:
            trace.prices[i] = _series(
                where, f"{field}.prices", entry["prices"], horizon, integer=False, starts=True
            )
    for hall, entry in sorted(halls.items()):
        field = f"halls.{hall}"
        if hall not in region.halls:
            raise _fail(where, field, f"no such hall in region {region.id}")
        outages = entry.get("outages", []) if isinstance(entry, dict) else None
        if not isinstance(outages, list):
            raise _fail(where, f"{field}.outages", "not a list of [start, end] pairs")
        for j, pair in enumerate(outages):
            at = f"{field}.outages[{j}]"
            if (
                not isinstance(pair, list)
                or len(pair) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in pair)
            ):
                raise _fail(where, at, "not a [start, end] pair of whole minutes")
            start, end = pair
            if not 0 <= start < end <= horizon:
                raise _fail(
                    where, at, f"[{start}, {end}] is not within 0 <= start < end <= {horizon}"
                )
            trace.hall_losses.append(HallLoss(hall, start, end))
    for minute in trace.hits:
        trace.hits[minute].sort(key=lambda h: (h.pool, not h.holds))
    trace.hall_losses.sort(key=lambda h: (h.start, h.hall))
    return trace


def load_trace(path: Path, region: Region, seed: int = 0) -> tuple[RegionTrace, int]:
    """A trace file for ``region``, and its horizon in minutes."""
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise TraceFileError(f"{path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise TraceFileError(f"{path}: not JSON: {exc.msg} at line {exc.lineno}") from None
    trace = parse_trace(doc, region, str(path), seed)
    return trace, int(doc["minutes"])


def trace_region(path: Path) -> str:
    """The region a trace file names (for choosing the region before loading it)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TraceFileError(f"{path}: cannot read a trace document: {exc}") from None
    region = doc.get("region") if isinstance(doc, dict) else None
    if not isinstance(region, str):
        raise TraceFileError(f"{path}: region: missing or not a string")
    return region


def document(
    trace: RegionTrace,
    region: Region,
    minutes: int,
    *,
    owner_preempts: bool,
    extra_pools: Mapping[int, Mapping[str, Sequence[Sequence[float]]]] | None = None,
) -> dict[str, Any]:
    """A trace as a neutral document: its reclaim events as counts per minute, the owner's
    free slots where the trace has them, prices where they move, hall outages."""
    pools: dict[str, dict[str, list[list[float]]]] = {}
    for minute in sorted(trace.hits):
        for hit in trace.hits[minute]:
            if hit.holds:
                entry = pools.setdefault(region.pool_id(region.pools[hit.pool]), {})
                entry.setdefault("reclaims", []).append([minute, len(hit.slots)])
    for i, steps in sorted(trace.available.items()):
        pools.setdefault(region.pool_id(region.pools[i]), {})["available"] = [
            [m, v] for m, v in steps
        ]
    for i, prices in sorted(trace.prices.items()):
        pools.setdefault(region.pool_id(region.pools[i]), {})["prices"] = [
            [m, v] for m, v in prices
        ]
    for i, extra in sorted((extra_pools or {}).items()):
        entry = pools.setdefault(region.pool_id(region.pools[i]), {})
        for key, series in extra.items():
            entry[key] = [list(x) for x in series]
    halls: dict[str, dict[str, list[list[int]]]] = {}
    for h in trace.hall_losses:
        halls.setdefault(h.hall, {"outages": []})["outages"].append([h.start, h.end])
    return {
        "format": FORMAT,
        "region": region.id,
        "minutes": minutes,
        "source": trace.source,
        "owner_preempts": owner_preempts,
        "pools": dict(sorted(pools.items())),
        "halls": dict(sorted(halls.items())),
    }


def synthetic_document(
    region: Region, contracts: Sequence[Contract], cfg: EstateConfig
) -> dict[str, Any]:
    """The synthetic generator's trace of ``region`` as a neutral document. Where the
    owner's load only limits launches (``owner_preempts`` off) it is written all the same,
    in 15-minute steps, with ``owner_preempts: false``."""
    trace = region_trace(region, contracts, cfg)
    if not trace.available:
        for i, pool in enumerate(region.pools):
            steps: list[tuple[int, int]] = []
            for minute in range(0, cfg.minutes, 15):
                free = trace.owner_free(i, minute, pool.reclaimable_units)
                if not steps or steps[-1][1] != free:
                    steps.append((minute, free))
            trace.available[i] = steps
    return document(trace, region, cfg.minutes, owner_preempts=cfg.owner_preempts)
