"""Request and response models of every surface: the HTTP contract (``/openapi.json``).

Field names follow the router's model runtime contract so existing clients
work unchanged. The surface requests are the plugin API's typed requests
(:mod:`vllm_srun.plugins.requests`, re-exported here): validated once, for
shape, and handed to the family as they are; a model validates what depends on
it (``dimensions`` against its size, ``head`` against its heads).

Why one module of 400-odd lines: it is the contract, one pydantic class per
JSON shape and nothing else, read top to bottom against the OpenAPI snapshot
(``tests/serve/openapi.json``); splitting it would scatter one document.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from vllm_srun.plugins.requests import (
    ClassifyRequest,
    EmbeddingsRequest,
    Milliseconds,
    RerankRequest,
    Strict,
)
from vllm_srun.plugins.spec import ItemErrorCode, RequestErrorCode

API_VERSION = "v1"


# -- shared -------------------------------------------------------------------------------
class ErrorBody(Strict):
    code: RequestErrorCode
    message: str


class ErrorResponse(Strict):
    """Every request-level failure: ``{"error": {"code", "message"}}``."""

    error: ErrorBody


class InputUsage(Strict):
    """What one input used: its tokens, those run, whether it was cut, how many windows."""

    tokens: int = Field(description="Tokens of the whole input as one row, special tokens once.")
    processed_tokens: int = Field(
        description="Tokens actually run: special tokens of every row, each content token once."
    )
    truncated: bool = Field(description="Whether content was cut (options.overflow truncate).")
    windows: int = Field(description="Rows the input ran as (1 unless windowed).")


class Usage(Strict):
    """Tokens a classify, rerank or decisions request read (an encoder generates none)."""

    input_tokens: int
    output_tokens: int = Field(description="Always 0 here.")


class EmbeddingsUsage(Strict):
    """OpenAI's embeddings usage: both are the tokens the request read."""

    prompt_tokens: int
    total_tokens: int


class ItemError(Strict):
    """An input that failed alone; its siblings are answered."""

    index: int
    error: ItemErrorCode
    message: str = Field(
        description="Extension (a 2.3 client ignores it): what is wrong and how to fix it."
    )


class Representation(Strict):
    """What an embedding is: which model's which exit, at what size, of what input."""

    model_sha256: str | None = Field(description="The model's digest (the card's model_sha256).")
    layer: int | None = Field(description="The exit read (the card's embedding.layers).")
    dimension: int = Field(description="Floats per vector, after dimensions.")
    normalized: bool = Field(description="Whether each vector has unit L2 norm.")
    modality: str = Field(description="What was embedded: text.")


class ResponseMeta(BaseModel):
    """``options.return_meta``: which model answered, how, and how long this request took.

    Other keys a family or an extension adds (a decisions readout's ``method``,
    ``questions``, ``temperature``, ...) are Extensions: a 2.3 client ignores them.
    """

    model_config = ConfigDict(extra="allow")

    model_id: str | None = Field(None, description="The served model's id (the card's id).")
    revision: str | None = Field(
        None, description="The 40-hex commit of the weights; null for a local package."
    )
    model_sha256: str | None = Field(None, description="The card's model_sha256.")
    profile: str | None = Field(None, description='The numerics profile answered in ("exact").')
    numerics: str | None = Field(
        None,
        description="exact (the model's own outputs), or approximate (a zero-shot readout, "
        "such as decisions answered from an embedder's similarities).",
    )
    engine: str | None = None
    accelerator: str | None = None
    device: str | None = None
    queue_ms: float | None = Field(
        None, description="This request's wait from admission to its first forward, ms."
    )
    compute_ms: float | None = Field(
        None, description="Time of the forwards this request's rows ran in, ms."
    )
    head: str | None = Field(None, description="Classify: the head that answered.")
    representation: Representation | None = Field(
        None, description="Embeddings: what the vectors are."
    )


# -- embeddings ---------------------------------------------------------------------------
class Embedding(Strict):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(
        description="Floats, or (encoding_format base64) their little-endian float32 bytes."
    )
    input: InputUsage


class EmbeddingError(ItemError):
    object: Literal["embedding"] = "embedding"


class EmbeddingsResponse(Strict):
    object: Literal["list"] = "list"
    data: list[Embedding | EmbeddingError]
    model: str
    usage: EmbeddingsUsage
    meta: ResponseMeta | None = None


# -- classify -----------------------------------------------------------------------------
class Span(Strict):
    start: int = Field(description="Unicode code point, inclusive.")
    end: int = Field(description="Unicode code point, exclusive.")
    text: str
    label: str
    probability: float


class ClassifyWindow(Strict):
    """One window of an input read with options.overflow window."""

    start: int = Field(
        description="First content token of the window (special tokens not counted)."
    )
    end: int = Field(description="Content token after the window's last (exclusive).")
    probabilities: list[float] | None = Field(
        None, description="Sequence heads: this window's label distribution."
    )
    scores: list[float] | None = Field(
        None, description="Scores heads: this window's label scores (relevance: its score)."
    )


class TokenProbabilities(Strict):
    """One content token of a token head's input (options.return_tokens)."""

    start: int = Field(description="Unicode code point, inclusive.")
    end: int = Field(description="Unicode code point, exclusive.")
    probabilities: list[float] = Field(
        description="Per label, in labels order: P(B-label) + P(I-label); 1 minus their sum "
        "is the chance the token is outside every entity."
    )


class ClassifyResult(Strict):
    index: int
    input: InputUsage
    label: str | None = None
    probabilities: list[float] | None = None
    scores: list[float] | None = None
    selected: list[str] | None = None
    spans: list[Span] | None = None
    tokens: list[TokenProbabilities] | None = None
    windows: list[ClassifyWindow] | None = Field(
        None,
        description="options.overflow window: every window, in order; the result merges "
        "them (a label's maximum; a token's most central window).",
    )


class ClassifyResponse(Strict):
    model: str
    head: str
    kind: Literal["sequence", "scores", "token", "relevance"] = Field(
        description="relevance (a cross-encoder scoring pairs) is an Extension: a 2.3 client "
        "reads its scores as a scores head's."
    )
    labels: list[str]
    results: list[ClassifyResult | ItemError]
    usage: Usage
    meta: ResponseMeta | None = None


# -- rerank -------------------------------------------------------------------------------
class RerankResult(Strict):
    index: int
    relevance_score: float = Field(
        description="A cross-encoder: the sigmoid of its logit, 0 to 1. A bi-encoder: the "
        "cosine of the query's and the document's embeddings, -1 to 1."
    )
    logit: float = Field(
        description="A cross-encoder: its raw logit. A bi-encoder: the cosine again."
    )
    document: str | None = None
    input: InputUsage = Field(
        description="The pair's tokens (a cross-encoder) or the document's (a bi-encoder)."
    )


class RerankResponse(Strict):
    model: str
    results: list[RerankResult | ItemError]
    usage: Usage
    meta: ResponseMeta | None = None


# -- bundle -------------------------------------------------------------------------------
# -- decisions ----------------------------------------------------------------------------
# The request models document /v1/decisions; the route validates the raw body with
# vllm_srun.plugins.decisions instead, so a bad question fails only itself
# (invalid_question) and a duplicated key is caught before a parser drops it.
class DecisionOption(Strict):
    key: str
    description: str | None = None


class DecisionQuestion(Strict):
    """One typed question; ``criteria``, or ``choices`` / ``levels``, never both."""

    type: Literal["choice", "noul", "score"]
    instructions: NonBlank = Field(description="The question itself; not blank.")
    criteria: dict[str, str | None] | list[str] | None = Field(
        None,
        description="Choice: 2..255 option keys to descriptions (null allowed); "
        'Noul: {"false": ..., "true": ...}; Score: 2..10 level descriptions, level 1 first.',
    )
    choices: list[DecisionOption] | None = Field(
        None, description="Choice and Noul: the options as a list instead of criteria."
    )
    levels: list[str] | None = Field(
        None, description="Score: the level descriptions instead of criteria."
    )


class DecisionOptions(Strict):
    deadline_ms: Milliseconds | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Answer within this many ms, or deadline_exceeded.",
    )
    profile: Literal["exact"] = "exact"
    return_meta: StrictBool = False


NonBlank = Annotated[str, Field(pattern=r"\S")]
"""Text with at least one character that is not white space."""


class DecisionState(Strict):
    state: NonBlank | dict[str, Any] | list[Any]
    questions: dict[str, DecisionQuestion] = Field(min_length=1)


class DecisionsRequest(Strict):
    model: str | None = None
    state: NonBlank | dict[str, Any] | list[Any] = Field(
        description="Text (not blank), an object or an array."
    )
    questions: dict[str, DecisionQuestion] = Field(
        min_length=1, description="Answered in this order; at least one."
    )
    states: list[DecisionState] | None = Field(
        None, description="More states asked in the same call, each under its own questions."
    )
    options: DecisionOptions | None = None


class ChoiceAnswer(Strict):
    type: Literal["choice"]
    choice: str
    probabilities: dict[str, float]
    confidence: float = Field(description="1 - normalised entropy of the probabilities.")


class NoulAnswer(Strict):
    type: Literal["noul"]
    noul: float = Field(description="P(true).")


class ScoreAnswer(Strict):
    type: Literal["score"]
    score: float = Field(description="The expected level, levels numbered from 1.")
    probabilities: dict[str, float]
    confidence: float
    legend: dict[str, str | None]


class FailedAnswer(Strict):
    type: Literal["choice", "noul", "score"] | None
    error: Literal[
        "invalid_question",
        "max_length_exceeded",
        "deadline_exceeded",
        "invalid_model_output",
        "unavailable",
    ]
    message: str


DecisionAnswer = ChoiceAnswer | NoulAnswer | ScoreAnswer | FailedAnswer


class DecisionUsage(Strict):
    input_tokens: int
    output_tokens: int


class DecisionStateAnswers(Strict):
    index: int = Field(description="The entry's position in the request's states.")
    answers: dict[str, DecisionAnswer]
    meta: dict[str, Any] | None = None


class DecisionNamedStateAnswers(Strict):
    answers: dict[str, DecisionAnswer]
    meta: dict[str, Any] | None = None


class DecisionsResponse(Strict):
    model: str
    answers: dict[str, DecisionAnswer]
    usage: DecisionUsage
    states: list[DecisionStateAnswers] | dict[str, DecisionNamedStateAnswers] | None = Field(
        default=None,
        description="The answers of each states entry: a list with index, or (vllm-sr/4.0, "
        "states sent as an object) an object under the same names.",
    )
    meta: ResponseMeta | None = None


class SystemOneBatchRequest(Strict):
    """The same questions about each state (``vllm-sr/4.0`` also accepts the older
    question forms; see ``--systemone-schema``)."""

    model: str | None = None
    states: list[NonBlank | dict[str, Any] | list[Any]] = Field(
        min_length=1, max_length=64, description="The states, each answered in order."
    )
    questions: dict[str, DecisionQuestion] = Field(
        min_length=1, description="Asked about every state, in this order."
    )
    options: DecisionOptions | None = None


class SystemOneBatchResult(Strict):
    index: int = Field(description="The state's position in the request's states.")
    answers: dict[str, DecisionAnswer]


class SystemOneBatchResponse(Strict):
    model: str
    results: list[SystemOneBatchResult]
    usage: DecisionUsage
    meta: ResponseMeta | None = None


class BundleOptions(Strict):
    deadline_ms: Milliseconds | None = Field(
        None, gt=0, allow_inf_nan=False, description="The default deadline of every task."
    )


class BundleTask(Strict):
    id: str
    embeddings: EmbeddingsRequest | None = None
    classify: ClassifyRequest | None = None
    rerank: RerankRequest | None = None
    decisions: dict[str, Any] | None = Field(
        None, description="A /v1/decisions body (DecisionsRequest), validated per question."
    )
    systemone_batch: dict[str, Any] | None = Field(
        None, description="A /v1/systemone/batch body (SystemOneBatchRequest)."
    )


class BundleRequest(Strict):
    tasks: list[BundleTask] = Field(min_length=1)
    options: BundleOptions | None = None


class BundleResult(Strict):
    id: str
    status: int
    embeddings: EmbeddingsResponse | None = None
    classify: ClassifyResponse | None = None
    rerank: RerankResponse | None = None
    decisions: DecisionsResponse | None = None
    systemone_batch: SystemOneBatchResponse | None = None
    error: ErrorBody | None = None


class BundleResponse(Strict):
    results: list[BundleResult]


# -- models and health --------------------------------------------------------------------
class Head(Strict):
    name: str
    kind: str
    labels: list[str]
    inputs: list[str]
    overflow: list[str]
    window: dict[str, int]
    reduction: str


class EmbeddingInfo(Strict):
    dimensions: int
    normalized: bool
    pooling: str
    max_tokens: int


class Golden(Strict):
    status: str
    checked: bool
    matched: bool | None
    reference: str | None


class ModelCard(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    object: Literal["model"] = Field(description="OpenAI's object type.")
    created: int = Field(description="When the runtime took the model on (Unix seconds).")
    owned_by: str = Field(
        description="The repository's owner on the Hub, or vllm-srun for a local package."
    )
    family: str | None
    repo: str | None
    revision: str | None
    model_sha256: str | None
    verification: str | None
    surfaces: list[str]
    question_types: list[str]
    heads: list[Head]
    embedding: EmbeddingInfo | None
    limits: dict[str, Any]
    licence: str | None
    profile: str
    profiles: list[str]
    engine: str | None
    accelerator: str | None
    device: str | None
    dtype: str | None
    parameters: int | None
    status: Literal["loading", "warming", "ready", "failed"]
    reason: str | None
    golden: Golden


class ProcessLimits(Strict):
    max_bundle_tasks: int
    max_request_bytes: int


class PluginInfo(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    distribution: str | None
    version: str | None
    error: str | None


class ModelsResponse(Strict):
    object: Literal["list"] = "list"
    api_version: str
    limits: ProcessLimits
    plugins: list[PluginInfo]
    data: list[ModelCard]


class ModelHealth(Strict):
    status: str
    reason: str | None


class HealthResponse(Strict):
    status: Literal["starting", "loading", "warming", "ready", "degraded", "failed"]
    api_version: str
    reason: str | None
    models: dict[str, ModelHealth]


class LiveResponse(Strict):
    status: Literal["alive"]
    api_version: str
