"""Lost work from real drains: agent drains → its journal → the ledger → `sco ledger lost-work`.

Two drains through the agent's engine on a node with a training job (its checkpoint
server answers over the real socket with the steps its save leaves behind) and a CI job
(no socket: requeued, its run time so far is the loss). The journal the agent wrote is
booked with `sco ledger record-drains` (twice: once counted) into an embedded ledger.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.checkpoint.protocol import Saved
from agent.checkpoint.server import register
from agent.notices import Notice
from agent.scheduler import Workload
from tests.support.agent_fakes import training_agent
from workers.cli.main import app

pytestmark = pytest.mark.timeout(120)
runner = CliRunner()


async def test_lost_work_of_real_drains_is_booked_and_shown_by_workload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, scheduler = training_agent(tmp_path, "81")
    started = datetime.now(UTC) - timedelta(seconds=120)
    ci = Workload("82", "slurm-82", "ci", "spot", "sco-contract=ci", started_at=started)
    node = [*scheduler.workloads_on_node, ci]
    lost_per_save = iter([1, 0])
    server = register(
        lambda reason, deadline: Saved("file:///ckpt/step-7", lost_steps=next(lost_per_save)),
        socket_path=tmp_path / "sockets" / "slurm_81/sock",
    )
    try:
        for n in (1, 2):  # the requeued jobs run on the node again before the second
            scheduler.workloads_on_node = list(node)
            deadline = datetime.now(UTC) + timedelta(seconds=30)
            await agent.submit(Notice(f"lw-{n}", "g1", deadline, "reclaim", "test"))
            await agent._drain(agent.queue.get_nowait())
    finally:
        server.close()
    outcomes = {(r.notice_id, w.workload): w for r in agent.reports for w in r.workloads}
    assert outcomes[("lw-1", "81")].result == "checkpointed"
    assert outcomes[("lw-1", "81")].lost_steps == 1
    assert outcomes[("lw-1", "82")].result == "requeued"
    lost_ci = outcomes[("lw-1", "82")].lost_seconds
    assert lost_ci is not None and 120 <= lost_ci < 150

    monkeypatch.setenv("SCO_LEDGER_DSN", f"chdb://{tmp_path / 'ledger'}")
    journal = agent.config.journal_path
    for _ in range(2):  # booking the same journal again changes nothing
        booked = runner.invoke(app, ["ledger", "record-drains", str(journal), "--region", "r1"])
        assert booked.exit_code == 0, booked.output
        assert "2 drains, 4 workload outcomes booked" in booked.output
    shown = runner.invoke(app, ["ledger", "lost-work", "--window", "7d", "--by", "workload"])
    assert shown.exit_code == 0, shown.output
    assert "llm-train" in shown.output and "ci-runners" in shown.output
    rows = runner.invoke(
        app, ["ledger", "lost-work", "--window", "7d", "--by", "workload", "--json"]
    )
    by = {r["key"]: r for r in json.loads(rows.output)}
    assert (by["llm-train"]["drains"], by["llm-train"]["lost_steps"]) == (2, 1)
    assert by["ci-runners"]["workloads"] == 2 and by["ci-runners"]["lost_seconds"] >= 240
    bad = runner.invoke(app, ["ledger", "lost-work", "--by", "pool"])
    assert bad.exit_code == 1 and "--by pool: choose from workload" in bad.output
