"""`sco dev certs node | revoke | crl | list`: the secure box's identities (decisions 0024,
0038).

A node's agent gets a certificate of the box's issuer whose URI SAN is its SPIFFE ID and a
NATS user mapped from it; a revoked identity maps to no user, so the box's NATS refuses it
from the reload these commands trigger on.
"""

from __future__ import annotations

import typer

from workers.cli.common import console, errors_as_exit, print_json, settings, table
from workers.devbox.box import Box
from workers.devbox.identities import node_kind
from workers.devbox.pki import spiffe_id
from workers.devbox.process import DevboxError

app = typer.Typer(
    help="The secure box's identities: enrol a node's agent, revoke an identity.",
    no_args_is_help=True,
)


def _secure_box() -> Box:
    with errors_as_exit(DevboxError):
        box = Box(settings())
        if box.secure is None:
            raise DevboxError(
                "the box runs the default profile: no TLS identities (`sco dev up --profile "
                "secure`, or box.profile = secure)"
            )
    return box


def _reloaded(box: Box) -> str:
    with errors_as_exit(DevboxError):
        pid = box.reload_nats()
    return f"NATS (pid {pid}) reloaded" if pid else "NATS not running: applies at its next start"


@app.command()
def node(
    name: str = typer.Argument(..., help="The node's id (its agent's node_id)."),
    hall: str = typer.Option(..., "--hall", help="The node's hall."),
    region: str | None = typer.Option(None, "--region", help="Default: the settings' region."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Enrol a node: its agent's certificate (SPIFFE ID spiffe://sco/<region>/node/<name>)
    and NATS user with the agent's permissions. Prints the files to install as the agent's
    nats_tls_cert, nats_tls_key and nats_tls_ca."""
    box = _secure_box()
    assert box.secure is not None
    r = region or box.s.region
    with errors_as_exit(DevboxError):
        issued = box.secure.enrol_node(r, hall, name)
    nats = _reloaded(box)
    doc = {
        "identity": spiffe_id(node_kind(name), r),
        "nats_tls_cert": str(issued.cert_path),
        "nats_tls_key": str(issued.key_path),
        "nats_tls_ca": str(box.secure.issuer.ca_file),
        "nats_url": f"tls://localhost:{box.secure.nats_port}",
    }
    if as_json:
        print_json(doc)
        return
    for k, v in doc.items():
        console.print(f"{k} = {v}")
    console.print(nats)


@app.command()
def revoke(
    identity: str = typer.Argument(..., help="A SPIFFE ID, e.g. spiffe://sco/r1/node/n1."),
    reason: str = typer.Option("", "--reason", help="Recorded with the revocation."),
) -> None:
    """Revoke an identity: the box's NATS maps no user to it any more and reloads, which
    refuses its certificate and closes its live connections; its certificates' serials go
    into the issuing CA's CRL, which the box's PostgreSQL and nginx (Temporal) reload, so
    they refuse it too. Idempotent."""
    box = _secure_box()
    assert box.secure is not None
    with errors_as_exit(DevboxError):
        box.secure.revoke(identity, reason)
    nats = _reloaded(box)
    with errors_as_exit(DevboxError):
        crl = box.reload_crl()
    console.print(f"revoked {identity}; {nats}; {'; '.join(crl)}")


@app.command()
def crl() -> None:
    """Write the box's CRL file again (each CA's CRL, renewed when near its next update)
    and reload the box's PostgreSQL and nginx if it changed (decision 0038)."""
    box = _secure_box()
    assert box.secure is not None
    with errors_as_exit(DevboxError):
        lines = box.reload_crl()
    console.print(f"{box.secure.crl_detail()}; {'; '.join(lines)}")


@app.command("list")
def list_(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Enrolled nodes, revoked identities with their certificates' serials, and the CRL."""
    box = _secure_box()
    assert box.secure is not None
    with errors_as_exit(DevboxError):
        nodes = box.secure.identities.nodes()
        revoked = box.secure.identities.revoked()
    if as_json:
        print_json(
            {
                "nodes": [n.model_dump(mode="json") for n in nodes],
                "revoked": [r.model_dump(mode="json") for r in revoked],
            }
        )
        return
    gone = {r.identity for r in revoked}
    table(
        "enrolled nodes",
        ["region", "hall", "node", "identity", "state"],
        [
            [
                n.region,
                n.hall,
                n.node,
                (i := spiffe_id(node_kind(n.node), n.region)),
                "revoked" if i in gone else "active",
            ]
            for n in nodes
        ],
    )
    table(
        "revoked identities",
        ["identity", "revoked at", "reason", "serials in a CRL (issuer)"],
        [
            [
                r.identity,
                r.revoked_at.isoformat(),
                r.reason,
                ", ".join(f"{c.serial} ({c.issuer})" for c in r.certificates) or "-",
            ]
            for r in revoked
        ],
    )
    console.print(box.secure.crl_detail())
