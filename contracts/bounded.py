"""Bounded JSON: size, nesting and number limits checked before (and while) parsing.

Anything that crosses a trust boundary (a bundle from the bucket, a notice off the wire, a
file a node reads) is parsed here and nowhere else. Python's own parser raises
RecursionError on deep nesting and ValueError on an integer of more than 4,300 digits:
neither is a JSON error, so an unbounded `json.loads` lets one hostile object crash every
process that reads it. Here every such input is one `InputRejected` naming what is wrong.
"""

from __future__ import annotations

import json
import math
from typing import Any

#: Largest bundle a node accepts (the 1,000-contract bench bundle is ~0.6 MB).
MAX_BUNDLE_BYTES = 8 * 1024 * 1024
#: Largest signed notice (a real one is ~600 bytes).
MAX_NOTICE_BYTES = 16 * 1024
#: Deepest nesting of objects and arrays (a bundle nests 7 deep).
MAX_DEPTH = 32
#: Longest integer or number literal, in characters (a serial, a count, a price).
MAX_NUMBER_CHARS = 40


class InputRejected(ValueError):
    """The input is refused before it is used; str() says what is wrong, in one line."""


def check_depth(raw: bytes, max_depth: int = MAX_DEPTH) -> None:
    """Refuse nesting deeper than `max_depth` with a linear scan (strings skipped), before
    any parser recurses into it."""
    depth = 0
    in_string = False
    escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > max_depth:
                raise InputRejected(f"nested deeper than {max_depth} levels")
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1


def _int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise InputRejected(f"a number of {len(text)} digits (at most {MAX_NUMBER_CHARS})")
    return int(text)


def _float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise InputRejected(f"a number of {len(text)} characters (at most {MAX_NUMBER_CHARS})")
    value = float(text)
    if not math.isfinite(value):
        raise InputRejected(f"a number out of range ({text})")
    return value


def _constant(text: str) -> Any:
    raise InputRejected(f"{text} is not JSON")


def loads(raw: bytes, *, what: str, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """Parse `raw` as JSON within the limits; InputRejected("<what>: ...") otherwise."""
    if len(raw) > max_bytes:
        raise InputRejected(f"{what}: {len(raw)} bytes (at most {max_bytes})")
    try:
        check_depth(raw, max_depth)
        text = raw.decode("utf-8")
        return json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except InputRejected as exc:
        raise InputRejected(f"{what}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise InputRejected(f"{what}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise InputRejected(f"{what}: not JSON ({exc.msg} at char {exc.pos})") from None
    except (ValueError, RecursionError) as exc:  # belt and braces: never anything else
        raise InputRejected(f"{what}: not usable JSON ({type(exc).__name__})") from None
