"""The region in a box with its real Prometheus: every process's target is `up`, every
panel of the on-call dashboard returns series, a hall loss makes the floor alert fire
and resolve after the rebuild, and a workflow whose tasks fail fires SCOWorkflowTaskFailing
(on a copy of the rules whose `for:` are zero)."""

from __future__ import annotations

import asyncio
import functools
import json
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from activities.provider.sim_service import SimulatorClient
from tests.support import services, tools
from tests.support.paths import BASE_DSN, REGIONS_DIR, REPO
from tests.support.wait import eventually
from tests.workers.test_devbox import sco
from workers.devbox.box import Box
from workers.devbox.prometheus import RULES_FILE
from workers.devbox.services import ChildProcessService, region_processes
from workers.settings import Settings
from workers.temporal_connect import connect

pytestmark = [pytest.mark.devbox, pytest.mark.timeout(900)]

DASHBOARD = REPO / "deploy" / "grafana" / "sco-on-call.json"
#: Panels fed by the node agents' textfiles: no agent runs in the box, so these queries
#: must be valid but have nothing to return there.
NODE_SIDE = ("sco_agent_",)
#: The box's scrape targets: the simulator, the worker (SCO's and Temporal's metrics), a
#: notice relay per hall of r1, the outbox relay, the ledger consumer and the drain intake.
JOBS = {
    "sco-simulator": 1,
    "sco-worker": 1,
    "sco-worker-runtime": 1,
    "sco-notice-relay": 4,
    "sco-outbox-relay": 1,
    "sco-ledger-consumer": 1,
    "sco-drain-intake": 1,
}
FLOOR_CONTRACT = "llm-train"  # the example tier-1 contract with a floor in r1

T = TypeVar("T")


def _fast_rules(into: Path) -> None:
    """The shipped rules with every `for:` zero: the box test cannot wait 5 minutes."""
    doc = yaml.safe_load(RULES_FILE.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "0s"
    into.mkdir(parents=True)
    (into / "sco.yml").write_text(yaml.safe_dump(doc, sort_keys=False))


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Settings]:
    tools.require("prometheus")
    dsn = services.scratch_database(BASE_DSN)
    _fast_rules(tmp_path / "rules")
    env = {
        "SCO_DATA_DIR": str(tmp_path / "sco"),
        "SCO_REGIONS_DIR": str(REGIONS_DIR),
        "SCO_POSTGRES_DSN": dsn,
        "SCO_TEMPORAL__ADDRESS": f"127.0.0.1:{services.free_port()}",
        "SCO_TEMPORAL__UI_PORT": str(services.free_port()),
        "SCO_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{services.free_port()}",
        "SCO_OPENBAO__BOX": "false",  # tests/workers/test_openbao.py runs the box's OpenBao
        # The box's NATS is the machine's: a simulated cloud of the test's own.
        "SCO_PROVIDER__SIMULATOR_PREFIX": f"sco-{uuid.uuid4().hex[:8]}",
        "SCO_PROMETHEUS__PORT": str(services.free_port()),
        "SCO_PROMETHEUS__BOX_PORTS_FROM": str(services.free_port_range(16)),
        "SCO_PROMETHEUS__RULES_DIR": str(tmp_path / "rules"),
        "SCO_PROMETHEUS__SCRAPE_SECONDS": "1",
        "SCO_PROMETHEUS__EVALUATION_SECONDS": "1",
        "SCO_WORKER__COLLECT_SECONDS": "1",
    }
    with services.environment(env):
        try:
            Box(Settings(), with_workers=True).up()
            yield Settings()
        finally:
            Box(Settings()).down()
            services.drop_database(dsn)


def _api(s: Settings, path: str, **params: str) -> Any:
    url = f"http://127.0.0.1:{s.prometheus.port}/api/v1/{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]


def _query(s: Settings, expr: str) -> list[dict[str, Any]]:
    return list(_api(s, "query", query=expr)["result"])


def _until(what: str, probe: Callable[[], T | None], timeout: float) -> T:
    """`eventually` at Prometheus's pace (a scrape a second); a probe's error fails at once."""
    return eventually(probe, timeout=timeout, what=what, every=1, retrying=())


def _process_logs(s: Settings, tail: int = 600) -> str:
    """The end of every box process's log: what a target that never came up said."""
    logs = sorted((s.data_dir / "logs").glob("*.log"))
    return "\n".join(f"--- {p.name}:\n{p.read_text(errors='replace')[-tail:]}" for p in logs)


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def _answers(port: int, path: str) -> bool:
    return _status(port, path) == 200


def _firing(s: Settings, alert: str) -> list[dict[str, Any]]:
    return [
        a
        for a in _api(s, "alerts")["alerts"]
        if a["labels"]["alertname"] == alert and a["state"] == "firing"
    ]


def _shortfall(s: Settings) -> float | None:
    rows = _query(s, f'sco:floor_shortfall_units{{contract="{FLOOR_CONTRACT}"}}')
    return float(rows[0]["value"][1]) if rows else None


def _panel_queries() -> list[tuple[str, str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]


def test_every_target_up_every_panel_answers_and_a_hall_loss_fires_the_floor_alert(
    box: Settings,
) -> None:
    s = box

    not_up: list[str] = []

    def all_up() -> dict[str, int] | None:
        active = _api(s, "targets", state="active")["activeTargets"]
        up: dict[str, int] = {}
        not_up[:] = []
        for t in active:
            if t["health"] == "up":
                up[t["labels"]["job"]] = up.get(t["labels"]["job"], 0) + 1
            else:
                not_up.append(f"{t['scrapeUrl']} {t['health']}: {t.get('lastError', '')}")
        return up if up == JOBS else None

    # Ten processes starting beside the rest of the suite on two cores: a bounded wait that
    # names the targets still down when it gives up.
    try:
        _until("every process's target up", all_up, timeout=240)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; not up: {not_up}; {_process_logs(s)}") from None
    # The alert follows the targets within an evaluation (its `for:` is zero here).
    _until("SCOProcessDown quiet", lambda: not _firing(s, "SCOProcessDown"), timeout=30)

    # Every process answers /healthz, and /readyz once its dependencies answer.
    for svc in region_processes(s):
        if isinstance(svc, ChildProcessService):
            port = int(svc.env[next(k for k in svc.env if k.endswith("HEALTH_PORT"))])
            for path in ("/healthz", "/readyz"):
                _until(f"{svc.name} {path}", functools.partial(_answers, port, path), 120)

    # The floor keeper holds the floor: the collector's gauges say so through Prometheus.
    try:
        _until("the floor whole", lambda: _shortfall(s) == 0, timeout=420)
    except AssertionError as exc:
        log = (s.data_dir / "logs" / "worker-r1.log").read_text()[-3000:]
        raise AssertionError(f"{exc}; shortfall {_shortfall(s)}; worker log:\n{log}") from None
    _until(
        "the ledger consumer's lag measured",
        lambda: _query(s, "sco:ledger_lag:sum"),
        timeout=60,
    )

    for title, expr in _panel_queries():
        if any(m in expr for m in NODE_SIDE):
            _query(s, expr)  # answered (the query is valid), nothing to return in the box
            continue
        # Bounded wait, not one look: a histogram appears with the first acquisition the
        # collector sees, and its rate() needs two scrapes of it.
        _until(
            f"dashboard panel {title!r}: {expr} returns series",
            functools.partial(_query, s, expr),
            60,
        )

    # Hall B is lost: the simulated cloud stops answering for it and the operator says so.
    _until("no floor alert before", lambda: not _firing(s, "SCOFloorBelowUnits"), timeout=60)
    lost_at = time.time()
    sim = SimulatorClient(s.nats_url, "r1", prefix=s.provider.simulator_prefix)
    asyncio.run(_fail_hall(sim, "B"))
    lost = sco({}, "hall", "lost", "r1", "B", "--by", "test", "--reason", "power")
    assert lost.returncode == 0, lost.stderr

    _until("SCOHallLost firing", lambda: _firing(s, "SCOHallLost"), timeout=120)
    # The rebuild in the survivors may be quick: Prometheus keeps every evaluation's
    # ALERTS series, so a firing since the loss that lasted only seconds is on record.
    fired = _until(
        "SCOFloorBelowUnits fired after the loss",
        lambda: _api(
            s,
            "query_range",
            query='ALERTS{alertname="SCOFloorBelowUnits",alertstate="firing"}',
            start=f"{lost_at:.3f}",
            end=f"{time.time():.3f}",
            step="1",
        )["result"],
        timeout=300,
    )
    # Any floor with units in B may be the first to fire (r1 has more than one floor).
    assert all(r["metric"].get("contract") for r in fired), fired

    def rebuilt() -> dict[str, float] | None:
        held = {
            r["metric"]["hall"]: float(r["value"][1])
            for r in _query(s, f'sco_floor_held_units{{contract="{FLOOR_CONTRACT}"}}')
        }
        whole = _shortfall(s) == 0 and not _firing(s, "SCOFloorBelowUnits")
        return held if whole and held.get("B", 0) == 0 and sum(held.values()) > 0 else None

    # The keeper rebuilds the floor in the three halls left: the alert resolves.
    _until("the floor rebuilt without B and SCOFloorBelowUnits resolved", rebuilt, timeout=600)
    assert _firing(s, "SCOHallLost")  # the hall stays lost until an operator restores it

    asyncio.run(_a_broken_workflow_fires_the_task_failure_alert(s))


async def _fail_hall(sim: SimulatorClient, hall: str) -> None:
    try:
        await sim.fail_hall(hall)
    finally:
        await sim.close()


#: A workflow type no worker registers: every task of it fails on the region worker, as a
#: workflow wedged by a nondeterminism error does (issue 37), and the SDK counts each one.
BROKEN_TYPE = "SCOBoxBrokenWorkflow"


async def _a_broken_workflow_fires_the_task_failure_alert(s: Settings) -> None:
    """A workflow whose tasks fail on the region worker makes SCOWorkflowTaskFailing fire
    in the box's real Prometheus, from the worker's own SDK metrics, naming its type."""
    client = await connect(s, "r1")
    handle = await client.start_workflow(
        BROKEN_TYPE, id=f"broken-{uuid.uuid4().hex[:8]}", task_queue=s.temporal.task_queue("r1")
    )
    try:
        firing = await asyncio.to_thread(
            eventually,
            lambda: [
                a
                for a in _firing(s, "SCOWorkflowTaskFailing")
                if a["labels"].get("workflow_type") == BROKEN_TYPE
            ],
            timeout=180,
            what=f"SCOWorkflowTaskFailing firing for {BROKEN_TYPE}",
        )
        assert firing[0]["labels"]["namespace"] == s.temporal.namespace("r1"), firing
        # The region's own workflows are not failing: only the broken one is named.
        others = [
            a["labels"].get("workflow_type")
            for a in _firing(s, "SCOWorkflowTaskFailing")
            if a["labels"].get("workflow_type") != BROKEN_TYPE
        ]
        assert others == [], others
    finally:
        await handle.terminate("box test: the alert fired")
