"""Fuzzing the node agent's two boundaries: bundle bytes and notice bytes.

Whatever arrives, the verifier answers with its typed refusal (`BundleRejected`, a notice
`Refusal`) or a verified result, never another exception, and quickly. Inputs: random
bytes, genuine bytes with bytes changed, hostile JSON (deep, huge numbers, odd constants),
and the worst case, hostile content *signed by a trusted key* (a leaked key), which reaches
the parser behind the signature check. Derandomized (a fixed seed, no example database),
so CI runs the same cases every time.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nacl.encoding import HexEncoder
from nacl.signing import SigningKey

from contracts import bundle, keys
from contracts.bundle import BundleContent, BundleRejected, canonical_json
from contracts.cache import BundleCache
from contracts.keys import TrustStore
from contracts.notice import NoticePolicy, ReclaimNotice
from contracts.notice_signing import DOMAIN, Accepted, NodeIdentity, Refusal, check, sign
from contracts.source import read_contracts
from tests.support.fuzz import examples
from tests.support.paths import EXAMPLES

pytestmark = pytest.mark.timeout(120)

FUZZ = settings(
    derandomize=True,
    database=None,
    max_examples=examples(250),
    deadline=timedelta(seconds=2),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: Longest any one input may take to be judged (a 100,000-deep array included).
BOUND_SECONDS = 1.0

SIGNER = SigningKey(b"\x11" * 32)
RELAY = SigningKey(b"\x12" * 32)
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
ME = NodeIdentity("r1", "D", "node-f")


def _genuine_bundle() -> bytes:
    sources, findings = read_contracts(EXAMPLES)
    assert not findings
    return bundle.build(
        [s.contract for s in sources],
        serial=7,
        created_at=NOW - timedelta(hours=1),
        key=SIGNER,
        notice_policies=[
            NoticePolicy(
                region="r1",
                lead_seconds=120,
                keys={keys.key_id(RELAY.verify_key): RELAY.verify_key.encode(HexEncoder).decode()},
            )
        ],
    )


GENUINE_BUNDLE = _genuine_bundle()
CONTENT = BundleContent.model_validate(json.loads(GENUINE_BUNDLE)["content"], strict=False)
GENUINE_NOTICE = sign(
    ReclaimNotice(
        notice_id="n-1",
        region="r1",
        hall="D",
        node="node-f",
        pool_id="r1.D.cpu.l",
        issued_at=NOW,
        deadline=NOW + timedelta(seconds=100),
    ),
    RELAY,
)

# JSON-ish text, hostile on purpose: deep nesting, long numbers, constants JSON lacks.
_atoms = st.one_of(
    st.integers(min_value=-(10**60), max_value=10**60).map(str),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-0", "true", "null", '"x"']),
    st.text(max_size=20).map(json.dumps),
    st.integers(min_value=4000, max_value=6000).map(lambda n: "9" * n),
)
_hostile_json = st.one_of(
    _atoms,
    st.integers(min_value=1, max_value=100_000).map(lambda d: "[" * d + "]" * d),
    st.integers(min_value=1, max_value=100_000).map(lambda d: '{"a":' * d + "1" + "}" * d),
    st.recursive(
        _atoms,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4).map(lambda xs: "[" + ",".join(xs) + "]"),
            st.dictionaries(st.text(max_size=8), inner, max_size=4).map(
                lambda d: "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in d.items()) + "}"
            ),
        ),
        max_leaves=20,
    ),
).map(lambda text: text.encode("utf-8", "surrogatepass"))


def _mutated(genuine: bytes) -> st.SearchStrategy[bytes]:
    """The genuine bytes with a few bytes replaced, inserted or cut."""

    def apply(edits: list[tuple[int, int, int]]) -> bytes:
        out = bytearray(genuine)
        for kind, where, value in edits:
            at = where % (len(out) or 1)
            if kind == 0 and out:
                out[at] = value
            elif kind == 1:
                out.insert(at, value)
            elif out:
                del out[at]
        return bytes(out)

    edit = st.tuples(st.integers(0, 2), st.integers(0, 10**7), st.integers(0, 255))
    return st.lists(edit, min_size=1, max_size=4).map(apply)


def _signed_bundle(content: bytes) -> bytes:
    """`content` (any bytes) in a canonical envelope signed by the trusted key."""
    signature = HexEncoder.encode(SIGNER.sign(content).signature)
    kid = keys.key_id(SIGNER.verify_key).encode()
    return b'{"content":' + content + b',"key_id":"' + kid + b'","signature":"' + signature + b'"}'


def _signed_notice(body: bytes) -> bytes:
    """`body` (any bytes) in a canonical notice envelope signed by the trusted relay."""
    signature = HexEncoder.encode(RELAY.sign(DOMAIN + body).signature)
    kid = keys.key_id(RELAY.verify_key).encode()
    return b'{"key_id":"' + kid + b'","notice":' + body + b',"signature":"' + signature + b'"}'


bundle_bytes = st.one_of(
    st.binary(max_size=512),
    _hostile_json,
    _mutated(GENUINE_BUNDLE),
    _hostile_json.map(_signed_bundle),
)
notice_bytes = st.one_of(
    st.binary(max_size=512),
    _hostile_json,
    _mutated(GENUINE_NOTICE),
    _hostile_json.map(_signed_notice),
)


@pytest.fixture(scope="module")
def trust(tmp_path_factory: pytest.TempPathFactory) -> TrustStore:
    directory: Path = tmp_path_factory.mktemp("fuzz-trust")
    kid = keys.key_id(SIGNER.verify_key)
    (directory / f"{kid}.pub").write_bytes(SIGNER.verify_key.encode(HexEncoder))
    return TrustStore.load(directory)


def test_the_genuine_inputs_verify(trust: TrustStore) -> None:
    """The fuzzer's starting points are accepted, so mutations are judged against real ones."""
    assert bundle.verify(GENUINE_BUNDLE, trust, now=NOW).serial == 7
    assert isinstance(check(GENUINE_NOTICE, CONTENT, ME, NOW), Accepted)


@FUZZ
@given(raw=bundle_bytes)
def test_any_bundle_bytes_get_a_typed_refusal_quickly(trust: TrustStore, raw: bytes) -> None:
    """Bundle bytes from the bucket or the cache: verified or BundleRejected, in bounded time."""
    started = time.perf_counter()
    try:
        verified = bundle.verify(raw, trust, now=NOW)
    except BundleRejected as exc:
        assert "\n" not in str(exc)  # one line naming what is wrong
    else:
        assert verified.raw == GENUINE_BUNDLE  # nothing else is a genuine bundle
    assert time.perf_counter() - started < BOUND_SECONDS


@FUZZ
@given(raw=bundle_bytes)
def test_any_bundle_bytes_offered_to_a_cache_never_raise(
    trust: TrustStore, tmp_path_factory: pytest.TempPathFactory, raw: bytes
) -> None:
    """The cache's offer (what a refresh does) answers, never raises, and keeps nothing bad."""
    cache = BundleCache(tmp_path_factory.mktemp("fuzz-cache"), trust, clock=lambda: NOW)
    result = cache.offer(raw)
    assert result.accepted == (raw == GENUINE_BUNDLE)


@FUZZ
@given(raw=notice_bytes)
def test_any_notice_bytes_get_a_typed_refusal_quickly(raw: bytes) -> None:
    """Notice bytes off the wire: Accepted or a typed Refusal, never an exception, quickly."""
    started = time.perf_counter()
    result = check(raw, CONTENT, ME, NOW)
    assert isinstance(result, Accepted | Refusal)
    if isinstance(result, Accepted):
        assert canonical_json(json.loads(raw)) == raw
    else:
        assert "\n" not in result.detail
    assert time.perf_counter() - started < BOUND_SECONDS
