"""`sco notice-relay | reclaim`: the hall's notice relay, and an operator's reclaim."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
import typer

from activities.fleet.repository import FleetRepository, InstanceRow
from contracts.bounded import InputRejected
from contracts.notice import reclaim_subject
from contracts.notice_signing import EARLY_WARNING_HORIZON
from contracts.reclaim import ReclaimReply, ReclaimRequest, parse_reclaim_reply
from workers.cli import audit
from workers.cli.bounds import path_value
from workers.cli.common import (
    console,
    errors_as_exit,
    fail,
    fleet_db,
    known_region,
    print_json,
    print_workflow_link,
    region_or_exit,
    settings,
    workflow_url,
)


def notice_relay(
    region: str = typer.Option(None),
    hall: str = typer.Option(..., help="The hall (A-D)."),
    sweep_seconds: float = typer.Option(1.0, help="How often deadlines are checked."),
) -> None:
    """Run the hall's notice relay: reclaims → notices with a deadline → deletes; until
    SIGTERM/Ctrl-C."""
    # `sco notice-relay` starts it without typer (workers/cli/entry.py); the same checks.
    from workers.cli.notice_relay import StartError, start

    try:
        start(region, hall, sweep_seconds)
    except StartError as exc:
        fail(str(exc))


def _owners(rows: list[InstanceRow]) -> str:
    return ", ".join(sorted({f"{r.workload} via {r.acquisition_id or '?'}" for r in rows}))


_RELATIVE = re.compile(r"^\+(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_at(text: str, now: datetime) -> datetime:
    """`--at`: ISO-8601 with a timezone (2026-12-02T10:00:00Z) or from now (+15m, +2h,
    +1d); in the future and within the early-warning horizon. ValueError: one line."""
    match = _RELATIVE.match(text.strip())
    if match:
        at = now + timedelta(**{_UNITS[match[2]]: int(match[1])})
    else:
        try:
            at = datetime.fromisoformat(text.strip())
        except ValueError:
            raise ValueError(
                f"--at {text!r}: not ISO-8601 (2026-12-02T10:00:00Z) nor +N[smhd] (+15m)"
            ) from None
        if at.tzinfo is None:
            raise ValueError(f"--at {text!r}: no timezone; add Z or an offset like +01:00")
    if at <= now:
        raise ValueError(f"--at {text!r}: {at.isoformat()} is not in the future")
    if at > now + EARLY_WARNING_HORIZON:
        raise ValueError(
            f"--at {text!r}: more than {EARLY_WARNING_HORIZON.days} days ahead "
            "(nodes refuse early warnings that far out)"
        )
    return at.astimezone(UTC)


def reclaim(
    target: str = typer.Argument(..., help="An instance name, or a pool id with --pool."),
    pool: bool = typer.Option(False, "--pool", help="TARGET is a pool: reclaim all of it."),
    reason: str = typer.Option("operator reclaim", help="Why (recorded in the ledger)."),
    region: str = typer.Option(None),
    by: str | None = audit.ByOpt,
    force: bool = typer.Option(
        False, "--force", help="Also reclaim committed capacity (a floor's, a fallback's)."
    ),
    at: str | None = typer.Option(
        None,
        "--at",
        help="Plan the reclaim for TIME (ISO-8601 with zone, or +15m/+2h/+1d): an early "
        "warning now, the hard notice at TIME minus the region's notice lead.",
    ),
    json_out: bool = typer.Option(False, "--json", help="The relay's answer as JSON."),
) -> None:
    """Ask the hall's notice relay to reclaim an instance or a whole pool (recorded).

    Committed instances (a tier-1 floor, a paid fallback) are refused unless --force: a
    reclaim there drops a floor below its size until the keeper has rebuilt it (the relay
    enforces it on each instance it acts on; this command only answers sooner). With
    --at the reclaim is planned: nodes hear a signed early warning at once, the
    controller starts replacements, and the hard notice follows with the region's lead."""
    from activities.decisions import DecisionKind
    from activities.events import TERMINAL_STATES, CapacityType, InstanceState
    from contracts.pool_id import PoolId
    from workers.cli import bounds
    from workers.client_security import nats_options
    from workflows.exclusion.models import exclusion_workflow_id

    try:
        planned_at = parse_at(at, datetime.now(UTC)) if at is not None else None
    except ValueError as exc:
        fail(str(exc))
    s = settings()
    region_id = known_region(s, region)
    if not pool:
        bounds.identifier("TARGET", target)
    reason = bounds.text("--reason", reason)
    operator = audit.who(by)
    decision = audit.operator_decision(
        s,
        region=region_id,
        kind=DecisionKind.RECLAIM,
        subject=target,
        outcome="reclaimed",
        by=operator,
        reason=reason,
    )
    with fleet_db(s) as db:
        repo = FleetRepository(db)
        if pool:
            try:
                pid = PoolId.parse(target)
            except ValueError as exc:
                fail(f"{exc}; a pool id is {region_id}.<hall>.<sku>.<size>")
            if pid.region != region_id:
                fail(f"{target}: a pool id is {region_id}.<hall>.<sku>.<size>")
            hall = pid.hall
            live = [InstanceState.ACTIVE, InstanceState.NOTICED, InstanceState.DRAINING]
            committed = [
                r
                for r in repo.list_instances(region_id, live, hall=hall)
                if r.pool_id == target and r.capacity_type is CapacityType.COMMITTED
            ]
            if committed and not force:
                fail(
                    f"{target}: holds {len(committed)} committed instance(s) "
                    f"({_owners(committed)}); refused without --force"
                )
            req = ReclaimRequest(
                pool_id=target, reason=reason, requested_by=operator, at=planned_at, force=force
            )
            pool_id = target
        else:
            row = repo.get_instance(target)
            if row is None:
                fail(f"{target}: no such instance in fleet state")
            if row.region != region_id:
                fail(f"{target}: an instance of region {row.region}, not {region_id}")
            if row.state in TERMINAL_STATES:
                fail(f"{target}: already {row.state.value}; nothing to reclaim")
            if row.capacity_type is CapacityType.COMMITTED and not force:
                fail(
                    f"{target}: committed capacity ({_owners([row])}); a reclaim drops it "
                    "below its floor until rebuilt; refused without --force"
                )
            hall = row.hall
            pool_id = row.pool_id
            req = ReclaimRequest(
                instances=[target],
                reason=reason,
                requested_by=operator,
                at=planned_at,
                force=force,
            )

    wait = bounds.NATS_REQUEST_SECONDS

    async def ask() -> ReclaimReply:
        try:
            nc = await nats.connect(
                s.nats_url,
                connect_timeout=bounds.NATS_CONNECT_SECONDS,
                allow_reconnect=False,
                max_reconnect_attempts=0,
                **nats_options(s),
            )
        except (nats.errors.Error, OSError) as exc:
            fail(f"NATS at {s.nats_url} does not answer: {exc or type(exc).__name__}")
        try:
            msg = await nc.request(
                reclaim_subject(region_id, hall), req.model_dump_json().encode(), timeout=wait
            )
            return parse_reclaim_reply(msg.data)
        except InputRejected as exc:
            fail(f"the notice relay for {region_id}/{hall} answered what is not a reply: {exc}")
        except nats.errors.NoRespondersError:
            fail(
                f"no notice relay runs for {region_id}/{hall}; start "
                f"`sco notice-relay --region {region_id} --hall {hall}`"
            )
        except nats.errors.TimeoutError:
            fail(
                f"the notice relay for {region_id}/{hall} did not answer within {wait:g} s; it may "
                f"still act on the request: `sco instances list --region {region_id}` shows "
                "which instances are noticed"
            )
        finally:
            await nc.close()

    with errors_as_exit(nats.errors.Error, OSError):
        answer = asyncio.run(ask())
    # `error` set: the relay noticed nothing (a bad request, or it is degraded).
    if answer.error is not None:
        fail(f"{region_id}/{hall}: {answer.error}")
    summary = answer.summary()
    audit.record(s, decision.model_copy(update={"reason": f"{reason} ({summary})"}))
    if json_out:
        print_json(
            {
                "region": region_id,
                "hall": hall,
                "pool_id": pool_id,
                "summary": summary,
                **answer.model_dump(mode="json"),
                "exclusion_ui_url": workflow_url(s, region_id, exclusion_workflow_id(pool_id)),
            }
        )
        return
    console.print(summary)
    # The relay tells the pool's exclusion cycle about each notice: that is where it shows.
    console.print(f"exclusion cycle of {pool_id}:")
    print_workflow_link(s, region_id, exclusion_workflow_id(pool_id))


def nats_users(
    out: Path = typer.Option(
        ..., help="users.conf to write (0600), beside sco-nats.conf.", parser=path_value
    ),
    secrets_dir: Path = typer.Option(
        ..., "--secrets", help="<user>.password files (made when missing, 0600).", parser=path_value
    ),
    node: list[str] = typer.Option(
        [], help="HALL/NODE of each node whose agent gets a user (repeat)."
    ),
    region: str = typer.Option(None),
    json_out: bool = typer.Option(False, "--json", help="What was written, as JSON."),
) -> None:
    """Render the region's NATS users with least-privilege permissions (deploy/nats/)."""
    from workers.cli import bounds
    from workers.nats_permissions import region_users, write_users

    region_model = region_or_exit(settings(), region)
    bounds.out_file("--out", out)
    bounds.out_dir("--secrets", secrets_dir)
    pairs = []
    for entry in node:
        hall, _, name = entry.partition("/")
        if hall not in region_model.halls or not name:
            fail(f"--node {entry!r}: expected HALL/NODE with HALL one of {region_model.halls}")
        bounds.identifier("--node", name, max_len=253)
        pairs.append((hall, name))
    try:
        users = region_users(region_model.id, region_model.halls, pairs)
    except ValueError as exc:
        fail(f"--node: {exc}")
    write_users(out, users, secrets_dir)
    if json_out:
        print_json(
            {
                "region": region_model.id,
                "users_conf": str(out),
                "users": len(users),
                "secrets": str(secrets_dir),
            }
        )
        return
    console.print(f"{out}: {len(users)} users for {region_model.id}, passwords in {secrets_dir}")
