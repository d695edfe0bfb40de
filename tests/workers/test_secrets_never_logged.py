"""No password of a DSN or URL reaches a log line or a settings dump: every logger path that
names a connection (NATS connect, drain intake, ledger consumer, outbox relay, region worker
start-up, the simulator) and `model_dump_json` of the settings (contracts/redact.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from workers.settings import Settings

PASSWORD = "pw-9f2c-never-shown"

DSNS = {
    "postgres_dsn": f"postgresql://sco:{PASSWORD}@127.0.0.1:1/sco?connect_timeout=1",
    "ledger_dsn": f"https://sco:{PASSWORD}@127.0.0.1:1/",
    "nats_url": f"nats://control-r1:{PASSWORD}@127.0.0.1:1",
}


def _settings(**more: Any) -> Settings:
    return Settings(**DSNS, **more)


def _output_until_quiet(
    proc: subprocess.Popen[bytes], first_within: float = 30.0, then: float = 2.0
) -> tuple[str, str]:
    """What the process writes until it exits, or until `then` seconds after its first line
    (a process retrying a dependency forever); then SIGTERM, and what it writes stopping."""
    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    chunks: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    deadline = time.monotonic() + first_within
    with selectors.DefaultSelector() as sel:
        for stream in (proc.stdout, proc.stderr):
            sel.register(stream, selectors.EVENT_READ)
        open_streams = 2
        while open_streams and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=max(0.0, deadline - time.monotonic())):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                    continue
                if not any(chunks.values()):
                    deadline = min(deadline, time.monotonic() + then)
                chunks[key.fd].append(data)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        rest_out, rest_err = proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        rest_out, rest_err = proc.communicate()
    out = b"".join(chunks[out_fd]) + rest_out
    err = b"".join(chunks[err_fd]) + rest_err
    return out.decode(errors="replace"), err.decode(errors="replace")


def test_model_dump_json_masks_every_dsn() -> None:
    s = _settings(
        contracts={"repo_url": f"https://oauth2:{PASSWORD}@git.example/c.git"},
        tracing={"otlp_endpoint": f"https://otel:{PASSWORD}@otel:4318/v1/traces"},
        slurm={"rest_url": f"http://slurm:{PASSWORD}@slurmrestd:6820", "rest_token": PASSWORD},
    )
    for text in (s.model_dump_json(), json.dumps(s.model_dump(mode="json")), repr(s), str(s)):
        assert PASSWORD not in text, text
    dumped = json.loads(s.model_dump_json())
    assert dumped["postgres_dsn"] == "postgresql://sco:***@127.0.0.1:1/sco?connect_timeout=1"
    assert dumped["nats_url"] == "nats://control-r1:***@127.0.0.1:1"
    assert dumped["contracts"]["repo_url"] == "https://oauth2:***@git.example/c.git"
    # The settings themselves still hold what the clients need.
    assert PASSWORD in s.postgres_dsn


def test_nats_connect_logs_the_url_masked(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nats

    from workers.nats_connect import connect_until_up

    async def refused(*_: object, **__: object) -> None:
        # nats-py itself keeps retrying an unreachable server; the retry loop here sees the
        # refusal as a server that went away between attempts would give it.
        raise OSError(111, "Connection refused")

    monkeypatch.setattr(nats, "connect", refused)

    async def go() -> None:
        stop = asyncio.Event()

        class StopOnFirst(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                stop.set()

        handler = StopOnFirst()
        logging.getLogger("workers.nats_connect").addHandler(handler)
        try:
            assert await connect_until_up(_settings(), stop, max_backoff_seconds=0.1) is None
        finally:
            logging.getLogger("workers.nats_connect").removeHandler(handler)

    with caplog.at_level(logging.INFO):
        asyncio.run(go())
    lines = [r.getMessage() for r in caplog.records if r.name == "workers.nats_connect"]
    assert lines and "nats://control-r1:***@127.0.0.1:1" in lines[0]
    assert not [x for x in lines if PASSWORD in x]


def test_drain_intake_start_up_line_is_masked(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.drain_intake import service

    class FakeNats:
        is_connected = True

        def jetstream(self) -> object:
            return object()

        async def close(self) -> None:
            return None

    class FakeIntake:
        def __init__(self, *_: object, **__: object) -> None:
            self.region = "r1"
            self.progress = None

        def close(self) -> None:
            return None

    async def connected(*_: object) -> FakeNats:
        return FakeNats()

    monkeypatch.setattr(service, "_connect", connected)
    monkeypatch.setattr(service, "DrainIntake", FakeIntake)

    async def go() -> None:
        stop = asyncio.Event()
        stop.set()
        await service._book(_settings(), ["r1"], stop, [False])

    with caplog.at_level(logging.INFO):
        asyncio.run(go())
    lines = [r.getMessage() for r in caplog.records if r.name == service.__name__]
    assert any("https://sco:***@127.0.0.1:1/" in x for x in lines), lines
    assert not [x for x in lines if PASSWORD in x]


@pytest.mark.parametrize(
    "command",
    [
        ["outbox", "relay"],
        ["ledger", "book-drains", "--region", "r1"],
        ["ledger", "consume"],
        ["worker", "--region", "r1"],
        ["sim", "serve", "--region", "r1"],
    ],
    ids=lambda c: "-".join(c[:2]),
)
def test_a_process_log_shows_no_password(command: list[str], tmp_path: Path) -> None:
    """The process as it runs, every dependency down (port 1) and every DSN with a password
    (read from the TOML file, never the environment): its whole stderr shows none."""
    config = tmp_path / "sco.toml"
    config.write_text(
        "".join(f'{k} = "{v}"\n' for k, v in DSNS.items())
        + f'data_dir = "{tmp_path / "data"}"\n'
        + f'regions_dir = "{Path("deploy/regions").resolve()}"\n'
        + '[temporal]\naddress = "127.0.0.1:1"\n'
        + '[kafka]\nbootstrap_servers = "127.0.0.1:1"\n'
        + "[worker]\nmetrics_port = 0\nstate_metrics_port = 0\nhealth_port = 0\n"
        + '[log]\nformat = "json"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCO_")}
    env["SCO_CONFIG"] = str(config)
    proc = subprocess.Popen(
        [sys.executable, "-c", "from workers.cli.main import main; main()", *command],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = _output_until_quiet(proc)
    assert err.strip() or out.strip(), "the process said nothing: the test saw no log path"
    assert PASSWORD not in err and PASSWORD not in out, err[-3000:]
