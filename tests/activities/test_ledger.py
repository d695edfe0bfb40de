"""The ClickHouse ledger on embedded chDB: schema, spend, reclaims, replay, sharing.

Each test opens one chDB directory under tmp_path; an open costs ~0.07 s once the engine
is loaded, so tests insert whole batches and query a handful of times.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from activities.events import CapacityType, EventKind, LifecycleEvent
from activities.ledger import (
    TABLE,
    LedgerStore,
    LedgerUnavailable,
    ReclaimRow,
    SpendRow,
    instance_history,
    reclaim_rate,
    reclaims_per_pool,
    spend,
)
from activities.ledger.store import EVENT_COLUMN_NAMES
from tests.support.paths import REPO

T0 = datetime(2025, 3, 1, 8, 0, tzinfo=UTC)


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def ev(kind: EventKind, instance: str, hours: float, **overrides: Any) -> LifecycleEvent:
    fields: dict[str, Any] = {
        "instance_id": instance,
        "region": "r1",
        "pool_id": "r1-A-c5-xl",
        "hall": "A",
        "sku": "c5",
        "size": "xl",
        "capacity_type": CapacityType.RECLAIMABLE,
        "workload": "spark-etl",
        "tier": 2,
        "price_per_hour": 0.5,
    }
    fields.update(overrides)
    return LifecycleEvent(kind=kind, occurred_at=at(hours), **fields)


def lifecycle(instance: str, ready: float, stop: float | None, **overrides: Any) -> list[Any]:
    """ACQUIRE just before READY, and DELETE at `stop` unless still running."""
    events = [
        ev(EventKind.ACQUIRE, instance, ready - 0.1, **overrides),
        ev(EventKind.READY, instance, ready, **overrides),
    ]
    if stop is not None:
        events.append(ev(EventKind.DELETE, instance, stop, **overrides))
    return events


TRAIN = {"workload": "llm-train", "tier": 1, "price_per_hour": 1.2, "pool_id": "r1-B-g4-2xl"}
CI = {"workload": "ci", "tier": 3, "price_per_hour": 2.0, "pool_id": "r1-C-m5-l"}

#: Window [T0, T0+4h). Expected: spark 1.0 (i1) + 0.75 (i5); llm-train 3.6; ci 1.0.
FLEET: list[LifecycleEvent] = [
    # i1: READY t0, DELETE t0+2h at 0.5/h -> 7200 s, 1.0
    *lifecycle("i1", 0, 2),
    # i2: READY t0+1h, still running at the window's end -> 3 h at 1.2/h = 3.6
    *lifecycle("i2", 1, None, **TRAIN),
    # i3: FAIL without READY: never ran, costs nothing
    ev(EventKind.ACQUIRE, "i3", 0, **CI),
    ev(EventKind.FAIL, "i3", 0.5, **CI),
    # i4: READY then FAIL after 30 min at 2.0/h -> 1.0
    ev(EventKind.READY, "i4", 0, **CI),
    ev(EventKind.FAIL, "i4", 0.5, **CI),
    # i5: reclaimed: NOTICE, DRAIN, DELETE at 1.5 h (a late duplicate DELETE does not
    # extend it) -> 1.5 h at 0.5/h = 0.75
    *lifecycle("i5", 0, 1.5),
    ev(EventKind.NOTICE, "i5", 1.0, reason="reclaim"),
    ev(EventKind.DRAIN, "i5", 1.1),
    ev(EventKind.DELETE, "i5", 3.0),
]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LedgerStore]:
    # A nested, not yet existing directory: the store creates parents.
    with LedgerStore(f"chdb://{tmp_path}/data/ledger") as ledger:
        yield ledger


def by_workload(rows: list[SpendRow]) -> dict[str | None, tuple[float, float]]:
    return {row.workload: (row.instance_seconds, row.spend) for row in rows}


def test_schema_is_idempotent_and_covers_every_event_field(store: LedgerStore) -> None:
    store.ensure_schema()
    store.ensure_schema()
    with store.session() as client:
        columns = [
            name
            for (name,) in client.query(
                "SELECT name FROM system.columns WHERE table = {t:String} ORDER BY position",
                parameters={"t": TABLE},
            ).result_rows
        ]
        engine, sorting_key = client.query(
            "SELECT engine, sorting_key FROM system.tables WHERE name = {t:String}",
            parameters={"t": TABLE},
        ).result_rows[0]
    assert columns == [*EVENT_COLUMN_NAMES, "inserted_at"]
    assert set(LifecycleEvent.model_fields) == set(EVENT_COLUMN_NAMES)
    assert (engine, sorting_key) == ("ReplacingMergeTree", "event_id")
    assert store.path is not None and store.path.is_dir()
    assert store.lock_path == store.path.with_name("ledger.lock")


def test_spend_exact_per_workload(store: LedgerStore) -> None:
    assert store.insert_events(FLEET) == len(FLEET)
    rows = spend(store, start=T0, end=at(4))
    assert by_workload(rows) == {
        "llm-train": pytest.approx((10800.0, 3.6)),
        "spark-etl": pytest.approx((7200.0 + 5400.0, 1.75)),
        "ci": pytest.approx((1800.0, 1.0)),
    }
    assert [row.workload for row in rows] == ["llm-train", "spark-etl", "ci"]  # by spend
    assert rows[0].tier is None and rows[0].pool_id is None  # not grouped by


def test_spend_window_clipping(store: LedgerStore) -> None:
    store.insert_events(FLEET)
    # [t0+1h, t0+3h): i1 1 h, i5 0.5 h, i2 2 h, i4 ended before the window.
    assert by_workload(spend(store, start=at(1), end=at(3))) == {
        "llm-train": pytest.approx((7200.0, 2.4)),
        "spark-etl": pytest.approx((5400.0, 0.75)),
    }
    # Only the still-running instance accrues after everything else stopped; its end is `end`.
    assert by_workload(spend(store, start=at(10), end=at(12))) == {
        "llm-train": pytest.approx((7200.0, 2.4)),
    }
    assert spend(store, start=at(-5), end=at(-1)) == []
    with pytest.raises(ValueError, match="empty window"):
        spend(store, start=at(1), end=at(1))


def test_spend_group_keys_and_filters(store: LedgerStore) -> None:
    store.insert_events(
        [*FLEET, *lifecycle("r2-i1", 0, 1, region="r2", pool_id="r2-A-c5-xl", price_per_hour=3.0)]
    )
    rows = spend(store, start=T0, end=at(4), group_by=("region", "capacity_type", "tier"))
    assert {(r.region, r.capacity_type, r.tier): r.spend for r in rows} == {
        ("r1", CapacityType.RECLAIMABLE, 1): pytest.approx(3.6),
        ("r1", CapacityType.RECLAIMABLE, 2): pytest.approx(1.75),
        ("r1", CapacityType.RECLAIMABLE, 3): pytest.approx(1.0),
        ("r2", CapacityType.RECLAIMABLE, 2): pytest.approx(3.0),
    }
    assert {r.pool_id: r.spend for r in spend(store, start=T0, end=at(4), group_by="pool_id")} == {
        "r1-A-c5-xl": pytest.approx(1.75),
        "r1-B-g4-2xl": pytest.approx(3.6),
        "r1-C-m5-l": pytest.approx(1.0),
        "r2-A-c5-xl": pytest.approx(3.0),
    }
    r2_only = spend(store, start=T0, end=at(4), region="r2")
    assert by_workload(r2_only) == {"spark-etl": pytest.approx((3600.0, 3.0))}
    (total,) = spend(store, start=T0, end=at(4), group_by=())
    assert (total.instance_seconds, total.spend) == pytest.approx((28800.0, 9.35))
    with pytest.raises(ValueError, match="'hall'"):
        spend(store, start=T0, end=at(4), group_by=("workload", "hall"))


def test_replayed_events_never_double_count(store: LedgerStore) -> None:
    def answers() -> tuple[Any, ...]:
        with store.session():  # nested sessions reuse this one: one chDB open, not four
            return (
                spend(store, start=T0, end=at(4), group_by=("workload", "pool_id")),
                reclaims_per_pool(store, start=T0, end=at(4)),
                reclaim_rate(store, pool_ids=["r1-A-c5-xl"], start=T0, end=at(4)),
                instance_history(store, "i5"),
            )

    store.insert_events(FLEET)
    first = answers()
    # A topic replay: the whole batch again, then part of it in another order.
    store.insert_events(FLEET)
    store.insert_events(list(reversed(FLEET[:6])))
    assert answers() == first
    assert len(first[3]) == 6 and first[1][0].reclaims == 1


def test_reclaims_per_pool_and_rate(store: LedgerStore) -> None:
    b = {"pool_id": "r1-B-g4-2xl"}
    store.insert_events(
        [
            *FLEET,  # one NOTICE in r1-A-c5-xl (i5)
            # r1-B: b1 noticed twice, b2 once; b1 runs 2 h, b2 2 h in [t0, t0+4h)
            *lifecycle("b1", 0, 2, **b),
            ev(EventKind.NOTICE, "b1", 1.0, **b),
            ev(EventKind.NOTICE, "b1", 1.5, **b),
            *lifecycle("b2", 2, None, **b),
            ev(EventKind.NOTICE, "b2", 3.0, **b),
            ev(EventKind.NOTICE, "b2", 5.0, **b),  # outside the window
            # r2: separate region
            *lifecycle("r2-i1", 0, 1, region="r2", pool_id="r2-A-c5-xl"),
            ev(EventKind.NOTICE, "r2-i1", 0.5, region="r2", pool_id="r2-A-c5-xl"),
        ]
    )
    assert reclaims_per_pool(store, start=T0, end=at(4)) == [
        ReclaimRow(region="r1", pool_id="r1-B-g4-2xl", reclaims=3, instances=2),
        ReclaimRow(region="r1", pool_id="r1-A-c5-xl", reclaims=1, instances=1),
        ReclaimRow(region="r2", pool_id="r2-A-c5-xl", reclaims=1, instances=1),
    ]
    assert reclaims_per_pool(store, start=T0, end=at(4), region="r2") == [
        ReclaimRow(region="r2", pool_id="r2-A-c5-xl", reclaims=1, instances=1),
    ]
    assert reclaims_per_pool(store, start=at(4), end=at(6)) == [
        ReclaimRow(region="r1", pool_id="r1-B-g4-2xl", reclaims=1, instances=1),
    ]
    rates = reclaim_rate(
        store, pool_ids=["r1-B-g4-2xl", "r1-A-c5-xl", "r1-C-m5-l", "nowhere"], start=T0, end=at(4)
    )
    # r1-B: 3 reclaims / (2 h of b1 + 2 h of b2) (i2 runs in r1-B-g4-2xl too: +3 h).
    # r1-A: 1 / (2 h of i1 + 1.5 h of i5). r1-C: i4 ran 0.5 h, no reclaims.
    assert rates == pytest.approx(
        {"r1-B-g4-2xl": 3 / 7, "r1-A-c5-xl": 1 / 3.5, "r1-C-m5-l": 0.0, "nowhere": 0.0}
    )
    assert reclaim_rate(store, pool_ids=[], start=T0, end=at(4)) == {}


def test_instance_history_in_lifecycle_order(store: LedgerStore) -> None:
    i5 = [e for e in FLEET if e.instance_id == "i5"]
    # Same millisecond as READY: lifecycle order breaks the tie.
    tied = ev(EventKind.NOTICE, "i5", 0)
    store.insert_events([*reversed(i5), tied])
    history = instance_history(store, "i5")
    assert [(e.kind, e.occurred_at) for e in history] == [
        (EventKind.ACQUIRE, at(-0.1)),
        (EventKind.READY, at(0)),
        (EventKind.NOTICE, at(0)),
        (EventKind.NOTICE, at(1.0)),
        (EventKind.DRAIN, at(1.1)),
        (EventKind.DELETE, at(1.5)),
        (EventKind.DELETE, at(3.0)),
    ]
    assert set(history) == {*i5, tied}  # every field round-trips
    assert instance_history(store, "nobody") == []


_QUERY_SCRIPT = """
import json, sys
from datetime import datetime
from activities.ledger import LedgerStore, LedgerUnavailable, spend
store = LedgerStore(sys.argv[1], lock_timeout=float(sys.argv[2]))
try:
    rows = spend(store, start=datetime.fromisoformat(sys.argv[3]),
                 end=datetime.fromisoformat(sys.argv[4]))
except LedgerUnavailable as exc:
    print(json.dumps({"unavailable": str(exc)}))
else:
    print(json.dumps({row.workload: row.spend for row in rows}))
"""


def _query_in_subprocess(dsn: str, lock_timeout: float) -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _QUERY_SCRIPT,
            dsn,
            str(lock_timeout),
            T0.isoformat(),
            at(4).isoformat(),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_another_process_shares_the_embedded_ledger(store: LedgerStore) -> None:
    store.insert_events(FLEET)
    # This process keeps its store between sessions; another process can query.
    assert _query_in_subprocess(store.dsn, lock_timeout=30) == pytest.approx(
        {"llm-train": 3.6, "spark-etl": 1.75, "ci": 1.0}
    )
    store.insert_events(lifecycle("late", 0, 1, workload="late"))  # and we still write
    with store.session():
        # While we hold a session, others wait for the lock and then give up clearly.
        busy = _query_in_subprocess(store.dsn, lock_timeout=0.2)
        assert "held by another process" in busy["unavailable"]
        with pytest.raises(LedgerUnavailable, match="held by another process"):
            LedgerStore(store.dsn, lock_timeout=0.05).ensure_schema()
    assert _query_in_subprocess(store.dsn, lock_timeout=30)["late"] == pytest.approx(0.5)


def test_reclaim_rates_read_by_a_child_are_the_in_process_ones(store: LedgerStore) -> None:
    """The region worker's store (`reads_in_child`) asks a child process for the rates
    of an embedded ledger: same answer, same lock (a held ledger is a clear error)."""
    b = {"pool_id": "r1-B-g4-2xl"}
    store.insert_events([*FLEET, *lifecycle("b1", 0, 2, **b), ev(EventKind.NOTICE, "b1", 1.0, **b)])
    pools = ["r1-B-g4-2xl", "r1-A-c5-xl", "r1-C-m5-l", "nowhere"]
    here = reclaim_rate(store, pool_ids=pools, start=T0, end=at(4))
    assert here["r1-A-c5-xl"] > 0 and here["r1-B-g4-2xl"] > 0
    child = LedgerStore(store.dsn, lock_timeout=30, reads_in_child=True)
    assert reclaim_rate(child, pool_ids=pools, start=T0, end=at(4)) == pytest.approx(here)
    assert child._client is None  # nothing was opened in this process
    with store.session():
        busy = LedgerStore(store.dsn, lock_timeout=0.2, reads_in_child=True)
        with pytest.raises(LedgerUnavailable, match=r"reading child: .*held by another process"):
            reclaim_rate(busy, pool_ids=pools, start=T0, end=at(4))


def test_a_child_reading_store_never_loads_the_engine(tmp_path: Path) -> None:
    """A process reading reclaim rates through `reads_in_child` holds neither chDB nor
    pyarrow (~280 MB resident in the region worker, decision 0037)."""
    code = (
        "import json, sys\n"
        "from datetime import UTC, datetime, timedelta\n"
        "from activities.ledger import LedgerStore, reclaim_rate\n"
        f"s = LedgerStore('chdb://{tmp_path}/ledger', reads_in_child=True)\n"
        "end = datetime.now(UTC)\n"
        "rates = reclaim_rate(s, pool_ids=['p'], start=end - timedelta(hours=1), end=end)\n"
        "maps = open('/proc/self/maps').read()\n"
        "print(json.dumps({'rates': rates, 'modules': sorted({m.split('.')[0] for m in "
        "sys.modules} & {'chdb', 'pyarrow'}), 'mapped': '_chdb' in maps}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    got = json.loads(done.stdout.splitlines()[-1])
    assert got == {"rates": {"p": 0.0}, "modules": [], "mapped": False}
    assert (tmp_path / "ledger").is_dir()  # the child made the ledger: it was asked


@pytest.mark.parametrize(
    ("request_text", "said"),
    [
        ('{"dsn": [[["deep"]]]}', "request: nested 4 deep > 3"),
        ("x" * (5 << 20), "request: 4194305 bytes (at most 4194304)"),
    ],
    ids=["deep", "large"],  # not the 5 MiB text: pytest puts the id in the environment
)
def test_the_reading_child_refuses_a_request_out_of_bounds(request_text: str, said: str) -> None:
    """The child parses its request within a size and depth bound: out of them, one line
    on stderr and the ledger-unavailable exit status, nothing read."""
    done = subprocess.run(
        [sys.executable, "-m", "activities.ledger.child"],
        input=request_text,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 3 and done.stdout == ""
    assert said in done.stderr.strip().splitlines()[-1]


def test_relative_chdb_path_resolves_against_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert LedgerStore("chdb:state/ledger").path == tmp_path / "state" / "ledger"
    assert LedgerStore("chdb://state/ledger").path == tmp_path / "state" / "ledger"
    assert LedgerStore("chdb://memory").path is None


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("chdb:///dev/null/ledger", "chdb:///dev/null/ledger"),
        ("ftp://ledger.example/sco", "ftp://ledger.example/sco"),
        ("http://sco:s3cret@127.0.0.1:1/sco", "http://sco:***@127.0.0.1:1/sco"),
    ],
)
def test_bad_dsn_is_ledger_unavailable_naming_it(dsn: str, shown: str) -> None:
    with pytest.raises(LedgerUnavailable, match=re.escape(shown)) as caught:
        LedgerStore(dsn, lock_timeout=1).ensure_schema()
    assert "s3cret" not in str(caught.value)
    assert caught.value.dsn == shown


def test_the_region_worker_reads_its_embedded_ledger_through_a_child(tmp_path: Path) -> None:
    from services.region_worker.service import worker_ledger
    from workers.settings import Settings

    store = worker_ledger(Settings(data_dir=tmp_path, ledger_dsn=""))
    assert store.reads_in_child and store.path == (tmp_path / "ledger").resolve()
    assert store.lock_timeout == 2.0
