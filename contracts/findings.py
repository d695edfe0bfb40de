"""What the compiler reports: one line per problem, `file:line: field: reason`."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Severity(enum.StrEnum):
    ERROR = "error"  # the bundle is not written
    WARNING = "warning"  # written, but an operator should look


@dataclass(frozen=True, order=True)
class Finding:
    file: str
    line: int
    field: str
    reason: str
    severity: Severity = Severity.ERROR

    def __str__(self) -> str:
        tag = " [warning]" if self.severity is Severity.WARNING else ""
        return f"{self.file}:{self.line}: {self.field}: {self.reason}{tag}"


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity is Severity.ERROR]
