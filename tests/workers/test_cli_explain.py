"""`sco explain contract | instance | pool` and `sco instances list`'s DRIFT column, on the
machine's PostgreSQL (fleet state), an embedded ledger and a signed bundle of the examples.

What SCO recorded is written the way its workflows write it (fleet-state rows, the
controller's acquisition record, exclusions, decisions in the ledger); the answers must
come from those records. Region r2, so the session database's r1 rows do not matter.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from activities.decisions import Decision, DecisionKind
from activities.events import CapacityType, EventKind
from activities.fleet.control_state import AcquisitionRecord, ControlRepository
from activities.fleet.repository import FleetRepository, InstanceSpec
from activities.ledger.store import LedgerStore
from contracts.region import load_regions
from tests.support.control_harness import install_example_bundle
from tests.support.paths import REGIONS_DIR
from workers.cli.main import app

pytestmark = pytest.mark.timeout(120)
runner = CliRunner()


def _instance(fleet: FleetRepository, iid: str, pool_id: str, acq: str) -> None:
    fleet.record_acquire(
        InstanceSpec(
            instance_id=iid,
            region="r2",
            pool_id=pool_id,
            capacity_type=CapacityType.RECLAIMABLE,
            workload="spark-etl",
            tier=2,
            acquisition_id=acq,
        )
    )
    fleet.record_event(iid, EventKind.READY, provider_id=f"p-{iid}")


def test_explain_answers_from_recorded_reasons(
    tmp_path: Path, pg_dsn: str, fleet_repo: FleetRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet_repo.sync_pools(load_regions(REGIONS_DIR)["r2"])
    cache, trust = install_example_bundle(tmp_path / "contracts")
    ledger_dsn = f"chdb://{tmp_path / 'ledger'}"
    monkeypatch.setenv("SCO_POSTGRES_DSN", pg_dsn)
    monkeypatch.setenv("SCO_LEDGER_DSN", ledger_dsn)
    monkeypatch.setenv("SCO_CONTRACTS__CACHE_DIR", str(cache))
    monkeypatch.setenv("SCO_CONTRACTS__TRUST_DIR", str(trust))
    tag = uuid.uuid4().hex[:6]
    control = ControlRepository(fleet_repo._pool)

    # The controller asked for spark-etl; its acquisition came up short and its fallback
    # waits for approval; one of its pools was excluded by the cycle; one instance sits in a
    # pool the contract does not allow (drift).
    acq = f"ctl-r2-p0-spark-etl-{tag}"
    good, drifted = f"{acq}-0000", f"{acq}-0001"
    _instance(fleet_repo, good, "r2.A.gp.xl", acq)
    _instance(fleet_repo, drifted, "r2.A.cpu.xl", acq)
    control.record_acquisition(
        AcquisitionRecord(
            acquisition_id=acq,
            region="r2",
            workload="spark-etl",
            partition=0,
            state="waiting_approval",
            requested_units=30,
            requested_instances=15,
            launched=2,
            active=2,
            shortfall_units=27,
            pool_ids=["r2.A.gp.xl"],
            detail="fallback:awaiting_approval",
        )
    )
    control.set_demand("r2", "cli", {"spark-etl": 30})
    with fleet_repo._pool.connection() as conn:
        conn.execute(
            """INSERT INTO exclusions (pool_id, state, reason, strikes, excluded_until, set_by)
               VALUES ('r2.B.gp.xl', 'excluded', '3 reclaims in 1 h', 1,
                       now() + interval '15 minutes', 'cycle')
               ON CONFLICT (pool_id) DO UPDATE SET state = 'excluded',
                   reason = excluded.reason, excluded_until = excluded.excluded_until"""
        )
    with LedgerStore(ledger_dsn) as ledger:
        ledger.insert_decisions(
            [
                Decision(
                    region="r2",
                    kind=DecisionKind.FALLBACK,
                    subject="spark-etl",
                    outcome="awaiting_approval",
                    reason="fallback 0.54/h over spend authority 0/h",
                    amount_per_hour=0.54,
                    workflow_id=acq,
                ),
                Decision(
                    region="r2",
                    kind=DecisionKind.DISRUPTION,
                    subject=drifted,
                    outcome="held",
                    reason="drift: blackout 0 is open",
                    workflow_id="lifecycle-r2",
                ),
                Decision(
                    region="r2",
                    kind=DecisionKind.EXCLUSION,
                    subject="r2.B.gp.xl",
                    outcome="excluded",
                    reason="3 notices from 3 instances within 3600 s",
                    workflow_id="pool-exclusion-r2.B.gp.xl",
                ),
            ]
        )

    out = runner.invoke(app, ["explain", "contract", "spark-etl", "--region", "r2"])
    assert out.exit_code == 0, out.output
    text = out.output
    assert "short by 27 units: holds 3 of 30" in text  # 2 units in gp.xl, 1 in cpu.xl
    assert "excluded pools: 1 of" in text and "r2.B.gp.xl (excluded: 3 reclaims in 1 h)" in text
    assert f"waiting approval: {acq}" in text
    assert (
        f"no free reclaimable capacity: acquisition {acq} (waiting_approval) came up 27 units short"
        in text
    )
    assert "fallback awaiting_approval: fallback 0.54/h over spend authority 0/h" in text
    assert "drifted instances: 1" in text
    assert f"voluntary disruption of {drifted}: held: drift: blackout 0 is open" in text
    doc = json.loads(
        runner.invoke(app, ["explain", "contract", "spark-etl", "--region", "r2", "--json"]).output
    )
    assert (doc["demand_units"], doc["held_units"], doc["short_units"]) == (30, 3, 27)
    assert doc["waiting_approval"] == [acq]
    assert doc["excluded_pools"] == ["r2.B.gp.xl"]
    assert set(doc["drifted"]) == {drifted}
    assert {b["reason"]: b["allowed"] for b in doc["budgets"]}["drift"] == 1  # 10 % of 2, up
    assert doc["decisions"][0]["workflow_id"] == acq

    out = runner.invoke(app, ["explain", "instance", drifted])
    assert out.exit_code == 0, out.output
    assert f"made by the region controller's acquisition {acq} for spark-etl's demand" in out.output
    assert "decision: fallback awaiting_approval" in out.output
    assert "drifted: sku cpu no longer allowed (gp, mem)" in out.output
    assert "released by: a reclaim of r2.A.cpu.xl" in out.output
    # Recorded without the planner's reasons (as before SCO kept them): said, not guessed.
    assert "why this pool: not recorded" in out.output
    doc = json.loads(runner.invoke(app, ["explain", "instance", good, "--json"]).output)
    assert doc["found"] and doc["drift"] == "" and doc["acquisition"]["acquisition_id"] == acq
    assert doc["choice"] is None and doc["chosen_over"] == []
    missing = runner.invoke(app, ["explain", "instance", f"nope-{tag}"])
    assert missing.exit_code == 1 and "no instance" in missing.output

    out = runner.invoke(app, ["explain", "pool", "r2.B.gp.xl"])
    assert out.exit_code == 0, out.output
    assert "excluded until" in out.output and "3 reclaims in 1 h" in out.output
    assert "allowed by: " in out.output and "spark-etl" in out.output
    assert "recorded" in out.output and "exclusion excluded: 3 notices" in out.output
    doc = json.loads(runner.invoke(app, ["explain", "pool", "r2.A.gp.xl", "--json"]).output)
    assert doc["exclusion"] is None or doc["exclusion"]["state"] == "admitted"
    assert doc["instances_by_workload"].get("spark-etl", 0) >= 1
    assert doc["pool"]["price_per_hour"] > 0

    listed = runner.invoke(app, ["instances", "list", "--region", "r2", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = {r["instance_id"]: r for r in json.loads(listed.output)}
    assert rows[drifted]["drifted"] is True
    assert rows[drifted]["drift_reason"] == "sku cpu no longer allowed (gp, mem)"
    assert rows[good]["drifted"] is False
    table = runner.invoke(app, ["instances", "list", "--region", "r2"])
    assert table.exit_code == 0 and "drift" in table.output
