"""Helpers for contract tests: example contracts as dicts, written out as files."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from tests.support.paths import REPO

EXAMPLES = REPO / "contracts" / "examples"


def example(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    return copy.deepcopy(data)


def write_contracts(directory: Path, contracts: dict[str, dict[str, Any]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for filename, data in contracts.items():
        (directory / filename).write_text(yaml.safe_dump(data, sort_keys=False))
    return directory
