"""The loaded-model contract: what a family's ``load`` returns, and the card it describes.

A family turns a package into a :class:`LoadedModel`: three verbs the
runtime calls in order for every request (``plan`` on the model's planning
thread, ``run`` on its scheduler's worker with rows of many requests,
``finish`` once a request's rows are done), plus two things the runtime reads
once at load (``card`` for ``/v1/models``, ``probe_items`` for the
batch-invariance probe and the forward-cost measurement).

A :class:`Plan` is the family's record of one planned request: the rows to run
and whatever the family needs to finish it.
"""

from __future__ import annotations

import abc
from typing import Any, Generic, TypedDict, TypeVar

import torch

from vllm_srun.plugins.requests import SurfaceRequest
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


class HeadCard(TypedDict, total=False):
    """One output head on the card: ``name``, ``kind`` (``sequence``, ``scores``,
    ``token``, ``relevance``, ``pooled``), ``labels``, the accepted ``inputs``
    (``text``, ``text_pair``), ``overflow`` policies, the ``window`` it reads
    long inputs in (``tokens``, ``overlap``) and how windows are merged
    (``reduction``)."""

    name: str
    kind: str
    labels: list[str]
    inputs: list[str]
    overflow: list[str]
    window: dict[str, int]
    reduction: str


class EmbeddingCard(TypedDict):
    """A pooled head's vectors: ``dimensions`` (floats per vector), ``normalized``
    (unit L2 norm), ``pooling`` (``mean``, ``cls``, ``max``, ...), ``max_tokens``."""

    dimensions: int
    normalized: bool
    pooling: str
    max_tokens: int


class ModelCard(TypedDict, total=False):
    """The family's part of a ``/v1/models`` card (the runtime adds identity,
    engine, device, probes and status).

    Keys:
        surfaces: the surfaces the model serves.
        question_types: ``choice``, ``noul``, ``score`` for a model answering decisions.
        heads: its output heads (:class:`HeadCard`).
        embedding: its pooled vectors (:class:`EmbeddingCard`), or ``None``.
        limits: token limits (``max_tokens``; decision models also
            ``max_model_len`` and ``model_max_tokens``), ``None`` where unset.
        decisions: how a decision model reads its answers (method, numerics,
            template, temperatures, ...).
        extensions: the surface extensions attached to the model, each with
            ``name``, ``surfaces``, ``numerics``, ``method`` and its own card.
    """

    surfaces: list[str]
    question_types: list[str]
    heads: list[HeadCard]
    embedding: EmbeddingCard | None
    limits: dict[str, int | None]
    decisions: dict[str, Any]
    extensions: list[dict[str, Any]]


PlanT = TypeVar("PlanT", bound=Plan)


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
    """

    surfaces: tuple[str, ...]

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
    def run(self, items: list[WorkItem]) -> list[torch.Tensor]:
        """One output per item, in order (float32, on the CPU)."""

    @abc.abstractmethod
    def finish(self, plan: PlanT, outputs: list[RowOutput]) -> dict[str, Any]:
        """The response body for a plan, given one output (or
        :class:`~vllm_srun.plugins.spec.RowError`) per item.

        An input any of whose rows failed answers with that row's error in its
        place; its siblings answer normally.
        """

    def card(self) -> ModelCard:
        """The family's part of the model card (nothing by default)."""
        return {}

    def probe_items(self) -> list[WorkItem]:
        """Rows of several lengths the runtime runs at load, alone and together.

        They measure the batch-invariance deviation (rows of different
        requests share a forward only when it is within 1e-5) and a forward's
        fixed cost. With none (the default) the model is unprobed: every
        request runs in forwards of its own, and the conformance kit warns.
        """
        return []


__all__ = ["EmbeddingCard", "HeadCard", "LoadedModel", "ModelCard", "Plan", "PlanT"]
