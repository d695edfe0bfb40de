"""The long-running processes as operators run them (`sco sim serve`, `sco notice-relay`,
`sco outbox relay`, `sco ledger consume`), each in its own process against the real
services: each does its job, then stops on SIGTERM or SIGINT with exit status 0 after
closing what it opened."""

from __future__ import annotations

import asyncio
import re
import signal
from pathlib import Path

from tests.support import services
from tests.support.paths import REPO
from tests.support.sco_process import Process


def test_simulator_and_notice_relay_serve_then_stop_on_sigterm_and_sigint(
    env: dict[str, str], tmp_path: Path, processes: list[Process]
) -> None:
    sim = Process(env, tmp_path / "sim.log", "sim", "serve", "--region", "r1")
    processes.append(sim)
    sim.wait_for("simulated cloud for r1 on NATS")
    relay = Process(env, tmp_path / "relay.log", "notice-relay", "--region", "r1", "--hall", "A")
    processes.append(relay)
    relay.wait_for("notice relay r1/A: republished 0")

    # The relay answers on NATS and reaches fleet state: a reclaim of a pool with no
    # instances notices none, and says so.
    code, out = asyncio.run(
        services.run_sco(env, "reclaim", "--pool", "r1.A.gp.m", "--region", "r1", cwd=REPO)
    )
    assert code == 0 and "0 noticed" in out, out

    assert relay.stop(signal.SIGTERM) == 0, relay.output()
    assert "notice relay r1/A stopped" in relay.output()
    assert sim.stop(signal.SIGINT) == 0, sim.output()
    assert "simulated cloud for r1 stopped" in sim.output()
    assert "Traceback" not in relay.output() + sim.output()


def test_outbox_relay_and_ledger_consumer_stop_on_sigint_and_sigterm(
    env: dict[str, str], kafka_bootstrap: str, tmp_path: Path, processes: list[Process]
) -> None:
    env = {**env, "SCO_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap}
    relay = Process(env, tmp_path / "relay.log", "outbox", "relay")
    processes.append(relay)
    relay.wait_for("relay: leading")
    consumer = Process(env, tmp_path / "consumer.log", "ledger", "consume")
    processes.append(consumer)
    consumer.wait_for("ledger consumer: ")

    assert relay.stop(signal.SIGINT) == 0, relay.output()
    assert "relay stopped after" in relay.output()
    assert consumer.stop(signal.SIGTERM) == 0, consumer.output()
    # Other tests of the session share the broker: what was inserted is theirs.
    assert re.search(r"ledger consumer stopped: \d+ inserted", consumer.output())
    assert "Traceback" not in relay.output() + consumer.output()
