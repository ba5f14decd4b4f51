"""A loaded task model: plan a surface request, run rows, finish the response
(:mod:`.answers` builds the response bodies)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from vllm_srun.plugins.cards import FamilyCard, HeadCard
from vllm_srun.plugins.collate import right_padded, split_rows
from vllm_srun.plugins.loaded import LoadedModel
from vllm_srun.plugins.requests import (
    OVERFLOW_MODES,
    ClassifyRequest,
    EmbeddingsRequest,
    ImageUrlPart,
    InputAudioPart,
    RerankRequest,
    SurfaceRequest,
)
from vllm_srun.plugins.responses import Representation, SurfaceAnswer
from vllm_srun.plugins.spec import (
    EncoderModel,
    RequestError,
    RowOutput,
    WorkItem,
    clip,
)
from vllm_srun.plugins.windows import DEFAULT_OVERLAP

from .answers import TaskPlan, answer
from .exits import (
    Exit,
    check_layer,
    check_rerank_exit,
    embedding_exits,
    embedding_layers,
    embedding_modalities,
    rerank_exits,
)
from .inputs import EncodedInput, InputPolicy, TextEncoder, invalid_text
from .package import (
    Description,
    Head,
    embedding_dimensions,
)

PROBE_TEXTS = (
    "a",
    "Batch invariance probe: a row alone and inside a batch must agree.",
    "Short text.",
    "A longer probe sentence, with punctuation, numbers like 212-555-0147 and an email "
    "address such as probe@example.org, so rows differ in length inside one batch.",
)
"""Rows of several lengths the load-time batch-invariance probe runs alone and together."""

PAIR_KINDS = frozenset({"sequence", "scores", "relevance"})
"""Head kinds that read a text pair (``text_pair``; the card's input ``pair``)."""

WINDOW_MERGES = {
    "sequence": "max per label over windows",
    "scores": "max per label over windows",
    "relevance": "max over windows",
    "token": "most-central window per token",
    "pooled": "content-token-weighted mean",
}
"""How each head kind merges the windows of a long input (:mod:`.readouts`), in words."""

WINDOW_REDUCTIONS: dict[str, Literal["max", "span_union"]] = {
    "sequence": "max",
    "scores": "max",
    "relevance": "max",
}
"""The merges the wire contract has a name for (``max``: the per-label maximum over
windows). A token head takes each token from its most central window and a pooled
head averages windows, which neither ``max`` nor ``span_union`` describes: ``None``."""


class TaskModel(LoadedModel[TaskPlan]):
    """A task-head model behind the loaded-model verbs (``plan``, ``run``, ``finish``).

    Args:
        description: what the package is (heads, pooling, limit).
        encoder: the tokenizer under the model's limit.
        engine_model: the engine's model; ``encode`` returns a float32 numpy array.
        defaults: family options from the models file: ``threshold`` and
            ``aggregation`` used where a classify request leaves them out.
    """

    pads_to_width = True

    def __init__(
        self,
        description: Description,
        encoder: TextEncoder,
        engine_model: EncoderModel,
        defaults: Mapping[str, Any] | None = None,
    ) -> None:
        self.defaults = dict(defaults or {})
        self.description = description
        self.encoder = encoder
        self.engine_model = engine_model
        self.heads = {head.name: head for head in description.heads}
        self.surfaces = tuple(sorted({h.surface for h in description.heads} | self._extra()))

    def _extra(self) -> set[str]:
        # A bi-encoder answers rerank with the cosine of its embeddings; a cross-encoder
        # answers classify too, scoring each {text, text_pair} as rerank scores it.
        kinds = {h.kind for h in self.description.heads}
        extra = set()
        if "pooled" in kinds:
            extra.add("rerank")
        if "relevance" in kinds:
            extra.add("classify")
        return extra

    def _classify_heads(self) -> list[Head]:
        return [
            h for h in self.description.heads if h.surface == "classify" or h.kind == "relevance"
        ]

    # -- the card -------------------------------------------------------------------------
    def exits(self) -> tuple[Exit, ...]:
        """The representations this model can be read at, default first
        (:func:`.exits.rerank_exits`): what the card's ``rerank.exits`` lists and what a
        rerank request's ``layer`` / ``dimensions`` must name."""
        return rerank_exits(self.description)

    def embedding_layers(self) -> tuple[int, ...]:
        """The layers this model's embeddings can be read at (:func:`.exits.embedding_layers`)."""
        return embedding_layers(self.description)

    def card(self) -> FamilyCard:
        """The family's part of the ``/v1/models`` card (wire contract 2.3): heads,
        embedding, rerank exits and limits; every number a JSON integer but thresholds."""
        pooling = self.description.pooling
        card: FamilyCard = {
            "surfaces": list(self.surfaces),
            "heads": [self._head_card(h) for h in self.description.heads],
            "embedding": None
            if pooling is None
            else {
                "dimensions": list(embedding_dimensions(pooling)),
                "layers": list(self.embedding_layers()),
                "modalities": ["text"],
                "normalized": pooling.normalize,
                "pooling": pooling.mode,
                "input_types": [],  # no instructed (query/document) prompts are applied
                "max_tokens": self.encoder.limit,
            },
            "rerank": None,
            "limits": {"max_input_tokens": self.encoder.limit},
        }
        exits = [found.card() for found in self.exits()]
        if "rerank" in self.surfaces and exits:
            card["rerank"] = {"exits": exits, "default": exits[0]}
        return card

    def _head_card(self, head: Head) -> HeadCard:
        """One head on the card (:class:`~vllm_srun.plugins.HeadCard`)."""
        limit = self.encoder.limit
        threshold = self.defaults.get("threshold") if head.kind in ("scores", "token") else None
        return {
            "name": head.name,
            "kind": head.kind,
            "labels": list(head.labels),
            "inputs": ["text", "pair"] if head.kind in PAIR_KINDS else ["text"],
            "default_threshold": None if threshold is None else float(threshold),
            "thresholds": None if head.thresholds is None else list(head.thresholds),
            "operating_point_sha256": head.thresholds_sha256,
            "overflow": OVERFLOW_MODES[0],  # what a request that names no policy gets
            "overflow_policies": list(OVERFLOW_MODES),
            "window": {
                "tokens": limit,
                "overlap": min(DEFAULT_OVERLAP, (limit - self.encoder.specials[0]) // 2),
            },
            "reduction": WINDOW_REDUCTIONS.get(head.kind),
            "window_reduction": WINDOW_MERGES[head.kind],
        }

    # -- plan -------------------------------------------------------------------------------
    def plan(self, surface: str, request: SurfaceRequest) -> TaskPlan:
        """Tokenise a typed request for ``surface`` and check what depends on this model.

        Raises:
            RequestError: ``unsupported_surface`` when the model does not serve
                the surface; ``invalid_request`` for settings this model cannot
                honour (``dimensions`` above its size, an unknown head, a text
                pair for a token head, windows that do not fit its limit).
        """
        if surface not in self.surfaces:
            raise RequestError(
                "unsupported_surface",
                f"this model serves {', '.join(self.surfaces)}, not {surface}",
            )
        if isinstance(request, EmbeddingsRequest):
            return self._plan_embeddings(request)
        if isinstance(request, ClassifyRequest):
            return self._plan_classify(request)
        if isinstance(request, RerankRequest):
            return self._plan_rerank(request)
        raise RequestError("invalid_request", f"a {surface} request was expected")

    def _encode(
        self, texts: list[str], pairs: list[str | None], policy: InputPolicy
    ) -> list[EncodedInput]:
        return [self.encoder.encode(t, p, policy) for t, p in zip(texts, pairs, strict=True)]

    def _plan_embeddings(self, request: EmbeddingsRequest) -> TaskPlan:
        pooling = self.description.pooling
        assert pooling is not None
        chosen = check_layer(embedding_exits(self.description), request.layer)
        size = pooling.dimensions if chosen is None else chosen.dimension
        dimensions = request.dimensions
        if dimensions is not None and dimensions > size:
            raise RequestError(
                "invalid_request",
                f"dimensions must be an integer from 1 to {size}, not {dimensions!r}",
                "dimensions",
            )
        head = next(h for h in self.description.heads if h.kind == "pooled")
        input_options = request.input_options
        policy = InputPolicy.from_options(input_options)
        options: dict[str, Any] = {
            "dimensions": dimensions,
            "encoding_format": request.encoding_format,
            "meta": None,
        }
        if input_options.meta:
            representation: Representation = {
                "model_sha256": None,  # the runtime gives the served model's digest
                "layer": None if chosen is None else chosen.layer,
                "dimension": size if dimensions is None else dimensions,
                "normalized": pooling.normalize,
                "modality": "text",
            }
            options["meta"] = {"representation": representation}
        rows = request.token_ids
        if rows is not None:
            vocabulary = self.encoder.vocabulary
            for index, row in enumerate(rows):
                at = next((j for j, i in enumerate(row) if i >= vocabulary), None)
                if at is not None:
                    single = isinstance(request.input[0], int)  # one row as a list of ids
                    where = f"input[{at}]" if single else f"input[{index}][{at}]"
                    raise RequestError(
                        "invalid_request",
                        f"{where} is token id {row[at]}; this model's vocabulary has ids 0 to "
                        f"{vocabulary - 1}",
                        "input",
                    )
            encoded = [self.encoder.encode_ids(row, policy) for row in rows]
            return TaskPlan("embeddings", head, encoded, [""] * len(rows), options=options)
        texts: list[str] = []
        encoded = []
        for item in request.contents:
            if isinstance(item, ImageUrlPart | InputAudioPart):
                texts.append("")
                encoded.append(EncodedInput(error=("invalid_input", self._unread(item))))
                continue
            text = item if isinstance(item, str) else item.text
            texts.append(text)
            encoded.append(self.encoder.encode(text, None, policy))
        return TaskPlan("embeddings", head, encoded, texts, options=options)

    def _unread(self, part: ImageUrlPart | InputAudioPart) -> str:
        """Why an image or audio part cannot be embedded here (the item error's message;
        the item's index is where it stands)."""
        modalities = list(embedding_modalities(self.description))
        shown = ", ".join(f'"{m}"' for m in modalities)
        return (
            f"an {part.type} part ({part.modality}) cannot be embedded here: this model embeds "
            f"{' and '.join(modalities) or 'nothing'} only (its card's embedding.modalities are "
            f"[{shown}]); send it to a model whose embedding.modalities list {part.modality}"
        )

    def _plan_classify(self, request: ClassifyRequest) -> TaskPlan:
        classify = self._classify_heads()
        name = request.head
        if name is None:
            if len(classify) != 1:
                names = ", ".join(h.name for h in classify)
                raise RequestError("invalid_request", f"name the head: one of {names}", "head")
            head = classify[0]
        elif name in self.heads and self.heads[name] in classify:
            head = self.heads[name]
        else:
            names = ", ".join(h.name for h in classify)
            raise RequestError(
                "invalid_request", f"unknown head {clip(name)!r}; this model has {names}", "head"
            )
        pairs = request.pairs
        if head.kind == "token":
            index = next((i for i, p in enumerate(pairs) if p.text_pair is not None), None)
            if index is not None:
                raise RequestError(
                    "invalid_request",
                    f"input[{index}] has a text_pair; the token head reads single texts",
                    "input",
                )
        options = request.classify_options
        texts = [p.text for p in pairs]
        return TaskPlan(
            "classify",
            head,
            self._encode(texts, [p.text_pair for p in pairs], InputPolicy.from_options(options)),
            texts,
            options={
                "threshold": self.defaults.get("threshold")
                if options.threshold is None
                else options.threshold,
                "aggregation": options.aggregation or self.defaults.get("aggregation", "max"),
                "windows": options.overflow == "window",
                "tokens": bool(options.return_tokens) and head.kind == "token",
                "meta": {"head": head.name} if options.meta else None,
            },
        )

    def _plan_rerank(self, request: RerankRequest) -> TaskPlan:
        query, documents = request.query, list(request.documents)
        check_rerank_exit(rerank_exits(self.description), request.layer, request.dimensions)
        bad = invalid_text(query)
        if bad is not None:  # the query belongs to every pair: it fails the request
            raise RequestError("invalid_request", f"query: {bad}", "query")
        input_options = request.input_options
        policy = InputPolicy.from_options(input_options)
        options: dict[str, Any] = {
            "top_n": request.top_n,
            "return_documents": request.return_documents,
            "meta": {} if input_options.meta else None,
        }
        cross = next((h for h in self.description.heads if h.kind == "relevance"), None)
        if cross is not None:
            encoded = self._encode([query] * len(documents), list(documents), policy)
            return TaskPlan("rerank", cross, encoded, documents, options=options)
        head = next(h for h in self.description.heads if h.kind == "pooled")
        encoded = self._encode([query, *documents], [None] * (len(documents) + 1), policy)
        if encoded[0].error is not None:
            raise RequestError("invalid_request", f"query: {encoded[0].error[1]}", "query")
        return TaskPlan("rerank", head, encoded, [query, *documents], options=options)

    # -- run --------------------------------------------------------------------------------
    def run(self, items: list[WorkItem], width: int | None = None) -> list[npt.NDArray[np.float32]]:
        """Pad the rows on the right (to ``width`` tokens, default the longest row's),
        run them in one engine call, and split per row.

        Returns one float32 numpy array per item (a view of the batch output):
        ``[tokens, hidden]`` hidden states, ``[tokens, tags]`` token logits or
        ``[labels]`` sequence logits.
        """
        if not items:
            return []
        batch = right_padded(items, self.encoder.pad_id, width)
        return split_rows(self.engine_model.encode(batch), items)

    def probe_items(self) -> list[WorkItem]:
        """Rows of several lengths for the load-time batch-invariance probe."""
        policy = InputPolicy(overflow="truncate")
        return [self.encoder.encode(text, None, policy).rows[0] for text in PROBE_TEXTS]

    # -- finish -----------------------------------------------------------------------------
    def finish(self, plan: TaskPlan, outputs: list[RowOutput]) -> SurfaceAnswer:
        """The response body (without ``model``) for a plan and one output per planned row
        (:func:`.answers.answer`)."""
        return answer(plan, outputs, self.description.pooling)
