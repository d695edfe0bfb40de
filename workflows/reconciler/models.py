"""Inputs, outputs and queries of the region's reconciler.

New fields always get defaults, so histories recorded before them still decode.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

#: Handler names, used by the workflow's decorators and by every client. Running
#: workflows answer to these strings: never rename one.
LAST_REPORT_QUERY = "last_report"


def reconciler_workflow_id(region: str) -> str:
    return f"reconciler-{region}"


class ReconcilerConfig(BaseModel):
    interval_seconds: float = Field(default=300.0, gt=0)
    # Provider-only things younger than this are left alone (a create or a lease on its way
    # into fleet state); fleet-only rows likewise.
    grace_seconds: float = Field(default=900.0, ge=0)
    # Fallback leases in use are extended by lease_hours when they end within this.
    renew_before_hours: float = Field(default=6.0, ge=0)
    lease_hours: float = Field(default=24.0, gt=0)
    passes_per_run: int = Field(default=100, ge=1)


class ReconcilerInput(BaseModel):
    region: str
    config: ReconcilerConfig = ReconcilerConfig()
    dry_run: bool = False  # find and report, change nothing
    once: bool = False  # one pass, then return its report (`sco reconcile`)
    budget_counter: int = 0  # carried over continue-as-new


class ReconcileReport(BaseModel):
    region: str
    at: datetime | None = None
    dry_run: bool = False
    orphan_servers: list[str] = []  # "<name> (<provider id>)"
    orphan_leases: list[str] = []  # lease names
    ghosts: list[str] = []  # instance ids
    renewed: list[str] = []  # lease names
    deleted_servers: int = 0
    deleted_leases: int = 0
    marked_lost: int = 0
    passes: int = 0
