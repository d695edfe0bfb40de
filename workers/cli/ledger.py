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
from activities.ledger.lost_work import DrainEventError, insert_drain, lost_work, rows_from_drain
from workers.cli.bounds import path_value
from workers.cli.common import (
    console,
    errors_as_exit,
    fail,
    known_region,
    print_json,
    settings,
    shown,
    table,
)
from workers.client_security import (
    ledger_options,
)

app = typer.Typer(help="Spend and reclaim history in the ClickHouse ledger.", no_args_is_help=True)

_WINDOW = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


#: The longest look back: the ledger keeps about a year.
MAX_WINDOW = timedelta(days=400)


def parse_window(text: str, maximum: timedelta = MAX_WINDOW) -> timedelta:
    match = _WINDOW.match(text)
    if not match or len(text) > 12:
        raise typer.BadParameter(f"{text!r}: expected a number and a unit, e.g. 90m, 24h, 7d")
    window = timedelta(**{_UNITS[match[2]]: min(int(match[1]), 10**9)})
    if not timedelta(0) < window <= maximum:
        raise typer.BadParameter(f"{text!r}: between 1s and {maximum.days}d")
    return window


def _region(region: str | None) -> str | None:
    """--region when given: a configured region (no default: every region)."""
    return None if region is None else known_region(settings(), region)


def _shown(path: Path) -> str:
    text = str(path)
    return ascii(text if len(text) <= 60 else text[:57] + "...")


def _store() -> closing[LedgerStore]:
    """The ledger for one command; its client closes after."""

    s = settings()
    return closing(LedgerStore(s.effective_ledger_dsn, client_options=ledger_options(s)))


@app.command("spend")
def spend_cmd(
    window: str = typer.Option("24h", help="Look back this far: 90m, 24h, 7d."),
    by: list[str] = typer.Option(["workload"], help=f"Group by: {', '.join(GROUP_KEYS)}."),
    region: str | None = typer.Option(None),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Spend (instance-hours x price) over a window, grouped."""
    bad = [b for b in by if b not in GROUP_KEYS]
    if bad:
        choose = ", ".join(GROUP_KEYS)
        fail(f"--by {', '.join(map(shown, bad))}: not a ledger key; choose from {choose}")
    region = _region(region)
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
    region: str | None = typer.Option(None),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Reclaim notices per pool over a window."""
    region = _region(region)
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
    region: str | None = typer.Option(None),
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
    from activities.decisions import DecisionKind
    from workers.cli import bounds

    region = _region(region)
    if kind is not None and kind not in {k.value for k in DecisionKind}:
        fail(f"--kind {shown(kind)}: one of {', '.join(k.value for k in DecisionKind)}")
    if subject is not None:
        subject = bounds.identifier("--subject", subject)
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
    from services.registry import service

    s = settings()
    with errors_as_exit(LedgerUnavailable):
        p = service("ledger-consumer").load()(s)
    console.print(f"ledger consumer stopped: {p.inserted} inserted, {p.malformed} malformed")


@app.command("book-drains")
def book_drains_cmd(
    region: list[str] = typer.Option(
        None, help="The regions whose drain reports to book (default: every region)."
    ),
) -> None:
    """Book node agents' drain reports from NATS into the ledger until stopped (SIGTERM/Ctrl-C)."""
    import asyncio

    from services.registry import service

    s = settings()
    for r in region or []:
        known_region(s, r)
    progress = asyncio.run(service("drain-intake").load()(s, region or s.regions))
    for name, p in progress.items():
        console.print(
            f"drain intake {name} stopped: {p.booked_reports} reports "
            f"({p.booked_rows} workload outcomes) booked, {p.malformed} malformed "
            f"({p.dead_lettered} dead-lettered)"
        )


@app.command("record-drains")
def record_drains_cmd(
    journal: Path = typer.Argument(
        ..., help="A node agent's drain journal (JSON lines).", parser=path_value
    ),
    region: str = typer.Option(..., help="The node's region."),
    as_json: bool = typer.Option(False, "--json", help="The answer as JSON."),
) -> None:
    """Book the lost work of every drain report in an agent journal (idempotent)."""
    region = known_region(settings(), region)
    if not journal.is_file():
        fail(f"JOURNAL {_shown(journal)}: not a file")
    try:
        lines = journal.read_text().splitlines()
    except OSError as exc:
        fail(f"{journal}: {exc.strerror}")
    # Every line is checked before anything is booked: a bad line books nothing.
    events = []
    for number, line in enumerate(lines, 1):
        try:
            event = json.loads(line)
        except json.JSONDecodeError as exc:
            fail(f"{journal}:{number}: not JSON: {exc.msg}")
        if not isinstance(event, dict) or event.get("event") != "drain_finished":
            continue
        try:
            rows_from_drain(event, region)
        except DrainEventError as exc:
            fail(f"{journal}:{number}: {exc}")
        events.append(event)
    booked = drains = 0
    with errors_as_exit(LedgerUnavailable), _store() as store:
        for event in events:
            booked += insert_drain(store, event, region)
            drains += 1
    if as_json:
        print_json({"drains": drains, "workload_outcomes": booked})
        return
    console.print(f"{drains} drains, {booked} workload outcomes booked")


@app.command("lost-work")
def lost_work_cmd(
    window: str = typer.Option("7d", help="Look back this far: 90m, 24h, 7d."),
    by: str = typer.Option("workload", help=f"Group by: {', '.join(LOST_WORK_BY)}."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Work lost to drains: training steps, Spark tasks rerun, requeued run time."""
    if by not in LOST_WORK_BY:
        fail(f"--by {shown(by)}: choose from {', '.join(LOST_WORK_BY)}")
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
