"""The environment of a secure box of its own (`Box(profile="secure")`) for a test or a
bench: its data directory, a scratch fleet database, and every listener on a free port,
OpenBao's included (the box starts one by default, at 8200 unless told), so two secure
boxes, a developer's `make up` and the suite never meet on a port; the box brought up in it
and down after; the operator's view of it (what `sco` uses)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support import services, tools
from tests.support.paths import REGIONS_DIR, REPO
from workers.devbox import tls_servers
from workers.devbox.box import Box, Progress
from workers.settings import Settings


def need_servers() -> None:
    """Skip the test where the secure box cannot run: its servers are not installed."""
    if tls_servers.postgres_bin_dir() is None:
        pytest.skip("PostgreSQL server binaries missing: apt-get install -y postgresql")
    if shutil.which("nginx") is None:
        pytest.skip("nginx missing: apt-get install -y nginx")
    tools.require("prometheus", "libnginx-mod-stream")


def secure_box_env(prefix: str, **extra: str) -> tuple[Path, dict[str, str]]:
    """A fresh directory (outside pytest's tmp tree, which is private to root: the box's
    PostgreSQL runs as the postgres user) and the `SCO_*` settings of a box in it; `extra`
    adds or overrides settings (e.g. `SCO_IDENTITY__TTL_SECONDS`)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"sco-{prefix}-"))
    env = {
        "SCO_DATA_DIR": str(tmp / "sco"),
        "SCO_REGIONS_DIR": str(REGIONS_DIR),
        "SCO_POSTGRES_DSN": (
            f"postgresql://postgres@127.0.0.1:5432/{prefix.replace('-', '_')[:12]}_"
            f"{uuid.uuid4().hex[:8]}"
        ),
        "SCO_BOX__SECURE_POSTGRES_PORT": str(services.free_port()),
        "SCO_BOX__SECURE_NATS_PORT": str(services.free_port()),
        "SCO_BOX__SECURE_TEMPORAL_PORT": str(services.free_port()),
        "SCO_BOX__SECURE_TEMPORAL_BACKEND_PORT": str(services.free_port()),
        "SCO_BOX__SECURE_KAFKA_BACKEND_PORT": str(services.free_port()),
        # OpenBao's API and, on the next port, its cluster listener.
        "SCO_OPENBAO__ADDRESS": f"https://127.0.0.1:{services.free_port_range(2)}",
        "SCO_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{services.free_port()}",
        "SCO_PROMETHEUS__PORT": str(services.free_port()),
        "SCO_PROMETHEUS__BOX_PORTS_FROM": str(services.free_port_range(32)),
    }
    env.update(extra)
    return tmp, env


def openbao_identities(ttl_seconds: int) -> dict[str, str]:
    """The settings (for `extra`) of a one-region box whose every process's certificate
    comes from the box's OpenBao and lives `ttl_seconds`: certificates that renew."""
    return {
        "SCO_REGIONS": '["r1"]',
        "SCO_BOX__SECURE_CERT_SOURCE": "openbao",
        "SCO_IDENTITY__TTL_SECONDS": str(ttl_seconds),
    }


@contextmanager
def secure_box_up(
    prefix: str,
    *,
    with_workers: bool = False,
    on_step: Progress | None = None,
    extra: dict[str, str] | None = None,
) -> Iterator[tuple[Box, dict[str, str]]]:
    """A secure box up in its own environment (`secure_box_env(prefix, **extra)`), and its
    settings; after, the box down, the whole of `os.environ` as it was (the box's settings
    are read from it, and `up` sets more), and its directory removed."""
    tmp, env = secure_box_env(prefix, **(extra or {}))
    before = dict(os.environ)
    os.environ.update(env)
    try:
        box = Box(Settings(), with_workers=with_workers, profile="secure", on_step=on_step)
        box.up()
        assert box.secure is not None
        yield box, env
    finally:
        try:
            Box(Settings()).down()
        finally:
            os.environ.clear()
            os.environ.update(before)
            shutil.rmtree(tmp, ignore_errors=True)


def operator_env(settings_file: Path) -> dict[str, str]:
    """The operator's environment: the settings file `sco dev up` wrote, no other SCO_*."""
    plain = {k: v for k, v in os.environ.items() if not k.startswith("SCO_")}
    return {**plain, "SCO_CONFIG": str(settings_file)}


def sco_as_operator(settings_file: Path, *args: str, timeout: float = 90) -> str:
    """What `sco *args` prints, run as the operator (`operator_env`); it must succeed."""
    out = subprocess.run(
        [str(Path(sys.executable).parent / "sco"), *args],
        env=operator_env(settings_file),
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=timeout,
    )
    assert out.returncode == 0, f"sco {' '.join(args)}: {out.stdout}{out.stderr}"
    return out.stdout


def operator_settings(settings_file: Path) -> Settings:
    """The settings `sco` reads in the operator's environment (the operator's certificate),
    this process's environment untouched after."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(operator_env(settings_file))
    try:
        return Settings()
    finally:
        os.environ.clear()
        os.environ.update(saved)
