"""Operator actions the CLI performs itself (not through a workflow), as ledger decisions.

Workflow-side actions (pause, resume, cancel, approve, hall, pool) are recorded by their
workflows; these are recorded here, through the same fleet-state outbox, with the free-text
`--by`, the authenticated identity where there is one, the reason and the time.
"""

from __future__ import annotations

import getpass
from typing import TYPE_CHECKING

import typer

from activities.decisions import Decision, DecisionKind
from workers.cli.common import fail, fleet_db
from workers.operator_identity import IdentityError, operator_identity
from workers.settings import Settings

if TYPE_CHECKING:
    # The database client loads with the first record (read-only commands of the modules
    # that import this one, `sco acquisitions list` say, never open fleet state).
    from psycopg_pool import ConnectionPool

ByOpt = typer.Option(None, "--by", help="Who does this (recorded; default: your login name).")
ReasonOpt = typer.Option(None, "--reason", help="Why (recorded in the ledger).")


def who(by: str | None) -> str:
    """`--by` when given (checked: printable, non-empty, bounded), else the login name."""
    from workers.cli import bounds

    return getpass.getuser() if by is None else bounds.text("--by", by, max_len=bounds.MAX_ID)


def why(reason: str | None) -> str:
    """`--reason` when given (checked: printable, non-empty, bounded), else empty."""
    from workers.cli import bounds

    return "" if reason is None else bounds.text("--reason", reason)


def identity(s: Settings) -> str:
    """The operator's authenticated identity, or a one-line error when it cannot be read."""
    try:
        return operator_identity(s)
    except IdentityError as exc:
        fail(f"temporal.tls.client_cert_file: {exc}")


def operator_decision(
    s: Settings,
    *,
    region: str,
    kind: DecisionKind,
    subject: str,
    outcome: str,
    by: str,
    reason: str,
    units: int = 0,
) -> Decision:
    return Decision(
        region=region,
        kind=kind,
        subject=subject,
        outcome=outcome,
        actor=by,
        identity=identity(s),
        reason=reason,
        units=units,
    )


def record(s: Settings, decision: Decision, pool: ConnectionPool | None = None) -> None:
    """Queue the decision for the ledger (on `pool`, else a connection of its own)."""
    from activities.fleet.control_state import ControlRepository

    if pool is not None:
        ControlRepository(pool).record_decision(decision)
        return
    with fleet_db(s) as own:
        ControlRepository(own).record_decision(decision)
