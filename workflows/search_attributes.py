"""Custom search attributes: how the Temporal UI lists in-flight work.

Operators filter acquisitions by region, hall, pool and state, e.g.
`SCORegion = "r1" AND SCOState = "waiting_approval"`.
"""

from __future__ import annotations

from typing import Any

from temporalio.common import SearchAttributeKey

REGION = SearchAttributeKey.for_keyword("SCORegion")
HALL = SearchAttributeKey.for_keyword_list("SCOHalls")
POOL = SearchAttributeKey.for_keyword_list("SCOPools")
STATE = SearchAttributeKey.for_keyword("SCOState")
WORKLOAD = SearchAttributeKey.for_keyword("SCOWorkload")

ALL: tuple[SearchAttributeKey[Any], ...] = (REGION, HALL, POOL, STATE, WORKLOAD)
