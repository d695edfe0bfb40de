"""systemd's notify protocol in a few lines: datagrams to $NOTIFY_SOCKET.

`notify("READY=1")` once started, `notify("WATCHDOG=1")` at least every WatchdogSec/2
($WATCHDOG_USEC), `notify("STOPPING=1")` on the way out. Without NOTIFY_SOCKET (not run
by systemd) every call is a no-op.
"""

from __future__ import annotations

import os
import socket


def notify(state: str, env: dict[str, str] | None = None) -> bool:
    env = dict(os.environ) if env is None else env
    address = env.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
        return True
    except OSError:
        return False


def watchdog_interval(env: dict[str, str] | None = None) -> float | None:
    """Seconds between watchdog pings (half of WatchdogSec), or None when not watched."""
    env = dict(os.environ) if env is None else env
    usec = env.get("WATCHDOG_USEC")
    pid = env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 1e6 / 2
    except ValueError:
        return None
