"""Names: the one a client most likely meant, for refusals that say the fix (a listener's
403, Chat's allow-list, a mistyped built-in model), shared by the listener's routes, the
router and the deploy targets, which import nothing of each other; the runtime's rules for
a model name and a local package path, and an image reference."""

from __future__ import annotations

import re
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


REPOSITORY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(?:/[A-Za-z0-9][A-Za-z0-9._-]*)?")
"""The runtime's rule for a model name (its ``MODEL_NAME_PATTERN``, mirrored: the frontend
imports nothing of the runtime; tests/deploy checks both agree): ``owner/name`` or
``name``, ASCII letters, digits, ``.``, ``_`` and ``-``, each part starting with a letter
or a digit."""

IMAGE_REFERENCE = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"(?::[0-9]{1,5})?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)
"""An image reference, simplified from the distribution spec: ``[REGISTRY[:PORT]/]PATH``
(lower-case parts joined by ``/``; ``.``, ``_``, ``__`` or ``-`` inside a part), then
``:TAG`` and/or ``@sha256:DIGEST``."""


def looks_local(model: str) -> bool:
    """Whether a MODEL argument names a local package directory, as the runtime reads it:
    an absolute path, or one starting ``~``, ``./`` or ``../`` (or ``.``, ``..``). A bare
    ``owner/name`` is a Hub repository or built-in name even when a folder of that name
    exists here (write ``./owner/name`` for the folder)."""
    return model.startswith(("/", "./", "../", "~")) or model in (".", "..")


def is_repository_id(name: str) -> bool:
    """Whether ``name`` (without ``@REVISION``) is a model name the runtime accepts."""
    return REPOSITORY_ID.fullmatch(name) is not None


def is_image_reference(image: str) -> bool:
    """Whether ``image`` is an image reference (:data:`IMAGE_REFERENCE`, at most 255
    characters)."""
    return len(image) <= 255 and IMAGE_REFERENCE.fullmatch(image) is not None
