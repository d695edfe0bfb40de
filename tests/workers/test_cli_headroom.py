"""Headroom on the CLI: `sco explain contract` and `sco demand list` show the headroom a
contract holds beyond its demand now, and which setting asked for it; on a scratch
PostgreSQL database and a signed bundle whose spark-etl carries headroom_units."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from activities.events import CapacityType, EventKind
from activities.fleet.control_state import ControlRepository
from activities.fleet.repository import InstanceSpec
from contracts.region import load_regions
from tests.support.control_harness import install_example_bundle, scratch_fleet
from tests.support.paths import REGIONS_DIR
from workers.cli.main import app

pytestmark = pytest.mark.timeout(120)
runner = CliRunner()


def test_explain_and_demand_list_show_the_headroom(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, trust = install_example_bundle(tmp_path, {"spark-etl": {"headroom_units": 6}})
    with scratch_fleet(load_regions(REGIONS_DIR)["r2"]) as (dsn, pool, fleet):
        monkeypatch.setenv("SCO_POSTGRES_DSN", dsn)
        monkeypatch.setenv("SCO_LEDGER_DSN", f"chdb://{tmp_path / 'ledger'}")
        monkeypatch.setenv("SCO_CONTRACTS__CACHE_DIR", str(cache))
        monkeypatch.setenv("SCO_CONTRACTS__TRUST_DIR", str(trust))
        ControlRepository(pool).set_demand("r2", "cli", {"spark-etl": 4})
        for n in range(3):  # gp.xl: 2 units each, 6 held for demand 4 + headroom 6
            iid = f"acq-r2-spark-etl-{n}"
            fleet.record_acquire(
                InstanceSpec(
                    instance_id=iid,
                    region="r2",
                    pool_id="r2.A.gp.xl",
                    capacity_type=CapacityType.RECLAIMABLE,
                    workload="spark-etl",
                    tier=2,
                    acquisition_id="acq-r2-spark-etl",
                )
            )
            fleet.record_event(iid, EventKind.READY, provider_id=f"p-{n}")

        out = runner.invoke(app, ["explain", "contract", "spark-etl", "--region", "r2"])
        assert out.exit_code == 0, out.output
        assert "not short: holds 6 units for a demand of 4" in out.output
        assert (
            "headroom: 6 units held ready beyond demand as cover (headroom_units 6); "
            "4 of them not held now (refilled at the next tick)" in " ".join(out.output.split())
        )
        doc = json.loads(
            runner.invoke(
                app, ["explain", "contract", "spark-etl", "--region", "r2", "--json"]
            ).output
        )
        assert (doc["headroom_units"], doc["headroom_short_units"]) == (6, 4)
        assert doc["headroom_why"] == "headroom_units 6"

        out = runner.invoke(app, ["demand", "list", "--region", "r2"])
        assert out.exit_code == 0, out.output
        assert "headroom" in out.output
        assert "spark-etl: 6 headroom units held ready beyond demand" in out.output
        rows = json.loads(runner.invoke(app, ["demand", "list", "--region", "r2", "--json"]).output)
        (row,) = [r for r in rows if r["workload"] == "spark-etl"]
        assert (row["units"], row["headroom_units"]) == (4, 6)
