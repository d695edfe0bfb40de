"""How many examples a costly property test draws.

`make test` draws the full count. `make check` (the fast tier, run on every edit) sets
SCO_FAST_TIER=1 and draws a quarter: the same properties, fewer cases, so the edit-test loop
stays within its 3 minutes while every example still runs in the suite before a landing.
"""

from __future__ import annotations

import os

FAST_TIER = os.environ.get("SCO_FAST_TIER") == "1"


def examples(full: int) -> int:
    return max(10, full // 4) if FAST_TIER else full
