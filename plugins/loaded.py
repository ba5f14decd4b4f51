"""The loaded-model contract: what a family's ``load`` returns.

A family turns a package into a :class:`LoadedModel`: three verbs the
runtime calls in order for every request (``plan`` on the model's planning
thread, ``run`` on its scheduler's worker with rows of many requests,
``finish`` once a request's rows are done), plus two things the runtime reads
once at load (``card`` for ``/v1/models``, a :class:`~vllm_srun.plugins.cards.FamilyCard`;
``probe_items`` for the batch-invariance probe and the forward-cost measurement).

A :class:`Plan` is the family's record of one planned request: the rows to run
and whatever the family needs to finish it.
"""

from __future__ import annotations

import abc
from typing import Generic, TypeVar, cast

import numpy as np
import numpy.typing as npt

from vllm_srun.plugins.cards import FamilyCard
from vllm_srun.plugins.decisions.answers import AnsweredDecisions, DecisionsAnswer
from vllm_srun.plugins.requests import SurfaceRequest
from vllm_srun.plugins.responses import (
    ClassifyResponse,
    EmbeddingsResponse,
    RerankResponse,
    SurfaceAnswer,
)
from vllm_srun.plugins.spec import RowOutput, WorkItem


class Plan:
    """Base of a planned surface request.

    Subclasses (usually dataclasses) set :attr:`items`, the rows the engine
    runs for the request, and keep whatever else ``finish`` needs.

    Attributes:
        items: the request's rows, in the order ``finish`` receives their outputs.
    """

    items: list[WorkItem]

    @property
    def queue_entries(self) -> int:
        """How many requests this one counts as against ``--max-queue`` (1; a
        decisions request with ``states`` counts each entry)."""
        return 1

    def read_end(self, index: int) -> int | None:
        """Where the text of input ``index`` stops being read, when its rows read only a
        beginning of it (``options.overflow: truncate`` cut it): the code point after the
        last one read. An extension adding spans to the answer keeps each one's ``end`` at
        or before it. ``None`` (the default): the whole text was read, or the plan does not
        say; a result that reports ``input.truncated`` while this is ``None`` gets no added
        spans."""
        return None


PlanT = TypeVar("PlanT", bound=Plan)

Answer = SurfaceAnswer | DecisionsAnswer
"""What ``finish`` returns: an embeddings, classify or rerank answer
(:mod:`vllm_srun.plugins.responses`) or a decisions answer
(:mod:`vllm_srun.plugins.decisions.answers`); the runtime adds ``model``."""

Answered = EmbeddingsResponse | ClassifyResponse | RerankResponse | AnsweredDecisions
"""An :data:`Answer` with the ``model`` that gave it (:func:`answered`)."""


def answered(answer: Answer, model: str) -> Answered:
    """``answer`` with ``model`` (the served model's name) added: each answer type plus
    ``model`` is its ``Answered`` type (mypy cannot follow ``{**answer, ...}`` over a
    union, hence the one cast)."""
    return cast(Answered, {"model": model, **answer})


class LoadedModel(abc.ABC, Generic[PlanT]):
    """Base class of what a family's ``load`` returns.

    ``plan`` validates and tokenises (raising
    :class:`~vllm_srun.plugins.spec.RequestError` for a request it cannot
    take; per-input failures stay inside the plan), ``run`` computes one batch
    of rows from any requests, ``finish`` turns a plan and its rows' outputs
    into the response body.

    It is generic in the family's plan type: ``class MyModel(LoadedModel[MyPlan])``
    receives its own plans back in ``finish``.

    Attributes:
        surfaces: the surfaces this model answers.
        pads_to_width: whether :meth:`run` takes ``width=`` (pad every row to that
            many tokens). Under the ``exact`` profile the runtime then pads each row
            to a fixed edge of its length, so rows of many lengths share a forward
            and a row's answer still depends on the row alone; without it (the
            default) such rows share a forward only with rows of their own length.
    """

    surfaces: tuple[str, ...]
    pads_to_width: bool = False

    @abc.abstractmethod
    def plan(self, surface: str, request: SurfaceRequest) -> PlanT:
        """Validate and tokenise a request for ``surface``.

        ``request`` is already typed and checked for shape
        (:mod:`vllm_srun.plugins.requests`): an
        :class:`~vllm_srun.plugins.requests.EmbeddingsRequest` for
        ``embeddings``, a ``ClassifyRequest``, a ``RerankRequest`` or a
        :class:`~vllm_srun.plugins.decisions.DecisionsRequest`. Check only what
        depends on the model (sizes, head names, limits).

        Raises:
            RequestError: the request as a whole cannot be taken.
        """

    @abc.abstractmethod
    def run(self, items: list[WorkItem]) -> list[npt.NDArray[np.float32]]:
        """One output per item, in order: a float32 numpy array in host memory (the row's
        ``[tokens, ...]`` per-token outputs or its ``[...]`` sequence output;
        :func:`~vllm_srun.plugins.collate.split_rows` cuts them from a batch).

        A model with :attr:`pads_to_width` also takes ``width: int | None = None``:
        pad every row to that many tokens (at least the longest row's length; the
        padding masked as usual), so that the runtime decides each row's shape.
        """

    @abc.abstractmethod
    def finish(self, plan: PlanT, outputs: list[RowOutput]) -> Answer:
        """The answer for a plan (the response without ``model``, :data:`Answer`), given
        one output (or :class:`~vllm_srun.plugins.spec.RowError`) per item.

        An input any of whose rows failed answers with that row's error in its
        place; its siblings answer normally.
        """

    def card(self) -> FamilyCard:
        """The family's part of the model card (:class:`~vllm_srun.plugins.cards.FamilyCard`):
        by default its surfaces alone (the runtime writes an empty value for every other key)."""
        return {"surfaces": list(self.surfaces)}

    def warm(self) -> None:
        """Prepare now what the first request would otherwise pay for (tables to load,
        patterns to compile) beside the forwards of the golden self-check. The runtime
        calls it once, while the model is ``warming``, before it is ready; nothing by
        default. An exception fails the model."""

    def probe_items(self) -> list[WorkItem]:
        """Rows of several lengths the runtime runs at load, alone and together.

        They measure the batch-invariance deviation (rows of different
        requests share a forward only when it is within 1e-5) and a forward's
        fixed cost. With none (the default) the model is unprobed: every
        request runs in forwards of its own, and the conformance kit warns.
        """
        return []


__all__ = [
    "Answer",
    "Answered",
    "LoadedModel",
    "Plan",
    "PlanT",
    "answered",
]
