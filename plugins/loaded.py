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
from typing import TYPE_CHECKING, Any, Generic, NotRequired, TypedDict, TypeVar

from vllm_srun.plugins.requests import SurfaceRequest
from vllm_srun.plugins.spec import WorkItem

if TYPE_CHECKING:  # torch is imported by what runs a model, not by the plugin API
    import torch

    from vllm_srun.plugins.spec import RowOutput


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


class WindowCard(TypedDict):
    """How a head reads an input longer than the model's limit under ``overflow:
    window``: windows of ``tokens`` tokens (special tokens included), neighbours
    sharing ``overlap`` content tokens."""

    tokens: int
    overlap: int


class HeadCard(TypedDict, total=False):
    """One output head on the card (wire contract 2.3 ``HeadCard``, plus extensions).

    Keys:
        name: the head's name (``classify`` requests select it with ``head``).
        kind: ``sequence``, ``scores``, ``token`` (the contract's kinds), or
            ``relevance`` and ``pooled`` (this runtime's own).
        labels: label names, in output order.
        inputs: what one input may carry: ``text``, ``pair`` (a ``text_pair``).
        default_threshold: the threshold applied when a request sends none (0..1),
            else ``None``.
        thresholds: the packaged per-label operating point, in ``labels`` order,
            else ``None``.
        operating_point_sha256: the SHA-256 of the file ``thresholds`` come from.
        overflow: the head's default overflow policy (``reject``, ``truncate`` or
            ``window``), what a request that sends none gets.
        overflow_policies: every policy a request may choose (an extension).
        window: the windows ``overflow: window`` reads (:class:`WindowCard`), or ``None``.
        reduction: how windows merge back, in the contract's words: ``max`` (per
            label, over windows) or ``span_union``; ``None`` when the head merges
            otherwise (then ``window_reduction`` says how).
        window_reduction: how windows merge back, in this runtime's words (an extension).
    """

    name: str
    kind: str
    labels: list[str]
    inputs: list[str]
    default_threshold: float | None
    thresholds: list[float] | None
    operating_point_sha256: str | None
    overflow: str
    overflow_policies: list[str]
    window: WindowCard | None
    reduction: str | None
    window_reduction: str


class EmbeddingCard(TypedDict):
    """A pooled head's vectors (wire contract 2.3 ``EmbeddingCard``, plus ``max_tokens``).

    Keys:
        dimensions: the vector sizes the model declares: its full size, then any
            Matryoshka sizes its package declares (integers).
        layers: the layers its vectors can be read at (at least the last layer,
            numbered from 1).
        modalities: what it embeds (``text``).
        normalized: whether vectors have unit L2 norm.
        pooling: ``mean``, ``cls``, ``max``, ``lasttoken``, ...
        input_types: the ``input_type`` values it tells apart (``query``,
            ``document``); empty for a model that is not instructed.
        max_tokens: its input limit in tokens (an extension).
    """

    dimensions: list[int]
    layers: list[int]
    modalities: list[str]
    normalized: bool
    pooling: str
    input_types: list[str]
    max_tokens: NotRequired[int]


class ExitCard(TypedDict):
    """One representation a request may read: the hidden states after ``layer``,
    ``dimension`` floats wide."""

    layer: int
    dimension: int


class RerankCard(TypedDict):
    """The representations rerank may read (``exits``) and the one it reads when a
    request names none (``default``)."""

    exits: list[ExitCard]
    default: ExitCard


class ModelCard(TypedDict, total=False):
    """The family's part of a ``/v1/models`` card (the runtime adds identity,
    engine, device, probes, status and plugins).

    Keys:
        surfaces: the surfaces the model serves.
        question_types: ``choice``, ``noul``, ``score`` for a model answering decisions.
        modalities: what a decisions state may hold (``text``).
        heads: its output heads (:class:`HeadCard`).
        embedding: its pooled vectors (:class:`EmbeddingCard`), or ``None``.
        rerank: what rerank reads (:class:`RerankCard`), for a model serving rerank.
        limits: integer limits: ``max_input_tokens`` (its input limit, special
            tokens included), and for decision models ``max_model_len`` and
            ``model_max_tokens``; ``None`` where unset.
        decisions: how a decision model reads its answers (method, numerics,
            template, temperatures, ...).
        extensions: the surface extensions attached to the model, each with
            ``name``, ``surfaces``, ``numerics``, ``method`` and its own card.
        weights: what the weights are when the family converted them from another
            format (a GGUF file: ``format``, ``quantisation``, the conversion); absent
            for a package whose weights load as they are.
    """

    surfaces: list[str]
    question_types: list[str]
    modalities: list[str]
    heads: list[HeadCard]
    embedding: EmbeddingCard | None
    rerank: RerankCard | None
    limits: dict[str, int | None]
    decisions: dict[str, Any]
    extensions: list[dict[str, Any]]
    weights: dict[str, Any]


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
    def run(self, items: list[WorkItem]) -> list[torch.Tensor]:
        """One output per item, in order (float32, on the CPU).

        A model with :attr:`pads_to_width` also takes ``width: int | None = None``:
        pad every row to that many tokens (at least the longest row's length; the
        padding masked as usual), so that the runtime decides each row's shape.
        """

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
    "EmbeddingCard",
    "ExitCard",
    "HeadCard",
    "LoadedModel",
    "ModelCard",
    "Plan",
    "PlanT",
    "RerankCard",
    "WindowCard",
]
