"""`sco reclaim --at`: a planned reclaim, validated in one line, then an early warning from
the hall's real relay process (and the plan in fleet state for its hard notice)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from activities.events import InstanceState
from activities.fleet.db import open_pool
from activities.fleet.repository import FleetRepository
from contracts.region import Region
from tests.support import services
from tests.support.paths import REPO
from tests.support.sco_process import Process
from tests.workers.test_notice_relay_faults import NoticeWatch, launch, start_relay
from workers.cli.main import app
from workers.cli.notices import parse_at

runner = CliRunner()
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "at"),
    [
        ("+15m", NOW + timedelta(minutes=15)),
        ("+2h", NOW + timedelta(hours=2)),
        ("+1d", NOW + timedelta(days=1)),
        ("2026-12-01T13:30:00Z", datetime(2026, 12, 1, 13, 30, tzinfo=UTC)),
        ("2026-12-01T14:30:00+01:00", datetime(2026, 12, 1, 13, 30, tzinfo=UTC)),
    ],
)
def test_at_takes_iso_8601_or_a_time_from_now(text: str, at: datetime) -> None:
    assert parse_at(text, NOW) == at


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("tomorrow", "not ISO-8601 (2026-12-02T10:00:00Z) nor +N[smhd] (+15m)"),
        ("+15 minutes", "not ISO-8601"),
        ("2026-12-01T13:30:00", "no timezone; add Z or an offset like +01:00"),
        ("2026-12-01T11:00:00Z", "is not in the future"),  # past for NOW and the real clock
        ("+40d", "more than 31 days ahead"),
    ],
)
def test_a_bad_at_is_one_line_naming_the_option(
    text: str, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match=r"^--at ") as raised:
        parse_at(text, NOW)
    assert says in str(raised.value) and "\n" not in str(raised.value)
    # Through the command: refused before anything is read or asked (no database here).
    monkeypatch.setenv("SCO_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("SCO_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:1/none")
    result = runner.invoke(app, ["reclaim", "some-node", "--region", "r1", "--at", text])
    assert result.exit_code == 1
    assert result.output.startswith("error: --at ") and says in result.output, result.output
    assert result.output.count("\n") == 1


@pytest.mark.timeout(120)
async def test_reclaim_at_sends_a_signed_early_warning_and_plans_the_hard_notice(
    env: dict[str, str], region_r1: Region, tmp_path: Path, processes: list[Process]
) -> None:
    start_relay(env, tmp_path, processes)
    [node] = await launch(env, region_r1, 1)
    async with NoticeWatch() as watch:
        code, out = await services.run_sco(
            env,
            "reclaim",
            node,
            "--region",
            "r1",
            "--at",
            "+15m",
            "--reason",
            "rack move",
            cwd=REPO,
        )
        assert code == 0 and "1 warned early (reclaim at " in out and node in out, out
        await watch.until({node}, within=20)
    [warning] = [n for n in watch.received if n.node == node]
    assert warning.early and "rack move" in warning.reason
    ahead = warning.deadline - datetime.now(UTC)
    assert timedelta(minutes=13) < ahead <= timedelta(minutes=15)
    pool = open_pool(env["SCO_POSTGRES_DSN"], max_size=1)
    try:
        repo = FleetRepository(pool)
        planned = repo.planned_reclaim(node)
        assert planned is not None and planned.reclaim_at == warning.deadline
        assert planned.noticed_at is None  # the hard notice is 2 minutes before the time
        row = repo.get_instance(node)
        assert row is not None and row.state is InstanceState.ACTIVE  # still fully usable
    finally:
        pool.close()
