"""The one JSON form SCO signs: sorted keys, no spaces, UTF-8, no NaN. Bundles and notices
are signed over these bytes, so signer and verifier must agree on them exactly.

Apart from contracts/bundle.py so that a notice signer (the notice relay) does not load
the bundle's contract models to sign a notice.
"""

from __future__ import annotations

import json
from typing import Any

from nacl.encoding import HexEncoder
from nacl.signing import SigningKey

from contracts.keys import key_id


def canonical_json(value: Any) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def signed_envelope(
    field: str, body: dict[str, Any], key: SigningKey, *, domain: bytes = b""
) -> bytes:
    """`{field: body, "key_id", "signature"}` as canonical JSON, the signature over `domain`
    and the body's canonical JSON (what a verifier checks before it parses anything)."""
    signature = key.sign(domain + canonical_json(body)).signature
    return canonical_json(
        {
            field: body,
            "key_id": key_id(key.verify_key),
            "signature": HexEncoder.encode(signature).decode(),
        }
    )
