"""The agent's Debian 12 package on a fresh Debian 12 node: a container from the
debootstrapped base image (deploy/image/base-image.sh, podman with runc as in the
reference), `dpkg -i` of the .deb, then the unit's own ExecStartPre and ExecStart command
lines with its User, Environment and directories. The node starts with no bundle: it
fetches its first one from the machine's real NATS object store, and a signed notice
published on NATS drains it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from agent.report import drain_subject
from contracts.distribution import bucket_for, publish
from contracts.notice import notice_stream
from contracts.notice_signing import sign
from tests.agent.test_agent_notices import make_notice
from tests.support import tools
from tests.support.agent_fakes import notice_key, signed_bundle
from tests.support.paths import REPO
from tests.support.wait import WaitTimeout, eventually
from tests.support.worker_nats import NATS_URL

BASE = "localhost/debian:bookworm"
NODE_IMAGE = "localhost/sco-agent-node:bookworm"
ENV = {**os.environ, "CONTAINERS_CONF": str(REPO / "deploy" / "image" / "containers.conf")}
UNIT = REPO / "deploy" / "agent" / "sco-agent.service"
pytestmark = pytest.mark.timeout(1200)


def podman(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], env=ENV, capture_output=True, text=True, timeout=timeout
    )


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    return settings


def as_the_unit_runs_it() -> str:
    """A shell script doing what systemd does for the unit: its directories, its
    environment, then ExecStartPre and ExecStart as its User."""
    unit = unit_settings()
    user = unit["User"][0]
    lines = ["set -e"]
    for kind, base in (("RuntimeDirectory", "/run"), ("StateDirectory", "/var/lib")):
        mode = unit.get(f"{kind}Mode", ["0755"])[-1]
        for name in " ".join(unit.get(kind, [])).split():
            lines.append(f"install -d -o {user} -g {user} -m {mode} {base}/{name}")
    env = " ".join(shlex.quote(e) for e in unit["Environment"])
    caps = ",".join(
        "+" + c.lower().removeprefix("cap_")
        for c in " ".join(unit.get("AmbientCapabilities", [])).split()
    )
    keep = f" --inh-caps={caps} --ambient-caps={caps}" if caps else ""
    run = f"setpriv --reuid={user} --regid={user} --init-groups{keep} env {env}"
    lines.append(f"{run} {unit['ExecStartPre'][0]}")
    lines.append(f"exec {run} {unit['ExecStart'][0]}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def node_image() -> str:
    tools.require("podman", "runc", "debootstrap")
    base = subprocess.run(
        [str(REPO / "deploy" / "image" / "base-image.sh")],
        env=ENV, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert base.returncode == 0, base.stderr
    if podman("image", "exists", NODE_IMAGE).returncode != 0:
        # A fresh Debian 12 node: python3 and what the package depends on, nothing else.
        built = subprocess.run(
            ["podman", "build", "--network", "host", "-t", NODE_IMAGE, "-f", "-", str(REPO)],
            input=(
                f"FROM {BASE}\nRUN apt-get update -q && apt-get install -y -q "
                "--no-install-recommends python3 init-system-helpers passwd util-linux "
                "&& rm -rf /var/lib/apt/lists/*\n"
            ),
            env=ENV, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert built.returncode == 0, built.stderr[-2000:]
    return NODE_IMAGE


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("deb")
    done = subprocess.run(
        [str(REPO / "deploy/agent/build-deb.sh"), "--target", "debian12", "--out", str(out)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHON": sys.executable},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip().splitlines()[-1])


async def _nats_setup(region: str, raw: bytes) -> None:
    nc = await nats.connect(NATS_URL, connect_timeout=2, max_reconnect_attempts=0)
    try:
        await nc.jetstream().add_stream(
            name=notice_stream(region), subjects=[f"sco.{region}.notice.>"]
        )
    finally:
        await nc.close()
    await publish(NATS_URL, region, raw)


async def _nats_teardown(region: str) -> None:
    nc = await nats.connect(NATS_URL, connect_timeout=2, max_reconnect_attempts=0)
    try:
        js = nc.jetstream()
        for drop in (js.delete_stream(notice_stream(region)),
                     js.delete_object_store(bucket_for(region))):  # fmt: skip
            with contextlib.suppress(Exception):  # already gone
                await drop
    finally:
        await nc.close()


@pytest.fixture
def region() -> Iterator[str]:
    name = f"t{uuid.uuid4().hex[:8]}"
    yield name
    asyncio.run(_nats_teardown(name))


def test_a_fresh_debian12_node_installs_starts_and_drains_on_a_signed_notice(
    node_image: str, deb: Path, region: str, tmp_path: Path
) -> None:
    node = "deb12-node-1"
    raw, trust, _ = signed_bundle(tmp_path, serial=7, notice_regions=[region])
    asyncio.run(_nats_setup(region, raw))
    files = tmp_path / "node"
    files.mkdir()
    shutil.copy(deb, files / "sco-agent.deb")
    pub = next(trust.glob("*.pub"))  # named by its key id, as the trust dir wants
    shutil.copy(pub, files / pub.name)
    (files / "agent.toml").write_text(
        f'node_id = "{node}"\nregion = "{region}"\nhall = "D"\nscheduler = "none"\n'
        f'nats_urls = ["{NATS_URL}"]\n'
    )
    (files / "start.sh").write_text(
        "set -e\n"
        "dpkg -i /node/sco-agent.deb\n"
        "install -m 0640 -g sco-agent /node/agent.toml /etc/sco-agent/agent.toml\n"
        f"install -m 0644 /node/{pub.name} /etc/sco-agent/trust/\n" + as_the_unit_runs_it()
    )
    name = f"sco-agent-{uuid.uuid4().hex[:8]}"
    run = podman("run", "-d", "--name", name, "--network", "host", "-v", f"{files}:/node:ro",
                 node_image, "sh", "/node/start.sh")  # fmt: skip
    assert run.returncode == 0, run.stderr
    try:

        def logs() -> str:
            out = podman("logs", name)
            return out.stdout + out.stderr

        def started() -> bool:
            out = logs()
            if "ready" in out and "sco-agent on" in out:
                return True
            state = podman("inspect", "-f", "{{.State.Status}}", name).stdout.strip()
            assert state == "running", out
            return False

        try:
            eventually(
                started, timeout=240, what="the node's agent started", every=0.5, retrying=()
            )
        except WaitTimeout as exc:
            raise WaitTimeout(f"{exc}\n{logs()}") from exc
        out = logs()
        # ExecStartPre fetched the fresh node's first bundle from NATS.
        assert "[ok] distributor: first bundle fetched from the distributor: accepted serial 7" in (
            out
        )
        assert "ready to drain\n" in out

        async def notice_and_report() -> dict[str, object]:
            nc = await nats.connect(NATS_URL, connect_timeout=2, max_reconnect_attempts=0)
            try:
                got: asyncio.Future[dict[str, object]] = asyncio.get_running_loop().create_future()

                async def on_report(msg: Msg) -> None:
                    event = json.loads(msg.data)
                    if event.get("event") == "drain_finished" and not got.done():
                        got.set_result(event)

                await nc.subscribe(drain_subject(region, "D", node), cb=on_report)
                notice = make_notice(region, node)
                await nc.jetstream().publish(notice.subject, sign(notice, notice_key(tmp_path)))
                return await asyncio.wait_for(got, 120)
            finally:
                await nc.close()

        report = asyncio.run(notice_and_report())
        assert report["node"] == node and report["bundle_serial"] == 7, report
        assert not report["conservative"] and not report["error"], report
        # It ran as the unit's User: the journal it wrote is sco-agent's.
        owner = podman("exec", name, "stat", "-c", "%U", "/var/lib/sco-agent/journal.jsonl")
        assert owner.stdout.strip() == "sco-agent", owner
    finally:
        podman("rm", "-f", "-t", "5", name)
