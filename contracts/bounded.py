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
import re
from itertools import accumulate
from typing import Any

#: Largest bundle a node accepts (the 1,000-contract bench bundle is ~0.6 MB).
MAX_BUNDLE_BYTES = 8 * 1024 * 1024
#: Largest signed notice (a real one is ~600 bytes).
MAX_NOTICE_BYTES = 16 * 1024
#: A notice relay's answer to a reclaim request: the nodes it noticed, a hall's worth.
MAX_RECLAIM_REPLY_BYTES = 1024 * 1024
#: Deepest nesting of objects and arrays (a bundle nests 7 deep).
MAX_DEPTH = 32
#: Longest integer or number literal, in characters (a serial, a count, a price).
MAX_NUMBER_CHARS = 40


class InputRejected(ValueError):
    """The input is refused before it is used; str() says what is wrong, in one line."""


#: A JSON string as the lexer reads it: a backslash escapes the byte after it, and a string
#: with no closing quote runs to the end. Unrolled, and matching wherever a quote opens, so
#: the scan stays linear on hostile input (a long run of quote-backslash pairs).
_STRING = re.compile(rb'"[^"\\]*(?:\\(?:.|\Z)[^"\\]*)*(?:"|\Z)', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
#: `[` and `{` one level in, `]` and `}` one out (-1 as a signed byte).
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def nesting_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in `raw` (brackets inside strings do not
    count), with C-speed steps only: before any parser recurses into it."""
    steps = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS).translate(_STEPS)
    return max(accumulate(memoryview(steps).cast("b"), initial=0))


def check_depth(raw: bytes, max_depth: int = MAX_DEPTH) -> None:
    """Refuse nesting deeper than `max_depth`, naming how deep it goes."""
    depth = nesting_depth(raw)
    if depth > max_depth:
        raise InputRejected(f"nested {depth} deep > {max_depth}")


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
