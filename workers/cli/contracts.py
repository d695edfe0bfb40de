"""`sco contracts`: keys, compile and sign, verify, publish, pull, status, admission."""

from __future__ import annotations

import asyncio
import os
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from activities.decisions import DecisionKind
from contracts import keys
from contracts.bundle import BundleRejected, VerifiedBundle, verify
from contracts.compiler import compile_and_sign
from contracts.findings import Severity
from workers.cli import audit
from workers.cli.common import console, err_console, fail, settings
from workers.cli.ledger import parse_window
from workers.client_security import (
    nats_options,
)

app = typer.Typer(
    help="Contracts: compile, sign, verify, publish, admission.", no_args_is_help=True
)


@app.command()
def keygen(out: Path = typer.Option(..., "--out", help="Directory for <key id>.key/.pub.")) -> None:
    """Write a new Ed25519 key pair; a directory of .pub files is a trust directory."""
    kid, private, public = keys.generate(out)
    console.print(f"key id {kid}\n  private: {private} (keep secret)\n  public:  {public}")


@app.command("compile")
def compile_cmd(
    src_dir: Path = typer.Argument(..., help="Directory of contract files (*.yaml)."),
    regions: Path = typer.Option(Path("deploy/regions"), help="Directory of region files."),
    key: Path = typer.Option(..., help="Private key (<key id>.key) to sign with."),
    out: Path = typer.Option(..., help="Bundle to write (replaced atomically)."),
    serial: int = typer.Option(None, min=1, help="Bundle serial; default: previous + 1."),
    created_at: datetime = typer.Option(
        None, help="Creation time (ISO 8601); default now. Same input and time give the same bytes."
    ),
    notice_keys: Path = typer.Option(
        None,
        help="Directory of <region>/<key id>.pub: the keys that may sign each region's "
        "reclaim notices (carried in the bundle; nodes refuse notices signed by others).",
    ),
) -> None:
    """Validate and feasibility-check every contract, then sign. Writes nothing on error."""
    try:
        signing = keys.load_signing_key(key)
    except keys.KeyFileError as exc:
        fail(str(exc))
    when = (created_at or datetime.now(UTC)).astimezone(UTC)
    result, written = compile_and_sign(
        src_dir, regions, signing, out, serial=serial, created_at=when, notice_keys_dir=notice_keys
    )
    for finding in result.findings:
        style = "yellow" if finding.severity is Severity.WARNING else "red"
        err_console.print(f"[{style}]{escape(str(finding))}[/]", highlight=False, soft_wrap=True)
    if written is None:
        n = sum(1 for f in result.findings if f.severity is Severity.ERROR)
        fail(f"{n} error(s); no bundle written")
    console.print(
        f"bundle {out}: serial {written}, {len(result.contracts)} contracts, "
        f"signed by {keys.key_id(signing.verify_key)}"
    )


def _verified(bundle_path: Path, trust: Path, max_age: str) -> VerifiedBundle:
    try:
        store = keys.TrustStore.load(trust)
        raw = bundle_path.read_bytes()
        return verify(raw, store, max_age=parse_window(max_age))
    except OSError as exc:
        fail(f"{bundle_path}: {exc.strerror}")
    except (keys.KeyFileError, BundleRejected) as exc:
        fail(f"{bundle_path}: REFUSED: {exc}")


@app.command("verify")
def verify_cmd(
    bundle_path: Path = typer.Argument(..., metavar="BUNDLE"),
    trust: Path = typer.Option(..., help="Trust directory of .pub files (and revoked.txt)."),
    max_age: str = typer.Option("24h", help="Older than this is reported stale."),
) -> None:
    """OK (exit 0) or why not (exit 1)."""
    b = _verified(bundle_path, trust, max_age)
    stale = " [yellow](stale: still usable for drains)[/]" if b.stale else ""
    console.print(
        f"OK serial {b.serial}, {len(b.content.contracts)} contracts, key {b.key_id}, "
        f"created {b.content.created_at.isoformat()}{stale}"
    )


@app.command()
def install(
    bundle_path: Path = typer.Argument(..., metavar="BUNDLE"),
    trust: Path = typer.Option(
        None, help="Trust directory; default: the control plane's (contracts.trust_dir)."
    ),
    by: str | None = audit.ByOpt,
    reason: str = audit.ReasonOpt,
) -> None:
    """Install a bundle for this control plane (verified; never a rollback; recorded)."""
    from contracts.cache import BundleCache

    s = settings()
    trust_dir = trust or s.trust_dir
    try:
        store = keys.TrustStore.load(trust_dir)
        raw = bundle_path.read_bytes()
    except OSError as exc:
        fail(f"{bundle_path}: {exc.strerror}")
    except keys.KeyFileError as exc:
        fail(str(exc))
    result = BundleCache(s.bundle_cache_dir, store).offer(raw)
    if not result.accepted:
        fail(f"{bundle_path}: {result.reason}")
    serial = result.bundle.serial if result.bundle else 0
    audit.record(
        s,
        audit.operator_decision(
            s,
            region=s.region,
            kind=DecisionKind.CONTRACTS,
            subject=f"bundle serial {serial}",
            outcome="installed" if result.changed else "unchanged",
            by=audit.who(by),
            reason=f"{bundle_path}: {result.reason}" + (f"; {reason}" if reason else ""),
        ),
    )
    console.print(f"{s.bundle_cache_dir}: {result.reason}")


@app.command()
def pull(
    every: float = typer.Option(
        0.0, help="Seconds between pulls, until SIGTERM; 0: pull once and exit."
    ),
    name: str = typer.Option(
        "",
        help="This consumer's name in `sco contracts status`; default: $HOSTNAME (the pod).",
    ),
) -> None:
    """Pull the region's bundle from the distributor into this control plane's cache,
    verified as a node does (never a rollback). Once: fails unless a valid bundle is
    installed after (an init container holds the pod until one is published). Each pull
    reports the serial held (`sco contracts status`)."""
    from contracts.cache import BundleCache
    from contracts.distribution import NatsBundleSource
    from contracts.holders import HoldingReporter
    from workers.shutdown import async_stop_event

    s = settings()
    try:
        cache = BundleCache(s.bundle_cache_dir, keys.TrustStore.load(s.trust_dir))
    except keys.KeyFileError as exc:
        fail(str(exc))
    source = NatsBundleSource(s.nats_url, s.region, nats_options(s))
    consumer = name or os.environ.get("HOSTNAME") or socket.gethostname()
    reporter = HoldingReporter(
        [s.nats_url], s.region, "control", consumer, nats_options(s), create_bucket=True
    )
    if every > 0:

        async def forever() -> None:
            with async_stop_event() as stop:
                await cache.refresh_forever(source.fetch, stop, every, held=reporter.report)

        asyncio.run(forever())
        return
    try:
        raw = asyncio.run(source.fetch())
    except Exception as exc:  # nats raises several unrelated types
        fail(f"pulling from {s.nats_url} for {s.region}: {exc}")
    if raw is None:
        held = cache.current()
        if held is None:
            fail(f"{s.nats_url}: no bundle published for {s.region} and none cached")
        asyncio.run(reporter.report(held.serial))
        console.print(f"{s.bundle_cache_dir}: none published; keeping serial {held.serial}")
        return
    result = cache.offer(raw)
    held = cache.current()
    asyncio.run(reporter.report(held.serial if held else None))
    if not result.accepted:
        fail(f"bundle from {s.nats_url}: {result.reason}")
    console.print(f"{s.bundle_cache_dir}: {result.reason}")


@app.command()
def status(
    silent_after: float = typer.Option(
        300.0, help="Seconds without a report after which a consumer shows as silent."
    ),
    check: bool = typer.Option(
        False, "--check", help="Exit 1 unless every consumer holds the published serial."
    ),
) -> None:
    """Which bundle serial each consumer holds (control-plane pods, node agents), against
    the published one: old serials, no bundle and silent consumers are marked."""
    from contracts.distribution import NatsBundleSource
    from contracts.holders import State, read_holdings, state

    s = settings()

    async def read() -> tuple[bytes | None, list[Any]]:
        raw = await NatsBundleSource(s.nats_url, s.region, nats_options(s)).fetch()
        return raw, await read_holdings(s.nats_url, s.region, nats_options(s))

    try:
        raw, holdings = asyncio.run(read())
    except Exception as exc:  # nats raises several unrelated types
        fail(f"reading {s.nats_url} for {s.region}: {exc}")
    published, how = _published_serial(raw, s.trust_dir)
    console.print(f"{s.region}: published serial {published or '-'} {how}")
    now = datetime.now(UTC)
    table = Table("consumer", "kind", "serial", "reported", "state")
    states = []
    for h in sorted(holdings, key=lambda h: (h.kind, h.name)):
        st = state(h, published, now, timedelta(seconds=silent_after))
        states.append(st)
        colour = "green" if st is State.CURRENT else "red"
        age = int((now - h.reported_at).total_seconds())
        table.add_row(
            escape(h.name),
            h.kind,
            "-" if h.serial is None else str(h.serial),
            f"{age} s ago",
            f"[{colour}]{st.value}[/]",
        )
    if holdings:
        console.print(table)
    else:
        console.print("no consumer has reported a bundle yet")
    if check and (not holdings or any(st is not State.CURRENT for st in states)):
        raise typer.Exit(1)


def _published_serial(raw: bytes | None, trust_dir: Path) -> tuple[int | None, str]:
    """The published bundle's serial, verified when this host has the trust keys."""
    import json

    if raw is None:
        return None, "(nothing published)"
    try:
        return verify(raw, keys.TrustStore.load(trust_dir), max_age=timedelta(days=3650)).serial, (
            "(verified)"
        )
    except keys.KeyFileError:
        pass  # no trust keys here: read the serial without checking the signature
    except BundleRejected as exc:
        return None, f"(refused: {escape(str(exc))})"
    try:
        return int(json.loads(raw)["content"]["serial"]), f"(unverified: no trust in {trust_dir})"
    except (ValueError, KeyError, TypeError):
        return None, "(not a bundle)"


@app.command()
def publish(
    bundle_path: Path = typer.Argument(..., metavar="BUNDLE"),
    trust: Path = typer.Option(..., help="Trust directory: only a bundle that verifies goes out."),
    region: list[str] = typer.Option(None, help="Region(s); default: the bundle's regions."),
    by: str | None = audit.ByOpt,
    reason: str = audit.ReasonOpt,
) -> None:
    """Publish to each region's NATS JetStream object store, where nodes pull it."""
    from contracts.distribution import publish as put

    b = _verified(bundle_path, trust, "3650d")
    s = settings()
    for r in region or b.content.regions:
        try:
            info = asyncio.run(put(s.nats_url, r, b.raw, nats_options(s)))
        except Exception as exc:  # nats raises several unrelated types
            fail(f"publishing to {s.nats_url} for {r}: {exc}")
        where = f"{info.bucket}/{info.name}"
        audit.record(
            s,
            audit.operator_decision(
                s,
                region=r,
                kind=DecisionKind.CONTRACTS,
                subject=f"bundle serial {b.serial}",
                outcome="published",
                by=audit.who(by),
                reason=f"to {where}" + (f"; {reason}" if reason else ""),
            ),
        )
        console.print(f"{r}: serial {b.serial} → {where} ({info.size} bytes)")


@app.command("render-admission")
def render_admission(
    bundle_path: Path = typer.Argument(..., metavar="BUNDLE"),
    trust: Path = typer.Option(..., help="Trust directory."),
    out: Path = typer.Option(..., help="Directory for job_submit.lua and the Kyverno policy."),
    slurm_partition: list[str] = typer.Option(["spot"], help="Reclaimable Slurm partition(s)."),
    slurm_default_partition: str = typer.Option(None, help="Slurm's default partition name."),
    k8s_exempt_namespace: list[str] = typer.Option(
        ["kube-system"],
        help="Namespaces Kyverno does not check (DaemonSets that tolerate "
        "every taint, such as CNI and kube-proxy).",
    ),
) -> None:
    """Generate Slurm job_submit.lua and a Kyverno ClusterPolicy from a verified bundle."""
    from contracts.admission.kyverno import render_cluster_policy_yaml
    from contracts.admission.slurm import render_job_submit_lua
    from contracts.atomic import write_atomic

    b = _verified(bundle_path, trust, "3650d")
    lua = render_job_submit_lua(
        b.content.contracts,
        serial=b.serial,
        reclaimable_partitions=slurm_partition,
        default_partition=slurm_default_partition,
    )
    policy = render_cluster_policy_yaml(
        b.content.contracts, serial=b.serial, exempt_namespaces=k8s_exempt_namespace
    )
    write_atomic(out / "job_submit.lua", lua.encode())
    write_atomic(out / "kyverno-clusterpolicy.yaml", policy.encode())
    console.print(
        f"serial {b.serial}: {out / 'job_submit.lua'}, {out / 'kyverno-clusterpolicy.yaml'}"
    )
