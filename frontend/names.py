"""The name a client most likely meant, for refusals that say the fix (a listener's 403,
Chat's allow-list): shared by the listener's routes and the router, which import nothing
of each other."""

from __future__ import annotations

from collections.abc import Sequence
from difflib import get_close_matches


def closest(model: str, names: Sequence[str]) -> str | None:
    """The name ``model`` most likely meant: one equal to it but for case or the
    repository (``all-MiniLM-L6-v2`` for ``sentence-transformers/all-MiniLM-L6-v2``),
    else the nearest spelling; ``None`` when none is close."""
    by_key: dict[str, str] = {}
    for name in names:
        by_key.setdefault(name.casefold(), name)
        by_key.setdefault(name.rsplit("/", 1)[-1].casefold(), name)
    wanted = model.strip().casefold()
    if wanted in by_key:
        return by_key[wanted]
    found = get_close_matches(wanted, list(by_key), n=1, cutoff=0.85)
    return by_key[found[0]] if found else None
