"""tests/support/timing.py: the end of every run says, per xdist worker, how long it was
busy, when it finished and what it ran last (the run's critical path)."""

from __future__ import annotations

from tests.support.timing import worker_lines


def test_workers_are_listed_in_the_order_they_finished_with_their_last_tests() -> None:
    timeline = {
        "gw0": [("tests/a.py::test_one", 100.0, 110.0), ("tests/a.py::test_two", 110.0, 400.0)],
        "gw1": [
            ("tests/b.py::test_early", 101.0, 102.0),
            ("tests/b.py::test_mid", 102.0, 150.0),
            ("tests/b.py::test_late[x]", 150.0, 200.0),
            ("tests/b.py::test_last", 200.0, 210.0),
        ],
    }
    lines = worker_lines(timeline)
    assert lines == [
        "gw1: 4 tests, busy 109 s, done at 110 s; last: test_mid (48 s), "
        "test_late[x] (50 s), test_last (10 s)",
        "gw0: 2 tests, busy 300 s, done at 300 s; last: test_one (10 s), test_two (290 s)",
    ]


def test_a_run_without_workers_prints_nothing() -> None:
    assert worker_lines({}) == []
    assert worker_lines({"gw0": []}) == []
    assert worker_lines({"gw0": [], "gw1": [("t.py::test_x", 5.0, 6.5)]}) == [
        "gw1: 1 tests, busy 2 s, done at 2 s; last: test_x (2 s)"
    ]
