"""The registry of long-running processes (services/registry.py) is what the CLI, the box and
the Kubernetes manifests agree on: each entry names a real `run`, a real `sco` command that
calls it through the registry, settings fields that exist, and one folder under services/."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
import typer
from typer import _click as click
from typer.core import TyperGroup

from services import registry
from services.registry import SERVICES, Port, Service
from tests.support.paths import REPO
from workers.cli.main import app
from workers.devbox import prometheus, services
from workers.devbox.prometheus import scrape_config
from workers.settings import Settings


def command_of(argv: tuple[str, ...]) -> click.Command:
    """The click command `sco <argv>` runs (lazy groups loaded as the CLI would)."""
    group = typer.main.get_command(app)
    ctx = click.Context(group)
    cmd: click.Command = group
    for word in argv:
        assert isinstance(cmd, TyperGroup), f"{argv}: {word!r} under a plain command"
        _, found, _ = cmd.resolve_command(ctx, [word])
        assert found is not None, f"sco {' '.join(argv)}: no such command"
        cmd = found
    return cmd


def test_names_are_unique_and_each_has_one_folder() -> None:
    names = [s.name for s in SERVICES]
    assert len(set(names)) == len(names)
    folders = {p.name for p in (REPO / "services").iterdir() if (p / "__init__.py").exists()}
    packages = {s.run.split(".")[1] for s in SERVICES}
    assert packages == folders, "a services/ folder without an entry, or the reverse"


@pytest.mark.parametrize("svc", SERVICES, ids=lambda s: s.name)
def test_run_is_the_packages_run(svc: Service) -> None:
    run = svc.load()
    assert callable(run) and run.__name__ == "run"
    assert run.__module__ == svc.run.split(":")[0]
    assert "settings" in inspect.signature(run).parameters


@pytest.mark.parametrize("svc", SERVICES, ids=lambda s: s.name)
def test_the_cli_command_starts_it_through_the_registry(svc: Service) -> None:
    cmd = command_of(svc.cli)
    assert cmd.callback is not None
    source = inspect.getsource(inspect.unwrap(cmd.callback))
    options = {opt for p in cmd.params for opt in getattr(p, "opts", [])}
    if svc.name == "notice-relay":
        # The typer command and `sco notice-relay` without the CLI share one `start`.
        from workers.cli import notice_relay

        source += inspect.getsource(notice_relay.start)
        typer_own = {"--help", "--show-completion", "--install-completion"}
        assert options - typer_own == set(notice_relay.OPTIONS)
    assert f'service("{svc.name}")' in source, f"sco {' '.join(svc.cli)} does not read the registry"
    wanted = {"hall": {"--region", "--hall"}, "region": {"--region"}, "box": set()}[svc.per]
    assert wanted <= options


@pytest.mark.parametrize("svc", SERVICES, ids=lambda s: s.name)
def test_settings_and_ports_exist(svc: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    if svc.settings_key is not None:
        assert svc.settings_key in Settings.model_fields
    assert [p.scraped for p in svc.ports].count(False) == 1, "one health port, last"
    assert not svc.ports[-1].scraped
    for i, port in enumerate(svc.ports):
        monkeypatch.setenv(port.env, str(20000 + i))
    s = Settings()
    assert [p.value(s) for p in svc.ports] == [20000 + i for i in range(len(svc.ports))]


def test_port_env_follows_the_settings_nesting() -> None:
    assert Port("metrics", "worker.metrics_port").env == "SCO_WORKER__METRICS_PORT"
    assert Port("metrics", "ledger_metrics_port").env == "SCO_LEDGER_METRICS_PORT"
    with pytest.raises(KeyError):
        registry.service("no-such-process")


def _box(monkeypatch: pytest.MonkeyPatch, with_prometheus: bool) -> list[services.Service]:
    binary: Callable[[], Any] = (
        (lambda: "/usr/bin/prometheus") if with_prometheus else (lambda: None)
    )
    monkeypatch.setattr(prometheus, "binary", binary)
    return services.region_processes(Settings(regions_dir=REPO / "deploy" / "regions"))


def test_the_box_starts_what_the_registry_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    procs = [p for p in _box(monkeypatch, False) if isinstance(p, services.ChildProcessService)]
    halls = "ABCD"  # deploy/regions/r1.toml
    boxed = [s for s in SERVICES if s.box_when(Settings())]
    expected = {}
    for svc in boxed:
        for hall in halls if svc.per == "hall" else [None]:
            expected[svc.box_name.format(region="r1", hall=hall)] = svc.argv("r1", hall)
    assert {p.name: p._argv for p in procs} == expected
    # Every port of every process, each its own, under the registry's variable names.
    ports = [int(v) for p in procs for v in p.env.values()]
    assert (
        len(set(ports))
        == len(ports)
        == sum(len(svc.ports) * (len(halls) if svc.per == "hall" else 1) for svc in boxed)
    )
    by_name = {p.name: p for p in procs}
    assert set(by_name["worker-r1"].env) == {p.env for p in registry.service("worker").ports}


def test_the_box_scrapes_every_metrics_port_under_the_registry_jobs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    procs = _box(monkeypatch, True)
    (prom,) = [p for p in procs if isinstance(p, services.PrometheusService)]
    config = scrape_config(prom.s, prom._prom.targets)
    jobs = {c["job_name"] for c in config["scrape_configs"]}  # type: ignore[attr-defined]
    boxed = [s for s in SERVICES if s.box_when(prom.s)]
    assert jobs == {job for svc in boxed for job in svc.jobs().values()}
    assert {"sco-worker", "sco-worker-runtime", "sco-notice-relay"} <= jobs


def test_without_the_simulator_the_box_leaves_it_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prometheus, "binary", lambda: None)
    s = Settings(regions_dir=REPO / "deploy" / "regions", provider={"kind": "openstack"})
    names = {p.name for p in services.region_processes(s)}
    assert "sim-r1" not in names and "worker-r1" in names


def test_the_box_starts_a_contract_sync_only_with_a_repository(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(prometheus, "binary", lambda: None)
    base = Settings(regions_dir=REPO / "deploy" / "regions")
    assert "contract-sync-r1" not in {p.name for p in services.region_processes(base)}
    with_repo = base.model_copy(
        update={"contracts": base.contracts.model_copy(update={"repo_url": "git://x/c.git"})}
    )
    procs = {p.name: p for p in services.region_processes(with_repo)}
    assert procs["contract-sync-r1"]._argv == ["contracts", "sync", "--region", "r1"]  # type: ignore[attr-defined]
