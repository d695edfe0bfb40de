"""The intake activity: read every scheduler source, normalise, store per source.

One activity call reads all sources concurrently. A source that answers replaces its own
demand rows whole (`replace_demand`): work that is no longer pending drops out. A source
that cannot be read keeps its last rows and is reported: zeroing it would have the
controllers release capacity that work is still waiting for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from pydantic import BaseModel
from temporalio import activity

from activities.demand.model import PendingWork, Unmatched, normalise
from activities.demand.source import DemandSource, SourceUnavailable
from activities.fleet.control_state import ControlRepository
from contracts.bundle import VerifiedBundle

#: Unmatched work listed per source in a report (the count is always complete).
_UNMATCHED_SHOWN = 20


class CollectInput(BaseModel):
    region: str
    # Sources unreadable for longer than the intake tolerates: if they fail again, their
    # demand is dropped (kept demand would hold capacity for work nobody can see).
    drop_if_failing: list[str] = []


class SourceReport(BaseModel):
    source: str
    ok: bool
    error: str = ""
    pending: int = 0  # jobs or pods read
    units: dict[str, int] = {}  # per contract, as stored
    unmatched_count: int = 0
    unmatched: list[Unmatched] = []  # the first few, for `sco demand sources`
    dropped: bool = False  # failing too long: its demand was dropped


class CollectResult(BaseModel):
    bundle_serial: int | None = None
    problem: str = ""  # why nothing was collected (no bundle)
    reports: list[SourceReport] = []
    changed: list[str] = []  # contracts whose stored demand changed


BundleLoader = Callable[[], tuple[VerifiedBundle | None, str]]


class DemandIntakeActivities:
    def __init__(
        self,
        sources: Sequence[DemandSource],
        control: ControlRepository | None,
        bundle: BundleLoader,
    ) -> None:
        self._sources = list(sources)
        self._control = control
        self._bundle = bundle

    @property
    def source_names(self) -> list[str]:
        return [s.name for s in self._sources]

    async def read(self, region: str) -> CollectResult:
        """What every source has pending now, normalised; stores nothing."""
        bundle, problem = self._bundle()
        if bundle is None:
            return CollectResult(problem=problem)
        contracts = bundle.content.contracts
        results = await asyncio.gather(*(_read(s) for s in self._sources))
        reports = []
        for source, result in zip(self._sources, results, strict=True):
            if isinstance(result, str):
                reports.append(SourceReport(source=source.name, ok=False, error=result))
                continue
            demand = normalise(contracts, region, result)
            reports.append(
                SourceReport(
                    source=source.name,
                    ok=True,
                    pending=len(result),
                    units=demand.units,
                    unmatched_count=len(demand.unmatched),
                    unmatched=demand.unmatched[:_UNMATCHED_SHOWN],
                )
            )
        return CollectResult(bundle_serial=bundle.serial, reports=reports)

    @activity.defn(name="demand.collect")
    async def collect(self, inp: CollectInput) -> CollectResult:
        out = await self.read(inp.region)
        if self._control is None:
            raise RuntimeError("demand.collect needs fleet state (a ControlRepository)")
        changed: set[str] = set()
        for report in out.reports:
            if report.ok:
                changed.update(
                    await asyncio.to_thread(
                        self._control.replace_demand, inp.region, report.source, report.units
                    )
                )
            elif report.source in inp.drop_if_failing:
                changed.update(
                    await asyncio.to_thread(
                        self._control.replace_demand, inp.region, report.source, {}
                    )
                )
                report.dropped = True
                activity.logger.warning(
                    "demand source %s failing too long, its demand dropped: %s",
                    report.source,
                    report.error,
                )
            else:
                activity.logger.warning("demand source %s: %s", report.source, report.error)
        return out.model_copy(update={"changed": sorted(changed)})


async def _read(source: DemandSource) -> list[PendingWork] | str:
    try:
        return await source.pending()
    except SourceUnavailable as exc:
        return exc.reason
