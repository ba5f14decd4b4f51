"""Edits of JSON text in place: find where a member's value lies, replace only it.

The frontend changes nothing of a request or an answer but its ``model`` selectors,
so it edits the text rather than decoding and re-encoding it: every other byte
(key order, a key given twice, number spellings, escapes) reaches the worker, and
the client, exactly as it was sent.
"""

from __future__ import annotations

import json
import re

_DECODER = json.JSONDecoder()
_WHITESPACE = re.compile(r"[ \t\n\r]*")
"""JSON's insignificant whitespace (RFC 8259 §2), matched by the regex engine: a body
padded with megabytes of it is skipped at C speed, not one character at a time."""

Span = tuple[int, int]
Edit = tuple[int, int, str]
"""``(start, end, text)``: replace ``text[start:end]`` (``start == end`` inserts)."""


def _skip(text: str, at: int) -> int:
    matched = _WHITESPACE.match(text, at)
    return matched.end() if matched is not None else at


def _expect(text: str, at: int, char: str) -> None:
    if text[at : at + 1] != char:
        raise ValueError(f"expected {char!r} at character {at}")


def _value_end(text: str, at: int) -> int:
    try:
        return int(_DECODER.raw_decode(text, at)[1])
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON at character {err.pos}: {err.msg}") from err
    except RecursionError as err:
        raise ValueError(f"the value at character {at} is nested too deeply") from err


def members(text: str, start: int) -> tuple[list[tuple[str, int, int]], int]:
    """The members of the object starting at ``start`` (``text[start] == "{"``): each
    ``(key, value start, value end)`` in order, duplicates included; and where the
    object ends.

    Raises:
        ValueError: not an object there, or not JSON.
    """
    _expect(text, start, "{")
    found: list[tuple[str, int, int]] = []
    at = _skip(text, start + 1)
    if text[at : at + 1] == "}":
        return found, at + 1
    while True:
        _expect(text, at, '"')
        end = _value_end(text, at)
        key = text[at:end]
        key = json.loads(key) if "\\" in key else key[1:-1]
        at = _skip(text, end)
        _expect(text, at, ":")
        at = _skip(text, at + 1)
        end = _value_end(text, at)
        found.append((key, at, end))
        at = _skip(text, end)
        if text[at : at + 1] == ",":
            at = _skip(text, at + 1)
            continue
        _expect(text, at, "}")
        return found, at + 1


def elements(text: str, start: int) -> tuple[list[Span], int]:
    """The elements of the array starting at ``start``: each ``(start, end)``; and where
    the array ends.

    Raises:
        ValueError: not an array there, or not JSON.
    """
    _expect(text, start, "[")
    found: list[Span] = []
    at = _skip(text, start + 1)
    if text[at : at + 1] == "]":
        return found, at + 1
    while True:
        end = _value_end(text, at)
        found.append((at, end))
        at = _skip(text, end)
        if text[at : at + 1] == ",":
            at = _skip(text, at + 1)
            continue
        _expect(text, at, "]")
        return found, at + 1


def document(text: str) -> list[tuple[str, int, int]]:
    """The members of ``text``, a JSON object and nothing else (whitespace aside).

    Raises:
        ValueError: anything else.
    """
    start = _skip(text, 0)
    found, end = members(text, start)
    if _skip(text, end) != len(text):
        raise ValueError(f"extra data at character {end}")
    return found


def member(found: list[tuple[str, int, int]], key: str) -> Span | None:
    """The span of the last member named ``key`` (JSON's reading of a repeated key)."""
    span = None
    for name, start, end in found:
        if name == key:
            span = (start, end)
    return span


def model_edits(text: str, start: int, name: str, *, insert: bool) -> list[Edit]:
    """Edits that make every ``model`` of the object at ``start`` say ``name``; with
    ``insert``, one that adds it when the object has none.

    Raises:
        ValueError: not an object there, or not JSON.
    """
    found, _ = members(text, start)
    value = json.dumps(name, ensure_ascii=False)
    edits = [(s, e, value) for key, s, e in found if key == "model"]
    if not edits and insert:
        at = start + 1
        edits.append((at, at, f'"model":{value}' + ("," if found else "")))
    return edits


def apply(text: str, edits: list[Edit]) -> str:
    """``text`` with ``edits`` (disjoint spans) applied."""
    if not edits:
        return text
    parts, at = [], 0
    for start, end, replacement in sorted(edits):
        parts += [text[at:start], replacement]
        at = end
    parts.append(text[at:])
    return "".join(parts)


def is_object(text: str, start: int) -> bool:
    return text[start : start + 1] == "{"
