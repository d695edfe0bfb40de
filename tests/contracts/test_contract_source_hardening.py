"""Contract files from a hostile contributor: refused with file:line: reason, in bounded time.

Every case goes through `compile_and_sign` (what `sco contracts compile` calls) and checks
that nothing is written; one goes through the real `sco` process.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey

from contracts import keys, strict_yaml
from contracts.compiler import CompileResult, compile_and_sign
from contracts.source import read_contract
from tests.support.contract_fixtures import EXAMPLES
from tests.support.fuzz import examples
from tests.support.paths import REGIONS_DIR, REPO
from tests.support.services import run_sco

WHEN = datetime(2026, 11, 1, tzinfo=UTC)
# CPU seconds of this process (time.process_time), not wall time: the bound is on the work
# a hostile file costs the reader, which another process on a busy machine does not change.
BUDGET_S = 2.0
SPARK = (EXAMPLES / "spark-etl.yaml").read_text()

BILLION_LAUGHS = (
    SPARK
    + 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    + "".join(
        f"{b}: &{b} [*{a},*{a},*{a},*{a},*{a},*{a},*{a},*{a},*{a}]\n"
        for a, b in zip("abcdefgh", "bcdefghi", strict=True)
    )
)


def compile_refused(src: Path, out: Path) -> tuple[list[str], float]:
    """Compile `src`; assert nothing was written; the findings and the seconds it took."""
    start = time.process_time()
    result, serial = compile_and_sign(
        src, REGIONS_DIR, SigningKey.generate(), out, serial=None, created_at=WHEN
    )
    took = time.process_time() - start
    assert serial is None and not result.ok
    assert not out.exists()
    return [str(f) for f in result.findings], took


def one_file(tmp_path: Path, text: str | bytes, name: str = "hostile.yaml") -> Path:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    path = src / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def test_an_alias_bomb_is_refused_at_its_first_anchor(tmp_path: Path) -> None:
    path = one_file(tmp_path, BILLION_LAUGHS)
    assert len(BILLION_LAUGHS) < 1500  # a few hundred bytes beyond the contract itself
    lines, took = compile_refused(path.parent, tmp_path / "bundle.json")
    first_anchor = SPARK.count("\n") + 1
    assert lines == [f"{path}:{first_anchor}: (document): anchor &a is not allowed"]
    assert took < BUDGET_S


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        ("extra: *nowhere\n", "alias *nowhere is not allowed"),
        ("base: &base {x: 1}\n", "anchor &base is not allowed"),
        ("extra:\n  <<: {vcpu: 1}\n", "merge key << is not allowed"),
        ("extra: {<<: [{vcpu: 1}]}\n", "merge key << is not allowed"),
    ],
)
def test_aliases_anchors_and_merge_keys_are_refused(tmp_path: Path, tail: str, reason: str) -> None:
    path = one_file(tmp_path, SPARK + tail)
    lines, took = compile_refused(path.parent, tmp_path / "bundle.json")
    assert len(lines) == 1 and lines[0].startswith(f"{path}:")
    assert lines[0].endswith(f": (document): {reason}")
    line = int(lines[0].removeprefix(f"{path}:").split(":")[0])
    assert line > SPARK.count("\n")  # points into the appended tail, not line 1
    assert took < BUDGET_S


def test_a_duplicate_tier_is_refused_not_last_one_wins(tmp_path: Path) -> None:
    text = SPARK.replace("tier: 2\n", "tier: 3\ntier: 1\n")
    path = one_file(tmp_path, text)
    tier3 = text.splitlines().index("tier: 3") + 1
    lines, _ = compile_refused(path.parent, tmp_path / "bundle.json")
    assert lines == [
        f"{path}:{tier3 + 1}: (document): duplicate key 'tier' (first on line {tier3})"
    ]


def test_a_nested_duplicate_key_is_refused(tmp_path: Path) -> None:
    text = SPARK.replace("  grace_seconds: 90\n", "  grace_seconds: 90\n  grace_seconds: 5\n")
    path = one_file(tmp_path, text)
    lines, _ = compile_refused(path.parent, tmp_path / "bundle.json")
    assert len(lines) == 1 and "duplicate key 'grace_seconds'" in lines[0]


def test_an_oversized_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    path = one_file(tmp_path, SPARK)
    with path.open("ab") as f:  # 8 GiB, sparse: reading it whole would not finish
        f.truncate(8 * 1024**3)
    lines, took = compile_refused(path.parent, tmp_path / "bundle.json")
    limit = strict_yaml.MAX_BYTES
    assert lines == [f"{path}:1: (document): over the {limit}-byte limit for a contract file"]
    assert took < BUDGET_S


def test_a_file_at_the_size_limit_is_read_in_time(tmp_path: Path) -> None:
    # The slowest shape per byte for the parser: one long flow sequence.
    body = "x: [" + ",".join(["1"] * ((strict_yaml.MAX_BYTES - 8) // 2)) + "]\n"
    assert len(body) <= strict_yaml.MAX_BYTES
    path = one_file(tmp_path, body)
    lines, took = compile_refused(path.parent, tmp_path / "bundle.json")
    assert lines and all(line.startswith(f"{path}:") for line in lines)
    assert took < BUDGET_S


@pytest.mark.parametrize(
    "text",
    [
        "x:\n" + "".join("  " * d + f"k{d}:\n" for d in range(1, 40)) + "  " * 40 + "v: 1\n",
        "x: " + "[" * 40 + "]" * 40 + "\n",
        "x: " + "[" * (strict_yaml.MAX_BYTES - 10),
        "x: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n",
    ],
    ids=["block-40", "flow-40", "flow-to-size-limit", "flow-maps-5000"],
)
def test_deep_nesting_is_refused(tmp_path: Path, text: str) -> None:
    path = one_file(tmp_path, text)
    lines, took = compile_refused(path.parent, tmp_path / "bundle.json")
    assert len(lines) == 1 and lines[0].startswith(f"{path}:")
    assert "nest" in lines[0]  # ours ("nested deeper than 32 levels") or libyaml's own limit
    assert took < BUDGET_S


def test_the_sco_command_refuses_a_hostile_repository(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "bomb.yaml").write_text(BILLION_LAUGHS)
    (src / "dup.yaml").write_text(SPARK.replace("tier: 2\n", "tier: 3\ntier: 1\n"))
    _, private, _ = keys.generate(tmp_path / "keys")
    out = tmp_path / "bundle.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    code, text = asyncio.run(
        run_sco(env, "contracts", "compile", str(src), "--regions", str(REGIONS_DIR),
                "--key", str(private), "--out", str(out), cwd=REPO)
    )  # fmt: skip
    took = time.perf_counter() - start
    assert code == 1 and not out.exists(), text
    assert (
        f"{src}/bomb.yaml:{SPARK.count(chr(10)) + 1}: (document): anchor &a is not allowed" in text
    )
    assert f"{src}/dup.yaml:5: (document): duplicate key 'tier' (first on line 4)" in text
    assert "2 error(s); no bundle written" in text
    assert took < 10  # includes the interpreter starting; the compile itself is checked above


LOADERS: list[type[strict_yaml.PyStrictLoader] | type[strict_yaml.CStrictLoader]] = [
    strict_yaml.PyStrictLoader
]
if yaml.__with_libyaml__:
    LOADERS.append(strict_yaml.CStrictLoader)


@pytest.mark.parametrize("loader", LOADERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("a: &x 1\nb: *x\n", 1, "anchor &x is not allowed"),
        ("a: 1\nb: *x\n", 2, "alias *x is not allowed"),
        ("a:\n  <<: {b: 1}\n", 2, "merge key << is not allowed"),
        ("a: 1\nb: 2\na: 3\n", 3, "duplicate key 'a' (first on line 1)"),
        ("a:\n" + "".join("  " * d + "b:\n" for d in range(1, 33)) + "  " * 33 + "c: 1\n",
         33, "nested deeper than 32 levels"),
    ],
)  # fmt: skip
def test_both_parsers_refuse_the_same(
    loader: type[strict_yaml.PyStrictLoader] | type[strict_yaml.CStrictLoader],
    text: str,
    line: int,
    reason: str,
) -> None:
    with pytest.raises(strict_yaml.RefusedYAML) as refused:
        strict_yaml.load(text, loader)
    assert refused.value.problem == reason
    assert refused.value.problem_mark is not None
    assert refused.value.problem_mark.line + 1 == line


# --- fuzzing -------------------------------------------------------------------------------

_scalar = st.one_of(
    st.integers(-(10**6), 10**6).map(str),
    st.sampled_from(
        ["r1", "spark", "tier", "true", "null", "~", "1e999", "'q'", '"d"', "9" * 5000]
    ),
)
_key = st.sampled_from(["name", "tier", "tier", "unit", "vcpu", "<<", "a", "b", "? c", "1"])
_prefix = st.sampled_from(["", "", "", "&a ", "*a", "!!str ", "!!binary ", "!!python/object "])


@st.composite
def hostile_yaml(draw: st.DrawFn, depth: int = 0) -> str:
    """Block and flow YAML mixing anchors, aliases, merge keys, tags and repeated keys."""
    kind = draw(st.sampled_from(["scalar", "flow", "block"] if depth < 45 else ["scalar"]))
    if kind == "scalar":
        return draw(_prefix) + draw(_scalar)
    if kind == "flow":
        items = draw(st.lists(hostile_yaml(depth + 1), max_size=3))
        return draw(_prefix) + "[" + ", ".join(items) + "]"
    pairs = draw(st.lists(st.tuples(_key, hostile_yaml(depth + 1)), min_size=1, max_size=3))
    pad = "  " * depth
    return "\n" + "".join(f"{pad}{k}: {v}\n" for k, v in pairs)


def _check_bounded(tmp_path: Path, content: bytes) -> CompileResult:
    path = tmp_path / "src" / "fuzz.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(content)
    out = tmp_path / "bundle.json"
    out.unlink(missing_ok=True)
    start = time.process_time()
    source, findings = read_contract(path, "fuzz.yaml")
    took = time.process_time() - start
    assert took < BUDGET_S
    assert (source is None) == bool(findings)
    for f in findings:
        assert f.file == "fuzz.yaml" and f.line >= 1 and f.reason and "\n" not in f.reason.strip()
    result, serial = compile_and_sign(
        path.parent, REGIONS_DIR, SigningKey.generate(), out, serial=None, created_at=WHEN
    )
    assert (serial is not None) == out.exists() == result.ok
    return result


FUZZ = settings(
    max_examples=examples(200),
    deadline=None,  # the budget is asserted per example above
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(body=hostile_yaml())
def test_fuzzed_hostile_yaml_is_answered_in_bounded_time(tmp_path: Path, body: str) -> None:
    result = _check_bounded(tmp_path, (SPARK + "extra:" + body + "\n").encode())
    assert not result.ok  # `extra` is not a contract field, so nothing may ever be signed


@FUZZ
@given(
    tail=st.one_of(
        st.binary(max_size=2000),
        st.text(alphabet=st.sampled_from("&*<[]{}:-?!|>'\"#%@ \n\tab1"), max_size=2000),
    )
)
def test_fuzzed_bytes_never_crash_the_reader(tmp_path: Path, tail: bytes | str) -> None:
    raw = tail if isinstance(tail, bytes) else tail.encode()
    _check_bounded(tmp_path, SPARK.encode() + raw)


@FUZZ
@given(
    key=st.sampled_from(["name", "tier", "kind", "unit", "drain"]),
    value=st.sampled_from(["1", "x", "{}", "[]", "3"]),
)
def test_any_repeated_top_level_key_is_refused(tmp_path: Path, key: str, value: str) -> None:
    result = _check_bounded(tmp_path, (SPARK + f"{key}: {value}\n").encode())
    assert [f"duplicate key '{key}'" in f.reason for f in result.findings] == [True]
