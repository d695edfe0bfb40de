"""`sco dev`: the local region in a box."""

from __future__ import annotations

import contextlib
import signal
import threading

import typer

from workers.cli.common import console, errors_as_exit, fail, print_json, settings, table
from workers.devbox.box import Box, ServiceStatus
from workers.devbox.process import DevboxError

app = typer.Typer(
    help="Run the local region in a box (real processes, data under .sco/).", no_args_is_help=True
)


def _show(statuses: list[ServiceStatus]) -> None:
    table(
        "SCO region in a box",
        ["service", "mode", "address", "health", "pid", "detail"],
        [
            [
                s.name,
                s.mode,
                s.address,
                "[green]ok[/]" if s.healthy else "[red]down[/]",
                s.pid,
                s.detail,
            ]
            for s in statuses
        ],
    )


@app.command()
def up(
    workers: bool = typer.Option(
        False, "--workers", help="Also start the region's worker, outbox relay and ledger consumer."
    ),
    foreground: bool = typer.Option(
        False, "--foreground", help="Stay attached; Ctrl-C stops everything started."
    ),
) -> None:
    """Start every service that does not already answer; idempotent."""
    s = settings()
    box = Box(
        s,
        with_workers=workers,
        on_step=lambda name, msg: console.print(f"[cyan]{name:>16}[/] {msg}"),
    )
    try:
        with errors_as_exit(DevboxError):
            statuses = box.up()
    except KeyboardInterrupt:
        fail("interrupted; stopped what this run had started", code=130)
    _show(statuses)
    temporal = next(x for x in statuses if x.name == "temporal")
    console.print(f"Temporal UI: http://{temporal.address.split(':')[0]}:{s.temporal.ui_port}")
    if prom := next((x for x in statuses if x.name == "prometheus"), None):
        console.print(f"Prometheus: {prom.address} (alerts: {prom.address}/alerts)")
    if foreground:
        done = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: done.set())
        console.print("running in the foreground; Ctrl-C stops everything")
        with contextlib.suppress(KeyboardInterrupt):
            done.wait()
        box.down()


@app.command()
def status(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Each service, its address and health. Exit 1 when any is unhealthy."""
    box = Box(settings())
    statuses = box.status()
    if as_json:
        print_json([s.as_dict() for s in statuses])
    else:
        _show(statuses)
    if not all(s.healthy for s in statuses):
        raise typer.Exit(1)


@app.command()
def down() -> None:
    """Stop what `up` started, and nothing else."""
    box = Box(settings(), on_step=lambda name, msg: console.print(f"[cyan]{name:>16}[/] {msg}"))
    stopped = box.down()
    console.print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")


@app.command("prometheus-rule")
def prometheus_rule() -> None:
    """Print deploy/prometheus/rules/sco.yml as a Kubernetes PrometheusRule."""
    from workers.devbox.prometheus import RULES_FILE, k8s_prometheus_rule

    typer.echo(k8s_prometheus_rule(RULES_FILE.read_text()), nl=False)
