"""`sco dev`: the local region in a box."""

from __future__ import annotations

import contextlib
import signal
import threading

import typer
from rich.markup import escape

from contracts.redact import mask_credentials
from workers.cli.bao import app as bao_app
from workers.cli.certs import app as certs_app
from workers.cli.common import (
    console,
    err_console,
    errors_as_exit,
    fail,
    known_region,
    print_json,
    settings,
    shown,
    table,
)
from workers.devbox.box import Box, ServiceStatus
from workers.devbox.process import DevboxError

app = typer.Typer(
    help="Run the local region in a box (real processes, data under .sco/).", no_args_is_help=True
)
app.add_typer(bao_app, name="bao")
app.add_typer(certs_app, name="certs")


def _show(statuses: list[ServiceStatus], box: Box) -> None:
    # The secure box names where its processes' certificates come from (each one's
    # notAfter is in its detail).
    certs = f", certificates from {box.secure.cert_source}" if box.secure is not None else ""
    table(
        f"SCO region in a box: {box.profile} profile{certs}",
        ["service", "mode", "address", "health", "pid", "rss MB", "transport", "detail"],
        [
            [
                s.name,
                s.mode,
                s.address,
                "[green]ok[/]" if s.healthy else "[red]down[/]",
                s.pid,
                s.rss_mb,
                s.transport,
                s.detail,
            ]
            for s in statuses
        ],
    )


def _as_json(box: Box, statuses: list[ServiceStatus]) -> None:
    """One object per service (the shape scripts read), each naming the box's profile."""
    print_json([{**x.as_dict(), "profile": box.profile} for x in statuses])


@app.command()
def up(
    workers: bool = typer.Option(
        False, "--workers", help="Also start the region's worker, outbox relay and ledger consumer."
    ),
    foreground: bool = typer.Option(
        False, "--foreground", help="Stay attached; Ctrl-C stops everything started."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Each service as JSON on stdout (progress on stderr)."
    ),
    regions: str | None = typer.Option(
        None,
        "--regions",
        envvar="SCO_BOX_REGIONS",
        help="Comma-separated regions whose processes --workers starts, each with its own "
        "ports and Prometheus, plus a global Prometheus over them (default: the region).",
    ),
    profile: str | None = typer.Option(
        None,
        "--profile",
        help="default: plaintext on loopback, the machine's PostgreSQL and NATS when they "
        "answer. secure: the box's own TLS-only PostgreSQL, NATS, Temporal and Kafka (mutual "
        "TLS), a certificate per process from the box's CA (default: box.profile).",
    ),
) -> None:
    """Start every service that does not already answer; idempotent."""
    s = settings()
    progress = err_console if as_json else console
    chosen: list[str] = []
    if regions is not None:
        chosen = [known_region(s, r.strip()) for r in regions.split(",")]
        if len(set(chosen)) != len(chosen):
            fail(f"--regions {shown(regions)}: a region named twice")
    if profile not in (None, "default", "secure"):
        fail(f"--profile {shown(profile)}: not default or secure")
    with errors_as_exit(DevboxError):
        box = Box(
            s,
            with_workers=workers,
            regions=chosen or None,
            profile="secure" if profile == "secure" else "default" if profile else None,
            on_step=lambda name, msg: progress.print(
                f"[cyan]{name:>16}[/] {mask_credentials(msg)}"
            ),
        )
    try:
        with errors_as_exit(DevboxError):
            statuses = box.up()
    except KeyboardInterrupt:
        fail("interrupted; stopped what this run had started", code=130)
    if as_json:
        _as_json(box, statuses)
    else:
        _show(statuses, box)
    temporal = next(x for x in statuses if x.name == "temporal")
    if box.secure is None:
        ui = f"http://{temporal.address.split(':')[0]}:{s.temporal.ui_port}"
        progress.print(f"Temporal UI: {ui}")
    else:
        progress.print("secure profile: no Temporal UI; the sco command needs its settings file:")
        for region, path in box.operator_settings_files().items():
            progress.print(f"  region {region}: export SCO_CONFIG={path}")
    for prom in (x for x in statuses if x.name.startswith("prometheus")):
        progress.print(f"{prom.name}: {prom.address} (alerts: {prom.address}/alerts)")
    if foreground:
        done = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: done.set())
        progress.print("running in the foreground; Ctrl-C stops everything")
        with contextlib.suppress(KeyboardInterrupt):
            done.wait()
        box.down()


@app.command()
def status(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """The profile; each service, its address, TLS or plaintext, health, and the memory
    (VmRSS) of each process the box started. Exit 1 when any is unhealthy."""
    with errors_as_exit(DevboxError):
        box = Box(settings())
    statuses = box.status()
    if as_json:
        _as_json(box, statuses)
    else:
        _show(statuses, box)
    if not all(s.healthy for s in statuses):
        raise typer.Exit(1)


@app.command()
def down(
    as_json: bool = typer.Option(False, "--json", help="What stopped, as JSON."),
) -> None:
    """Stop what `up` started, and nothing else."""
    progress = err_console if as_json else console
    box = Box(
        settings(),
        on_step=lambda name, msg: progress.print(f"[cyan]{name:>16}[/] {mask_credentials(msg)}"),
    )
    stopped = box.down()
    if as_json:
        print_json({"stopped": list(stopped)})
        return
    console.print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")


@app.command("prometheus-rule")
def prometheus_rule() -> None:
    """Print deploy/prometheus/rules/sco.yml as a Kubernetes PrometheusRule."""
    from workers.devbox.prometheus import RULES_FILE, k8s_prometheus_rule

    typer.echo(k8s_prometheus_rule(RULES_FILE.read_text()), nl=False)


@app.command("memory-diff")
def memory_diff(
    old: str = typer.Argument(
        ..., help="The earlier snapshot (<service>-<pid>-N.tracemalloc.json)."
    ),
    new: str = typer.Argument(..., help="A later snapshot of the same process."),
    top: int = typer.Option(15, "--top", min=1, max=500, help="How many tracebacks to show."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """The allocation sites that grew most between two memory snapshots of one process.

    A process started with PYTHONTRACEMALLOC=N writes a snapshot on each SIGUSR2 (see
    `<data_dir>/diagnostics/*.armed` for the processes that may be sent it)."""
    from pathlib import Path

    from workers import memory_trace

    with errors_as_exit(memory_trace.SnapshotError):
        before, after = memory_trace.load(Path(old)), memory_trace.load(Path(new))
    grown = memory_trace.growth(before, after, top)
    totals = {"before_kb": memory_trace.total_kb(before), "after_kb": memory_trace.total_kb(after)}
    if as_json:
        print_json({**totals, "grown": [g.as_dict() for g in grown]})
        return
    console.print(
        f"traced Python memory: {totals['before_kb'] / 1024:.1f} MB -> "
        f"{totals['after_kb'] / 1024:.1f} MB; the {len(grown)} tracebacks that grew most:"
    )
    for g in grown:
        console.print(
            f"[bold]+{g.size_diff_kb:.1f} KiB[/] "
            f"({g.count_diff:+d} blocks, {g.size_kb:.1f} KiB now)",
            highlight=False,
        )
        for frame in g.frames[-6:]:  # the innermost six: where the memory was taken
            # Whole paths (their ends say most); a file's oddities shown, not interpreted.
            console.print(
                f"    {escape(frame if frame.isprintable() else ascii(frame))}", highlight=False
            )
