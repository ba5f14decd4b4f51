"""From a task plan and its rows' outputs to the response body, one surface at a time.

Every input answers in its own place: a vector, a label distribution, label
scores, token spans or a relevance score, or the item error of its failed
row. Rerank results come sorted by score, failed documents after every scored one.

``usage`` follows each surface's contract: embeddings OpenAI's
``{prompt_tokens, total_tokens}``, classify and rerank ``{input_tokens,
output_tokens}`` (an encoder generates nothing: ``output_tokens`` is 0). A
request that asked for ``meta`` gets the surface's own keys here (classify
``head``, embeddings ``representation``); the serving layer adds the model's
identity and the request's timings.
"""

from __future__ import annotations

import base64
import copy
import math
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from vllm_srun.plugins.loaded import Plan
from vllm_srun.plugins.responses import (
    ClassifyAnswer,
    ClassifyKind,
    ClassifyResult,
    ClassifyWindow,
    Embedding,
    EmbeddingError,
    EmbeddingsAnswer,
    ItemError,
    RerankAnswer,
    RerankResult,
    ResponseMeta,
    SurfaceAnswer,
    embedding_error,
    embedding_item,
    embeddings_usage,
    item_error,
    usage,
)
from vllm_srun.plugins.spans import decode_spans
from vllm_srun.plugins.spec import RowError, RowOutput, WorkItem

from .inputs import EncodedInput
from .package import Head, Pooling
from .readouts import (
    Floats,
    finish_embedding,
    l2_normalize,
    label_probabilities,
    label_scores,
    merge_pooled,
    pool,
    token_probabilities,
)


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

    def read_end(self, index: int) -> int | None:
        """The code point after the last token read of input ``index``'s (first) text
        when ``truncate`` cut the input, else ``None``."""
        encoded = self.inputs[index] if 0 <= index < len(self.inputs) else None
        if encoded is None or not encoded.truncated:
            return None
        return encoded.offsets[-1][1] if encoded.offsets else 0


def relevance_score(logit: float) -> float:
    """A cross-encoder's logit as a probability: the logistic sigmoid, in float64
    (``0.0`` below -700, where ``exp`` would overflow)."""
    return 1.0 / (1.0 + math.exp(-logit)) if logit > -700 else 0.0


def _failed(rows: list[Any]) -> RowError | None:
    """The first failed row of an input, if any."""
    return next((r for r in rows if isinstance(r, RowError)), None)


def _finite(array: Floats) -> bool:
    return bool(np.isfinite(array).all())


def answer(plan: TaskPlan, outputs: list[RowOutput], pooling: Pooling | None) -> SurfaceAnswer:
    """The response body (without ``model``) for a plan and one output per planned row.

    An input with a failed row (:class:`RowError`) answers with that error in its place.
    """
    per_input: list[list[Any]] = []
    cursor = 0
    for encoded in plan.inputs:
        per_input.append(outputs[cursor : cursor + len(encoded.rows)])
        cursor += len(encoded.rows)
    used = sum(e.processed_tokens for e in plan.inputs if e.error is None)
    meta: ResponseMeta | None = plan.options.get("meta")
    if plan.surface == "embeddings":
        data = [
            _embedding(i, e, r, plan, pooling)
            for i, (e, r) in enumerate(zip(plan.inputs, per_input, strict=True))
        ]
        embeddings: EmbeddingsAnswer = {
            "object": "list",
            "data": data,
            "usage": embeddings_usage(used),
        }
        if meta is not None:
            embeddings["meta"] = copy.deepcopy(meta)
        return embeddings
    if plan.surface == "classify":
        results = [
            _classified(i, e, r, plan)
            for i, (e, r) in enumerate(zip(plan.inputs, per_input, strict=True))
        ]
        head = plan.head
        classified: ClassifyAnswer = {
            "head": head.name,
            "kind": cast(ClassifyKind, head.kind),  # a classify plan's head is never pooled
            "labels": list(head.labels),
            "results": results,
            "usage": usage(used),
        }
        if meta is not None:
            classified["meta"] = copy.deepcopy(meta)
        return classified
    reranked: RerankAnswer = {"results": _reranked(plan, per_input, pooling), "usage": usage(used)}
    if meta is not None:
        reranked["meta"] = copy.deepcopy(meta)
    return reranked


def _pooled(pooling: Pooling | None, encoded: EncodedInput, rows: list[Floats]) -> Floats:
    assert pooling is not None
    vectors = [pool(r, pooling.mode) for r in rows]
    return merge_pooled(vectors, [end - start for start, end in encoded.windows])


def _embedding(
    index: int,
    encoded: EncodedInput,
    rows: list[Floats],
    plan: TaskPlan,
    pooling: Pooling | None,
) -> Embedding | EmbeddingError:
    if encoded.error is not None:
        return embedding_error(index, *encoded.error)
    failed = _failed(rows)
    if failed is not None:
        return embedding_error(index, failed.code, failed.message)
    assert pooling is not None
    vector = finish_embedding(
        _pooled(pooling, encoded, rows), pooling.normalize, plan.options["dimensions"]
    )
    if not _finite(vector):
        return embedding_error(index, "invalid_model_output", "the embedding is not finite")
    payload: list[float] | str
    if plan.options["encoding_format"] == "base64":
        payload = base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    else:
        payload = vector.tolist()
    return embedding_item(index, payload, encoded.usage())


def _classified(
    index: int, encoded: EncodedInput, rows: list[Floats], plan: TaskPlan
) -> ClassifyResult | ItemError:
    if encoded.error is not None:
        return item_error(index, *encoded.error)
    failed = _failed(rows)
    if failed is not None:
        return item_error(index, failed.code, failed.message)
    head = plan.head
    result: ClassifyResult = {"index": index, "input": encoded.usage()}
    if not all(_finite(r) for r in rows):
        return item_error(index, "invalid_model_output", "the model's output is not finite")
    if plan.options.get("windows"):
        result["windows"] = _windows(encoded, rows, head)
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
        result["spans"] = [span.to_json() for span in spans]
        if plan.options.get("tokens"):
            per_label = label_probabilities(probabilities, head.tags, head.labels)
            result["tokens"] = [
                {"start": start, "end": end, "probabilities": values}
                for (start, end), values in zip(
                    encoded.offsets[:content], per_label.tolist(), strict=True
                )
            ]
        return result
    if head.kind == "relevance":  # the same score rerank answers, per window at most
        result["scores"] = [max(relevance_score(float(r.reshape(-1)[0])) for r in rows)]
        return result
    scores = label_scores(rows, head.kind)
    if head.kind == "sequence":
        best = int(np.argmax(scores))
        result["label"] = head.labels[best]
        result["probabilities"] = scores.tolist()
        return result
    values = scores.tolist()
    result["scores"] = values
    threshold = plan.options["threshold"]
    if threshold is not None or head.thresholds is not None:
        limits = [threshold] * len(values) if threshold is not None else list(head.thresholds or ())
        result["selected"] = [
            label for label, v, t in zip(head.labels, values, limits, strict=True) if v >= t
        ]
    return result


def _windows(encoded: EncodedInput, rows: list[Floats], head: Head) -> list[ClassifyWindow]:
    """Every window of a classified input: its content-token range ``[start, end)`` and,
    except for a token head, that window's own readout (``probabilities`` of a sequence
    head; ``scores`` of a scores or relevance head), which the result merges by maximum."""
    windows: list[ClassifyWindow] = []
    for (start, end), row in zip(encoded.windows, rows, strict=True):
        window: ClassifyWindow = {"start": start, "end": end}
        if head.kind == "sequence":
            window["probabilities"] = label_scores([row], "sequence").tolist()
        elif head.kind == "scores":
            window["scores"] = label_scores([row], "scores").tolist()
        elif head.kind == "relevance":
            window["scores"] = [relevance_score(float(row.reshape(-1)[0]))]
        windows.append(window)
    return windows


def _reranked(
    plan: TaskPlan, per_input: list[list[Floats]], pooling: Pooling | None
) -> list[RerankResult | ItemError]:
    scored: list[RerankResult] = []
    unscored: list[ItemError] = []
    if plan.head.kind == "relevance":
        for index, (encoded, rows) in enumerate(zip(plan.inputs, per_input, strict=True)):
            if encoded.error is not None:
                unscored.append(item_error(index, *encoded.error))
                continue
            failed = _failed(rows)
            if failed is not None:
                unscored.append(item_error(index, failed.code, failed.message))
                continue
            logit = float(rows[0].reshape(-1)[0])
            if not math.isfinite(logit):
                failure = item_error(index, "invalid_model_output", "the logit is not finite")
                unscored.append(failure)
                continue
            score = relevance_score(logit)
            scored.append(
                {
                    "index": index,
                    "relevance_score": score,
                    "logit": logit,
                    "input": encoded.usage(),
                }
            )
        documents = plan.texts
    else:
        query_encoded, query_rows = plan.inputs[0], per_input[0]
        query_failed = _failed(query_rows)
        query = np.zeros(0, dtype=np.float32)
        if query_failed is None:
            query = l2_normalize(_pooled(pooling, query_encoded, query_rows))
        documents = plan.texts[1:]
        for index, (encoded, rows) in enumerate(zip(plan.inputs[1:], per_input[1:], strict=True)):
            if encoded.error is not None:
                unscored.append(item_error(index, *encoded.error))
                continue
            failed = query_failed or _failed(rows)
            if failed is not None:
                unscored.append(item_error(index, failed.code, failed.message))
                continue
            doc = l2_normalize(_pooled(pooling, encoded, rows))
            cosine = float(np.sum(query * doc, dtype=np.float32))
            if not math.isfinite(cosine):  # before clamping: max(-1.0, nan) is -1.0
                unscored.append(
                    item_error(index, "invalid_model_output", "the score is not finite")
                )
                continue
            cosine = min(1.0, max(-1.0, cosine))
            scored.append(
                {
                    "index": index,
                    "relevance_score": cosine,
                    "logit": cosine,
                    "input": encoded.usage(),
                }
            )
    ranked = sorted(scored, key=lambda r: (-r["relevance_score"], r["index"]))
    if plan.options["return_documents"]:
        for r in ranked:
            r["document"] = documents[r["index"]]
    ordered: list[RerankResult | ItemError] = [*ranked, *unscored]  # failed ones after
    top_n: int | None = plan.options["top_n"]
    return ordered if top_n is None else ordered[:top_n]
