"""`sco ledger`: spend, reclaim history and work lost to drains; the Kafka → ClickHouse consumer."""

from __future__ import annotations

import json
import re
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import typer

from activities.ledger import (
    GROUP_KEYS,
    LedgerStore,
    LedgerUnavailable,
    decisions,
    reclaims_per_pool,
    spend,
)
from activities.ledger.lost_work import BY as LOST_WORK_BY
from activities.ledger.lost_work import DrainEventError, insert_drain, lost_work
from workers.cli.common import console, errors_as_exit, fail, print_json, settings, table
from workers.client_security import (
    ledger_options,
)

app = typer.Typer(help="Spend and reclaim history in the ClickHouse ledger.", no_args_is_help=True)

_WINDOW = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_window(text: str) -> timedelta:
    match = _WINDOW.match(text)
    if not match:
        raise typer.BadParameter(f"{text!r}: expected a number and a unit, e.g. 90m, 24h, 7d")
    return timedelta(**{_UNITS[match[2]]: int(match[1])})


def _store() -> closing[LedgerStore]:
    """The ledger for one command; its client closes after."""

    s = settings()
    return closing(LedgerStore(s.effective_ledger_dsn, client_options=ledger_options(s)))


@app.command("spend")
def spend_cmd(
    window: str = typer.Option("24h", help="Look back this far: 90m, 24h, 7d."),
    by: list[str] = typer.Option(["workload"], help=f"Group by: {', '.join(GROUP_KEYS)}."),
    region: str = typer.Option(None),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Spend (instance-hours x price) over a window, grouped."""
    bad = [b for b in by if b not in GROUP_KEYS]
    if bad:
        fail(f"--by {', '.join(bad)}: not a ledger key; choose from {', '.join(GROUP_KEYS)}")
    end = datetime.now(UTC)
    start = end - parse_window(window)
    with errors_as_exit(LedgerUnavailable), _store() as store:
        rows = spend(store, start=start, end=end, group_by=by, region=region)
    if as_json:
        print_json([r.model_dump(mode="json") for r in rows])
        return
    table(
        f"spend, last {window}",
        [*by, "instance-hours", "spend"],
        [
            [*(getattr(r, b) for b in by), f"{r.instance_seconds / 3600:.2f}", f"{r.spend:.2f}"]
            for r in rows
        ],
    )


@app.command("reclaims")
def reclaims_cmd(
    window: str = typer.Option("24h", help="Look back this far: 90m, 24h, 7d."),
    region: str = typer.Option(None),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Reclaim notices per pool over a window."""
    end = datetime.now(UTC)
    start = end - parse_window(window)
    with errors_as_exit(LedgerUnavailable), _store() as store:
        rows = reclaims_per_pool(store, start=start, end=end, region=region)
    if as_json:
        print_json([r.model_dump(mode="json") for r in rows])
        return
    table(
        f"reclaims, last {window}",
        ["pool", "notices", "instances"],
        [[r.pool_id, r.reclaims, r.instances] for r in rows],
    )


@app.command("decisions")
def decisions_cmd(
    window: str = typer.Option("24h", help="Look back this far: 90m, 24h, 7d."),
    region: str = typer.Option(None),
    kind: str = typer.Option(
        None,
        help="fallback, acquisition, release, exclusion, floor, demand, budget, reclaim, "
        "contracts.",
    ),
    subject: str = typer.Option(None, help="A contract, pool or instance."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Decisions over a window, newest first: fallback approvals, releases, outcomes, and
    every operator action (by: `--by`, with the certificate subject when there is one)."""
    end = datetime.now(UTC)
    start = end - parse_window(window)
    with errors_as_exit(LedgerUnavailable), _store() as store:
        rows = decisions(store, start=start, end=end, region=region, kind=kind, subject=subject)
    if as_json:
        print_json([r.model_dump(mode="json") for r in rows])
        return
    table(
        f"decisions, last {window}",
        ["when", "kind", "subject", "outcome", "by", "per hour", "units", "reason"],
        [
            [
                f"{r.occurred_at:%Y-%m-%d %H:%M:%S}",
                r.kind.value,
                r.subject,
                r.outcome,
                f"{r.actor} ({r.identity})" if r.identity else r.actor,
                f"{r.amount_per_hour:.2f}",
                r.units,
                r.reason,
            ]
            for r in rows
        ],
    )


@app.command("consume")
def consume_cmd() -> None:
    """Consume lifecycle events into the ledger until stopped (SIGTERM/Ctrl-C)."""
    from workers import ledger_consumer

    s = settings()
    with errors_as_exit(LedgerUnavailable):
        p = ledger_consumer.run(s)
    console.print(f"ledger consumer stopped: {p.inserted} inserted, {p.malformed} malformed")


@app.command("book-drains")
def book_drains_cmd(
    region: list[str] = typer.Option(
        None, help="The regions whose drain reports to book (default: every region)."
    ),
) -> None:
    """Book node agents' drain reports from NATS into the ledger until stopped (SIGTERM/Ctrl-C)."""
    import asyncio

    from workers import drain_intake_service

    s = settings()
    progress = asyncio.run(drain_intake_service.run(s, region or s.regions))
    for name, p in progress.items():
        console.print(
            f"drain intake {name} stopped: {p.booked_reports} reports "
            f"({p.booked_rows} workload outcomes) booked, {p.malformed} malformed"
        )


@app.command("record-drains")
def record_drains_cmd(
    journal: Path = typer.Argument(..., help="A node agent's drain journal (JSON lines)."),
    region: str = typer.Option(..., help="The node's region."),
) -> None:
    """Book the lost work of every drain report in an agent journal (idempotent)."""
    try:
        lines = journal.read_text().splitlines()
    except OSError as exc:
        fail(f"{journal}: {exc.strerror}")
    booked = drains = 0
    with errors_as_exit(LedgerUnavailable), _store() as store:
        for number, line in enumerate(lines, 1):
            try:
                event = json.loads(line)
            except json.JSONDecodeError as exc:
                fail(f"{journal}:{number}: not JSON: {exc.msg}")
            if not isinstance(event, dict) or event.get("event") != "drain_finished":
                continue
            try:
                booked += insert_drain(store, event, region)
            except DrainEventError as exc:
                fail(f"{journal}:{number}: {exc}")
            drains += 1
    console.print(f"{drains} drains, {booked} workload outcomes booked")


@app.command("lost-work")
def lost_work_cmd(
    window: str = typer.Option("7d", help="Look back this far: 90m, 24h, 7d."),
    by: str = typer.Option("workload", help=f"Group by: {', '.join(LOST_WORK_BY)}."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Work lost to drains: training steps, Spark tasks rerun, requeued run time."""
    if by not in LOST_WORK_BY:
        fail(f"--by {by}: choose from {', '.join(LOST_WORK_BY)}")
    end = datetime.now(UTC)
    start = end - parse_window(window)
    with errors_as_exit(LedgerUnavailable), _store() as store:
        rows = lost_work(store, start=start, end=end, by=by)  # type: ignore[arg-type]
    if as_json:
        print_json([r.model_dump(mode="json") for r in rows])
        return
    table(
        f"lost work, last {window}",
        [by, "drains", "workloads", "steps", "tasks", "requeued s", "unknown"],
        [
            [
                r.key,
                r.drains,
                r.workloads,
                r.lost_steps,
                r.lost_tasks,
                f"{r.lost_seconds:.1f}",
                r.unknown,
            ]
            for r in rows
        ],
    )
