"""Hypothesis: malformed contracts never crash the compiler, and every finding names a
file and a field."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.compiler import compile_dir
from contracts.region import load_regions
from tests.support.contract_fixtures import example
from tests.support.paths import REGIONS_DIR

REGIONS = load_regions(REGIONS_DIR)
BASE = example("llm-train")

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True),
    st.text(max_size=12),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += paths(v, (*prefix, i))
    return out


ALL_PATHS = [p for p in paths(BASE) if p]


def mutate(doc: dict[str, Any], path: tuple[Any, ...], value: Any, delete: bool) -> None:
    target: Any = doc
    for part in path[:-1]:
        target = target[part]
    if delete and isinstance(target, dict):
        del target[path[-1]]
    else:
        target[path[-1]] = value


def check(src: Path) -> None:
    result = compile_dir(src, REGIONS)
    for finding in result.findings:
        assert finding.file.endswith(".yaml"), finding
        assert finding.field, finding
        assert finding.line >= 1, finding
        assert str(finding).startswith(f"{finding.file}:{finding.line}: {finding.field}: ")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.sampled_from(ALL_PATHS), values, st.booleans()), min_size=1, max_size=4)
)
def test_mutated_contracts_never_crash(mutations: list[tuple[Any, Any, bool]]) -> None:
    doc = example("llm-train")
    for path, value, delete in mutations:
        try:
            mutate(doc, path, value, delete)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed this path
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "c.yaml").write_text(yaml.safe_dump(doc))
        check(Path(tmp))


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_never_crashes(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "c.yaml").write_text(text, encoding="utf-8", errors="surrogatepass")
        check(Path(tmp))
