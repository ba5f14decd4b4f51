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
    tokens: int
    processed_tokens: int
    truncated: bool
    windows: int


class Usage(Strict):
    prompt_tokens: int
    total_tokens: int


class ItemError(Strict):
    index: int
    error: ItemErrorCode
    message: str


# -- embeddings ---------------------------------------------------------------------------
class Embedding(Strict):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str
    input: InputUsage


class EmbeddingError(ItemError):
    object: Literal["embedding"] = "embedding"


class EmbeddingsResponse(Strict):
    object: Literal["list"] = "list"
    data: list[Embedding | EmbeddingError]
    model: str
    usage: Usage


# -- classify -----------------------------------------------------------------------------
class Span(Strict):
    start: int = Field(description="Unicode code point, inclusive.")
    end: int = Field(description="Unicode code point, exclusive.")
    text: str
    label: str
    probability: float


class ClassifyResult(Strict):
    index: int
    input: InputUsage
    label: str | None = None
    probabilities: list[float] | None = None
    scores: list[float] | None = None
    selected: list[str] | None = None
    spans: list[Span] | None = None


class ClassifyResponse(Strict):
    model: str
    head: str
    kind: Literal["sequence", "scores", "token", "relevance"]
    labels: list[str]
    results: list[ClassifyResult | ItemError]
    usage: Usage


# -- rerank -------------------------------------------------------------------------------
class RerankResult(Strict):
    index: int
    relevance_score: float
    logit: float
    document: str | None = None


class RerankResponse(Strict):
    model: str
    results: list[RerankResult | ItemError]
    usage: Usage


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
    meta: dict[str, Any] | None = None


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
    meta: dict[str, Any] | None = None


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
