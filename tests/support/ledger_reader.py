"""Another process reading an embedded ledger, as a CLI query or the worker's child does:
it waits (up to a minute) for whoever holds the ledger to let it go."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import REPO

#: Prints each query's first value, one per line (`queries` are its arguments after the DSN).
_READER = """
import sys
from activities.ledger.store import LedgerStore
with LedgerStore(sys.argv[1], lock_timeout=60) as store, store.session() as c:
    for sql in sys.argv[2:]:
        print(c.query(sql).result_rows[0][0])
"""


def read_elsewhere(dsn: str, *queries: str) -> list[str]:
    """Each query's first value, read by a process of its own."""
    out = subprocess.run(
        [sys.executable, "-c", _READER, dsn, *queries],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout.split()
