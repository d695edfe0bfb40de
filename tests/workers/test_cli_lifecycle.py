"""`sco lifecycle status` as an operator reads it (the query's answer printed); the
commands against a real worker are in tests/workers/test_audit_trail.py."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from workers.cli.lifecycle import _show
from workflows.lifecycle.models import LifecycleState, LifecycleStatus, ReplacementRecord

AT = datetime(2026, 12, 6, 8, 0, tzinfo=UTC)


def test_status_shows_pauses_candidates_waiting_halls_and_the_saving(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _show(
        LifecycleStatus(
            region="r1",
            state=LifecycleState.REPLACING,
            paused_contracts=["spark-etl"],
            rounds=7,
            replaced=2,
            saved_per_hour=0.224,
            in_flight={"acq-1": "drift"},
            held={"acq-2": "return-from-fallback: blackout 0 is open"},
            undrainable={"D": AT},
            recent=[
                ReplacementRecord(
                    contract="ci-runners",
                    instance_id="acq-0",
                    reason="return-from-fallback",
                    outcome="replaced",
                    why="fallback in r1.A.gp.xl at 0.176/h",
                    at=AT,
                    replacement="life-r1-ci-runners-1-0000",
                    saving_per_hour=0.112,
                )
            ],
        )
    )
    out = capsys.readouterr().out
    assert "lifecycle r1: replacing (running; paused contracts: spark-etl)" in out
    assert "2 replaced, saving 0.224/h" in out
    assert "hall D: no notice relay answered a drain" in out
    for text in ("acq-1", "in flight", "blackout 0 is open", "life-r1-ci-runners-1-0000"):
        assert text in out


def test_every_lifecycle_setting_reaches_the_workflow(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`SCO_LIFECYCLE__*` (each key but `enabled`, which decides whether it starts) is in
    the config the region worker starts the workflow with."""
    from services.region_worker.configs import configs_from
    from workers.settings import LifecycleSettings, load_settings

    values = {
        "interval_seconds": 42.0,
        "min_age_seconds": 7.0,
        "stable_rounds": 3,
        "min_saving_per_hour": 0.25,
        "consolidate": False,
        "consolidation_margin": 0.5,
        "consolidation_stable_rounds": 5,
        "max_return_parts": 2,
        "drain_retry_seconds": 99.0,
    }
    assert set(values) == set(LifecycleSettings.model_fields) - {"enabled"}
    monkeypatch.chdir(tmp_path)  # no sco.toml of the checkout's
    for key, value in values.items():
        monkeypatch.setenv(f"SCO_LIFECYCLE__{key.upper()}", str(value).lower())
    cfg = configs_from(load_settings()).lifecycle
    assert {k: getattr(cfg, k) for k in values} == values
