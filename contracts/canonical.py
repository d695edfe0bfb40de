"""The one JSON form SCO signs: sorted keys, no spaces, UTF-8, no NaN. Bundles and notices
are signed over these bytes, so signer and verifier must agree on them exactly.

Apart from contracts/bundle.py so that a notice signer (the notice relay) does not load
the bundle's contract models to sign a notice.
"""

from __future__ import annotations

import json
from typing import Any


def canonical_json(value: Any) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")
