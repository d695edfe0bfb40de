"""Stopping a long-running process: SIGTERM (Kubernetes, systemd, `sco dev down`) and
SIGINT (Ctrl-C) set a stop event the process's loop watches, so it finishes the step in
hand and closes what it opened instead of dying mid-write.

The previous handlers come back when the block ends, so a second Ctrl-C during cleanup,
or a signal after the process returned, behaves as Python's default would.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def async_stop_event() -> Iterator[asyncio.Event]:
    """An event set by SIGTERM/SIGINT, for a process running an asyncio loop; call it
    from inside that loop."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        yield stop
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


@contextmanager
def thread_stop_event() -> Iterator[threading.Event]:
    """An event set by SIGTERM/SIGINT, for a process whose loop blocks in its main thread
    (the Kafka relay and consumer); the loop must wake at least every few seconds."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
