"""Go's ``encoding/json`` rules, for checking what the upstream router can decode.

The router's client is generated (oapi-codegen) from the runtime contract and
decodes every response with Go's standard library. These rules, from the
``encoding/json`` documentation, decide whether a response decodes:

- a JSON ``null`` is accepted for any field (a pointer becomes nil, anything
  else keeps its zero value);
- an object key matches a struct field by its JSON name, exactly or else
  case-insensitively; keys that match no field are ignored;
- a value of the wrong JSON type fails the whole decode: a string where a
  number is declared, a bool where an integer is, an array where a string is;
- an integer field takes only an integer literal (``1``, not ``1.0`` or
  ``1e0``) within int64; a float32 field refuses a number beyond float32;
- strings, bools, arrays and objects must be exactly that;
- enums are plain strings (not checked) and ``oneOf`` unions are kept as raw
  JSON (anything decodes; the client converts them later);
- ``NaN`` and ``Infinity`` are not JSON: the parser refuses the whole body.

:func:`parse` reads a body as Go's parser would; :meth:`GoType.problems` lists
every place a decode would fail (an empty list: it decodes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

INT64 = (-(2**63), 2**63 - 1)
FLOAT32_MAX = 3.4028234663852886e38


def parse(text: str) -> Any:
    """The JSON value of ``text``; ``ValueError`` where Go's parser would refuse it
    (``NaN``/``Infinity`` tokens included)."""

    def refuse(token: str) -> Any:
        raise ValueError(f"{token} is not JSON: Go's decoder refuses the whole body")

    return json.loads(text, parse_constant=refuse)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


class GoType:
    """A Go type a JSON value is decoded into."""

    go: str = "?"

    def problems(self, value: Any, path: str = "$") -> list[str]:
        """Every decode failure of ``value`` at ``path`` (``[]``: it decodes)."""
        if value is None:
            return []
        return self._check(value, path)

    def _check(self, value: Any, path: str) -> list[str]:
        raise NotImplementedError

    def _mismatch(self, value: Any, path: str) -> list[str]:
        return [f"{path}: cannot unmarshal {_kind(value)} into Go value of type {self.go}"]


class Int(GoType):
    go = "int"

    def _check(self, value: Any, path: str) -> list[str]:
        if isinstance(value, float) and not isinstance(value, bool):
            return [f"{path}: cannot unmarshal number {value!r} into Go value of type int"]
        if not isinstance(value, int) or isinstance(value, bool):
            return self._mismatch(value, path)
        if not INT64[0] <= value <= INT64[1]:
            return [f"{path}: number {value} overflows int"]
        return []


@dataclass
class Float(GoType):
    bits: int = 64

    @property
    def go(self) -> str:  # type: ignore[override]
        return f"float{self.bits}"

    def _check(self, value: Any, path: str) -> list[str]:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return self._mismatch(value, path)
        if self.bits == 32 and abs(value) > FLOAT32_MAX:
            return [f"{path}: number {value} overflows float32"]
        return []


class Str(GoType):
    go = "string"

    def _check(self, value: Any, path: str) -> list[str]:
        return [] if isinstance(value, str) else self._mismatch(value, path)


class Bool(GoType):
    go = "bool"

    def _check(self, value: Any, path: str) -> list[str]:
        return [] if isinstance(value, bool) else self._mismatch(value, path)


class Raw(GoType):
    """``interface{}``, ``json.RawMessage`` or a ``oneOf`` union: any JSON value."""

    go = "json.RawMessage"

    def _check(self, value: Any, path: str) -> list[str]:
        return []


@dataclass
class List(GoType):
    item: GoType

    @property
    def go(self) -> str:  # type: ignore[override]
        return f"[]{self.item.go}"

    def _check(self, value: Any, path: str) -> list[str]:
        if not isinstance(value, list):
            return self._mismatch(value, path)
        return [p for i, v in enumerate(value) for p in self.item.problems(v, f"{path}[{i}]")]


@dataclass
class Map(GoType):
    item: GoType

    @property
    def go(self) -> str:  # type: ignore[override]
        return f"map[string]{self.item.go}"

    def _check(self, value: Any, path: str) -> list[str]:
        if not isinstance(value, dict):
            return self._mismatch(value, path)
        return [p for k, v in value.items() for p in self.item.problems(v, f"{path}.{k}")]


@dataclass
class Struct(GoType):
    """A generated struct: its JSON field names and types."""

    name: str
    fields: dict[str, GoType] = field(default_factory=dict)

    @property
    def go(self) -> str:  # type: ignore[override]
        return self.name

    def field_for(self, key: str) -> GoType | None:
        """The field a JSON key lands in: the exact name, else a case-insensitive match."""
        if key in self.fields:
            return self.fields[key]
        folded = key.casefold()
        for name, kind in self.fields.items():
            if name.casefold() == folded:
                return kind
        return None

    def _check(self, value: Any, path: str) -> list[str]:
        if not isinstance(value, dict):
            return self._mismatch(value, path)
        found: list[str] = []
        for key, item in value.items():
            kind = self.field_for(key)
            if kind is not None:
                found += kind.problems(item, f"{path}.{key}")
        return found

    def extend(self, name: str, **fields: GoType) -> Struct:
        """A struct with this one's fields and ``fields``."""
        return Struct(name, {**self.fields, **fields})
