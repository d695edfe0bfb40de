"""`sco dev up | status | down`: the local region in a box."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Literal

from workers import procstat
from workers.devbox import process
from workers.devbox.process import DevboxError
from workers.devbox.services import Service, infrastructure, postgres_show, region_processes
from workers.devbox.state import StateFile
from workers.settings import Settings

if TYPE_CHECKING:
    from workers.devbox.secure import SecureKafkaService, SecureProfile, SecureTemporalService

Profile = Literal["default", "secure"]


@dataclass
class ServiceStatus:
    name: str
    mode: str  # managed: our process; external: already answered; down
    address: str
    healthy: bool
    detail: str
    pid: int | None = None
    transport: str = ""  # TLS or plaintext, at this listener
    #: VmRSS of our process and its children, MB (None: not ours, or not running).
    rss_mb: float | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


Progress = Callable[[str, str], None]


def _rss(pid: int, kids: dict[int, list[int]]) -> float | None:
    mb = procstat.tree_rss_mb(pid, kids)
    return None if mb is None else round(mb, 1)


class Box:
    def __init__(
        self,
        settings: Settings,
        *,
        with_workers: bool = False,
        regions: list[str] | None = None,
        on_step: Progress | None = None,
        profile: Profile | None = None,
    ) -> None:
        """`regions`: whose processes `up` starts (default: the settings' region); `status`
        and `down` read the regions `up` recorded. `profile` (default `box.profile`): the
        one a running box was brought up with wins for `status` and `down`."""
        self.state_file = StateFile(settings.data_dir)
        recorded = self.state_file.read()
        running = recorded.profile if recorded.processes else None
        self.profile: Profile = profile or running or settings.box.profile
        if running and profile and running != profile:
            raise DevboxError(
                f"the box runs the {running} profile; `sco dev down` before "
                f"`sco dev up --profile {profile}`"
            )
        self.secure: SecureProfile | None = None
        if self.profile == "secure":
            from workers.devbox.secure import BOX_KIND, SecureProfile

            self.secure = SecureProfile(settings)
            settings = self.secure.settings_for(BOX_KIND, settings.region, settings)
        self.s = settings
        self._with_workers = with_workers
        self._regions = list(regions) if regions else None
        self._step = on_step or (lambda _name, _msg: None)
        unknown = [r for r in self._regions or [] if r not in settings.regions]
        if unknown:
            raise DevboxError(f"regions {', '.join(unknown)}: not in regions {settings.regions}")

    @property
    def regions(self) -> list[str]:
        return self._regions or self.state_file.read().regions or [self.s.region]

    def _infrastructure(self, regions: list[str] | None = None) -> list[Service]:
        if self.secure is not None:
            from workers.devbox import secure

            return secure.infrastructure(self.s, self.secure, regions or self.regions)
        return infrastructure(self.s, regions)

    def services(self, *, workers: bool | None = None) -> list[Service]:
        workers = self._with_workers if workers is None else workers
        regions = self.regions
        identity = self.secure.child_env if self.secure is not None else None
        cert = self.secure.certificate_detail if self.secure is not None else None
        return self._infrastructure(regions) + (
            region_processes(self.s, regions, identity, cert) if workers else []
        )

    def operator_settings_files(self) -> dict[str, str]:
        """The secure box: per region, the settings file the operator's `sco` uses
        (`SCO_CONFIG=...`); the default box needs none."""
        if self.secure is None:
            return {}
        return {r: str(self.secure.operator_file(r)) for r in self.regions}

    def up(self) -> list[ServiceStatus]:
        """Bring every service up; idempotent. Interrupted or failed: undo this run's starts."""
        result: list[ServiceStatus] = []
        services = self.services()
        with (
            self.state_file.locked() as state,
            process.spawning() as spawned,
            _sigterm_as_interrupt(spawned) as interrupts,
        ):
            if state.processes and state.profile != self.profile:
                raise DevboxError(f"the box runs the {state.profile} profile; `sco dev down` first")
            state.profile = self.profile
            if self._with_workers:
                state.regions = self.regions
            started: list[str] = []
            try:
                for svc in services:
                    rec = state.processes.get(svc.name)
                    if rec is not None and process.alive(rec):
                        mode, detail = "managed", "already running"
                    elif not svc.managed_only and svc.reuse_external and (health := svc.probe()).ok:
                        rec, mode, detail = None, svc.answering_mode, health.detail
                    else:
                        self._step(svc.name, f"starting at {svc.address}")
                        rec = svc.start()
                        state.processes[svc.name] = rec
                        started.append(svc.name)
                        mode, detail = "managed", "started"
                    interrupts.check()
                    prepared = svc.prepare()
                    interrupts.check()
                    detail = f"{detail}; {prepared}" if prepared else detail
                    self._step(svc.name, detail)
                    pid = rec.pid if rec else None
                    result.append(
                        ServiceStatus(svc.name, mode, svc.address, True, detail, pid, svc.transport)
                    )
            except BaseException:
                stopped = []
                for name in reversed(started):
                    self._step(name, "stopping (up did not finish)")
                    stopped.append(state.processes.pop(name))
                    process.stop(stopped[-1])
                # Spawned by a start that did not return (interrupted or failed in its wait)
                for rec in reversed(spawned.records):
                    if rec not in stopped:
                        self._step(Path(rec.argv[0]).name, "stopping (its start did not finish)")
                        process.stop(rec)
                raise
        return result

    def status(self) -> list[ServiceStatus]:
        state = self.state_file.read()
        out = []
        recorded_workers = any(
            n not in {s.name for s in self._infrastructure()} for n in state.processes
        )
        services = self.services(workers=self._with_workers or recorded_workers)
        # Probes wait on the network (a service that is down costs its timeout): all at once,
        # so `sco dev status` takes as long as the slowest probe, not their sum.
        with ThreadPoolExecutor(max_workers=len(services)) as probes:
            health = {
                svc.name: probes.submit(svc.status_probe)
                for svc in services
                if not svc.managed_only
            }
        kids = procstat.children_by_parent()  # one pass over /proc for every tree's RSS
        for svc in services:
            rec = state.processes.get(svc.name)
            if svc.managed_only:
                ok = rec is not None and process.alive(rec)
                detail = "running" if ok else "not running"
                cert = getattr(svc, "certificate", None)
                if ok and cert is not None:
                    detail += f"; {cert()}"
                out.append(
                    ServiceStatus(
                        svc.name,
                        "managed" if ok else "down",
                        svc.address,
                        ok,
                        detail,
                        rec.pid if ok and rec else None,
                        svc.transport,
                        _rss(rec.pid, kids) if ok and rec else None,
                    )
                )
                continue
            h = health[svc.name].result()
            ours = rec is not None and process.alive(rec)
            mode = "managed" if ours else (svc.answering_mode if h.ok else "down")
            out.append(
                ServiceStatus(
                    svc.name,
                    mode,
                    svc.address,
                    h.ok,
                    h.detail,
                    rec.pid if ours and rec else None,
                    svc.transport,
                    _rss(rec.pid, kids) if ours and rec else None,
                )
            )
        return out

    def down(self) -> list[str]:
        """Stop what `up` started, and nothing else: the region's processes all at once
        (none depends on another's shutdown; each finishes its step in hand), then the
        services they used, newest first."""
        stopped = []
        infra = {s.name for s in self._infrastructure()}
        with self.state_file.locked() as state:
            names = list(reversed(list(state.processes)))
            children = [n for n in names if n not in infra]
            alive = [n for n in children if process.alive(state.processes[n])]
            for name in alive:
                self._step(name, f"stopping pid {state.processes[name].pid}")
            if alive:
                with ThreadPoolExecutor(max_workers=len(alive)) as stops:
                    list(stops.map(lambda n: process.stop(state.processes[n]), alive))
            stopped += alive
            for name in children:
                state.processes.pop(name)
            for name in (n for n in names if n in infra):
                rec = state.processes.pop(name)
                if process.alive(rec):
                    self._step(name, f"stopping pid {rec.pid}")
                    process.stop(rec)
                    stopped.append(name)
            state.regions = []
        return stopped

    def reload_nats(self, timeout: float = 15.0) -> int | None:
        """The secure box's NATS configuration written again (enrolled nodes, revoked
        identities) and the running server told to reload it (SIGHUP); returns its pid once
        its log says it reloaded, None when the box's NATS is not running (the next `up`
        starts it with this configuration)."""
        if self.secure is None:
            raise DevboxError("the box runs the default profile: no TLS identities to map")
        self.secure.write_nats_config()
        rec = self.state_file.read().processes.get("nats")
        if rec is None or not process.alive(rec):
            return None
        _sighup_until_logged(
            "nats", rec.pid, Path(rec.log), "Reloaded server configuration", timeout
        )
        return rec.pid

    def reload_crl(self, timeout: float = 15.0) -> list[str]:
        """The secure box's CRL file written again (decision 0038) and the box's PostgreSQL
        and nginx told to reload it (SIGHUP; live connections stay) when their copy changed;
        returns one line per server. PostgreSQL has reloaded once `ssl_crl_file` names the
        new copy, nginx once its old worker shuts down gracefully (it accepts no more)."""
        if self.secure is None:
            raise DevboxError("the box runs the default profile: no TLS listeners")
        from workers.devbox.secure import (
            SecureKafkaService,
            SecurePostgresService,
            SecureTemporalService,
        )

        state = self.state_file.read()
        out: list[str] = []
        copy = SecurePostgresService(self.s, self.secure).install_crl()
        rec = state.processes.get("postgres")
        if rec is None or not process.alive(rec):
            out.append("PostgreSQL not running: reads the CRL at its next start")
        elif self._pg_crl_file() != str(copy):
            _sighup_until(
                rec.pid,
                lambda: self._pg_crl_file() == str(copy),
                timeout,
                f"postgres (pid {rec.pid}) did not take {copy} in {timeout:g} s; see {rec.log}",
            )
            out.append(f"PostgreSQL (pid {rec.pid}) reloaded")
        else:
            out.append("PostgreSQL has this CRL")
        # Temporal's nginx and Kafka's (decision 0036), each with its own copy.
        for label, nginx, name in (
            ("nginx", SecureTemporalService(self.s, self.secure), "temporal"),
            ("nginx for Kafka", SecureKafkaService(self.s, self.secure), "kafka"),
        ):
            out.append(self._reload_nginx_crl(label, nginx, state.processes.get(name), timeout))
        return out

    def _reload_nginx_crl(
        self,
        label: str,
        nginx: SecureTemporalService | SecureKafkaService,
        rec: process.ProcessRecord | None,
        timeout: float,
    ) -> str:
        assert self.secure is not None
        run = self.secure.root / nginx.run_dir_name
        copy = run / "crl.pem"
        before = copy.read_bytes() if copy.is_file() else b""
        nginx.install_crl()
        if rec is None or not process.alive(rec):
            return f"{label} not running: reads the CRL at its next start"
        if copy.read_bytes() == before:
            return f"{label} has this CRL"
        _sighup_until_logged(label, rec.pid, run / "error.log", "gracefully shutting down", timeout)
        return f"{label} (pid {rec.pid}) reloaded"

    def _pg_crl_file(self) -> str:
        """The box's PostgreSQL's `ssl_crl_file`, asked with the box's own identity."""
        import psycopg

        try:
            return postgres_show(self.s, "ssl_crl_file", connect_timeout=5)
        except psycopg.Error:
            return ""


def _sighup_until_logged(label: str, pid: int, log: Path, line: str, timeout: float) -> None:
    """`_sighup_until` the server's log `log` holds `line` once more than before: its word
    that it reloaded."""

    def count() -> int:
        try:
            return log.read_text(errors="replace").count(line)
        except OSError:
            return 0  # not written yet

    before = count()
    _sighup_until(
        pid,
        lambda: count() > before,
        timeout,
        f"{label} (pid {pid}) did not reload in {timeout:g} s; see {log}",
    )


def _sighup_until(pid: int, reloaded: Callable[[], bool], timeout: float, failure: str) -> None:
    """Tell the server `pid` to reload (SIGHUP: its live connections stay) and wait until
    `reloaded()`; DevboxError(`failure`) when it has not after `timeout` s."""
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while not reloaded():
        if time.monotonic() > deadline:
            raise DevboxError(failure)
        time.sleep(0.1)


class _Interrupts:
    """Ctrl-C or SIGTERM during `up`: raised at once, and remembered, so a step that
    swallowed it (a probe's asyncio.run under a timeout can) is still stopped after."""

    def __init__(self, spawned: process.Spawned) -> None:
        self.seen = False
        self._spawned = spawned

    def handler(self, _sig: int, _frame: FrameType | None) -> None:
        self.seen = True
        if self._spawned.interrupt_now():  # else raised once the new process is recorded
            raise KeyboardInterrupt

    def check(self) -> None:
        if self.seen:
            raise KeyboardInterrupt


@contextmanager
def _sigterm_as_interrupt(spawned: process.Spawned) -> Iterator[_Interrupts]:
    """A SIGTERM or SIGINT during `up` unwinds like Ctrl-C, so partial starts are undone.
    Our own SIGINT handler also keeps asyncio.run from turning Ctrl-C into a cancellation
    that a step could swallow."""
    interrupts = _Interrupts(spawned)
    previous = {
        sig: signal.signal(sig, interrupts.handler) for sig in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        yield interrupts
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


__all__ = ["Box", "DevboxError", "ServiceStatus"]
