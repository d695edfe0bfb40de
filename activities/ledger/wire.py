"""A ledger query's values as JSON, for the holder's socket (activities/ledger/holder.py):
its parameters one way and its rows the other.

JSON has no datetime, date, UUID or Decimal, and the bounded parser refuses NaN and the
infinities (contracts/bounded.py); each of those travels as a one-key object naming its
type (`{"$datetime": "2026-12-07T10:00:00+00:00"}`) and comes back as the value the
engine's own client gives, so a query's rows are the same whoever ran it.
"""

from __future__ import annotations

import math
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any
from uuid import UUID

_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def tagged(value: Any) -> Any:
    """`value` as JSON can carry it (lists and tuples as lists)."""
    if isinstance(value, datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, date):
        return {"$date": value.isoformat()}
    if isinstance(value, UUID):
        return {"$uuid": str(value)}
    if isinstance(value, Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, float) and not math.isfinite(value):
        return {"$float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, list | tuple):
        return [tagged(v) for v in value]
    if isinstance(value, dict):
        return {str(k): tagged(v) for k, v in value.items()}
    return value


def untagged(value: Any) -> Any:
    """The value `tagged` carried. ValueError for a tag whose text is not its type's."""
    if isinstance(value, list):
        return [untagged(v) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((tag, raw),) = value.items()
        if tag in _READERS:
            if not isinstance(raw, str):
                raise ValueError(f"{tag}: {type(raw).__name__}, not a string")
            return _READERS[tag](raw)
    return {k: untagged(v) for k, v in value.items()}


def _float(raw: str) -> float:
    if raw not in _FLOATS:
        raise ValueError(f"$float: {raw[:20]!r} is not nan, inf or -inf")
    return _FLOATS[raw]


def _decimal(raw: str) -> Decimal:
    # Decimal's refusal is an ArithmeticError: a ValueError like every other tag's.
    try:
        return Decimal(raw)
    except InvalidOperation:
        raise ValueError(f"$decimal: {raw[:20]!r} is not a number") from None


_READERS: dict[str, Any] = {
    "$datetime": datetime.fromisoformat,
    "$date": date.fromisoformat,
    "$uuid": UUID,
    "$decimal": _decimal,
    "$float": _float,
}
