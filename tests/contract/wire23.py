"""The runtime contract 2.3.0 as the upstream router's client sees it.

Written here from the facts of upstream ``vllm-project/semantic-router``
(``src/model-runtime/vllm_srun/api/openapi.yaml`` at ``0714e17c`` and the
client in ``src/semantic-router/pkg/modelservice/``): the response types the
generated client decodes into (:mod:`tests.contract.go` rules), the request
bodies its code builds, and the checks its code makes after decoding.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from typing import Any

from .go import Bool, Float, Int, List, Map, Raw, Str, Struct

VERSION = "2.3.0"
STRINGS = List(Str())
INTS = List(Int())
FLOATS = List(Float())

# -- shared pieces ---------------------------------------------------------------------
Usage = Struct("Usage", {"input_tokens": Int(), "output_tokens": Int()})
EmbeddingsUsage = Struct("EmbeddingsUsage", {"prompt_tokens": Int(), "total_tokens": Int()})
ErrorBody = Struct("ErrorBody", {"code": Str(), "message": Str()})
ErrorResponse = Struct("Error", {"error": ErrorBody})
InputUsage = Struct(
    "InputUsage",
    {
        "tokens": Int(),
        "processed_tokens": Int(),
        "truncated": Bool(),
        "tokens_lower_bound": Bool(),
        "windows": Int(),
    },
)
Span = Struct(
    "Span", {"label": Str(), "start": Int(), "end": Int(), "text": Str(), "probability": Float()}
)
Representation = Struct(
    "Representation",
    {
        "model_sha256": Str(),
        "layer": Int(),
        "dimension": Int(),
        "normalized": Bool(),
        "modality": Str(),
    },
)
ResponseMeta = Struct(
    "ResponseMeta",
    {
        "model_id": Str(),
        "revision": Str(),
        "model_sha256": Str(),
        "profile": Str(),
        "numerics": Str(),
        "engine": Str(),
        "accelerator": Str(),
        "device": Str(),
        "queue_ms": Float(),
        "compute_ms": Float(),
        "head": Str(),
        "representation": Representation,
    },
)

# -- decisions -----------------------------------------------------------------------------
Answer = Struct(
    "Answer",
    {
        "input_coverage": Str(),
        "type": Str(),
        "choice": Str(),
        "noul": Float(),
        "score": Float(),
        "probabilities": Map(Float()),
        "confidence": Float(),
        "abstain_probability": Float(),
        "legend": Map(Str()),
        "error": Str(),
        "message": Str(),
    },
)
SetAnswer = Struct(
    "SetAnswer", {"input_coverage": Str(), "selected": STRINGS, "probabilities": Map(Float())}
)
_DECISION_FIELDS = {
    "model": Str(),
    "answers": Map(Answer),
    "spans": Map(List(Span)),
    "sets": Map(SetAnswer),
    "thresholds": Map(Float()),
    "span_heads": Map(Str()),
    "usage": Usage,
    "meta": ResponseMeta,
}
DecisionStateResponse = Struct("DecisionStateResponse", dict(_DECISION_FIELDS))
DecisionResponse = Struct(
    "DecisionResponse", {**_DECISION_FIELDS, "states": Map(DecisionStateResponse)}
)

# -- classify ------------------------------------------------------------------------------
ClassifyWindow = Struct(
    "ClassifyWindow",
    {"start": Int(), "end": Int(), "probabilities": FLOATS, "scores": FLOATS},
)
TokenProbabilities = Struct(
    "TokenProbabilities", {"start": Int(), "end": Int(), "probabilities": FLOATS}
)
ClassifyResult = Struct(
    "ClassifyResult",
    {
        "index": Int(),
        "label": Str(),
        "probabilities": FLOATS,
        "scores": FLOATS,
        "selected": STRINGS,
        "spans": List(Span),
        "tokens": List(TokenProbabilities),
        "windows": List(ClassifyWindow),
        "input": InputUsage,
        "error": Str(),
    },
)
ClassifyResponse = Struct(
    "ClassifyResponse",
    {
        "model": Str(),
        "head": Str(),
        "kind": Str(),
        "labels": STRINGS,
        "results": List(ClassifyResult),
        "usage": Usage,
        "meta": ResponseMeta,
    },
)

# -- embeddings and rerank -------------------------------------------------------------------
Embedding = Struct(
    "Embedding",
    {"object": Str(), "index": Int(), "embedding": Raw(), "input": InputUsage, "error": Str()},
)
EmbeddingsResponse = Struct(
    "EmbeddingsResponse",
    {
        "object": Str(),
        "data": List(Embedding),
        "model": Str(),
        "usage": EmbeddingsUsage,
        "meta": ResponseMeta,
    },
)
RerankResult = Struct(
    "RerankResult",
    {
        "index": Int(),
        "relevance_score": Float(),
        "logit": Float(),
        "document": Str(),
        "input": InputUsage,
        "error": Str(),
    },
)
RerankResponse = Struct(
    "RerankResponse",
    {"model": Str(), "results": List(RerankResult), "usage": Usage, "meta": ResponseMeta},
)

# -- bundle ----------------------------------------------------------------------------------
BundleResult = Struct(
    "BundleResult",
    {
        "id": Str(),
        "status": Int(),
        "decisions": DecisionResponse,
        "classify": ClassifyResponse,
        "embeddings": EmbeddingsResponse,
        "rerank": RerankResponse,
        "error": ErrorBody,
    },
)
BundleResponse = Struct("BundleResponse", {"results": List(BundleResult)})
SURFACE_RESPONSES = {
    "decisions": DecisionResponse,
    "classify": ClassifyResponse,
    "embeddings": EmbeddingsResponse,
    "rerank": RerankResponse,
}

# -- models and health -------------------------------------------------------------------------
HeadWindow = Struct("HeadWindow", {"tokens": Int(), "overlap": Int()})
HeadCard = Struct(
    "HeadCard",
    {
        "name": Str(),
        "kind": Str(),
        "labels": STRINGS,
        "inputs": STRINGS,
        "default_threshold": Float(),
        "thresholds": FLOATS,
        "overflow": Str(),
        "window": HeadWindow,
        "reduction": Str(),
        "operating_point_sha256": Str(),
    },
)
EmbeddingCard = Struct(
    "EmbeddingCard",
    {
        "dimensions": INTS,
        "layers": INTS,
        "modalities": STRINGS,
        "normalized": Bool(),
        "pooling": Str(),
        "input_types": STRINGS,
    },
)
RerankExit = Struct("RerankExit", {"layer": Int(), "dimension": Int()})
RerankCard = Struct("RerankCard", {"exits": List(RerankExit), "default": RerankExit})
ModelLimits = Struct(
    "ModelLimits",
    {
        name: Int()
        for name in (
            "max_input_tokens",
            "max_scan_tokens",
            "truncate_tokens",
            "min_options",
            "max_options",
            "min_levels",
            "max_levels",
            "max_inputs",
            "image_max_pixels",
            "image_source_max_pixels",
            "image_max_bytes",
        )
    },
)
ProfileInfo = Struct("ProfileInfo", {"name": Str(), "numerics": Str(), "description": Str()})
GoldenStatus = Struct(
    "GoldenStatus", {"status": Str(), "checked": Int(), "matched": Int(), "reference": Str()}
)
PluginInfo = Struct(
    "PluginInfo",
    {
        "group": Str(),
        "name": Str(),
        "distribution": Str(),
        "version": Str(),
        "capabilities": Map(Raw()),
    },
)
ModelCard = Struct(
    "ModelCard",
    {
        **{
            name: Str()
            for name in (
                "id",
                "object",
                "owned_by",
                "family",
                "repo",
                "revision",
                "model_sha256",
                "manifest_sha256",
                "licence",
                "profile",
                "engine",
                "accelerator",
                "device",
                "dtype",
                "status",
                "reason",
            )
        },
        "surfaces": STRINGS,
        "question_types": STRINGS,
        "presets": STRINGS,
        "modalities": STRINGS,
        "heads": List(HeadCard),
        "embedding": EmbeddingCard,
        "rerank": RerankCard,
        "limits": ModelLimits,
        "profiles": List(ProfileInfo),
        "accelerator_validated": Bool(),
        "parameters": Int(),
        "ready": Bool(),
        "golden": GoldenStatus,
        "plugins": List(PluginInfo),
    },
)
ProcessLimits = Struct("ProcessLimits", {"max_bundle_tasks": Int(), "max_request_bytes": Int()})
ModelList = Struct(
    "ModelList",
    {"api_version": Str(), "object": Str(), "data": List(ModelCard), "limits": ProcessLimits},
)
ModelHealth = Struct("ModelHealth", {"status": Str(), "reason": Str()})
Health = Struct(
    "Health",
    {
        "api_version": Str(),
        "status": Str(),
        "reason": Str(),
        "model": Str(),
        "models": Map(ModelHealth),
    },
)
Liveness = Struct("Liveness", {"api_version": Str(), "status": Str()})


# -- request bodies as the client builds them --------------------------------------------------
def decisions_body(
    model: str | None,
    state: Any,
    questions: dict[str, dict[str, Any]],
    deadline_ms: float | None = None,
) -> dict[str, Any]:
    """``Client.Decide``: questions with ``type``, ``instructions`` and ordered
    ``choices`` (``{key, description}``) or ``levels``; ``options.return_meta`` true,
    ``deadline_ms`` when the caller's context has a deadline."""
    options: dict[str, Any] = {"return_meta": True}
    if deadline_ms is not None:
        options["deadline_ms"] = deadline_ms
    body: dict[str, Any] = {"state": state, "questions": questions, "options": options}
    if model is not None:
        body["model"] = model
    return body


def classify_body(
    model: str,
    inputs: list[dict[str, str]],
    head: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    """``encodeClassify``: inputs always as ``{text, text_pair, context, question,
    answer}`` items (empty fields left out), ``options.return_meta`` true."""
    items = [{k: v for k, v in item.items() if v} for item in inputs]
    body: dict[str, Any] = {
        "model": model,
        "input": items,
        "options": {"return_meta": True, **options},
    }
    if head:
        body["head"] = head
    return body


def embeddings_body(
    model: str,
    texts: list[str],
    dimensions: int | None = None,
    layer: int | None = None,
    **options: Any,
) -> dict[str, Any]:
    """``encodeEmbed``: inputs always as content parts, ``encoding_format`` base64,
    ``options.return_meta`` true; ``dimensions`` and ``layer`` when set."""
    body: dict[str, Any] = {
        "model": model,
        "input": [{"type": "text", "text": text} for text in texts],
        "encoding_format": "base64",
        "options": {"return_meta": True, **options},
    }
    if dimensions:
        body["dimensions"] = dimensions
    if layer:
        body["layer"] = layer
    return body


def rerank_body(
    model: str,
    query: str,
    documents: list[str],
    layer: int | None = None,
    dimensions: int | None = None,
    **options: Any,
) -> dict[str, Any]:
    """``encodeRerank``: the card's exit as ``layer``/``dimensions`` when set,
    ``options.return_meta`` true."""
    body: dict[str, Any] = {
        "model": model,
        "query": query,
        "documents": documents,
        "options": {"return_meta": True, **options},
    }
    if layer:
        body["layer"] = layer
    if dimensions:
        body["dimensions"] = dimensions
    return body


def bundle_body(tasks: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """``Bundle.send``: task IDs ``"1"``, ``"2"``, ... in submission order."""
    return {"tasks": [{"id": str(i), s: body} for i, (s, body) in enumerate(tasks, 1)]}


# -- what the client's code checks after decoding ------------------------------------------------
def major(version: Any) -> str:
    """The major part of an ``api_version``; the client refuses any but ``2``."""
    return str(version).split(".", 1)[0]


def vector(value: Any) -> list[float]:
    """``decodeVector``: a float list, or a standard-base64 string of little-endian
    float32 values; non-empty and finite. ``AssertionError`` where the client fails."""
    if isinstance(value, str):
        try:
            packed = base64.b64decode(value, validate=True)
        except binascii.Error as err:
            raise AssertionError(f"embedding is not standard base64: {err}") from None
        assert len(packed) % 4 == 0, "embedding is not base64 float32"
        values = list(struct.unpack(f"<{len(packed) // 4}f", packed))
    else:
        assert isinstance(value, list), f"embedding has an unknown encoding: {value!r:.80}"
        values = [float(v) for v in value]
    assert values, "embedding is empty"
    assert all(math.isfinite(v) for v in values), "embedding is not finite"
    return values


def check_rerank(body: dict[str, Any], documents: int) -> None:
    """``decodeRerank``: each document's result exactly once, a finite ``logit`` on
    every result without an error (else the client marks it invalid_model_output)."""
    seen = [False] * documents
    for result in body["results"]:
        index = result["index"]
        assert 0 <= index < documents and not seen[index], f"rerank index {index} is invalid"
        seen[index] = True
        if result.get("error") is None:
            assert isinstance(result.get("logit"), int | float), f"no logit: {result}"
            assert math.isfinite(result["logit"])
    assert all(seen), "a rerank result is missing"


def check_embeddings(body: dict[str, Any], inputs: int) -> list[list[float] | None]:
    """``decodeEmbed``: indexes in range, a vector on every item without an error."""
    vectors: list[list[float] | None] = [None] * inputs
    for item in body["data"]:
        index = item["index"]
        assert 0 <= index < inputs, f"embedding index {index} is out of range"
        if item.get("error") is None:
            assert item.get("embedding") is not None, f"embedding {index} has no vector"
            vectors[index] = vector(item["embedding"])
    return vectors
