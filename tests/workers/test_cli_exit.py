"""Read commands run concurrently exit 0: every Temporal client and its runtime's threads
end before the interpreter finalizes (once: exit 134, PyGILState_Release at finalizing)."""

from __future__ import annotations

import asyncio
import os
import uuid

from temporalio.client import Client

from tests.support import services
from tests.support.paths import REGIONS_DIR, REPO

READS = [
    ("pool", "status", "r1.A.gp.l", "--json"),
    ("floor", "status", "--json", "--region", "r1"),
    ("controller", "status", "--json", "--region", "r1"),
    ("acquisitions", "list", "--all", "--json", "--region", "r1"),
]


async def test_read_commands_four_at_a_time_exit_zero(region_client: Client) -> None:
    env = {
        **os.environ,
        "SCO_TEMPORAL__ADDRESS": region_client.service_client.config.target_host,
        "SCO_TEMPORAL__NAMESPACE_PREFIX": services.namespace_prefix(region_client),
        "SCO_REGIONS_DIR": str(REGIONS_DIR),
        "SCO_DATA_DIR": f"/tmp/sco-{uuid.uuid4().hex[:8]}",
    }
    results: list[tuple[int, str]] = []
    for _ in range(4):
        results += await asyncio.gather(*(services.run_sco(env, *argv, cwd=REPO) for argv in READS))
    failed = [(code, out[-300:]) for code, out in results if code != 0]
    assert not failed, failed
