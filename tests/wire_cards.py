"""Check a served document against the wire types it is documented by: every value of the
declared JSON type with no coercion (pydantic strict: 48.0 is no integer, a bool no
count), and every key declared (the card types allow extra keys on the wire, so that
a 2.3 client ignores ours; here no key may go undocumented)."""

from __future__ import annotations

import types
from typing import Any, Union, get_args, get_origin

from pydantic import TypeAdapter
from typing_extensions import get_type_hints, is_typeddict

from vllm_srun.plugins.cards import ExtensionCard, ModelCard

FREE_FORM = (ExtensionCard,)
"""Types whose documented keys are followed by free-form ones (an extension's own card)."""


def undeclared(value: Any, hint: Any, where: str = "$") -> list[str]:
    """The paths of keys in ``value`` that ``hint`` (a TypedDict, or a list, dict or
    union of them) does not declare."""
    if is_typeddict(hint):
        if not isinstance(value, dict):
            return []
        hints = get_type_hints(hint)
        found = [] if hint in FREE_FORM else [f"{where}.{k}" for k in value if k not in hints]
        for key, item in value.items():
            if key in hints:
                found += undeclared(item, hints[key], f"{where}.{key}")
        return found
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return [path for arg in get_args(hint) for path in undeclared(value, arg, where)]
    if origin is list and isinstance(value, list):
        (item_hint,) = get_args(hint)
        return [
            p for i, item in enumerate(value) for p in undeclared(item, item_hint, f"{where}[{i}]")
        ]
    if origin is dict and isinstance(value, dict):
        _, item_hint = get_args(hint)
        return [p for k, item in value.items() for p in undeclared(item, item_hint, f"{where}.{k}")]
    return []


def assert_typed(value: Any, hint: Any) -> None:
    """``value`` validates as ``hint`` in strict mode and has no undeclared key."""
    TypeAdapter(hint).validate_python(value, strict=True)
    assert undeclared(value, hint) == []


def assert_wire_card(card: Any) -> None:
    """``card`` is a :class:`~vllm_srun.plugins.cards.ModelCard`, exactly."""
    assert_typed(card, ModelCard)
