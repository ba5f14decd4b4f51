"""Reading a raw decisions body: JSON whose duplicate keys are found, not dropped.

``json.loads`` keeps the last of two equal keys in one object without a word;
a decisions request must refuse that (which ``criteria`` did the client mean?).
:func:`loads_checked` parses the bytes and reports the path of every key seen
more than once; :func:`non_finite` finds a NaN or infinite number in a document
another parser accepted; :func:`describe_path` writes a :data:`Path` as a
message shows it (``questions.q1.choices[0].key``).

Nothing here knows the decisions schema: :func:`vllm_srun.plugins.decisions.parse_body`
reads a body with :func:`loads_checked` and validates it with
:func:`~vllm_srun.plugins.decisions.parse_request`.
"""

from __future__ import annotations

import json
import math
from typing import Any

from vllm_srun.plugins.spec import RequestError, clip

Path = tuple[str | int, ...]
"""Where a value sits in a JSON document: object keys and array indices from the root."""


class _Object(dict[str, Any]):
    """A parsed JSON object that remembers the keys it saw more than once."""

    repeated: list[str]


def _collect(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object()
    obj.repeated = []
    for key, value in pairs:
        if key in obj and key not in obj.repeated:
            obj.repeated.append(key)
        obj[key] = value
    return obj


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _plain(value: Any, path: Path, found: list[Path]) -> Any:
    """``value`` rebuilt from plain dicts and lists, duplicate keys appended to ``found``."""
    if isinstance(value, dict):
        found.extend((*path, key) for key in getattr(value, "repeated", ()))
        return {k: _plain(v, (*path, k), found) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, (*path, i), found) for i, v in enumerate(value)]
    return value


def loads_checked(
    raw: bytes | bytearray | str, *, constants: bool = False
) -> tuple[Any, list[Path]]:
    """Parse JSON text and report each duplicated object key.

    Args:
        raw: the body (UTF-8, UTF-16 or UTF-32 bytes, as :func:`json.loads` detects, or text).
        constants: accept ``NaN``/``Infinity`` (to find the duplicates of a
            document another parser already accepted; check its values apart).

    Returns:
        ``(value, duplicates)``: the document built from plain ``dict``/``list``
        (a duplicated key keeps its last value, as :func:`json.loads` does)
        and, in document order, the path of every key that appeared more than
        once in its object, e.g. ``("questions", "team", "criteria", "billing")``.

    Raises:
        RequestError: ``invalid_request`` when the text is not JSON, uses
            ``NaN``/``Infinity`` (which JSON does not have) without
            ``constants``, or nests too deeply to read.
    """
    try:
        value = json.loads(
            raw,
            object_pairs_hook=_collect,
            parse_constant=float if constants else _reject_constant,
        )
        found: list[Path] = []
        return _plain(value, (), found), found
    except (ValueError, UnicodeDecodeError) as err:
        raise RequestError("invalid_request", f"the body is not valid JSON: {err}") from err
    except RecursionError as err:
        raise RequestError(
            "invalid_request",
            "the body nests arrays or objects too deeply to read; flatten the state",
        ) from err


def non_finite(value: Any, path: Path = ()) -> Path | None:
    """The path of the first NaN or infinite number in a parsed document, or ``None``."""
    stack: list[tuple[Any, Path]] = [(value, path)]
    while stack:
        current, where = stack.pop()
        if isinstance(current, float) and not math.isfinite(current):
            return where
        if isinstance(current, dict):
            stack.extend((v, (*where, k)) for k, v in reversed(list(current.items())))
        elif isinstance(current, list):
            stack.extend((v, (*where, i)) for i, v in reversed(list(enumerate(current))))
    return None


def describe_path(path: Path) -> str:
    """``("questions", "q1", "choices", 0, "key")`` as ``questions.q1.choices[0].key``;
    each name cut to :data:`~vllm_srun.plugins.spec.ECHO_LIMIT` characters (:func:`clip`),
    so a message naming a path never grows with the names a client sent."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{clip(part)}" if text else clip(part)
    return text
