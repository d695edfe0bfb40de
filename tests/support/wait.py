"""One way for a test to wait: `eventually` (sync) and `eventually_async`.

Each polls a condition until it holds or the deadline passes, then fails with what it waited
for, how long, and the last value or error the condition gave, so a timeout in CI says what
did not happen instead of "assert False". The condition returns a truthy value when done;
that value is returned (a found row, a status), so the caller need not ask twice. An
exception from the condition counts as "not yet" (a service still starting refuses
connections); the last one is shown when the wait gives up. `retrying` narrows that to the
errors that mean "not yet" (an RPC error while a server registers something): any other
error fails the wait at once, as it would have failed the call.

The poll interval starts at `first` and doubles up to `every`: quick conditions are seen
quickly, slow ones do not spin a loaded 2-core machine. These sleeps are the waiting itself,
not a settle time: nothing else in tests/ sleeps except where the sleep is the behaviour
under test.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TypeVar

T = TypeVar("T")

#: The errors from a condition that mean "not yet" (the others propagate at once).
Retrying = type[Exception] | tuple[type[Exception], ...]


class WaitTimeout(AssertionError):
    """The condition did not hold in time; the message says what was awaited."""


def _give_up(what: str, timeout: float, last: object, error: BaseException | None) -> WaitTimeout:
    detail = f"last error: {error!r}" if error is not None else f"last value: {last!r}"
    return WaitTimeout(f"waited {timeout:g} s for {what}; {detail}")


async def _poll(
    attempt: Callable[[], Awaitable[T | None]],
    pause: Callable[[float], Awaitable[object]],
    *,
    timeout: float,  # noqa: ASYNC109 - the deadline of the poll itself
    what: str,
    every: float,
    first: float,
    retrying: Retrying,
) -> T:
    """The one poll loop: `attempt` until it gives a truthy value, `pause` between tries."""
    deadline = time.monotonic() + timeout
    delay = first
    last: T | None = None
    error: BaseException | None = None
    while True:
        try:
            last = await attempt()
            error = None
        except retrying as exc:  # not yet: a dependency still coming up, a row not there
            error = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise _give_up(what, timeout, last, error)
        await pause(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, every)


def _to_the_end(poll: Coroutine[object, None, T]) -> T:
    """Run a coroutine that never suspends (each of its awaits is done at once) to its end,
    without an event loop: `eventually` is the poll loop, blocking."""
    try:
        poll.send(None)
    except StopIteration as end:
        value: T = end.value
        return value
    poll.close()
    raise RuntimeError("a blocking poll suspended")  # never: it awaits only plain calls


def eventually(
    condition: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    every: float = 0.2,
    first: float = 0.01,
    retrying: Retrying = Exception,
) -> T:
    """Call `condition` until it returns a truthy value; return that value."""

    async def pause(seconds: float) -> None:
        # sleep is the behaviour under test: the poll's own interval, the one home of it.
        # Blocking on purpose: `_to_the_end` runs this coroutine, never an event loop.
        time.sleep(seconds)  # noqa: ASYNC251

    return _to_the_end(
        _poll(
            checked(condition),
            pause,
            timeout=timeout,
            what=what,
            every=every,
            first=first,
            retrying=retrying,
        )
    )


async def eventually_async(
    condition: Callable[[], Awaitable[T | None]],
    *,
    timeout: float,  # noqa: ASYNC109 - the same signature as `eventually`; this is the poller
    what: str,
    every: float = 0.2,
    first: float = 0.01,
    retrying: Retrying = Exception,
) -> T:
    """`eventually` for a coroutine condition, waiting on the event loop."""
    return await _poll(
        condition,
        asyncio.sleep,  # the poll's own interval, as in `eventually`
        timeout=timeout,
        what=what,
        every=every,
        first=first,
        retrying=retrying,
    )


def checked(condition: Callable[[], T | None]) -> Callable[[], Awaitable[T | None]]:
    """A plain condition for `eventually_async`: state that tasks on the test's own event loop
    change (an agent's reports), which a blocking `eventually` would never let them change."""

    async def check() -> T | None:
        return condition()

    return check
