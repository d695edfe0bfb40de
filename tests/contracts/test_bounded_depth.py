"""The one nesting-depth check (contracts/bounded.py) that bundles, notices, checkpoint
replies and drain reports all go through: it reads strings as a JSON lexer does, names the
depth it found, and stays linear on hostile input."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from activities.ledger.lost_work import DrainEventError, parse_event
from contracts.bounded import InputRejected, check_depth, loads, nesting_depth

pytestmark = pytest.mark.timeout(60)


def byte_by_byte(raw: bytes) -> int:
    """The deepest nesting, one byte at a time: the lexer's reading, the reference."""
    depth = deepest = 0
    in_string = escaped = False
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
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


JSONISH = st.lists(st.sampled_from(list(b'[]{}"\\a\n')), max_size=200).map(bytes)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200) | JSONISH)
def test_the_depth_is_the_lexers(raw: bytes) -> None:
    assert nesting_depth(raw) == byte_by_byte(raw)


@pytest.mark.parametrize(
    ("raw", "depth"),
    [
        (b"{}", 1),
        (b'{"a": [[1], {"b": "[[[["}]}', 3),
        (b'["\\"[[", []]', 2),  # an escaped quote does not end the string
        (b'["\\\\", [[]]]', 3),  # an escaped backslash does not escape the quote
        (b'[ "unterminated [[[[', 1),  # the rest is inside the string
        (b"]]][[", 0),
    ],
)
def test_depths(raw: bytes, depth: int) -> None:
    assert nesting_depth(raw) == depth


def test_a_refusal_names_the_depth_and_the_limit() -> None:
    with pytest.raises(InputRejected, match=r"^bundle: nested 33 deep > 32$"):
        loads(b"[" * 33 + b"]" * 33, what="bundle", max_bytes=1000)
    check_depth(b"[" * 32 + b"]" * 32)  # at the limit: taken


def test_a_drain_report_refused_for_depth_says_so() -> None:
    with pytest.raises(DrainEventError, match=r"^nested 9 deep > 8$") as refused:
        parse_event(b'{"workloads": ' + b"[" * 8 + b"]" * 8 + b"}")
    assert refused.value.kind == "too_deep"


def test_quote_backslash_runs_are_scanned_in_linear_time() -> None:
    """256 kB of `"\\` pairs (the largest drain report): a string scan that retried at every
    quote took minutes on it (8 s at 32 kB)."""
    raw = b'"\\' * (128 * 1024)
    start = time.monotonic()
    assert nesting_depth(raw) == 0
    with pytest.raises(DrainEventError, match="not JSON"):
        parse_event(raw)
    assert time.monotonic() - start < 5
