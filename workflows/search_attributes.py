"""Custom search attributes: how the Temporal UI lists in-flight work.

Operators filter acquisitions by region, hall, pool and state, e.g.
`SCORegion = "r1" AND SCOState = "waiting_approval"`, or by contract
(`SCOWorkload = "spark-etl"`), with requested and acquired instance counts as columns.
"""

from __future__ import annotations

from typing import Any

from temporalio.common import SearchAttributeKey

REGION = SearchAttributeKey.for_keyword("SCORegion")
HALL = SearchAttributeKey.for_keyword_list("SCOHalls")
POOL = SearchAttributeKey.for_keyword_list("SCOPools")
STATE = SearchAttributeKey.for_keyword("SCOState")
WORKLOAD = SearchAttributeKey.for_keyword("SCOWorkload")
# Instances an acquisition was asked for, and how many are ACTIVE so far.
REQUESTED = SearchAttributeKey.for_int("SCORequested")
ACQUIRED = SearchAttributeKey.for_int("SCOAcquired")

ALL: tuple[SearchAttributeKey[Any], ...] = (
    REGION,
    HALL,
    POOL,
    STATE,
    WORKLOAD,
    REQUESTED,
    ACQUIRED,
)
