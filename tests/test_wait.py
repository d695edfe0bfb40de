"""tests/support/wait.py: it returns the condition's value and says what it waited for."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.support.wait import WaitTimeout, checked, eventually, eventually_async


def test_eventually_returns_the_first_truthy_value() -> None:
    calls = itertools.count()
    got = eventually(lambda: next(calls) >= 3 and "ready", timeout=5, what="three calls")
    assert got == "ready"


def test_eventually_names_what_it_waited_for_and_the_last_error() -> None:
    def refuses() -> bool:
        raise ConnectionRefusedError("port 1")

    with pytest.raises(WaitTimeout, match=r"waited 0.05 s for the broker; last error: Connection"):
        eventually(refuses, timeout=0.05, what="the broker")


async def test_eventually_async_reports_the_last_value() -> None:
    async def empty() -> list[int]:
        return []

    with pytest.raises(WaitTimeout, match=r"for rows; last value: \[\]"):
        await eventually_async(empty, timeout=0.05, what="rows")


def test_eventually_lets_errors_outside_retrying_through_at_once() -> None:
    calls = itertools.count()

    def broken() -> bool:
        next(calls)
        raise KeyError("not a transient error")

    with pytest.raises(KeyError):
        eventually(broken, timeout=5, what="a call", retrying=ConnectionError)
    assert next(calls) == 1


async def test_eventually_async_retries_only_the_errors_it_is_told_to() -> None:
    calls = itertools.count()

    async def refused_twice() -> str:
        if next(calls) < 2:
            raise ConnectionRefusedError("not yet")
        return "up"

    assert (
        await eventually_async(refused_twice, timeout=5, what="a server", retrying=ConnectionError)
        == "up"
    )


async def test_checked_lets_the_loop_run_between_plain_checks() -> None:
    done = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, done.set)
    assert await eventually_async(checked(done.is_set), timeout=5, what="the timer") is True


async def test_eventually_blocks_inside_a_running_event_loop_without_using_it() -> None:
    """The blocking poll runs to its end on its own, even where a loop is running."""
    calls = itertools.count()
    assert eventually(lambda: next(calls) >= 2, timeout=5, what="three calls") is True
    assert next(calls) == 3
