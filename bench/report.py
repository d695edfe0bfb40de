"""One shape for every benchmark's output: figures beside their targets.

A figure is a name, a value and a unit, the target it is held to (with the comparator that
says which side is good) and its anchor: what the value is measured from or compared with
(a signal's send time, the exact MILP optimum, the configured token rate). A measurement
that did not happen is a figure whose value is null with the reason, never a sentinel
number; any such figure makes the bench exit non-zero. Each bench prints one JSON object
(`Report.emit`), and writes it to $SCO_BENCH_REPORT when that is set: bench/run_all.py
reads that file, since Temporal's core SDK logs its warnings to stdout as well.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

REPORT_FILE_ENV = "SCO_BENCH_REPORT"
Comparator = Literal["<=", ">=", "=="]


@dataclass(frozen=True)
class Figure:
    name: str
    value: float | None
    unit: str
    target: float | None
    comparator: Comparator | None
    anchor: str
    met: bool | None  # None: no target stated, or nothing was measured
    reason: str = ""  # why value is None


def judge(value: float | None, target: float | None, comparator: Comparator | None) -> bool | None:
    if value is None or target is None or comparator is None:
        return None
    if comparator == "<=":
        return value <= target
    if comparator == ">=":
        return value >= target
    return value == target


def machine() -> dict[str, Any]:
    """CPU count and load average: the machine is shared, so every figure carries them."""
    return {"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()]}


@dataclass
class Report:
    bench: str
    settings: dict[str, Any]
    figures: list[Figure] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    _started: float = field(default_factory=time.monotonic)
    _machine_start: dict[str, Any] = field(default_factory=machine)

    def figure(
        self,
        name: str,
        value: float | None,
        unit: str,
        *,
        anchor: str,
        target: float | None = None,
        comparator: Comparator | None = None,
        reason: str = "",
    ) -> Figure:
        if value is None and not reason:
            raise ValueError(f"{self.bench}.{name}: a missing value needs a reason")
        fig = Figure(
            name=name,
            value=None if value is None else round(float(value), 4),
            unit=unit,
            target=target,
            comparator=comparator,
            anchor=anchor,
            met=judge(value, target, comparator),
            reason=reason,
        )
        self.figures.append(fig)
        return fig

    def measurement_missing(
        self,
        name: str,
        reason: str,
        unit: str,
        *,
        anchor: str,
        target: float | None = None,
        comparator: Comparator | None = None,
    ) -> Figure:
        """The measurement did not happen: null plus the reason; the bench exits non-zero."""
        return self.figure(
            name, None, unit, anchor=anchor, target=target, comparator=comparator, reason=reason
        )

    @property
    def missing(self) -> list[Figure]:
        return [f for f in self.figures if f.value is None]

    def as_dict(self) -> dict[str, Any]:
        end = machine()
        return {
            "bench": self.bench,
            "machine": {
                "cpus": end["cpus"],
                "loadavg_start": self._machine_start["loadavg"],
                "loadavg_end": end["loadavg"],
            },
            "wall_s": round(time.monotonic() - self._started, 1),
            "settings": self.settings,
            "figures": [asdict(f) for f in self.figures],
            "missing": len(self.missing),
            "notes": self.notes,
            "details": self.details,
        }

    def emit(self) -> int:
        """Print the report as one JSON object on stdout; the exit status to leave with."""
        text = json.dumps(self.as_dict(), indent=2, default=str)
        print(text)
        sys.stdout.flush()
        if path := os.environ.get(REPORT_FILE_ENV):
            Path(path).write_text(text + "\n")
        if not self.figures:
            print(f"{self.bench}: no figures recorded", file=sys.stderr)
            return 1
        for f in self.missing:
            print(f"{self.bench}: {f.name} not measured: {f.reason}", file=sys.stderr)
        return 1 if self.missing else 0
