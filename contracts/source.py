"""Reading contract files (YAML, one contract per file) with the line of every field."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import ValidationError

from contracts import strict_yaml
from contracts.findings import Finding
from contracts.model import Contract

Loc = tuple[str | int, ...]
SUFFIXES = (".yaml", ".yml")
# Bounds the whole compile with the per-file limits: at most this many files of at most
# strict_yaml.MAX_BYTES each.
MAX_FILES = 10_000


@dataclass
class ContractSource:
    path: str  # as shown in findings: relative to the source directory's parent
    contract: Contract
    lines: dict[Loc, int] = field(default_factory=dict)

    def line(self, *loc: str | int) -> int:
        return line_of(self.lines, loc)


def line_of(lines: dict[Loc, int], loc: Loc) -> int:
    """The line of the deepest known prefix of `loc` (1 when nothing matches)."""
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return 1


def line_map(node: yaml.Node, loc: Loc = ()) -> dict[Loc, int]:
    lines: dict[Loc, int] = {loc: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else str(key.start_mark)
            lines.update(line_map(value, (*loc, name)))
            lines[(*loc, name)] = key.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.update(line_map(item, (*loc, i)))
    return lines


def field_path(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"


class _TooLarge(Exception):
    pass


def _read_bounded(path: Path) -> str:
    """The file's text, refusing more than MAX_BYTES without reading past it."""
    with path.open("rb") as f:
        raw = f.read(strict_yaml.MAX_BYTES + 1)
    if len(raw) > strict_yaml.MAX_BYTES:
        raise _TooLarge
    return raw.decode("utf-8")


def read_contract(path: Path, shown: str) -> tuple[ContractSource | None, list[Finding]]:
    """Parse and validate one file; every problem becomes a finding, nothing raises."""
    try:
        text = _read_bounded(path)
    except _TooLarge:
        limit = f"over the {strict_yaml.MAX_BYTES}-byte limit for a contract file"
        return None, [Finding(shown, 1, "(document)", limit)]
    except (OSError, UnicodeDecodeError) as exc:
        return None, [Finding(shown, 1, "(document)", f"cannot read: {exc}")]
    try:
        node, data = strict_yaml.load(text)
    except strict_yaml.RefusedYAML as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark is not None else 1
        return None, [Finding(shown, line, "(document)", str(exc.problem))]
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        char = exc.character if isinstance(exc.character, int) else ord(exc.character)
        reason = f"YAML syntax error: character #x{char:04x}: {exc.reason}"
        return None, [Finding(shown, line, "(document)", reason)]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc)
        return None, [Finding(shown, line, "(document)", f"YAML syntax error: {problem}")]
    except ValueError as exc:  # e.g. an integer past Python's digit limit
        return None, [Finding(shown, 1, "(document)", f"unreadable value: {exc}")]
    lines: dict[Loc, int] = line_map(node) if node is not None else {(): 1}
    if not isinstance(data, dict):
        kind = "empty" if data is None else type(data).__name__
        return None, [Finding(shown, 1, "(document)", f"a contract is a mapping, not {kind}")]
    try:
        # strict=False: YAML gives ints for floats and lists for tuples; the model still
        # refuses unknown fields and wrong types.
        contract = Contract.model_validate(data, strict=False)
    except ValidationError as exc:
        found = []
        for err in exc.errors():
            loc = tuple(
                p for p in err["loc"] if not isinstance(p, str) or not p.startswith("function-")
            )
            reason = err["msg"].removeprefix("Value error, ")
            found.append(Finding(shown, line_of(lines, loc), field_path(loc), reason))
        return None, found
    return ContractSource(shown, contract, lines), []


def read_contracts(src_dir: Path) -> tuple[list[ContractSource], list[Finding]]:
    if not src_dir.is_dir():
        return [], [Finding(str(src_dir), 1, "(directory)", "not a directory")]
    files: list[Path] = []
    for p in src_dir.rglob("*"):
        if p.suffix in SUFFIXES and p.is_file():
            files.append(p)
            if len(files) > MAX_FILES:
                reason = f"more than {MAX_FILES} contract files"
                return [], [Finding(str(src_dir), 1, "(directory)", reason)]
    if not files:
        return [], [Finding(str(src_dir), 1, "(directory)", "no *.yaml contract files")]
    sources, findings = [], []
    for path in sorted(files):
        src, found = read_contract(path, str(path))
        findings += found
        if src is not None:
            sources.append(src)
    return sources, findings
