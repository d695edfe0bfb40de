"""The control activities on no fleet state, control state or provider: for tests of the
parts that need none of them (the reclaim-rate cache, the exact planner's threads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from activities.control.activities import ControlActivities
from tests.support.paths import REGIONS_DIR


def bare_control(tmp_path: Path, **options: Any) -> ControlActivities:
    """`options`: ControlActivities' keyword arguments (ledger, solver_threads, ...)."""
    nothing: Any = None
    return ControlActivities(
        nothing,
        nothing,
        nothing,
        regions_dir=REGIONS_DIR,
        bundle_cache_dir=tmp_path,
        trust_dir=tmp_path,
        **options,
    )
