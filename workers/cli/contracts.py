"""`sco contracts`: keys, compile and sign, verify, publish, pull, status, admission, and
contracts from git (sync, approve-rewrite, import)."""

from __future__ import annotations

import asyncio
import os
import re
import socket
from collections.abc import Awaitable, Coroutine
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import typer

from activities.decisions import DecisionKind
from contracts import keys
from contracts.bundle import BundleRejected, VerifiedBundle, verify
from contracts.compiler import compile_and_sign
from contracts.distribution import Published
from contracts.findings import Severity
from contracts.redact import mask_credentials
from workers.cli import audit, bounds
from workers.cli.bounds import path_value
from workers.cli.common import console, err_console, escape, fail, print_json, settings, shown
from workers.cli.ledger import parse_window
from workers.client_security import (
    nats_options,
)
from workers.settings import Settings

T = TypeVar("T")
JsonOpt = typer.Option(False, "--json", help="The answer as JSON (its schema: docs/reference.md).")
#: `--max-age` of a bundle: what verify accepts (publish and admission use the most).
BUNDLE_MAX_AGE = timedelta(days=3650)

app = typer.Typer(
    help="Contracts: compile, sign, verify, publish, admission.", no_args_is_help=True
)


@app.command()
def keygen(
    out: Path = typer.Option(
        ..., "--out", help="Directory for <key id>.key/.pub.", parser=path_value
    ),
    json_out: bool = JsonOpt,
) -> None:
    """Write a new Ed25519 key pair; a directory of .pub files is a trust directory."""
    bounds.out_dir("--out", out)
    kid, private, public = keys.generate(out)
    if json_out:
        print_json({"key_id": kid, "private": str(private), "public": str(public)})
        return
    console.print(f"key id {kid}\n  private: {private} (keep secret)\n  public:  {public}")


@app.command("compile")
def compile_cmd(
    src_dir: Path = typer.Argument(
        ..., help="Directory of contract files (*.yaml).", parser=path_value
    ),
    regions: Path = typer.Option(
        Path("deploy/regions"), help="Directory of region files.", parser=path_value
    ),
    key: Path = typer.Option(
        ..., help="Private key (<key id>.key) to sign with.", parser=path_value
    ),
    out: Path = typer.Option(..., help="Bundle to write (replaced atomically).", parser=path_value),
    serial: int = typer.Option(None, min=1, help="Bundle serial; default: previous + 1."),
    created_at: datetime = typer.Option(
        None, help="Creation time (ISO 8601); default now. Same input and time give the same bytes."
    ),
    notice_keys: Path = typer.Option(
        None,
        help="Directory of <region>/<key id>.pub: the keys that may sign each region's "
        "reclaim notices (carried in the bundle; nodes refuse notices signed by others), and "
        "optionally <region>/scopes.yaml: the hall(s) each key signs for and when it retires "
        "(`sco keys relay-new`). Required for every region of the bundle that has notice "
        "relays.",
        parser=path_value,
    ),
    without_notice_keys: bool = typer.Option(
        False,
        "--without-notice-keys",
        help="Sign a bundle without notice keys for regions with relays: their nodes then "
        "verify notices only with the relay keys pinned in their install (notice_keys_dir).",
    ),
    json_out: bool = JsonOpt,
) -> None:
    """Validate and feasibility-check every contract, then sign. Writes nothing on error."""
    bounds.in_dir("SRC_DIR", src_dir)
    bounds.in_dir("--regions", regions)
    bounds.in_file("--key", key)
    bounds.out_file("--out", out)
    if notice_keys is not None:
        bounds.in_dir("--notice-keys", notice_keys)
    if serial is not None:
        bounds.whole("--serial", serial, low=1, high=2**53)
    if created_at is not None and not 2000 <= created_at.year <= 2200:
        fail(f"--created-at {created_at.isoformat()}: not a year between 2000 and 2200")
    try:
        signing = keys.load_signing_key(key)
    except keys.KeyFileError as exc:
        fail(str(exc))
    when = (created_at or datetime.now(UTC)).astimezone(UTC)
    result, written = compile_and_sign(
        src_dir,
        regions,
        signing,
        out,
        serial=serial,
        created_at=when,
        notice_keys_dir=notice_keys,
        require_notice_keys=not without_notice_keys,
    )
    for finding in result.findings:
        style = "yellow" if finding.severity is Severity.WARNING else "red"
        err_console.print(f"[{style}]{escape(str(finding))}[/]", highlight=False, soft_wrap=True)
    if written is None:
        n = sum(1 for f in result.findings if f.severity is Severity.ERROR)
        fail(f"{n} error(s); no bundle written")
    if json_out:
        print_json(
            {
                "bundle": str(out),
                "serial": written,
                "contracts": len(result.contracts),
                "key_id": keys.key_id(signing.verify_key),
                "warnings": [str(f) for f in result.findings],
            }
        )
        return
    console.print(
        f"bundle {out}: serial {written}, {len(result.contracts)} contracts, "
        f"signed by {keys.key_id(signing.verify_key)}"
    )


def _verified(bundle_path: Path, trust: Path, max_age: str) -> VerifiedBundle:
    bounds.in_file("BUNDLE", bundle_path)
    bounds.in_dir("--trust", trust)
    try:
        store = keys.TrustStore.load(trust)
        raw = bundle_path.read_bytes()
        return verify(raw, store, max_age=parse_window(max_age, BUNDLE_MAX_AGE))
    except OSError as exc:
        fail(f"{bundle_path}: {exc.strerror}")
    except (keys.KeyFileError, BundleRejected) as exc:
        fail(f"{bundle_path}: REFUSED: {exc}")


@app.command("verify")
def verify_cmd(
    bundle_path: Path = typer.Argument(..., metavar="BUNDLE", parser=path_value),
    trust: Path = typer.Option(
        ..., help="Trust directory of .pub files (and revoked.txt).", parser=path_value
    ),
    max_age: str = typer.Option("24h", help="Older than this is reported stale."),
    json_out: bool = JsonOpt,
) -> None:
    """OK (exit 0) or why not (exit 1)."""
    b = _verified(bundle_path, trust, max_age)
    if json_out:
        print_json(
            {
                "serial": b.serial,
                "contracts": len(b.content.contracts),
                "key_id": b.key_id,
                "created_at": b.content.created_at.isoformat(),
                "stale": b.stale,
            }
        )
        return
    stale = " [yellow](stale: still usable for drains)[/]" if b.stale else ""
    console.print(
        f"OK serial {b.serial}, {len(b.content.contracts)} contracts, key {b.key_id}, "
        f"created {b.content.created_at.isoformat()}{stale}"
    )


@app.command()
def install(
    bundle_path: Path = typer.Argument(..., metavar="BUNDLE", parser=path_value),
    trust: Path = typer.Option(
        None,
        help="Trust directory; default: the control plane's (contracts.trust_dir).",
        parser=path_value,
    ),
    by: str | None = audit.ByOpt,
    reason: str | None = audit.ReasonOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Install a bundle for this control plane (verified; never a rollback; recorded)."""
    from contracts.bundle import parse_content
    from contracts.cache import BundleCache

    s = settings()
    bounds.in_file("BUNDLE", bundle_path)
    trust_dir = bounds.in_dir("--trust", trust) if trust is not None else s.trust_dir
    operator, why = audit.who(by), audit.why(reason)
    try:
        store = keys.TrustStore.load(trust_dir)
        raw = bundle_path.read_bytes()
    except OSError as exc:
        fail(f"{bundle_path}: {exc.strerror}")
    except keys.KeyFileError as exc:
        fail(str(exc))
    result = BundleCache(s.bundle_cache_dir, store, parse=parse_content).offer(raw)
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
            by=operator,
            reason=f"{bundle_path}: {result.reason}" + (f"; {why}" if why else ""),
        ),
    )
    if json_out:
        print_json(
            {
                "serial": serial,
                "changed": result.changed,
                "reason": result.reason,
                "cache_dir": str(s.bundle_cache_dir),
            }
        )
        return
    console.print(f"{s.bundle_cache_dir}: {result.reason}")


@app.command()
def pull(
    every: float = typer.Option(
        0.0, help="Seconds between pulls, until SIGTERM; 0: pull once and exit."
    ),
    name: str | None = typer.Option(
        None,
        help="This consumer's name in `sco contracts status`; default: $HOSTNAME (the pod).",
    ),
    json_out: bool = typer.Option(False, "--json", help="A single pull's answer as JSON."),
) -> None:
    """Pull the region's bundle from the distributor into this control plane's cache,
    verified as a node does (never a rollback). Once: fails unless a valid bundle is
    installed after (an init container holds the pod until one is published). Each pull
    reports the serial held (`sco contracts status`)."""
    from contracts.bundle import parse_content
    from contracts.cache import BundleCache
    from contracts.distribution import NatsBundleSource
    from contracts.holders import HoldingReporter
    from workers.shutdown import async_stop_event

    bounds.finite("--every", every, low=0, high=86_400)
    if name is not None:
        bounds.identifier("--name", name, max_len=253)
    s = settings()
    try:
        cache = BundleCache(
            s.bundle_cache_dir, keys.TrustStore.load(s.trust_dir), parse=parse_content
        )
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
                await cache.refresh_forever(
                    source.fetch,
                    stop,
                    every,
                    held=reporter.report,
                    fetch_reset=source.fetch_reset,
                    region=s.region,
                )

        asyncio.run(forever())
        return
    pulling = f"pulling from {s.nats_url} for {s.region}"
    reset = _on_nats(source.fetch_reset(), f"NATS at {s.nats_url}", pulling)
    raw = _on_nats(source.fetch(), f"NATS at {s.nats_url}", pulling)
    if reset is not None:
        applied = cache.apply_reset(reset, s.region)
        if applied.changed or not applied.accepted:
            console.print(f"serial reset: {escape(applied.reason)}")
    if raw is None:
        held = cache.current()
        if held is None:
            fail(f"{s.nats_url}: no bundle published for {s.region} and none cached")
        asyncio.run(reporter.report(held.serial))
        if json_out:
            print_json({"serial": held.serial, "changed": False, "reason": "none published"})
            return
        console.print(f"{s.bundle_cache_dir}: none published; keeping serial {held.serial}")
        return
    result = cache.offer(raw)
    held = cache.current()
    asyncio.run(reporter.report(held.serial if held else None))
    if not result.accepted:
        fail(f"bundle from {s.nats_url}: {result.reason}")
    if json_out:
        serial = held.serial if held else None
        print_json({"serial": serial, "changed": result.changed, "reason": result.reason})
        return
    console.print(f"{s.bundle_cache_dir}: {result.reason}")


@app.command()
def status(
    silent_after: float = typer.Option(
        300.0, help="Seconds without a report after which a consumer shows as silent."
    ),
    check: bool = typer.Option(
        False, "--check", help="Exit 1 unless every consumer holds the published serial."
    ),
    json_out: bool = JsonOpt,
) -> None:
    """Which bundle serial each consumer holds (control-plane pods, node agents), against
    the published one: old serials, no bundle and silent consumers are marked."""
    from contracts.distribution import NatsBundleSource
    from contracts.holders import State, read_holdings, state

    bounds.finite("--silent-after", silent_after, low=1, high=30 * 86_400)
    s = settings()

    from contracts.gitsync import NatsSyncStore

    async def read() -> tuple[bytes | None, list[Any], dict[int, Any]]:
        raw = await NatsBundleSource(s.nats_url, s.region, nats_options(s)).fetch()
        holdings = await read_holdings(s.nats_url, s.region, nats_options(s))
        store = NatsSyncStore(s.nats_url, s.region, s.trust_dir, nats_options(s))
        serials = [h.serial for h in holdings] + [_raw_serial(raw) if raw else None]
        return raw, holdings, await store.commits([x for x in serials if x is not None])

    raw, holdings, commits = _on_nats(
        read(), f"NATS at {s.nats_url}", f"reading {s.nats_url} for {s.region}"
    )
    published, how = _published_serial(raw, s.trust_dir)
    from_git = commits.get(published) if published is not None else None
    now = datetime.now(UTC)
    if json_out:
        states = [state(h, published, now, timedelta(seconds=silent_after)) for h in holdings]
        print_json(
            {
                "region": s.region,
                "published_serial": published,
                "published": how.strip("()"),
                "published_commit": from_git.commit if from_git else None,
                "published_signer": from_git.signer if from_git else None,
                "consumers": [
                    {
                        "name": h.name,
                        "kind": h.kind,
                        "serial": h.serial,
                        "commit": commits[h.serial].commit if h.serial in commits else None,
                        "reported_at": h.reported_at.isoformat(),
                        "state": st.value,
                    }
                    for h, st in zip(holdings, states, strict=True)
                ],
            }
        )
        if check and (not holdings or any(st is not State.CURRENT for st in states)):
            raise typer.Exit(1)
        return
    at = f", commit {from_git.commit[:12]} signed by {from_git.signer}" if from_git else ""
    console.print(f"{s.region}: published serial {published or '-'}{at} {how}")
    from rich.table import Table

    table = Table("consumer", "kind", "serial", "commit", "reported", "state")
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
            commits[h.serial].commit[:12] if h.serial in commits else "-",
            f"{age} s ago",
            f"[{colour}]{st.value}[/]",
        )
    if holdings:
        console.print(table)
    else:
        console.print("no consumer has reported a bundle yet")
    if check and (not holdings or any(st is not State.CURRENT for st in states)):
        raise typer.Exit(1)


#: A region's name as a NATS subject token and bucket suffix (the sync may serve a region
#: this host's settings do not list: it needs only the region's file in regions_dir).
_REGION_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


def _sync_region(s: Any, region: str | None) -> str:
    r = s.region if region is None else region
    if not _REGION_NAME.fullmatch(r):
        fail(f"--region {shown(r)}: not a region name (lowercase letters, digits, -)")
    return str(r)


#: A full commit id: SHA-1 or SHA-256 object names.
_FULL_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def _raw_serial(raw: bytes) -> int | None:
    import json

    try:
        return int(json.loads(raw)["content"]["serial"])
    except (ValueError, KeyError, TypeError):
        return None


async def _within(coro: Awaitable[T], what: str) -> T:
    """CORO within the CLI's NATS deadline, or a one-line error naming what did not answer."""
    try:
        return await asyncio.wait_for(coro, bounds.NATS_REQUEST_SECONDS)
    except TimeoutError:
        fail(f"{what} did not answer within {bounds.NATS_REQUEST_SECONDS:g} s")


def _on_nats(coro: Coroutine[Any, Any, T], what: str, failing: str) -> T:
    """CORO run within the CLI's NATS deadline: a timeout is a one-line error naming `what`
    that did not answer, any other failure one saying what was `failing` and why."""
    try:
        return asyncio.run(_within(coro, what))
    except typer.Exit:
        raise
    except Exception as exc:  # nats raises several unrelated types
        fail(f"{failing}: {exc}")


def _published_serial(raw: bytes | None, trust_dir: Path) -> tuple[int | None, str]:
    """The published bundle's serial, verified when this host has the trust keys."""
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
    from contracts.bounded import MAX_BUNDLE_BYTES, loads

    try:
        doc = loads(raw, what="bundle", max_bytes=MAX_BUNDLE_BYTES)
        return int(doc["content"]["serial"]), f"(unverified: no trust in {trust_dir})"
    except (ValueError, KeyError, TypeError):
        return None, "(not a bundle)"


def _publish_recorded(
    s: Settings,
    region: str,
    upload: Coroutine[Any, Any, Published],
    *,
    what: str,
    subject: str,
    by: str,
    why: str | None,
) -> tuple[Published, str]:
    """`upload` (a put into `region`'s bucket) within the CLI's NATS deadline (`what` did
    not answer), recorded in the ledger as the operator's decision; the object's
    `bucket/name` with it. A failure is a one-line error."""
    info = _on_nats(upload, what, f"publishing to {mask_credentials(s.nats_url)} for {region}")
    where = f"{info.bucket}/{info.name}"
    audit.record(
        s,
        audit.operator_decision(
            s,
            region=region,
            kind=DecisionKind.CONTRACTS,
            subject=subject,
            outcome="published",
            by=by,
            reason=f"to {where}" + (f"; {why}" if why else ""),
        ),
    )
    return info, where


@app.command()
def publish(
    bundle_path: Path = typer.Argument(..., metavar="BUNDLE", parser=path_value),
    trust: Path = typer.Option(
        ..., help="Trust directory: only a bundle that verifies goes out.", parser=path_value
    ),
    region: list[str] = typer.Option(None, help="Region(s); default: the bundle's regions."),
    by: str | None = audit.ByOpt,
    reason: str | None = audit.ReasonOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Publish to each region's NATS JetStream object store, where nodes pull it."""
    from contracts.distribution import publish as put
    from workers.cli.common import known_region
    from workers.nats_limits import limit_agent_streams

    b = _verified(bundle_path, trust, "3650d")
    s = settings()
    regions = [known_region(s, r) for r in region] if region else b.content.regions
    operator, why = audit.who(by), audit.why(reason)

    async def put_limited(r: str) -> Published:
        info = await put(s.nats_url, r, b.raw, nats_options(s))
        await limit_agent_streams(s, r)  # agents read it: bounded consumers (nats_limits)
        return info

    published = []
    for r in regions:
        info, where = _publish_recorded(
            s,
            r,
            put_limited(r),
            what=mask_credentials(s.nats_url),
            subject=f"bundle serial {b.serial}",
            by=operator,
            why=why,
        )
        published.append({"region": r, "serial": b.serial, "object": where, "bytes": info.size})
        if not json_out:
            console.print(f"{r}: serial {b.serial} → {where} ({info.size} bytes)")
    if json_out:
        print_json(published)


@app.command("reset-serial")
def reset_serial(
    region: str = typer.Option(..., help="The region whose nodes reset their serial floor."),
    to: int = typer.Option(
        ...,
        "--to",
        help="The new rollback floor: the serial of the genuine bundle nodes must accept "
        "next (or lower).",
    ),
    key: Path = typer.Option(
        ...,
        help="A bundle signing key (<key id>.key) nodes trust and that is not revoked.",
        parser=path_value,
    ),
    out: Path = typer.Option(..., help="Where to write the signed reset.", parser=path_value),
    publish_it: bool = typer.Option(
        False, "--publish", help="Also publish it to the region's bucket, where nodes fetch it."
    ),
    by: str | None = audit.ByOpt,
    reason: str | None = audit.ReasonOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Sign a serial reset: the way out of a poisoned serial (a bundle signed with a leaked
    key whose serial locks out the genuine ones). Revoke the leaked key first (revoked.txt
    in every trust directory), then reset to the serial of the next genuine bundle and
    publish both. Nodes apply a reset once, within 7 days of its issue."""
    from contracts import serial_reset
    from contracts.atomic import write_atomic
    from contracts.bundle import MAX_SERIAL
    from contracts.distribution import publish as put

    bounds.identifier("--region", region, max_len=64)
    bounds.whole("--to", to, low=1, high=MAX_SERIAL)
    bounds.in_file("--key", key)
    bounds.out_file("--out", out)
    # A reset overrides every node's rollback floor: it always says why (it used to crash
    # on a missing reason, the signed reset's field being a string).
    if reason is None:
        fail("--reason: required: a serial reset is signed and recorded with why it was made")
    reason = bounds.text("--reason", reason, max_len=200)
    who = bounds.text("--by", audit.who(by), max_len=100)
    s = settings() if publish_it else None
    if s is not None:
        from workers.cli.common import known_region

        known_region(s, region)
    try:
        signing = keys.load_signing_key(key)
    except keys.KeyFileError as exc:
        fail(str(exc))
    raw = serial_reset.sign(
        serial_reset.SerialReset(
            region=region, to_serial=to, issued_at=datetime.now(UTC), reason=reason, by=who
        ),
        signing,
    )
    write_atomic(out, raw)
    kid = keys.key_id(signing.verify_key)
    where = ""
    if s is not None:
        _, where = _publish_recorded(
            s,
            region,
            put(s.nats_url, region, raw, nats_options(s), name=serial_reset.OBJECT_NAME),
            what=f"NATS at {mask_credentials(s.nats_url)}",
            subject=f"serial reset to {to}",
            by=who,
            why=reason,
        )
    if json_out:
        print_json(
            {"region": region, "to_serial": to, "key_id": kid, "out": str(out), "object": where}
        )
        return
    console.print(f"serial reset for {region} to {to}: {out}, signed by {kid}")
    if where:
        console.print(f"{region}: serial reset → {where}")


@app.command("render-admission")
def render_admission(
    bundle_path: Path = typer.Argument(..., metavar="BUNDLE", parser=path_value),
    trust: Path = typer.Option(..., help="Trust directory.", parser=path_value),
    out: Path = typer.Option(
        ..., help="Directory for job_submit.lua and the Kyverno policy.", parser=path_value
    ),
    slurm_partition: list[str] = typer.Option(["spot"], help="Reclaimable Slurm partition(s)."),
    slurm_default_partition: str = typer.Option(None, help="Slurm's default partition name."),
    k8s_exempt_namespace: list[str] = typer.Option(
        ["kube-system"],
        help="Namespaces Kyverno does not check (DaemonSets that tolerate "
        "every taint, such as CNI and kube-proxy).",
    ),
    json_out: bool = JsonOpt,
) -> None:
    """Generate Slurm job_submit.lua and a Kyverno ClusterPolicy from a verified bundle."""
    from contracts.admission.kyverno import render_cluster_policy_yaml
    from contracts.admission.slurm import render_job_submit_lua
    from contracts.atomic import write_atomic

    bounds.in_dir("--out", out)
    for p in slurm_partition:
        bounds.identifier("--slurm-partition", p, max_len=64)
    if slurm_default_partition is not None:
        bounds.identifier("--slurm-default-partition", slurm_default_partition, max_len=64)
    for ns in k8s_exempt_namespace:
        bounds.identifier("--k8s-exempt-namespace", ns, max_len=63)
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
    if json_out:
        files = [str(out / "job_submit.lua"), str(out / "kyverno-clusterpolicy.yaml")]
        print_json({"serial": b.serial, "written": files})
        return
    console.print(
        f"serial {b.serial}: {out / 'job_submit.lua'}, {out / 'kyverno-clusterpolicy.yaml'}"
    )


@app.command("sync")
def sync_cmd(
    region: str = typer.Option(None, help="The region to publish for; default: `region`."),
    once: bool = typer.Option(False, "--once", help="One fetch and what follows, then exit."),
) -> None:
    """Follow the contract repository (contracts.repo_url, then contracts.mirror_urls):
    each new commit on contracts.ref whose SSH signature an `allowed_signers` of the trust
    directory accepts is compiled, signed and published with the next serial; unsigned or
    unknown signers, compile errors and history rewrites publish nothing. Until SIGTERM,
    every contracts.sync_interval_seconds; `--once`: exit 1 when the head is not published."""
    from services.contract_sync.service import SyncSettingsError, sync_for
    from services.registry import service

    s = settings()
    r = _sync_region(s, region)
    try:
        sync = sync_for(s, r)  # settings checked before anything runs, also without --once
    except (SyncSettingsError, keys.KeyFileError) as exc:
        fail(str(exc))
    if not once:
        asyncio.run(service("contract-sync").load()(s, r))
        return
    try:
        report = asyncio.run(sync.step())
    except (SyncSettingsError, keys.KeyFileError) as exc:
        fail(str(exc))
    except Exception as exc:  # git, NATS: the reason is in the message
        fail(f"contract sync for {r}: {exc}")
    fetched = report.fetched
    if fetched is not None:
        which = "primary" if fetched.index == 0 else f"mirror {fetched.index}"
        console.print(f"{r}: fetched {fetched.head[:12]} from {fetched.remote} ({which})")
        for url, why in fetched.skipped:
            err_console.print(f"  {escape(url)} did not answer: {escape(why)}", highlight=False)
        if report.behind:
            console.print(f"{r}: {fetched.remote} is behind the published commit; nothing to do")
    for res in report.results:
        style = "green" if res.outcome.value in ("published", "adopted") else "red"
        err_console.print(f"[{style}]{escape(res.describe())}[/]", highlight=False, soft_wrap=True)
    held = report.held
    console.print(
        f"{r}: running serial {held.serial if held else '-'}"
        + (f", commit {held.commit}" if held and held.commit else "")
    )
    if not report.head_ok and report.results:
        raise typer.Exit(1)


@app.command("approve-rewrite")
def approve_rewrite(
    commit: str = typer.Argument(..., help="The new head (full commit id) to accept."),
    region: str = typer.Option(None, help="Region; default: `region`."),
    by: str | None = audit.ByOpt,
    reason: str = audit.ReasonOpt,
) -> None:
    """Let the sync publish COMMIT although the last published commit is not in its history
    (a force-push). Only that head: a later rewrite needs its own approval."""
    from contracts.gitsync import NatsSyncStore

    if not _FULL_COMMIT.fullmatch(commit):
        fail(f"COMMIT {shown(commit)}: a full commit id (40 or 64 hex digits)")
    s = settings()
    r = _sync_region(s, region)
    operator, why = audit.who(by), audit.why(reason)
    store = NatsSyncStore(s.nats_url, r, s.trust_dir, nats_options(s))
    _on_nats(
        store.approve_rewrite(commit, operator, why),
        f"NATS at {s.nats_url}",
        f"recording the approval in {s.nats_url} for {r}",
    )
    console.print(f"{r}: the sync may publish {commit} (history rewrite approved)")


@app.command("import")
def import_cmd(
    src_dir: Path = typer.Argument(
        ..., help="Today's directory of contract files.", parser=path_value
    ),
    repo: Path = typer.Option(
        ..., help="The git work tree to make the first commit in.", parser=path_value
    ),
    bundle_path: Path = typer.Option(
        None,
        "--bundle",
        help="The bundle in use, whose serial the commit keeps; default: this control "
        "plane's cached bundle.",
        parser=path_value,
    ),
    sign_with: Path = typer.Option(
        None, help="SSH private key to sign the commit with (gpg.format=ssh).", parser=path_value
    ),
) -> None:
    """Turn a contract directory into the repository's first commit, at contracts.path,
    keeping the serial of the bundle in use (trailer `SCO-Serial`): the sync adopts it
    without publishing again, and the next commit gets the next serial."""
    import json
    import shutil
    import subprocess

    from contracts.gitsync import SERIAL_TRAILER

    bounds.in_dir("DIR", src_dir)
    bounds.out_dir("--repo", repo)
    if sign_with is not None:
        bounds.in_file("--sign-with", sign_with)
    s = settings()
    current = bundle_path or (s.bundle_cache_dir / "bundle.json")
    try:
        serial = int(json.loads(current.read_bytes())["content"]["serial"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        fail(f"{current}: no serial to keep ({exc})")
    dest = repo / s.contracts.path
    if dest.exists() and any(dest.iterdir()):
        fail(f"{dest} exists and is not empty: import makes the first commit only")
    if not any(src_dir.glob("*.yaml")):
        fail(f"DIR {shown(str(src_dir))}: no contract files (*.yaml)")
    sign = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={sign_with}"] if sign_with else []
    git = ["git", "-C", str(repo)]
    message = f"Import contracts from {src_dir} at serial {serial}\n\n{SERIAL_TRAILER}: {serial}\n"
    try:
        if not (repo / ".git").exists():
            subprocess.run(
                ["git", "init", "--quiet", "-b", s.contracts.ref, str(repo)],
                check=True,
                capture_output=True,
                text=True,
            )
        shutil.copytree(src_dir, dest, dirs_exist_ok=True)
        subprocess.run([*git, "add", s.contracts.path], check=True, capture_output=True, text=True)
        subprocess.run(
            [*git, *sign, "commit", "--quiet", *(["-S"] if sign_with else []), "-m", message],
            check=True,
            capture_output=True,
            text=True,
        )
        head = subprocess.run(
            [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
        ).stdout.strip()
    except subprocess.CalledProcessError as exc:
        why = (exc.stderr or exc.stdout or "").strip().splitlines()
        fail(f"git {exc.cmd[3] if len(exc.cmd) > 3 else ''} in {repo}: {why[-1] if why else exc}")
    except OSError as exc:
        fail(f"importing {src_dir} into {repo}: {exc}")
    console.print(
        f"{repo}: commit {head} holds {src_dir} at serial {serial}; push it to the remote"
    )


@app.command("estate")
def estate_cmd(
    region: str = typer.Option(None, help="Region; default: `region`."),
    out: Path = typer.Option(..., help="The snapshot to write (JSON).", parser=path_value),
) -> None:
    """Write the region's estate snapshot from fleet state for `sco contracts plan
    --estate`: live instances (reclaimable, floor, fallback), demand per contract, current
    pool prices."""
    from activities.control.estate_snapshot import estate_snapshot
    from activities.fleet.control_state import ControlRepository
    from activities.fleet.repository import FleetRepository
    from contracts.atomic import write_atomic
    from workers.cli.common import fleet_db, known_region

    s = settings()
    r = known_region(s, region)
    bounds.out_file("--out", out)
    with fleet_db(s) as pool:
        snap = estate_snapshot(FleetRepository(pool), ControlRepository(pool), r, datetime.now(UTC))
    write_atomic(out, snap.model_dump_json(indent=1).encode() + b"\n")
    console.print(
        f"{out}: {len(snap.instances)} instances, {len(snap.demand)} contracts with demand in {r}"
    )


@app.command("plan")
def plan_cmd(
    base: str = typer.Argument(..., help="The commit (or ref) the change starts from."),
    head: str = typer.Argument(..., help="The commit (or ref) of the change."),
    repo: Path = typer.Option(
        Path("."), help="The contract repository (a git work tree).", parser=path_value
    ),
    estate: Path = typer.Option(
        ...,
        help="Snapshot of the region's estate (JSON: instances, demand, current prices; "
        "planning/change_plan.py EstateSnapshot).",
        parser=path_value,
    ),
    fmt: str = typer.Option("markdown", "--format", help="markdown or json."),
    out: Path = typer.Option(
        None, help="Write here instead of standard output.", parser=path_value
    ),
) -> None:
    """What a contract change does to the estate: contracts changed field by field, floors
    per hall and the committed capacity they need, caps and spend authority, instances
    that stop conforming and their drains, cost per hour before and after. Exit 2 when the
    change is infeasible (HEAD does not compile, a floor does not fit, spend authority
    below the running fallback)."""
    import json
    import tempfile

    from contracts.compiler import compile_dir, load_region_dir
    from contracts.gitrepo import GitError, GitMirror
    from planning.change_plan import EstateSnapshot, plan_change, to_json, to_markdown

    if fmt not in ("markdown", "json"):
        fail(f"--format {shown(fmt)}: markdown or json")
    for name, ref in (("BASE", base), ("HEAD", head)):
        if not ref.strip() or ref.startswith("-") or not ref.isprintable() or len(ref) > 256:
            fail(f"{name} {shown(ref)}: not a commit or ref")
    bounds.in_dir("--repo", repo)
    bounds.in_file("--estate", estate)
    if out is not None:
        bounds.out_file("--out", out)
    s = settings()
    try:
        snap = EstateSnapshot.model_validate(json.loads(estate.read_bytes()))
    except (OSError, ValueError) as exc:
        fail(f"{estate}: {exc}")
    regions, problems = load_region_dir(s.regions_dir)
    if problems or snap.region not in regions:
        fail(f"{s.regions_dir}: no region {snap.region} ({'; '.join(map(str, problems))})")
    region = regions[snap.region]
    git_dir = repo / ".git" if (repo / ".git").exists() else repo
    git = GitMirror(git_dir)
    try:
        commits = [git.resolve(base), git.resolve(head)]
        with tempfile.TemporaryDirectory(prefix="sco-plan-") as tmp:
            results = []
            for i, commit in enumerate(commits):
                src = git.export(commit, s.contracts.path, Path(tmp) / str(i) / s.contracts.path)
                results.append(compile_dir(src, regions))
    except GitError as exc:
        fail(str(exc))
    errors = [f for f in results[1].findings if f.severity is Severity.ERROR]
    plan = plan_change(
        commits[0],
        commits[1],
        results[0].contracts,
        results[1].contracts,
        region,
        snap,
        [_relative_finding(f, tmp) for f in errors],
    )
    text = to_markdown(plan) if fmt == "markdown" else to_json(plan)
    if out is not None:
        out.write_text(text)
    else:
        typer.echo(text, nl=False)
    if not plan.feasible:
        raise typer.Exit(2)


def _relative_finding(f: Any, tmp: str) -> Any:
    """A finding's file as in the repository (not the export's temporary folder)."""
    from dataclasses import replace

    parts = Path(f.file).parts
    anchor = Path(tmp).parts
    if parts[: len(anchor)] == anchor:
        return replace(f, file=str(Path(*parts[len(anchor) + 1 :])))
    return f
