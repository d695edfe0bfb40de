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
import shutil
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
from tests.support.agent_fakes import notice_key, signed_bundle
from tests.support.deb_node import as_the_unit_runs_it, podman
from tests.support.wait import WaitTimeout, eventually
from tests.support.worker_nats import NATS_URL

pytestmark = pytest.mark.timeout(1200)


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
