"""CLI outputs that name a workflow print its Temporal UI link (`temporal.ui_url`); `--json`
outputs carry it as `ui_url`. Every command's link is checked against a real worker in
test_audit_trail.py; here the link's form, and one command against the dev server."""

from __future__ import annotations

import json
import os
import uuid

from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from tests.support import services
from tests.support.paths import REPO
from workers.cli.common import workflow_url
from workers.settings import Settings, TemporalSettings
from workflows import search_attributes as sa
from workflows.intake.models import intake_workflow_id


def test_the_link_names_the_namespace_and_the_workflow() -> None:
    s = Settings(
        temporal=TemporalSettings(ui_url="https://temporal.example/", namespace_prefix="p-")
    )
    assert workflow_url(s, "r1", "acq-r1-spark-etl-0123456789") == (
        "https://temporal.example/namespaces/p-r1/workflows/acq-r1-spark-etl-0123456789"
    )
    # An id is one path segment, whatever it holds.
    assert workflow_url(s, "r1", "a/b#c").endswith("/workflows/a%2Fb%23c")


def test_the_default_is_the_box_ui_on_its_port() -> None:
    assert workflow_url(Settings(), "r2", "controller-r2-p0") == (
        "http://127.0.0.1:8233/namespaces/r2/workflows/controller-r2-p0"
    )
    moved = Settings(temporal=TemporalSettings(ui_port=18233))
    assert workflow_url(moved, "r1", "x").startswith("http://127.0.0.1:18233/")


async def test_a_command_prints_the_link_of_the_workflow_it_signals(
    region_client: Client,
) -> None:
    """`sco demand collect` signals the region's intake workflow (started here on a queue no
    worker polls: a signal needs no worker)."""
    wid = intake_workflow_id("r1")
    idle = f"tq-{uuid.uuid4()}"
    handle = await region_client.start_workflow("DemandIntakeWorkflow", id=wid, task_queue=idle)
    acq = f"acq-r1-links-{uuid.uuid4().hex[:10]}"
    acquisition = await region_client.start_workflow(
        "AcquisitionWorkflow",
        id=acq,
        task_queue=idle,
        search_attributes=TypedSearchAttributes([SearchAttributePair(sa.REGION, "r1")]),
    )
    prefix = services.namespace_prefix(region_client)
    env = {
        **os.environ,
        "SCO_TEMPORAL__ADDRESS": region_client.service_client.config.target_host,
        "SCO_TEMPORAL__NAMESPACE_PREFIX": prefix,
        "SCO_TEMPORAL__UI_URL": "http://ui.test:8080",
    }
    ui = f"http://ui.test:8080/namespaces/{prefix}r1/workflows"
    try:
        code, out = await services.run_sco(env, "demand", "collect", "--region", "r1", cwd=REPO)
        assert code == 0, out
        assert f"asked {wid} to collect now" in out
        assert f"Temporal UI: {ui}/{wid}" in out
        # A list names each workflow: its link under the table, `ui_url` in --json.
        listed: list[dict[str, object]] = []
        for _ in range(60):  # visibility catches up within moments on the dev server
            code, out = await services.run_sco(
                {**env, "SCO_LOG__LEVEL": "ERROR"},
                *("acquisitions", "list", "--region", "r1", "--json"),
                cwd=REPO,
            )
            assert code == 0, out
            listed = [r for r in json.loads(out) if r["id"] == acq]
            if listed:
                break
        assert [r["ui_url"] for r in listed] == [f"{ui}/{acq}"]
        code, out = await services.run_sco(env, "acquisitions", "list", "--region", "r1", cwd=REPO)
        assert code == 0 and f"{acq}: {ui}/{acq}" in out, out
    finally:
        await handle.terminate()
        await acquisition.terminate()
