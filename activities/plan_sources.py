"""What every snapshot activity plans from: the region file and the installed signed bundle
(the one nodes and admission use), read the same way by the controller and the floor keeper.

A missing or bad file is not an activity failure: it comes back as a one-line problem the
workflow shows in its status and acts on by planning nothing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from contracts.bundle import VerifiedBundle, installed_bundle
from contracts.region import Region, RegionFileError, load_region


@dataclass(frozen=True)
class PlanSources:
    """Where the region files and the installed bundle live (settings, per worker)."""

    regions_dir: Path
    bundle_cache_dir: Path
    trust_dir: Path

    async def load(self, region_id: str) -> tuple[Region, VerifiedBundle] | str:
        """The region and the bundle, or the problem that stops planning (one line)."""
        try:
            region = await asyncio.to_thread(load_region, self.regions_dir / f"{region_id}.toml")
        except (RegionFileError, FileNotFoundError) as exc:
            return f"region file: {exc}"
        bundle, problem = await asyncio.to_thread(
            installed_bundle, self.bundle_cache_dir, self.trust_dir
        )
        if bundle is None:
            return problem
        return region, bundle
