"""The node agent's metrics as a Prometheus textfile (node_exporter's textfile collector
reads it: nothing listens on the node). Rewritten atomically after each notice, refusal
and drain, so it costs nothing between events.

No prometheus_client on the node: the few series are written by hand in the text format.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import Counter
from pathlib import Path

from agent.drain import DrainReport

log = logging.getLogger(__name__)

DRAIN_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0)
OUTCOMES = ("clean", "forced", "failed")
#: Refusals rewrite the textfile at most this often.
REFUSED_WRITE_SECONDS = 1.0


def drain_outcome(report: DrainReport) -> str:
    """failed: the drain or a workload failed; forced: a workload was forced; else clean."""
    results = {w.result for w in report.workloads}
    if report.error or "failed" in results:
        return "failed"
    return "forced" if "forced" in results else "clean"


class AgentMetrics:
    def __init__(self, path: Path | None, node: str) -> None:
        self._path = path
        self._node = node
        self._lock = threading.Lock()
        self.received: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.told = 0
        self.forced = 0
        self._buckets = {o: [0] * len(DRAIN_BUCKETS) for o in OUTCOMES}
        self._sum = dict.fromkeys(OUTCOMES, 0.0)
        self._count = dict.fromkeys(OUTCOMES, 0)
        # The clock and the bundle's trust, as gauges (None: not known yet).
        self.clock_offset: float | None = None
        self.clock_synchronised: bool | None = None
        self.bundle_age: float | None = None
        self.bundle_trusted_for_notices = False
        self._last_refusal_write = 0.0
        self._flush_pending = False
        self.write()

    def clock(self, offset_seconds: float | None, synchronised: bool | None) -> None:
        self.clock_offset, self.clock_synchronised = offset_seconds, synchronised
        self.write()

    def bundle(self, age_seconds: float | None, trusted_for_notices: bool) -> None:
        """Rewritten when the age moves by a whole second or the trust changes, not on
        every call (every notice asks)."""
        if age_seconds is not None:
            age_seconds = float(round(age_seconds))
        if (age_seconds, trusted_for_notices) == (self.bundle_age, self.bundle_trusted_for_notices):
            return
        self.bundle_age, self.bundle_trusted_for_notices = age_seconds, trusted_for_notices
        self.write()

    def notice_received(self, source: str) -> None:
        self.received[source] += 1
        self.write()

    def notice_refused(self, reason: str) -> None:
        """Counted at once; the file is rewritten at most once a second (a flood of garbage
        on the notice subject must not cost a file rewrite per message)."""
        self.refused[reason] += 1
        now = time.monotonic()
        if now - self._last_refusal_write >= REFUSED_WRITE_SECONDS:
            self._last_refusal_write = now
            self.write()
            return
        if self._flush_pending:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): write now
            self.write()
            return
        self._flush_pending = True
        loop.call_later(REFUSED_WRITE_SECONDS, self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        self._last_refusal_write = time.monotonic()
        self.write()

    def drain_finished(self, report: DrainReport) -> None:
        outcome = drain_outcome(report)
        seconds = (report.finished_ms or 0.0) / 1000
        for i, bound in enumerate(DRAIN_BUCKETS):
            if seconds <= bound:
                self._buckets[outcome][i] += 1
        self._sum[outcome] += seconds
        self._count[outcome] += 1
        self.told += sum(1 for w in report.workloads if w.told_ms is not None)
        self.forced += sum(1 for w in report.workloads if w.result == "forced")
        self.write()

    def render(self) -> str:
        n = f'node="{self._node}"'
        out = [
            "# HELP sco_agent_notices_received_total Reclaim notices accepted, by source",
            "# TYPE sco_agent_notices_received_total counter",
            *(
                f'sco_agent_notices_received_total{{{n},source="{s}"}} {v}'
                for s, v in sorted(self.received.items())
            ),
            "# HELP sco_agent_notices_refused_total Notices refused (signature, replay, ...)",
            "# TYPE sco_agent_notices_refused_total counter",
            f'sco_agent_notices_refused_total{{{n},reason="none"}} 0',
            *(
                f'sco_agent_notices_refused_total{{{n},reason="{r}"}} {v}'
                for r, v in sorted(self.refused.items())
            ),
            "# HELP sco_agent_workloads_told_total Workloads told of a reclaim",
            "# TYPE sco_agent_workloads_told_total counter",
            f"sco_agent_workloads_told_total{{{n}}} {self.told}",
            "# HELP sco_agent_workloads_forced_total Workloads forced off at the deadline",
            "# TYPE sco_agent_workloads_forced_total counter",
            f"sco_agent_workloads_forced_total{{{n}}} {self.forced}",
            "# HELP sco_agent_drain_duration_seconds A drain from notice to done, by outcome",
            "# TYPE sco_agent_drain_duration_seconds histogram",
        ]
        for o in OUTCOMES:
            labels = f'{n},outcome="{o}"'
            for bound, count in zip(DRAIN_BUCKETS, self._buckets[o], strict=True):
                out.append(
                    f'sco_agent_drain_duration_seconds_bucket{{{labels},le="{bound}"}} {count}'
                )
            out.append(
                f'sco_agent_drain_duration_seconds_bucket{{{labels},le="+Inf"}} {self._count[o]}'
            )
            out.append(f"sco_agent_drain_duration_seconds_sum{{{labels}}} {self._sum[o]}")
            out.append(f"sco_agent_drain_duration_seconds_count{{{labels}}} {self._count[o]}")
        if self.clock_offset is not None:
            out += [
                "# HELP sco_agent_clock_offset_seconds NATS server clock minus this node's clock",
                "# TYPE sco_agent_clock_offset_seconds gauge",
                f"sco_agent_clock_offset_seconds{{{n}}} {self.clock_offset:.6f}",
            ]
        if self.clock_synchronised is not None:
            out += [
                "# HELP sco_agent_clock_synchronised 1 when the kernel says NTP synchronised it",
                "# TYPE sco_agent_clock_synchronised gauge",
                f"sco_agent_clock_synchronised{{{n}}} {int(self.clock_synchronised)}",
            ]
        if self.bundle_age is not None:
            out += [
                "# HELP sco_agent_bundle_age_seconds Age of the contract bundle held",
                "# TYPE sco_agent_bundle_age_seconds gauge",
                f"sco_agent_bundle_age_seconds{{{n}}} {self.bundle_age:.0f}",
            ]
        out += [
            "# HELP sco_agent_bundle_trusted_for_notices 1 while the bundle held is young "
            "enough to vouch for notice keys",
            "# TYPE sco_agent_bundle_trusted_for_notices gauge",
            f"sco_agent_bundle_trusted_for_notices{{{n}}} {int(self.bundle_trusted_for_notices)}",
        ]
        return "\n".join(out) + "\n"

    def write(self) -> None:
        """Atomically (a rename): the collector never reads half a file."""
        if self._path is None:
            return
        with self._lock:
            tmp = self._path.with_name(f".{self._path.name}.{os.getpid()}.tmp")
            try:
                self._path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(self.render())
                os.replace(tmp, self._path)
            except OSError as exc:  # metrics never stop a drain
                log.warning("metrics textfile %s not written: %s", self._path, exc)
