"""Per-hall notice keys: `<notice keys dir>/<region>/scopes.yaml` says which hall's relay
each notice key signs for, and when a retired key stops verifying.

    # key id: the halls it signs for, and (optional) when nodes stop accepting it
    3f2a9c0d1e2b4a5f:
      halls: [A]
    9b1c2d3e4f5a6b7c:
      halls: [A]
      not_after: 2026-12-07T10:05:00Z

A region with this file is hall-scoped: its keys without an entry sign for no hall (the
compiler warns about each), so a key nobody placed is never read as "every hall". A
region without it keeps every key region-wide, as bundles did before per-hall keys.
`sco keys relay-new` and `sco keys relay-retire` write the file; it is plain data, read
with the contract files' strict YAML loader, and every problem is one finding naming the
file, line and field.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import yaml

from contracts import strict_yaml
from contracts.atomic import write_atomic
from contracts.findings import Finding, Severity
from contracts.notice import KeyScope
from contracts.records import RecordError
from contracts.region import Region
from contracts.source import Loc, field_path, line_map, line_of

SCOPES_FILE = "scopes.yaml"
_HEADER = (
    "# Per-hall notice keys (contracts/notice_scopes.py): key id -> the halls it signs\n"
    "# for, and optionally not_after, when nodes stop accepting it. Written by\n"
    "# `sco keys relay-new` / `sco keys relay-retire`.\n"
)


def read_scopes(
    region_dir: Path, region: Region, key_ids: set[str]
) -> tuple[dict[str, KeyScope] | None, list[Finding]]:
    """The scopes of `region_dir/scopes.yaml` (None: no such file, the region's keys stay
    region-wide), checked against the region's halls and the keys of the directory."""
    path = region_dir / SCOPES_FILE
    shown = str(path)
    if not path.exists():
        return None, []
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return None, [Finding(shown, 1, "(document)", f"cannot read: {exc.strerror}")]
    if len(raw) > strict_yaml.MAX_BYTES:
        return None, [Finding(shown, 1, "(document)", f"over {strict_yaml.MAX_BYTES} bytes")]
    try:
        node, data = strict_yaml.load(raw.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, ValueError) as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc)
        return None, [Finding(shown, line, "(document)", f"not readable YAML: {problem}")]
    lines: dict[Loc, int] = line_map(node) if node is not None else {(): 1}
    if data is None:
        data = {}
    if not isinstance(data, dict):
        return None, [Finding(shown, 1, "(document)", "a mapping of key id -> scope expected")]
    scopes: dict[str, KeyScope] = {}
    findings: list[Finding] = []
    for kid, entry in data.items():
        at = (str(kid),)
        if not isinstance(kid, str):
            findings.append(
                Finding(
                    shown,
                    line_of(lines, at),
                    str(kid),
                    "a key id is a string of 16 hex digits: quote it (YAML read it as "
                    f"{type(kid).__name__})",
                )
            )
            continue
        if kid not in key_ids:
            findings.append(
                Finding(
                    shown,
                    line_of(lines, at),
                    str(kid),
                    f"no such key: {region_dir}/{kid}.pub is missing (or revoked)",
                )
            )
            continue
        try:
            scope = KeyScope.from_json(entry, "")
        except RecordError as exc:
            loc = (*at, *exc.loc)
            findings.append(Finding(shown, line_of(lines, loc), field_path(loc), exc.reason))
            continue
        unknown = [h for h in scope.halls if h not in region.halls]
        if unknown:
            findings.append(
                Finding(
                    shown,
                    line_of(lines, (*at, "halls")),
                    f"{kid}.halls",
                    f"hall {', '.join(unknown)} not in region {region.id} "
                    f"(halls {', '.join(region.halls) or 'none'})",
                )
            )
            continue
        scopes[kid] = scope
    for kid in sorted(key_ids - set(data)):
        findings.append(
            Finding(
                shown,
                1,
                kid,
                "no entry: this key signs for no hall (nodes refuse every notice it signs); "
                "give it halls or remove its .pub",
                Severity.WARNING,
            )
        )
    return scopes, findings


def _load_plain(path: Path) -> dict[str, KeyScope]:
    """The file's entries for rewriting (the CLI's own writes); {} when it does not exist.
    ValueError (one line, naming the file) when it is not a mapping of valid scopes."""
    if not path.exists():
        return {}
    try:
        _, data = strict_yaml.load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not readable YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a mapping of key id -> scope expected")
    out: dict[str, KeyScope] = {}
    for kid, entry in data.items():
        try:
            out[str(kid)] = KeyScope.from_json(entry, str(kid))
        except RecordError as exc:
            raise ValueError(f"{path}: {exc}") from None
    return out


def _write(path: Path, scopes: dict[str, KeyScope]) -> None:
    doc = {kid: scope.to_json() for kid, scope in sorted(scopes.items())}
    text = _HEADER + yaml.safe_dump(doc, sort_keys=True, default_flow_style=None)
    write_atomic(path, text.encode("utf-8"))


def add_key(region_dir: Path, kid: str, halls: list[str]) -> None:
    """Let `kid` sign for `halls` (replacing what it had)."""
    path = region_dir / SCOPES_FILE
    scopes = _load_plain(path)
    scopes[kid] = KeyScope(halls=halls)
    _write(path, scopes)


def retire_key(region_dir: Path, kid: str, not_after: datetime) -> None:
    """Nodes stop accepting `kid` after `not_after` (its halls stay as they were)."""
    path = region_dir / SCOPES_FILE
    scopes = _load_plain(path)
    if kid not in scopes:
        raise ValueError(f"{path}: key {kid} has no entry to retire")
    scopes[kid] = scopes[kid].replace(not_after=not_after)
    _write(path, scopes)


def hall_keys(region_dir: Path, hall: str) -> list[str]:
    """The key ids `scopes.yaml` lets sign for `hall` and not yet given a `not_after`
    (ValueError when the file is not valid: checked before anything is written)."""
    scopes = _load_plain(region_dir / SCOPES_FILE)
    return sorted(k for k, s in scopes.items() if hall in s.halls and s.not_after is None)


def retirement_time(now: datetime, lead_seconds: int, margin: timedelta) -> datetime:
    """When a key that stops signing at `now` may retire: its last notices are republished
    until their deadline (`now` + lead) and nodes allow `margin` of clock skew."""
    return now + timedelta(seconds=lead_seconds) + margin
