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


NoImages = Annotated[
    list[Any] | None,
    Field(
        max_length=0,
        description="Accepted only empty (or left out): no decision model served here "
        "reads images; a non-empty list is refused with invalid_request.",
    ),
]


class DecisionState(Strict):
    """One more state, asked and answered as a request of its own would be."""

    state: NonBlank | dict[str, Any] | list[Any]
    questions: dict[str, DecisionQuestion] = Field(min_length=1)
    images: NoImages = None


class DecisionsRequest(Strict):
    model: str | None = None
    state: NonBlank | dict[str, Any] | list[Any] = Field(
        description="Text (not blank), an object or an array."
    )
    questions: dict[str, DecisionQuestion] = Field(
        min_length=1, description="Answered in this order; at least one."
    )
    states: dict[str, DecisionState] | list[DecisionState] | None = Field(
        None,
        description="More states asked in the same call, each with its own questions and "
        "answered as its own request would be: an object of entries under names that show "
        "something (answered as an object under the same names), or an array (answered "
        "as an array, each entry with its index).",
    )
    images: NoImages = None
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
    """The tokens one state and its questions read (``output_tokens``: always 0, nothing
    is generated)."""

    input_tokens: int
    output_tokens: int


class DecisionStateResponse(Strict):
    """One ``states`` entry answered as its own request would be."""

    model: str = Field(description="The model that answered the entry.")
    answers: dict[str, DecisionAnswer]
    usage: DecisionUsage = Field(description="The tokens this entry read, and only this entry.")
    meta: dict[str, Any] | None = None


class DecisionStateAnswers(DecisionStateResponse):
    """An entry of a ``states`` array, answered in the same place."""

    index: int = Field(description="The entry's position in the request's states.")


class DecisionsResponse(Strict):
    model: str
    answers: dict[str, DecisionAnswer]
    usage: DecisionUsage = Field(
        description="The tokens the request's own state and questions read; each states "
        "entry reports its own usage (their sum is what the whole request read)."
    )
    states: dict[str, DecisionStateResponse] | list[DecisionStateAnswers] | None = Field(
        default=None,
        description="Each states entry's answer, in the form the request's states had: an "
        "object under the same names, or an array with each entry's index.",
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
    usage: DecisionUsage = Field(description="The tokens of every state's questions, summed.")
    meta: dict[str, Any] | None = None


class BundleOptions(Strict):
    deadline_ms: Milliseconds | None = Field(
        None, gt=0, allow_inf_nan=False, description="The default deadline of every task."
    )


class BundleTask(Strict):
    """One task: an ``id`` and exactly one surface request, answered as that surface's
    route would answer it (a body failing validation fails only its own task)."""

    id: str = Field(min_length=1, description="Names the task's result; not empty.")
    embeddings: EmbeddingsRequest | None = Field(None, description="A /v1/embeddings body.")
    classify: ClassifyRequest | None = Field(None, description="A /v1/classify body.")
    rerank: RerankRequest | None = Field(None, description="A /v1/rerank body.")
    decisions: DecisionsRequest | None = Field(
        None, description="A /v1/decisions body; a bad question fails only itself."
    )
    systemone_batch: SystemOneBatchRequest | None = Field(
        None, description="A /v1/systemone/batch body."
    )


class BundleRequest(Strict):
    """Several surface requests in one call. Only a malformed bundle is refused as a
    whole (400; 413 above limits.max_bundle_tasks tasks)."""

    tasks: list[BundleTask] = Field(min_length=1)
    options: BundleOptions | None = None


class BundleResult(Strict):
    """A task's answer, in task order: the surface's response under the task's key with
    status 200, or the error and the status the task would have had alone."""

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
