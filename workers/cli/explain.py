"""`sco explain contract | instance | pool`: why, from what SCO recorded (activities/explain.py).

Also the DRIFT column of `sco instances list` (`drift_of`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import typer

from workers.cli.common import console, fail, fleet_db, known_region, print_json, settings

if TYPE_CHECKING:
    from pydantic import BaseModel

    from activities.explain import ExplainSources
    from activities.fleet.repository import InstanceRow
    from workers.settings import Settings

JsonOpt = typer.Option(False, "--json", help="The answer as JSON (its schema: docs/reference.md).")

app = typer.Typer(
    help="Why: a contract short, an instance running, a pool excluded (from recorded reasons).",
    no_args_is_help=True,
)


def drift_of(s: Settings, rows: Sequence[InstanceRow]) -> dict[str, str] | None:
    """Drift reason by instance id for the drifted ones among `rows`; None without a valid
    installed bundle (drift unknown)."""
    from contracts.bundle import installed_bundle
    from planning.drift import fleet_drift

    bundle, _ = installed_bundle(s.bundle_cache_dir, s.trust_dir)
    if bundle is None:
        return None
    verdicts = fleet_drift(bundle.content.contracts, rows)
    return {k: v.why for k, v in verdicts.items() if v.drifted}


@contextmanager
def _sources() -> Iterator[tuple[ExplainSources, list[str]]]:
    """Fleet state (required), the bundle and the ledger (each said when missing)."""
    from activities.explain import ExplainSources
    from activities.ledger.store import LedgerStore, LedgerUnavailable
    from contracts.bundle import installed_bundle
    from workers.client_security import ledger_options

    s = settings()
    notes: list[str] = []
    bundle, problem = installed_bundle(s.bundle_cache_dir, s.trust_dir)
    if bundle is None:
        notes.append(problem)
    ledger: LedgerStore | None = None
    try:
        ledger = LedgerStore(s.effective_ledger_dsn, client_options=ledger_options(s))
    except LedgerUnavailable as exc:
        notes.append(f"{exc}: no recorded decisions or reclaims shown")
    try:
        with fleet_db(s) as pg:
            yield ExplainSources(pg=pg, bundle=bundle, ledger=ledger, now=datetime.now(UTC)), notes
    except LedgerUnavailable as exc:
        fail(str(exc))
    finally:
        if ledger is not None:
            ledger.close()


def _show(title: str, answer: BaseModel, why: list[str], notes: list[str], as_json: bool) -> None:
    if as_json:
        print_json(answer.model_dump(mode="json") | {"notes": notes})
        return
    console.print(f"[bold]{title}[/bold]")
    for line in why:
        console.print(f"  - {line}", markup=False, highlight=False)
    for note in notes:
        console.print(f"  (note: {note})", markup=False, highlight=False)


@app.command("contract")
def contract(
    name: str = typer.Argument(..., help="The contract's name."),
    region: str = typer.Option(None, help="Region; default from settings."),
    as_json: bool = JsonOpt,
) -> None:
    """Short by how much and why: caps, excluded pools, no free capacity, fallback waiting
    for approval or declined, acquisitions in flight; budgets and drift."""
    from activities.explain import explain_contract
    from workers.cli import bounds

    name = bounds.identifier("NAME", name)
    r = known_region(settings(), region)
    with _sources() as (src, notes):
        out = explain_contract(src, r, name)
    if not out.in_bundle and not out.demand_units:
        fail(f"no contract {name!r} in the installed bundle and no demand for it in {r}")
    why = list(out.why)
    if out.in_bundle and not as_json:
        why.append(
            "voluntary disruption now: "
            + ", ".join(
                f"{b.reason} {'unlimited' if b.allowed is None else b.allowed}" for b in out.budgets
            )
        )
        if out.drifted:
            why.append(f"drifted instances: {len(out.drifted)} (sco explain instance ID)")
        shown = "\n".join(why)
        for d in out.decisions[:5]:
            said = f"{d.kind} {d.outcome}" + (f": {d.reason}" if d.reason else "")
            if said not in shown:  # the reasons above already quote it
                why.append(f"recorded {d.occurred_at:%Y-%m-%d %H:%M} {said}")
    _show(f"contract {name} in {r}", out, why, notes, as_json)


@app.command("instance")
def instance(
    instance_id: str = typer.Argument(..., help="The instance id (its provider-side name)."),
    as_json: bool = JsonOpt,
) -> None:
    """Why it exists (the acquisition or floor that made it, the decisions), why its pool was
    chosen over the others (the reasons recorded with its acquisition) and what would
    release it."""
    from activities.explain import explain_instance
    from workers.cli import bounds

    instance_id = bounds.identifier("INSTANCE_ID", instance_id)
    with _sources() as (src, notes):
        out = explain_instance(src, instance_id)
    if not out.found:
        fail(f"no instance {instance_id!r} in fleet state")
    why = list(out.why)
    if not as_json:
        why += [f"released by: {line}" for line in out.released_by]
        why += [f"history: {line}" for line in out.history[-5:]]
    _show(f"instance {instance_id}", out, why, notes, as_json)


@app.command("pool")
def pool(
    pool_id: str = typer.Argument(..., help="The pool: region.hall.sku.size, e.g. r1.A.gp.xl."),
    as_json: bool = JsonOpt,
) -> None:
    """Its exclusion state and why, reclaims, price, who uses it and which contracts may,
    and when an acquisition last passed it over and why."""
    from activities.explain import explain_pool
    from contracts.pool_id import PoolId

    try:
        parsed = PoolId.parse(pool_id)
    except ValueError as exc:
        fail(f"POOL_ID: {exc}")
    known_region(settings(), parsed.region)
    with _sources() as (src, notes):
        out = explain_pool(src, pool_id)
    if not out.found:
        fail(out.why[0])
    why = list(out.why)
    if not as_json:
        why += [
            f"recorded {d.occurred_at:%Y-%m-%d %H:%M} {d.kind} {d.outcome}"
            + (f": {d.reason}" if d.reason else "")
            for d in out.decisions[:5]
        ]
    _show(f"pool {pool_id}", out, why, notes, as_json)
