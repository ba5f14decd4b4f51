"""The model registry: what bytes a served model is made of, and whether they can be trusted.

:func:`prepare` turns a MODEL argument into a verified package directory
before any weight loads: :mod:`.resolve` finds the bytes (a local directory,
a built-in model's installed mirror, the Hugging Face cache, or a download
through :mod:`.hub`), :mod:`.verify` checks them (every digest of a built-in
model; links; unlisted loadable files) or computes the identity of a model
that is not built in. The built-in table is the catalog's ``models`` layer
(families register :class:`vllm_srun.plugins.ModelEntry` objects through
``register_models``); :func:`table` lists it for ``vllm-srun models``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vllm_srun.plugins import ModelEntry

from .digests import DigestCache
from .resolve import ResolvedSource, check_revision, resolve, split_model
from .verify import (
    Verification,
    VerificationCard,
    count_parameters,
    identity,
    is_loadable,
    pinned_result,
    verify_package,
)


class IdentityCard(VerificationCard):
    """The identity fields of a card (:meth:`PreparedModel.card`; typed on the wire by
    :class:`vllm_srun.plugins.cards.ModelCard`)."""

    repo: str | None
    revision: str | None
    licence: str | None
    parameters: int | None
    source: str


@dataclass(frozen=True)
class PreparedModel:
    """A resolved and verified model, ready for a family to load.

    Attributes:
        source: where the bytes are (:class:`ResolvedSource`).
        verification: what the check found (:class:`Verification`).
        entry: the built-in table entry the package matched, or ``None``.
        repo, revision, licence, parameters: the identity the card reports.
    """

    source: ResolvedSource
    verification: Verification
    entry: ModelEntry | None
    repo: str | None
    revision: str | None
    licence: str | None
    parameters: int | None

    def card(self) -> IdentityCard:
        """The identity fields of a ``/v1/models`` card (DESIGN §5)."""
        return {
            "repo": self.repo,
            "revision": self.revision,
            "licence": self.licence,
            "parameters": self.parameters,
            "source": self.source.origin,
            **self.verification.card(),
        }


def prepare(
    model: str | os.PathLike[str],
    *,
    builtins: Mapping[str, ModelEntry],
    revision: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    offline: bool = False,
    accept_licences: Iterable[str] = (),
    digest_cache: DigestCache | None = None,
) -> PreparedModel:
    """Resolve and verify a MODEL argument (see :func:`.resolve.resolve`).

    A local directory whose loadable files are exactly a built-in model's
    (same paths, same digests) is that built-in model, ``pinned``. Digests of
    files unchanged since an earlier start come from ``digest_cache``
    (:meth:`DigestCache.default` when ``None``: the runtime's cache directory),
    which is saved afterwards.

    Raises:
        LoadError: any resolution or verification failure, with the operator
            phrase first (``a revision is required``, ``revision must be a
            40-hex commit``, ``a file hash does not match``, ``access denied,
            gated or private``, ``a licence must be accepted``, ...).
    """
    source = resolve(
        model,
        builtins=builtins,
        revision=revision,
        cache_dir=cache_dir,
        offline=offline,
        accept_licences=accept_licences,
    )
    entry = source.entry
    status = "local" if source.kind == "local" else "revision"
    digests = DigestCache.default() if digest_cache is None else digest_cache
    try:
        verification = verify_package(
            source.path,
            entry=entry,
            root=source.root,
            status=status,
            source=source.origin,
            digest=digests.sha256,
            mirror=source.mirror,
        )
    finally:  # the digests of the files read are kept even when one of them failed
        digests.save()
    if entry is None:
        entry = _matching_builtin(builtins, verification) if status == "local" else None
        if entry is not None:  # the same bytes as a built-in: the same identity
            verification = pinned_result(verification.files, verification.extra_files)
    if entry is not None:
        parameters = entry.parameters
        if parameters is None and verification.status == "computed":
            parameters = count_parameters(source.path, verification.files)
        return PreparedModel(
            source,
            verification,
            entry,
            entry.name,
            entry.revision,
            entry.licence,
            parameters,
        )
    return PreparedModel(
        source,
        verification,
        None,
        source.repo,
        source.revision,
        None,
        count_parameters(source.path, verification.files),
    )


def _matching_builtin(
    builtins: Mapping[str, ModelEntry], verification: Verification
) -> ModelEntry | None:
    for entry in builtins.values():
        if dict(entry.files) == verification.files:
            return entry
    return None


def entry_json(entry: ModelEntry) -> dict[str, Any]:
    """One built-in model as ``vllm-srun models --json`` lists it."""
    return {
        "name": entry.name,
        "family": entry.family,
        "revision": entry.revision,
        "licence": entry.licence,
        "licence_restricted": entry.licence_restricted,
        "parameters": entry.parameters,
        "description": entry.description,
        "files": dict(sorted(entry.files.items())),
        "patterns": list(entry.patterns),
        "mirrors": [
            {"distribution": m.distribution, "version": m.version, "path": m.path}
            for m in entry.mirrors
        ],
    }


def table(builtins: Mapping[str, ModelEntry]) -> list[dict[str, Any]]:
    """Every built-in model (:func:`entry_json`), sorted by name."""
    return [entry_json(builtins[name]) for name in sorted(builtins)]


__all__ = [
    "DigestCache",
    "PreparedModel",
    "ResolvedSource",
    "Verification",
    "check_revision",
    "entry_json",
    "identity",
    "is_loadable",
    "prepare",
    "resolve",
    "split_model",
    "table",
    "verify_package",
]
