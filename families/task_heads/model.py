"""A loaded task model: plan a surface request, run rows, finish the response."""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm_srun.plugins.loaded import HeadCard, LoadedModel, ModelCard, Plan
from vllm_srun.plugins.requests import (
    OVERFLOW_MODES,
    ClassifyRequest,
    EmbeddingsRequest,
    RerankRequest,
    SurfaceRequest,
)
from vllm_srun.plugins.spans import decode_spans
from vllm_srun.plugins.spec import (
    EncoderBatch,
    EncoderModel,
    ItemErrorCode,
    RequestError,
    RowError,
    RowOutput,
    WorkItem,
)
from vllm_srun.plugins.windows import DEFAULT_OVERLAP

from .inputs import EncodedInput, InputPolicy, TextEncoder, invalid_text
from .package import Description, Head
from .readouts import finish_embedding, label_scores, merge_pooled, pool, token_probabilities

PROBE_TEXTS = (
    "a",
    "Batch invariance probe: a row alone and inside a batch must agree.",
    "Short text.",
    "A longer probe sentence, with punctuation, numbers like 212-555-0147 and an email "
    "address such as probe@example.org, so rows differ in length inside one batch.",
)
"""Rows of several lengths the load-time batch-invariance probe runs alone and together."""


@dataclass
class TaskPlan(Plan):
    """A planned request: its inputs, the rows they need, and what finishing needs."""

    surface: str
    head: Head
    inputs: list[EncodedInput]
    texts: list[str]
    items: list[WorkItem] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.items = [row for encoded in self.inputs for row in encoded.rows]


def relevance_score(logit: float) -> float:
    """A cross-encoder's logit as a probability: the logistic sigmoid, in float64
    (``0.0`` below -700, where ``exp`` would overflow)."""
    return 1.0 / (1.0 + math.exp(-logit)) if logit > -700 else 0.0


def _failed(rows: list[Any]) -> RowError | None:
    """The first failed row of an input, if any."""
    return next((r for r in rows if isinstance(r, RowError)), None)


def _finite(tensor: torch.Tensor) -> bool:
    return bool(torch.isfinite(tensor).all())


def _error(index: int, code: ItemErrorCode, message: str) -> dict[str, Any]:
    return {"index": index, "error": code, "message": message}


class TaskModel(LoadedModel[TaskPlan]):
    """A task-head model behind the loaded-model verbs (``plan``, ``run``, ``finish``).

    Args:
        description: what the package is (heads, pooling, limit).
        encoder: the tokenizer under the model's limit.
        engine_model: the engine's model; ``encode`` returns float32 CPU tensors.
    """

    def __init__(
        self, description: Description, encoder: TextEncoder, engine_model: EncoderModel
    ) -> None:
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
    def card(self) -> ModelCard:
        """The family's part of the ``/v1/models`` card: heads, embedding, limits."""
        pooling = self.description.pooling
        heads: list[HeadCard] = [
            {
                "name": h.name,
                "kind": h.kind,
                "labels": list(h.labels),
                "inputs": ["text", "text_pair"]
                if h.kind in ("sequence", "scores", "relevance")
                else ["text"],
                "overflow": list(OVERFLOW_MODES),
                "window": {
                    "tokens": self.encoder.limit,
                    "overlap": min(
                        DEFAULT_OVERLAP, (self.encoder.limit - self.encoder.specials[0]) // 2
                    ),
                },
                "reduction": {
                    "token": "most-central window per token",
                    "pooled": "content-token-weighted mean",
                }.get(h.kind, "max per label over windows"),
            }
            for h in self.description.heads
        ]
        return {
            "surfaces": list(self.surfaces),
            "heads": heads,
            "embedding": None
            if pooling is None
            else {
                "dimensions": pooling.dimensions,
                "normalized": pooling.normalize,
                "pooling": pooling.mode,
                "max_tokens": self.encoder.limit,
            },
            "limits": {"max_tokens": self.encoder.limit},
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
        dimensions = request.dimensions
        if dimensions is not None and dimensions > pooling.dimensions:
            raise RequestError(
                "invalid_request",
                f"dimensions must be an integer from 1 to {pooling.dimensions}, not {dimensions!r}",
            )
        head = next(h for h in self.description.heads if h.kind == "pooled")
        policy = InputPolicy.from_options(request.input_options)
        options = {"dimensions": dimensions, "encoding_format": request.encoding_format}
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
                    )
            encoded = [self.encoder.encode_ids(row, policy) for row in rows]
            return TaskPlan("embeddings", head, encoded, [""] * len(rows), options=options)
        texts = request.texts
        encoded = self._encode(texts, [None] * len(texts), policy)
        return TaskPlan("embeddings", head, encoded, texts, options=options)

    def _plan_classify(self, request: ClassifyRequest) -> TaskPlan:
        classify = self._classify_heads()
        name = request.head
        if name is None:
            if len(classify) != 1:
                names = ", ".join(h.name for h in classify)
                raise RequestError("invalid_request", f"name the head: one of {names}")
            head = classify[0]
        elif name in self.heads and self.heads[name] in classify:
            head = self.heads[name]
        else:
            names = ", ".join(h.name for h in classify)
            raise RequestError("invalid_request", f"unknown head {name!r}; this model has {names}")
        pairs = request.pairs
        if head.kind == "token":
            index = next((i for i, p in enumerate(pairs) if p.text_pair is not None), None)
            if index is not None:
                raise RequestError(
                    "invalid_request",
                    f"input[{index}] has a text_pair; the token head reads single texts",
                )
        options = request.classify_options
        texts = [p.text for p in pairs]
        return TaskPlan(
            "classify",
            head,
            self._encode(texts, [p.text_pair for p in pairs], InputPolicy.from_options(options)),
            texts,
            options={"threshold": options.threshold, "aggregation": options.aggregation or "max"},
        )

    def _plan_rerank(self, request: RerankRequest) -> TaskPlan:
        query, documents = request.query, list(request.documents)
        bad = invalid_text(query)
        if bad is not None:  # the query belongs to every pair: it fails the request
            raise RequestError("invalid_request", f"query: {bad}")
        policy = InputPolicy.from_options(request.input_options)
        options = {"top_n": request.top_n, "return_documents": request.return_documents}
        cross = next((h for h in self.description.heads if h.kind == "relevance"), None)
        if cross is not None:
            encoded = self._encode([query] * len(documents), list(documents), policy)
            return TaskPlan("rerank", cross, encoded, documents, options=options)
        head = next(h for h in self.description.heads if h.kind == "pooled")
        encoded = self._encode([query, *documents], [None] * (len(documents) + 1), policy)
        if encoded[0].error is not None:
            raise RequestError("invalid_request", f"query: {encoded[0].error[1]}")
        return TaskPlan("rerank", head, encoded, [query, *documents], options=options)

    # -- run --------------------------------------------------------------------------------
    def run(self, items: list[WorkItem]) -> list[torch.Tensor]:
        """Pad the rows on the right, run them in one engine call, and split per row.

        Returns one float32 tensor per item: ``[tokens, hidden]`` hidden
        states, ``[tokens, tags]`` token logits or ``[labels]`` sequence logits.
        """
        if not items:
            return []
        width = max(item.tokens for item in items)
        ids = torch.full((len(items), width), self.encoder.pad_id, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        types = None
        if any(item.token_type_ids is not None for item in items):
            types = torch.zeros((len(items), width), dtype=torch.long)
        for row, item in enumerate(items):
            ids[row, : item.tokens] = torch.tensor(item.input_ids, dtype=torch.long)
            mask[row, : item.tokens] = 1
            if types is not None and item.token_type_ids is not None:
                types[row, : item.tokens] = torch.tensor(item.token_type_ids, dtype=torch.long)
        out = self.engine_model.encode(EncoderBatch(ids, mask, types))
        if out.dim() == 2:
            return list(out.unbind(0))
        return [out[row, : item.tokens] for row, item in enumerate(items)]

    def probe_items(self) -> list[WorkItem]:
        """Rows of several lengths for the load-time batch-invariance probe."""
        policy = InputPolicy(overflow="truncate")
        return [self.encoder.encode(text, None, policy).rows[0] for text in PROBE_TEXTS]

    # -- finish -----------------------------------------------------------------------------
    def finish(self, plan: TaskPlan, outputs: list[RowOutput]) -> dict[str, Any]:
        """The response body (without ``model``) for a plan and one output per planned row.

        An input with a failed row (:class:`RowError`) answers with that error in its place.
        """
        per_input: list[list[Any]] = []
        cursor = 0
        for encoded in plan.inputs:
            per_input.append(outputs[cursor : cursor + len(encoded.rows)])
            cursor += len(encoded.rows)
        usage_tokens = sum(e.processed_tokens for e in plan.inputs if e.error is None)
        usage = {"prompt_tokens": usage_tokens, "total_tokens": usage_tokens}
        if plan.surface == "embeddings":
            data = [
                self._embedding(i, e, r, plan)
                for i, (e, r) in enumerate(zip(plan.inputs, per_input, strict=True))
            ]
            return {"object": "list", "data": data, "usage": usage}
        if plan.surface == "classify":
            results = [
                self._classified(i, e, r, plan)
                for i, (e, r) in enumerate(zip(plan.inputs, per_input, strict=True))
            ]
            head = plan.head
            return {
                "head": head.name,
                "kind": head.kind,
                "labels": list(head.labels),
                "results": results,
                "usage": usage,
            }
        return {"results": self._reranked(plan, per_input), "usage": usage}

    def _pooled(self, encoded: EncodedInput, rows: list[torch.Tensor]) -> torch.Tensor:
        pooling = self.description.pooling
        assert pooling is not None
        vectors = [pool(r, pooling.mode) for r in rows]
        return merge_pooled(vectors, [end - start for start, end in encoded.windows])

    def _embedding(
        self, index: int, encoded: EncodedInput, rows: list[torch.Tensor], plan: TaskPlan
    ) -> dict[str, Any]:
        item: dict[str, Any] = {"object": "embedding", "index": index}
        if encoded.error is not None:
            return {**item, "error": encoded.error[0], "message": encoded.error[1]}
        failed = _failed(rows)
        if failed is not None:
            return {**item, "error": failed.code, "message": failed.message}
        pooling = self.description.pooling
        assert pooling is not None
        vector = finish_embedding(
            self._pooled(encoded, rows), pooling.normalize, plan.options["dimensions"]
        )
        if not _finite(vector):
            return {
                **item,
                "error": "invalid_model_output",
                "message": "the embedding is not finite",
            }
        if plan.options["encoding_format"] == "base64":
            payload: Any = base64.b64encode(vector.numpy().astype("<f4").tobytes()).decode("ascii")
        else:
            payload = vector.tolist()
        return {**item, "embedding": payload, "input": encoded.usage()}

    def _classified(
        self, index: int, encoded: EncodedInput, rows: list[torch.Tensor], plan: TaskPlan
    ) -> dict[str, Any]:
        if encoded.error is not None:
            return _error(index, *encoded.error)
        failed = _failed(rows)
        if failed is not None:
            return _error(index, failed.code, failed.message)
        head = plan.head
        result: dict[str, Any] = {"index": index, "input": encoded.usage()}
        if not all(_finite(r) for r in rows):
            return _error(index, "invalid_model_output", "the model's output is not finite")
        if head.kind == "token":
            content = max(end for _, end in encoded.windows)
            probabilities = token_probabilities(rows, encoded.row_content, encoded.windows, content)
            spans = decode_spans(
                plan.texts[index],
                encoded.offsets[:content],
                probabilities,
                list(head.tags),
                aggregation=plan.options["aggregation"],
                threshold=plan.options["threshold"],
            )
            return {**result, "spans": [span.to_json() for span in spans]}
        if head.kind == "relevance":  # the same score rerank answers, per window at most
            return {
                **result,
                "scores": [max(relevance_score(float(r.reshape(-1)[0])) for r in rows)],
            }
        scores = label_scores(rows, head.kind)
        if head.kind == "sequence":
            best = int(torch.argmax(scores))
            return {**result, "label": head.labels[best], "probabilities": scores.tolist()}
        values = scores.tolist()
        result["scores"] = values
        threshold = plan.options["threshold"]
        if threshold is not None or head.thresholds is not None:
            limits = (
                [threshold] * len(values) if threshold is not None else list(head.thresholds or ())
            )
            result["selected"] = [
                label for label, v, t in zip(head.labels, values, limits, strict=True) if v >= t
            ]
        return result

    def _reranked(
        self, plan: TaskPlan, per_input: list[list[torch.Tensor]]
    ) -> list[dict[str, Any]]:
        results: list[dict[str, Any]] = []
        if plan.head.kind == "relevance":
            for index, (encoded, rows) in enumerate(zip(plan.inputs, per_input, strict=True)):
                if encoded.error is not None:
                    results.append(_error(index, *encoded.error))
                    continue
                failed = _failed(rows)
                if failed is not None:
                    results.append(_error(index, failed.code, failed.message))
                    continue
                logit = float(rows[0].reshape(-1)[0])
                if not math.isfinite(logit):
                    results.append(_error(index, "invalid_model_output", "the logit is not finite"))
                    continue
                score = relevance_score(logit)
                results.append({"index": index, "relevance_score": score, "logit": logit})
            documents = plan.texts
        else:
            query_encoded, query_rows = plan.inputs[0], per_input[0]
            query_failed = _failed(query_rows)
            query = torch.zeros(0)
            if query_failed is None:
                query = torch.nn.functional.normalize(
                    self._pooled(query_encoded, query_rows), dim=0
                )
            documents = plan.texts[1:]
            for index, (encoded, rows) in enumerate(
                zip(plan.inputs[1:], per_input[1:], strict=True)
            ):
                if encoded.error is not None:
                    results.append(_error(index, *encoded.error))
                    continue
                failed = query_failed or _failed(rows)
                if failed is not None:
                    results.append(_error(index, failed.code, failed.message))
                    continue
                doc = torch.nn.functional.normalize(self._pooled(encoded, rows), dim=0)
                cosine = float(torch.dot(query, doc))
                if not math.isfinite(cosine):  # before clamping: max(-1.0, nan) is -1.0
                    results.append(_error(index, "invalid_model_output", "the score is not finite"))
                    continue
                cosine = min(1.0, max(-1.0, cosine))
                results.append({"index": index, "relevance_score": cosine, "logit": cosine})
        ranked = sorted(
            (r for r in results if "error" not in r),
            key=lambda r: (-r["relevance_score"], r["index"]),
        )
        unscored = [r for r in results if "error" in r]
        if plan.options["return_documents"]:
            for r in ranked:
                r["document"] = documents[r["index"]]
        ordered = ranked + unscored  # failed documents after every scored one
        top_n: int | None = plan.options["top_n"]
        return ordered if top_n is None else ordered[:top_n]
