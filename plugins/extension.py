"""The surface-extension contract: add a surface to a model another family loaded.

A family loads a package and serves the surfaces it knows. A surface
extension adds one more to a loaded model whose card qualifies, without
loading anything of its own: ``similarity_readout`` lets a model with a pooled
head answer ``decisions`` through its own embeddings. ``--family`` still picks
only the loading family; an extension attaches after it.

The runtime asks every installed extension, in name order, for each loaded
model: an extension that :meth:`~SurfaceExtension.qualifies` and adds a
surface the model does not serve yet is attached through
:meth:`~SurfaceExtension.attach`. The answers it gives are reported on the
model's card under ``extensions`` with their ``numerics`` and ``method``.

An extension may instead (or also) *augment* a surface the host serves
(:attr:`SurfaceExtension.augments`): ``pii_patterns`` adds pattern-recognised
spans to a token model's ``classify`` answers. Requests for that surface then
plan and finish through the extension's model, which plans on the host and
rewrites the host's answer; the rows are still the host's.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, ClassVar, Generic

from vllm_srun.plugins.cards import FamilyCard
from vllm_srun.plugins.loaded import Answer, LoadedModel, PlanT
from vllm_srun.plugins.requests import SurfaceRequest

if TYPE_CHECKING:
    from vllm_srun.plugins.spec import RowOutput

NUMERICS = ("exact", "approximate")
"""How an extension's answers relate to a reference: bit-exact, or a documented approximation."""


class SurfaceExtension(abc.ABC):
    """Base class of surface-extension plugins.

    Class attributes:
        name: the extension's name (``similarity_readout``).
        surfaces: the surfaces it adds (``("decisions",)``).
        numerics: ``exact`` or ``approximate`` (answers from a method that is
            not the model's trained readout, e.g. zero-shot cosine similarity).
        method: one line naming the method, shown on the card.
        augments: surfaces the host already serves whose answers the extension
            rewrites (its model plans on the host and finishes from the host's
            answer); at most one extension augments a surface, the first in
            name order.
    """

    name: ClassVar[str]
    surfaces: ClassVar[tuple[str, ...]] = ()
    augments: ClassVar[tuple[str, ...]] = ()
    numerics: ClassVar[str] = "approximate"
    method: ClassVar[str] = ""

    @abc.abstractmethod
    def qualifies(self, card: FamilyCard) -> str | None:
        """``None`` when the extension can serve the model with this card, else why not.

        Args:
            card: the loaded model's card as the family reports it (``surfaces``,
                ``heads``, ``embedding``, ``limits``, ...).
        """

    @abc.abstractmethod
    def attach(self, host: LoadedModel[Any], card: FamilyCard) -> SurfaceModel[Any]:
        """A loaded model answering :attr:`surfaces` through ``host``.

        The returned object follows the loaded-model protocol
        (:class:`SurfaceModel`) for the added surfaces:
        ``plan(surface, request)`` returns work items the *host* runs (the
        runtime batches them with the host's other rows), and
        ``finish(plan, outputs)`` turns the host's row outputs into the
        answer. It must not run forwards itself.
        """


class SurfaceModel(abc.ABC, Generic[PlanT]):
    """What :meth:`SurfaceExtension.attach` returns: ``plan`` and ``finish`` for the
    surfaces the extension adds, over rows its host runs.

    ``plan`` returns work items the *host* runs (the runtime batches them with
    the host's other rows, shares the result cache and dedupe with them);
    ``finish`` turns the host's row outputs into the answer. It never runs a
    forward itself.
    """

    @abc.abstractmethod
    def plan(self, surface: str, request: SurfaceRequest) -> PlanT:
        """Validate a typed request for an added surface and plan the host rows it needs.

        Raises:
            RequestError: the request as a whole cannot be taken.
        """

    @abc.abstractmethod
    def finish(self, plan: PlanT, outputs: list[RowOutput]) -> Answer:
        """The response body from the host's outputs for the plan's rows."""

    def warm(self) -> None:
        """Prepare now what the first request would otherwise pay for (``pii_patterns``
        compiles Presidio's patterns). The runtime calls it once, while the host model is
        ``warming``, before it is ready; nothing by default. An exception is logged and
        the model serves (the extension then pays on its first request)."""

    def card(self) -> dict[str, object]:
        """What the card's ``extensions`` entry says about these answers beside
        ``name``, ``surfaces``, ``numerics`` and ``method``: a JSON object of the
        extension's own (free-form; a ``question_types`` key, a list of strings, moves
        up to the model's card)."""
        return {}


def extension_violations(extension: SurfaceExtension) -> list[str]:
    """Reasons ``extension`` breaks the contract (empty when it conforms)."""
    from vllm_srun.plugins.accelerator import NAME_PATTERN

    problems = []
    name = getattr(extension, "name", None)
    if type(name) is not str or not NAME_PATTERN.match(name):
        problems.append(f"extension name {name!r} must match {NAME_PATTERN.pattern}")
    surfaces = getattr(extension, "surfaces", None)
    augments = getattr(extension, "augments", ())
    if not all(
        isinstance(names, tuple) and all(type(s) is str and s for s in names)
        for names in (surfaces, augments)
    ) or not (surfaces or augments):
        problems.append(
            "extension surfaces and augments must be tuples of surface names, not both empty"
        )
    if getattr(extension, "numerics", None) not in NUMERICS:
        problems.append(f"extension numerics must be one of {', '.join(NUMERICS)}")
    method = getattr(extension, "method", None)
    if type(method) is not str or not method.strip():
        problems.append("extension method must name how the answers are computed")
    return problems
