"""The agent under systemd: sd_notify over $NOTIFY_SOCKET, and the unit file itself."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import sdnotify
from tests.support.paths import REPO
from tests.support.systemd import systemd_verify

UNIT = REPO / "deploy" / "agent" / "sco-agent.service"
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, Path]]:
    """A datagram socket standing in for systemd's notify socket."""
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(15)
    yield sock, path
    sock.close()


def _receive_until(sock: socket.socket, wanted: str, got: list[str]) -> None:
    while not any(wanted in message.split("\n") for message in got):
        got.append(sock.recv(4096).decode())


def test_the_daemon_says_ready_pings_the_watchdog_and_says_stopping(
    tmp_path: Path, notify_socket: tuple[socket.socket, Path]
) -> None:
    """`python -m agent` as systemd runs it (Type=notify, WatchdogSec): READY=1 once it
    watches, WATCHDOG=1 every WatchdogSec/2, STOPPING=1 on SIGTERM, then exit 0."""
    sock, path = notify_socket
    config = tmp_path / "agent.toml"
    config.write_text(
        textwrap.dedent(f"""\
            node_id = "n1"
            region = "r1"
            hall = "D"
            scheduler = "none"
            nats_urls = []
            cache_dir = "{tmp_path / "cache"}"
            trust_dir = "{tmp_path / "trust"}"
            journal_path = "{tmp_path / "journal.jsonl"}"
            socket_dir = "{tmp_path / "sockets"}"
            """)
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCO_", "WATCHDOG_"))}
    env.update(NOTIFY_SOCKET=str(path), WATCHDOG_USEC="200000")  # a ping every 0.1 s
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "--config", str(config)],
        cwd=REPO, env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    got: list[str] = []
    try:
        _receive_until(sock, "READY=1", got)
        assert got[0].split("\n") == [  # no trust, no NATS: it says it drains conservatively
            "READY=1",
            "STATUS=watching for reclaim notices; NO CONTRACT BUNDLE YET: draining conservatively",
        ]
        ready_at = time.monotonic()
        for _ in range(3):
            got.append(sock.recv(4096).decode())
        pings_in = time.monotonic() - ready_at
        proc.send_signal(signal.SIGTERM)
        _receive_until(sock, "STOPPING=1", got)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert got[1:4] == ["WATCHDOG=1"] * 3
    assert pings_in < 2, pings_in  # every ~0.1 s, not never
    assert got[-1] == "STOPPING=1"
    assert "ready" in stderr and "stopping" in stderr


def test_notify_reaches_an_abstract_socket_and_is_a_no_op_outside_systemd() -> None:
    name = f"sco-agent-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    try:
        assert sdnotify.notify("WATCHDOG=1", {"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(64) == b"WATCHDOG=1"
    finally:
        sock.close()
    assert not sdnotify.notify("READY=1", {})  # not run by systemd
    assert not sdnotify.notify("READY=1", {"NOTIFY_SOCKET": "@gone-" + name})  # no listener


def test_the_watchdog_interval_is_half_of_watchdog_sec_for_this_process_only() -> None:
    me = str(os.getpid())
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": me}) == 15
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "soon"}) is None
    assert sdnotify.watchdog_interval({}) is None


needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None or not Path("/lib/systemd/system").is_dir(),
    reason="systemd-analyze (and systemd's units) not installed",
)


@needs_systemd_analyze
def test_the_unit_file_verifies_clean(tmp_path: Path) -> None:
    # The executable the unit runs, where the package puts it.
    exe = tmp_path / "usr" / "bin" / "sco-agent"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    unit = tmp_path / "etc" / "systemd" / "system" / UNIT.name
    unit.parent.mkdir(parents=True)
    shutil.copy(UNIT, unit)
    assert systemd_verify(unit, tmp_path) == ""
    text = UNIT.read_text()
    for line in ["Type=notify", "NotifyAccess=main", "WatchdogSec=30", "User=sco-agent"]:
        assert line in text.splitlines()

    # The check has teeth: a typo, a bad value and a missing binary are each reported.
    bad = unit.with_name("bad.service")
    bad.write_text(text.replace("WatchdogSec=", "WatchdogSex=").replace("=notify\n", "=notif\n"))
    complaints = systemd_verify(bad, tmp_path)
    assert "Unknown key 'WatchdogSex'" in complaints and "notif" in complaints
    exe.unlink()
    assert "is not executable" in systemd_verify(unit, tmp_path)
