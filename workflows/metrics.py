"""SCO's own Prometheus counters, from workflow code.

They go out with Temporal's runtime metrics (the worker's `worker.metrics_port`); the SDK
skips metrics while replaying, so a replayed history never counts twice.
"""

from __future__ import annotations

from temporalio import workflow


def count(name: str, description: str, value: int = 1, **labels: str) -> None:
    if value > 0:
        workflow.metric_meter().create_counter(name, description).add(value, labels)
