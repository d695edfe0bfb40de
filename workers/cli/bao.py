"""`sco dev bao status | provision | issue`: the OpenBao of `openbao.address`.

With the box's defaults these reach the server `sco dev up` runs, with its CA and root
token; set `openbao.ca_file` and `openbao.token_file` to use another server.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from workers.cli import bounds
from workers.cli.common import (
    console,
    errors_as_exit,
    fail,
    known_region,
    print_json,
    settings,
    shown,
)
from workers.devbox.openbao import box_plan, client, describe
from workers.devbox.process import DevboxError
from workers.openbao.client import BaoError
from workers.openbao.plan import PROCESS_KINDS, PlanError, check_name
from workers.openbao.provision import issue as issue_certificate
from workers.openbao.provision import provision as apply_plan

app = typer.Typer(
    help="OpenBao: seal state, idempotent provisioning, SPIFFE certificates.",
    no_args_is_help=True,
)


@app.command()
def status(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Whether the server answers, is initialised and unsealed, and where. Exit 1 unless
    it is unsealed."""
    s = settings()
    with errors_as_exit(BaoError):
        st = client(s, with_token=False).seal_status()
    doc = {
        "address": s.openbao.address,
        "initialized": st.initialized,
        "sealed": st.sealed,
        "version": st.version,
    }
    if as_json:
        print_json(doc)
    else:
        state = "sealed" if st.sealed else "unsealed"
        if not st.initialized:
            state = "not initialised"
        console.print(f"OpenBao {st.version} at {s.openbao.address}: {state}")
    if st.sealed or not st.initialized:
        raise typer.Exit(1)


@app.command()
def provision(as_json: bool = typer.Option(False, "--json", help="The changes as JSON.")) -> None:
    """Lay SCO's mounts, CAs, roles, policies, secrets and relay keys over the server;
    only what differs changes (a second run changes nothing)."""
    s = settings()
    with errors_as_exit(BaoError, DevboxError, PlanError):
        changes = apply_plan(client(s), box_plan(s))
    if as_json:
        print_json({"changes": [{"what": c.what, "path": c.path} for c in changes]})
        return
    for c in changes:
        console.print(f"  {c}")
    console.print(describe(changes))


@app.command()
def issue(
    kind: str = typer.Option(..., "--kind", help=f"One of: {', '.join(PROCESS_KINDS)}."),
    out: Path = typer.Option(
        ..., "--out", help="Directory for cert.pem, key.pem and ca.pem (each 0600)."
    ),
    region: str | None = typer.Option(None, "--region", help="Default: the settings' region."),
    instance: str | None = typer.Option(
        None,
        "--instance",
        help="notice-relay: its hall; agent: its node. The SPIFFE ID's last segment.",
    ),
    ttl: int | None = typer.Option(
        None, "--ttl", help="Seconds (60 to 86400); default: the role's, one hour."
    ),
    as_json: bool = typer.Option(False, "--json", help="SPIFFE ID, serial and files as JSON."),
) -> None:
    """Issue a certificate with the kind's SPIFFE ID from the region's intermediate CA."""
    s = settings()
    r = known_region(s, region)
    if kind not in PROCESS_KINDS:
        fail(f"--kind {shown(kind)}: not one of {', '.join(PROCESS_KINDS)}")
    if instance is not None:
        with errors_as_exit(PlanError):
            check_name("--instance", bounds.text("--instance", instance, max_len=63))
    if out.exists() and not out.is_dir():
        fail(f"--out {shown(str(out))}: exists and is not a directory")
    with errors_as_exit(BaoError, PlanError):
        got = issue_certificate(client(s), r, kind, instance=instance, ttl_s=ttl)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    files = {"cert.pem": got.certificate + "\n", "key.pem": got.private_key + "\n"}
    files["ca.pem"] = got.ca_chain
    for name, text in files.items():
        path = out / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        path.chmod(0o600)
    if as_json:
        print_json(
            {
                "spiffe_id": got.spiffe_id,
                "serial": got.serial,
                "expires_at": got.expires_at,
                "files": [str(out / n) for n in files],
            }
        )
        return
    console.print(f"{got.spiffe_id}: serial {got.serial}, written to {out}")
