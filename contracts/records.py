"""Strict JSON records without pydantic: what the node agent parses (decision 0041).

The node agent reads three shapes off its trust boundaries: reclaim notices, the notice
policies and drain terms of its signed bundle, and its configuration. Importing pydantic
(and building models) costs a process about 9 MB before it holds anything, a quarter of
the agent's budget (issue 33), so those shapes are frozen dataclasses that check
themselves in `__post_init__` and read JSON through `Reader`. The control plane uses the
same classes; where a pydantic model holds one (BundleContent's notice policies), the
field validates and serialises with the class's own `from_json`/`to_json`
(contracts/bundle.py), so each rule is written once, in the class.

Errors are `RecordError` (a ValueError), one line: `<where>: <what is wrong>`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, TypeVar

E = TypeVar("E", bound=Enum)
R = TypeVar("R")


class RecordError(ValueError):
    """A JSON value is not the record it should be; str() says where and why, `loc` is
    the field's path (`halls[0]` -> ("halls", 0)) for a finding on the file's line."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}" if where else reason)
        self.where = where
        self.reason = reason

    @property
    def loc(self) -> tuple[str | int, ...]:
        parts = re.findall(r"[^.\[\]]+|\[\d+\]", self.where)
        return tuple(int(p[1:-1]) if p.startswith("[") else p for p in parts)


def _kind(value: object) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


class Reader:
    """The fields of one JSON object, read with their types; `done()` refuses the rest."""

    def __init__(self, doc: object, where: str, *, allowed: Iterable[str] = ()) -> None:
        if not isinstance(doc, dict):
            raise RecordError(where, f"expected an object, got {_kind(doc)}")
        self._doc: dict[str, Any] = doc
        self._where = where
        self._allowed = frozenset(allowed)
        self._seen: set[str] = set()

    def at(self, name: str) -> str:
        return f"{self._where}.{name}" if self._where else name

    def _get(self, name: str, default: object) -> object:
        self._seen.add(name)
        if name in self._doc:
            return self._doc[name]
        if default is _REQUIRED:
            raise RecordError(self.at(name), "field required")
        return default

    def text(self, name: str, default: str | None = None) -> str:
        value = self._get(name, _REQUIRED if default is None else default)
        if not isinstance(value, str):
            raise RecordError(self.at(name), f"expected a string, got {_kind(value)}")
        return value

    def opt_text(self, name: str) -> str | None:
        value = self._get(name, None)
        if value is not None and not isinstance(value, str):
            raise RecordError(self.at(name), f"expected a string, got {_kind(value)}")
        return value

    def integer(self, name: str, default: int | None = None) -> int:
        value = self._get(name, _REQUIRED if default is None else default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecordError(self.at(name), f"expected an integer, got {_kind(value)}")
        return value

    def when(self, name: str) -> datetime:
        return parse_datetime(self._get(name, _REQUIRED), self.at(name))

    def opt_when(self, name: str) -> datetime | None:
        value = self._get(name, None)
        return None if value is None else parse_datetime(value, self.at(name))

    def choice(self, name: str, kind: type[E], default: E | None = None) -> E:
        value = self._get(name, _REQUIRED if default is None else default)
        if isinstance(value, kind):
            return value
        try:
            return kind(value)
        except ValueError:
            options = ", ".join(repr(m.value) for m in kind)
            raise RecordError(self.at(name), f"expected one of {options}") from None

    def texts(self, name: str, *, default: list[str] | None = None) -> list[str]:
        value = self._get(name, _REQUIRED if default is None else default)
        if not isinstance(value, list):
            raise RecordError(self.at(name), f"expected an array, got {_kind(value)}")
        for n, item in enumerate(value):
            if not isinstance(item, str):
                raise RecordError(f"{self.at(name)}[{n}]", f"expected a string, got {_kind(item)}")
        return list(value)

    def text_map(self, name: str) -> dict[str, str]:
        return self.mapping(name, lambda value, where: _string(value, where))

    def mapping(self, name: str, item: Callable[[object, str], R]) -> dict[str, R]:
        value = self._get(name, {})
        if not isinstance(value, dict):
            raise RecordError(self.at(name), f"expected an object, got {_kind(value)}")
        return {key: item(v, f"{self.at(name)}.{key}") for key, v in value.items()}

    def array(self, name: str, item: Callable[[object, str], R]) -> list[R]:
        value = self._get(name, [])
        if not isinstance(value, list):
            raise RecordError(self.at(name), f"expected an array, got {_kind(value)}")
        return [item(v, f"{self.at(name)}[{n}]") for n, v in enumerate(value)]

    def raw(self, name: str) -> object:
        """A field read as it is (None when absent), for a record of its own."""
        return self._get(name, None)

    def done(self) -> None:
        extra = sorted(set(self._doc) - self._seen - self._allowed)
        if extra:
            raise RecordError(self.at(extra[0]), "extra field not permitted")


_REQUIRED = object()


def read(doc: object, where: str, make: Callable[[Reader], R]) -> R:
    """The record `make` builds from object `doc`, its own checks named from `where`, and
    no field left that it did not read."""
    reader = Reader(doc, where)
    with within(where):
        record = make(reader)
    reader.done()
    return record


@contextmanager
def within(where: str) -> Iterator[None]:
    """A record's own checks (its `__post_init__`) named from where it was read."""
    try:
        yield
    except RecordError as exc:
        if not where:
            raise
        raise RecordError(f"{where}.{exc.where}" if exc.where else where, exc.reason) from None


def _string(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise RecordError(where, f"expected a string, got {_kind(value)}")
    return value


def parse_datetime(value: object, where: str) -> datetime:
    """An ISO 8601 date-time as JSON carries it (a datetime passes as it is)."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or len(value) > 40:
        raise RecordError(where, f"expected an ISO 8601 date-time, got {_kind(value)}")
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise RecordError(where, f"{value!r} is not an ISO 8601 date-time") from None


def json_datetime(value: datetime) -> str:
    """A datetime as pydantic writes it in JSON (UTC as `Z`): signed bytes stay the same
    as those of the models these records replaced."""
    text = value.isoformat()
    if value.utcoffset() == timedelta(0) and value.tzinfo is not None:
        return text.removesuffix("+00:00") + "Z"
    return text


def aware(value: datetime, where: str) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise RecordError(where, "needs a timezone")
    return value
