"""`sco keys`: the notice relays' per-hall signing keys (contracts/notice_scopes.py).

A rotation, with no relay or agent restart:
1. `sco keys relay-new --region r1 --hall A`: a new key pair; its .pub and its hall go into
   the notice keys directory the bundles are compiled from.
2. Publish a bundle with it (`sco contracts compile --notice-keys` + `publish`, or the
   contract sync) and wait until the nodes hold it (`sco contracts status`).
3. Install the new private key as hall A's relay key file (`notices.hall_key_files.A`):
   the relay signs with it from its next notice (it re-reads the file on change/SIGHUP).
4. `sco keys relay-retire --region r1 --key OLD`: the old key's `not_after` becomes now +
   the region's notice lead + the clock skew margin (its last notices verify until their
   deadline); publish again. Bundles compiled after that time leave it out.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import typer

from contracts import keys
from contracts.notice_scopes import (
    SCOPES_FILE,
    add_key,
    hall_keys,
    read_scopes,
    retire_key,
    retirement_time,
)
from contracts.notice_signing import DEFAULT_MARGIN
from workers.cli import bounds
from workers.cli.bounds import path_value
from workers.cli.common import console, fail, print_json, region_or_exit, settings, table

app = typer.Typer(
    help="Notice relays' per-hall signing keys: make, retire, list.", no_args_is_help=True
)
JsonOpt = typer.Option(False, "--json", help="The answer as JSON (its schema: docs/reference.md).")
NoticeKeysOpt = typer.Option(
    None,
    "--notice-keys",
    help="The notice keys directory bundles are compiled from (<region>/<key id>.pub and "
    "<region>/scopes.yaml); default: contracts.notice_keys_dir.",
    parser=path_value,
)


def _keys_dir(given: Path | None) -> Path:
    found = given if given is not None else settings().contracts.notice_keys_dir
    if found is None:
        fail("--notice-keys: not given and contracts.notice_keys_dir is not set")
    return found


@app.command("relay-new")
def relay_new(
    hall: str = typer.Option(..., help="The hall whose relay will sign with the key."),
    out: Path = typer.Option(
        ..., "--out", help="Directory for the private key (<key id>.key, 0600).", parser=path_value
    ),
    region: str = typer.Option(None),
    notice_keys: Path = NoticeKeysOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Make a key for one hall's notice relay: the private key into --out, its .pub and
    its hall into the notice keys directory (published with the next bundle)."""
    region_model = region_or_exit(settings(), region)
    if hall not in region_model.halls:
        fail(f"--hall {hall!r}: region {region_model.id} has halls {', '.join(region_model.halls)}")
    keys_dir = _keys_dir(notice_keys)
    bounds.out_dir("--notice-keys", keys_dir)
    bounds.out_dir("--out", out)
    region_dir = keys_dir / region_model.id
    try:
        others = hall_keys(region_dir, hall)  # reads scopes.yaml: refused before any write
        region_dir.mkdir(parents=True, exist_ok=True)
        kid, private, public = keys.generate(out)
        shutil.copyfile(public, region_dir / public.name)
        add_key(region_dir, kid, [hall])
    except (OSError, ValueError) as exc:
        fail(str(exc))
    if json_out:
        print_json(
            {
                "key_id": kid,
                "region": region_model.id,
                "hall": hall,
                "private": str(private),
                "public": str(region_dir / public.name),
                "still_signing": others,
            }
        )
        return
    console.print(
        f"key {kid} for {region_model.id}/{hall}\n"
        f"  private: {private} (keep secret; hall {hall}'s relay key file)\n"
        f"  public:  {region_dir / public.name}, halls in {region_dir / SCOPES_FILE}\n"
        "next: publish a bundle with it, wait until nodes hold it (`sco contracts status`), "
        f"then install the private key as notices.hall_key_files.{hall}"
        + (
            f"; then `sco keys relay-retire --region {region_model.id} --key {others[0]}`"
            if others
            else ""
        )
    )


@app.command("relay-retire")
def relay_retire(
    key: str = typer.Option(..., "--key", help="The key id to retire."),
    at: datetime = typer.Option(
        None,
        "--at",
        help="When nodes stop accepting it (ISO 8601 with zone); default: now + the "
        "region's notice lead + the clock skew margin (its last notices stay valid).",
    ),
    region: str = typer.Option(None),
    notice_keys: Path = NoticeKeysOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Retire a relay key: nodes refuse what it signs after its not_after, and bundles
    compiled after that leave it out. Run once its hall's relay signs with the new key."""
    region_model = region_or_exit(settings(), region)
    bounds.identifier("--key", key)
    region_dir = _keys_dir(notice_keys) / region_model.id
    bounds.in_dir("--notice-keys", region_dir)
    now = datetime.now(UTC)
    if at is not None and at.tzinfo is None:
        fail(f"--at {at.isoformat()}: no timezone; add Z or an offset like +01:00")
    when = (
        at.astimezone(UTC)
        if at is not None
        else retirement_time(now, region_model.notice_lead_seconds, DEFAULT_MARGIN)
    )
    if at is not None and when < now + timedelta(seconds=region_model.notice_lead_seconds):
        console.print(
            f"[yellow]--at {when.isoformat()} is sooner than now + the notice lead "
            f"({region_model.notice_lead_seconds} s): notices it signed last may be refused "
            "before their deadline[/]"
        )
    try:
        retire_key(region_dir, key, when)
    except (OSError, ValueError) as exc:
        fail(str(exc))
    if json_out:
        print_json({"key_id": key, "region": region_model.id, "not_after": when.isoformat()})
        return
    console.print(
        f"key {key} of {region_model.id}: not_after {when.isoformat()}; publish a bundle "
        "for nodes to learn it"
    )


@app.command("relay-list")
def relay_list(
    region: str = typer.Option(None),
    notice_keys: Path = NoticeKeysOpt,
    json_out: bool = JsonOpt,
) -> None:
    """The region's relay keys: which halls each signs for and when it retires (as the
    next bundle will carry them)."""
    region_model = region_or_exit(settings(), region)
    region_dir = _keys_dir(notice_keys) / region_model.id
    bounds.in_dir("--notice-keys", region_dir)
    try:
        trust = keys.TrustStore.load(region_dir)
    except keys.KeyFileError as exc:
        fail(str(exc))
    live = {k for k in trust.keys if k not in trust.revoked}
    scopes, findings = read_scopes(region_dir, region_model, live)
    problems = [str(f) for f in findings]
    rows = []
    for kid in sorted(trust.keys):
        scope = scopes.get(kid) if scopes is not None else None
        rows.append(
            {
                "key_id": kid,
                "halls": "all" if scopes is None else ",".join(scope.halls) if scope else "",
                "not_after": scope.not_after.isoformat() if scope and scope.not_after else "",
                "revoked": kid in trust.revoked,
            }
        )
    if json_out:
        print_json({"region": region_model.id, "keys": rows, "problems": problems})
        return
    table(
        f"notice relay keys of {region_model.id}",
        ["key id", "halls", "not after", "revoked"],
        [[r["key_id"], r["halls"] or "(none)", r["not_after"], r["revoked"]] for r in rows],
    )
    for line in problems:
        console.print(f"[yellow]{line}[/]")
