"""Ledger reads in a short-lived child process, for a long-running process that reads an
embedded (chDB) ledger now and then: the region worker reads reclaim rates every few
minutes. Loading the engine in the worker costs ~280 MB of resident memory for the life
of the process (chDB's library, pyarrow) and every open/close leaks ~2.3 MB more inside
the engine (store.py); a child that opens the ledger, answers and exits costs neither.
The answer is the same query's (queries.reclaim_rate) on the same ledger, under the same
lock and lock timeout; a server ledger is read in-process as before. When the ledger's
holder (the consumer) answers on its socket, no child is started (activities/ledger/holder.py).

The child reads one JSON request on stdin and writes the answer as JSON on stdout;
a ledger it cannot read is one line on stderr and exit status 3:

    echo '{"dsn": "chdb:///d", "lock_timeout": 2, "pools": ["r1.A.cpu.xl"],
           "start": "2026-01-01T00:00:00+00:00", "end": "..."}' |
        python -m activities.ledger.child
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from typing import Any

from activities.ledger.store import LedgerStore, LedgerUnavailable
from contracts.bounded import InputRejected, loads

#: Seconds a child may take beyond its lock wait: starting Python and loading the engine
#: takes 1-2 s on an idle machine, several on a loaded one.
CHILD_START_SECONDS = 60.0
_UNAVAILABLE = 3
#: Either way a message is a flat object of pool ids (a region has a few hundred pools):
#: 4 MiB and depth 3 are far above any real one, and bound what a broken peer can send.
MAX_MESSAGE_BYTES = 4 << 20
MAX_MESSAGE_DEPTH = 3


def rate_request(
    store: LedgerStore, *, pool_ids: list[str], start: datetime, end: datetime
) -> dict[str, Any]:
    """The request for `queries.reclaim_rate` of `store`'s ledger, as a child (or the
    ledger's holder, activities/ledger/holder.py) reads it."""
    return {
        "dsn": store.dsn,
        "lock_timeout": store.lock_timeout,
        "pools": pool_ids,
        "start": start.isoformat(),
        "end": end.isoformat(),
    }


def reclaim_rate_in_child(store: LedgerStore, request: dict[str, Any]) -> dict[str, float]:
    """The answer to `request` (`rate_request`), asked of a child process; a child that
    fails or times out raises LedgerUnavailable with its reason."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "activities.ledger.child"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=store.lock_timeout + CHILD_START_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise LedgerUnavailable(
            store.dsn,
            f"reading child gave no answer in {store.lock_timeout + CHILD_START_SECONDS:.0f} s",
        ) from None
    except OSError as exc:
        raise LedgerUnavailable(store.dsn, f"cannot start the reading child: {exc}") from exc
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        reason = lines[-1] if lines else f"exit status {done.returncode}"
        raise LedgerUnavailable(store.dsn, f"reading child: {reason}")
    try:
        answer: Any = loads(
            done.stdout.encode(),
            what="reading child's answer",
            max_bytes=MAX_MESSAGE_BYTES,
            max_depth=MAX_MESSAGE_DEPTH,
        )
        return {str(pool): float(rate) for pool, rate in answer.items()}
    except (InputRejected, ValueError, AttributeError) as exc:
        raise LedgerUnavailable(store.dsn, f"reading child answered {done.stdout[:80]!r}") from exc


def answer_request(store: LedgerStore, request: Any) -> dict[str, float]:
    """`queries.reclaim_rate` of `store` for a parsed request (the child's own store, or the
    holder's: activities/ledger/holder.py). ValueError, KeyError or TypeError when the
    request is not one; LedgerUnavailable when the ledger cannot be read."""
    from activities.ledger.queries import reclaim_rate

    pools = request["pools"]
    if not isinstance(pools, list):
        raise TypeError(f"pools is {type(pools).__name__}, not a list")
    if not all(isinstance(p, str) for p in pools):
        raise TypeError("pools: every pool id must be a string")
    return reclaim_rate(
        store,
        pool_ids=pools,
        start=datetime.fromisoformat(request["start"]),
        end=datetime.fromisoformat(request["end"]),
    )


def request_error(exc: Exception) -> str:
    """One line saying what is wrong with a request (out of bounds, a field missing or bad)."""
    if isinstance(exc, InputRejected):
        return str(exc)  # names the request already
    if isinstance(exc, KeyError):
        return f"request: field {exc.args[0]!r} missing"
    return f"request: {exc}"


def main() -> int:
    store: LedgerStore | None = None
    try:
        req = loads(
            sys.stdin.buffer.read(MAX_MESSAGE_BYTES + 1),
            what="request",
            max_bytes=MAX_MESSAGE_BYTES,
            max_depth=MAX_MESSAGE_DEPTH,
        )
        store = LedgerStore(req["dsn"], lock_timeout=float(req["lock_timeout"]))
        rates = answer_request(store, req)
    except LedgerUnavailable as exc:
        print(exc.reason, file=sys.stderr)
        return _UNAVAILABLE
    except (ValueError, KeyError, TypeError) as exc:  # InputRejected is a ValueError
        print(request_error(exc), file=sys.stderr)
        return _UNAVAILABLE
    finally:
        if store is not None:
            store.close()
    json.dump(rates, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
