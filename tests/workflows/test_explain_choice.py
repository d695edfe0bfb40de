"""`sco explain instance` says why the controller chose the instance's pool over the others,
from the reasons the controller recorded with the acquisition (planning/choice.py): a real
RegionControllerWorkflow on the time-skipping server, real PostgreSQL, the signed example
bundle and the in-process simulated cloud; the CLI reads what the controller wrote."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

from activities.control.models import partition_of
from activities.events import InstanceState
from activities.fleet.control_state import ControlRepository
from activities.provider.simulator import Latency, SimulatedCloud
from contracts.feasibility import units_per_instance
from contracts.model import UnitShape
from contracts.region import Region
from tests.support.control_harness import (
    install_example_bundle,
    poll_until,
    region_worker,
    scratch_fleet,
)
from workers.cli.main import app
from workflows.controller.models import ControllerInput
from workflows.controller.workflow import RegionControllerWorkflow

pytestmark = pytest.mark.timeout(180)
CONTRACT = "spark-etl"  # 4 vCPU / 16 GiB on gp|mem x xl|2xl in halls A-D, spread group batch


def _cheapest_allowed(region: Region) -> str:
    """spark-etl's cheapest pool per unit in r1 (no reclaims yet: price per unit)."""
    unit = UnitShape(vcpu=4, memory_gib=16)
    costs = [
        (p.price_per_hour / units_per_instance(unit, p), region.pool_id(p))
        for p in region.pools
        if p.sku in ("gp", "mem") and p.size in ("xl", "2xl")
    ]
    return min(costs)[1]


async def test_instance_explanation_names_the_pools_passed_over_and_why(
    workflow_env: WorkflowEnvironment,
    region_r1: Region,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    excluded = _cheapest_allowed(region_r1)
    cache, trust = install_example_bundle(tmp_path)
    with scratch_fleet(region_r1) as (dsn, pool, fleet):
        control = ControlRepository(pool)
        with pool.connection() as conn:
            conn.execute(
                """INSERT INTO exclusions (pool_id, state, reason, strikes, excluded_until, set_by)
                   VALUES (%s, 'excluded', '3 reclaims in 1 h', 1,
                           now() + interval '15 minutes', 'cycle')""",
                (excluded,),
            )
        control.set_demand("r1", "cli", {CONTRACT: 8})
        loop = asyncio.get_running_loop()
        cloud = SimulatedCloud(region_r1, latency=Latency(boot_s=0.0), clock=loop.time)
        async with region_worker(
            workflow_env.client, cloud, fleet, control, bundle_dir=cache, trust_dir=trust
        ) as h:
            handle = await h.client.start_workflow(
                RegionControllerWorkflow.run,
                ControllerInput(region="r1", partition=partition_of(CONTRACT, 4)),
                id=f"controller-test-{uuid.uuid4().hex[:6]}",
                task_queue=h.queue,
            )

            async def active() -> bool:
                rows = fleet.list_instances("r1", [InstanceState.ACTIVE])
                return any(r.workload == CONTRACT for r in rows)

            await poll_until(active)
            await handle.terminate()
        inst = next(
            r for r in fleet.list_instances("r1", [InstanceState.ACTIVE]) if r.workload == CONTRACT
        )
        assert inst.pool_id != excluded

        monkeypatch.setenv("SCO_POSTGRES_DSN", dsn)
        monkeypatch.setenv("SCO_LEDGER_DSN", f"chdb://{tmp_path / 'ledger'}")
        monkeypatch.setenv("SCO_CONTRACTS__CACHE_DIR", str(cache))
        monkeypatch.setenv("SCO_CONTRACTS__TRUST_DIR", str(trust))
        runner = CliRunner()
        out = runner.invoke(app, ["explain", "instance", inst.instance_id])
        assert out.exit_code == 0, out.output
        text = " ".join(out.output.split())  # as one line: the console wraps long ones
        assert f"why {inst.pool_id}: chosen: " in text and "risk-adjusted" in text
        assert f"chosen over {excluded}: excluded by the pool exclusion cycle" in text
        assert ": dearer: 0.0400/unit-h risk-adjusted" in text, text
        assert "0.0080/unit-h more than the dearest pool chosen" in text, text
        # Same price per unit as the xl pools chosen, but 4 units an instance where the
        # spread group may add only 2: the planner's real reason, said.
        assert "an instance holds 4 units but spread group batch may add only 2 here" in text

        doc = json.loads(
            runner.invoke(app, ["explain", "instance", inst.instance_id, "--json"]).output
        )
        choice = doc["choice"]
        assert choice["basis"] == "planner" and choice["ranked"] == 16  # 2 skus x 2 sizes x 4 halls
        assert inst.pool_id in {c["pool_id"] for c in choice["chosen"]}
        verdicts = {c["pool_id"]: c["verdict"] for c in choice["passed_over"]}
        assert verdicts[excluded] == "excluded"
        assert "dearer" in verdicts.values()
        assert len(choice["passed_over"]) <= 8
        assert any(line.startswith(f"{excluded}: excluded") for line in doc["chosen_over"])

        out = runner.invoke(app, ["explain", "pool", excluded])
        assert out.exit_code == 0, out.output
        assert f"for {CONTRACT} (acquisition " in out.output
        assert "excluded by the pool exclusion cycle" in out.output
