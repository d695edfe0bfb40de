"""`sco checkpoints`: per-contract checkpoint storage on Ceph RGW (user, bucket, lifecycle)."""

from __future__ import annotations

from pathlib import Path

import typer

from activities.checkpoints.rgw import (
    Credentials,
    ProvisionError,
    Rgw,
    provision_all,
    read_credentials,
    stored,
    write_credentials,
)
from workers.cli.bounds import path_value
from workers.cli.common import console, fail, print_json, settings, table
from workers.cli.contracts import _verified

app = typer.Typer(help="Checkpoint storage per contract on Ceph RGW (S3).", no_args_is_help=True)

_CREDS = typer.Option(
    Path(".sco/checkpoints"),
    help="Directory of per-contract credentials (<contract>.json, 0600).",
    parser=path_value,
)


@app.command("provision")
def provision_cmd(
    bundle_path: Path = typer.Argument(..., metavar="BUNDLE", parser=path_value),
    trust: Path = typer.Option(
        ..., help="Trust directory: only a bundle that verifies is used.", parser=path_value
    ),
    endpoint: str = typer.Option("http://127.0.0.1:7480", help="RGW's S3 endpoint."),
    ceph_conf: Path = typer.Option(
        Path("/etc/ceph/ceph.conf"), help="ceph.conf for radosgw-admin.", parser=path_value
    ),
    keep_days: int = typer.Option(7, min=1, help="Lifecycle: expire checkpoints after N days."),
    credentials: Path = _CREDS,
    openbao_region: str | None = typer.Option(
        None,
        help="Also keep each contract's keys in OpenBao (openbao.* settings), at "
        "sco/<region>/checkpoints/<contract>, readable with the policy "
        "sco-<region>-checkpoints-<contract> only.",
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Per contract checkpointing to s3://: an RGW user, bucket, lifecycle rule (idempotent)."""
    from workers.cli import bounds

    if (
        not endpoint.startswith(("http://", "https://"))
        or bounds.text("--endpoint", endpoint, max_len=bounds.MAX_ID) != endpoint
    ):
        fail(f"--endpoint {endpoint!r}: not an http(s) URL")
    bounds.in_file("--ceph-conf", ceph_conf)
    bounds.whole("--keep-days", keep_days, low=1, high=3650)
    bounds.out_dir("--credentials", credentials)
    if openbao_region is not None:
        bounds.identifier("--openbao-region", openbao_region)
    bundle = _verified(bundle_path, trust, "24h")
    try:
        done = provision_all(Rgw(endpoint, ceph_conf), bundle.content.contracts, keep_days)
    except ProvisionError as exc:
        fail(str(exc))
    for creds in done:
        write_credentials(credentials, creds)
    in_bao = _to_openbao(openbao_region, done) if openbao_region is not None else {}
    columns = ("contract", "user", "bucket", "prefix", "credentials", "openbao")
    rows = [
        (
            c.contract,
            c.user,
            c.bucket,
            c.prefix,
            str(credentials / f"{c.contract}.json"),
            in_bao.get(c.contract, ""),
        )
        for c in done
    ]
    if as_json:
        print_json([dict(zip(columns, r, strict=True)) for r in rows])
        return
    table("checkpoint storage", columns, rows)
    console.print(f"{len(done)} contracts provisioned, expiry after {keep_days} days")


def _to_openbao(region: str, done: list[Credentials]) -> dict[str, str]:
    """Each contract's keys into OpenBao; contract -> "<path> (policy <name>)"."""
    from workers.devbox import openbao
    from workers.openbao import checkpoint_secrets
    from workers.openbao.client import BaoError

    try:
        client = openbao.client(settings())
        stored = [checkpoint_secrets.store(client, region, c) for c in done]
    except (BaoError, OSError) as exc:
        fail(f"--openbao-region {region}: OpenBao: {exc}")
    return {s.contract: f"{s.path} (policy {s.policy})" for s in stored}


_JSON_KEYS = ("run", "step", "state", "objects", "bytes", "last_modified")


@app.command("list")
def list_cmd(
    contract: str = typer.Argument(..., metavar="CONTRACT"),
    credentials: Path = _CREDS,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """The checkpoints stored for CONTRACT (read with its own keys); partial ones marked."""
    from workers.cli import bounds

    bounds.identifier("CONTRACT", contract)
    bounds.in_dir("--credentials", credentials)
    try:
        creds = read_credentials(credentials, contract)
        found = stored(creds)
    except ProvisionError as exc:
        fail(str(exc))
    except Exception as exc:  # botocore's errors: endpoint down, access denied
        fail(f"{contract}: s3://{creds.bucket}: {type(exc).__name__}: {exc}")
    rows = [
        (
            f.run,
            f.step,
            "complete" if f.complete else "partial",
            f.objects,
            f.bytes,
            f.last_modified.isoformat(),
        )
        for f in found
    ]
    if as_json:
        print_json([dict(zip(_JSON_KEYS, r, strict=True)) for r in rows])
        return
    table(
        f"checkpoints of {contract} in s3://{creds.bucket}/{creds.prefix}",
        ("run", "step", "state", "objects", "bytes", "modified"),
        rows,
    )
