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
    ProfileName,
    RerankRequest,
    Strict,
)
from vllm_srun.plugins.spec import ItemErrorCode, RequestErrorCode

API_VERSION = "2.3.0"
"""The router's wire contract this runtime serves (``api_version`` on ``/health``,
``/health/live`` and ``/v1/models``; ``info.version`` of the OpenAPI document). A
client refuses another major version."""


# -- shared -------------------------------------------------------------------------------
class ErrorBody(Strict):
    code: RequestErrorCode
    message: str
    type: Literal["invalid_request_error", "server_error"] = Field(
        description="OpenAI's error type: server_error for a 5xx or overloaded, else "
        "invalid_request_error."
    )
    param: str | None = Field(
        description="The request field at fault (OpenAI's param), null when no one is."
    )


class ErrorResponse(Strict):
    """Every request-level failure: ``{"error": {"code", "message", "type", "param"}}``."""

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
    profile: str | None = Field(
        None, description="The numeric profile answered in (exact, batching, max_speed, ...)."
    )
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
    source: Literal["model", "pattern"] | None = Field(
        None,
        description="Extension (a 2.3 client ignores it), on models a pattern extension augments: "
        "model (the token head) or pattern (a validated pattern recognizer).",
    )
    recognizer: str | None = Field(
        None,
        description="Extension: the pattern recognizer that found the span (Presidio's class "
        "name, e.g. CreditCardRecognizer); null for the model's spans.",
    )


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
        'Noul: {"false": ..., "true": ...}; Score: 2..10 level descriptions, level 0 first.',
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
    profile: ProfileName | None = None
    return_meta: StrictBool = False


NonBlank = Annotated[str, Field(pattern=r"\S")]
"""Text with at least one character that is not white space."""


NoImages = Annotated[
    list[str] | None,
    Field(
        description="Images as data URLs (contract 2.3); accepted only empty (or left out): "
        "no decision model served here reads images, and a non-empty list is refused with "
        "invalid_request.",
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
    score: float = Field(
        description="The expected level, levels numbered from 0 (0 <= score <= N-1)."
    )
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
    usage: DecisionUsage = Field(description="The tokens of every state's questions, summed.")
    meta: ResponseMeta | None = None


# -- the jev schema (--systemone-schema jev; vllm_srun.serve.jev) ---------------------------
class JevChoiceAnswer(Strict):
    type: Literal["choice"]
    choice: str
    probabilities: dict[str, float]
    confidence: float = Field(description="(max p - 1/n) / (1 - 1/n), Jev's formula.")


class JevScoreAnswer(Strict):
    type: Literal["score"]
    score: float = Field(description="The expected level, levels numbered from 0.")
    probabilities: dict[str, float] = Field(description='Keyed "0".."N-1".')
    confidence: float = Field(
        description="1 - sum_i p_i |i - m| / S_n (m the most probable level, S_n the same "
        "sum for the uniform distribution), Jev's formula."
    )
    legend: dict[str, str]


JevAnswer = JevChoiceAnswer | NoulAnswer | JevScoreAnswer


class JevSystemOneResponse(Strict):
    """A ``/v1/systemone`` answer in the ``jev`` schema: exactly these fields, this
    runtime's own extras under ``x_`` names."""

    model: str
    answers: dict[str, JevAnswer]
    usage: DecisionUsage
    x_meta: ResponseMeta | None = None
    x_states: dict[str, Any] | list[Any] | None = Field(
        default=None, description="The answers of a request's states entries (not Jev's)."
    )


class JevBatchResult(Strict):
    index: int
    answers: dict[str, JevAnswer]


class JevBatchResponse(Strict):
    """A ``/v1/systemone/batch`` answer in the ``jev`` schema."""

    model: str
    results: list[JevBatchResult]
    usage: DecisionUsage
    x_meta: ResponseMeta | None = None


class JevValidationItem(Strict):
    loc: list[str | int] = Field(description='Where in the body: "body", then the path.')
    msg: str
    type: str = Field(description="invalid_request or invalid_question.")


class JevValidationError(Strict):
    """A ``jev`` schema validation failure (422): Jev's ``detail`` list, and this
    runtime's ``error`` beside it."""

    detail: list[JevValidationItem]
    error: ErrorBody


class JevErrorDetail(Strict):
    error_type: str
    message: str


class JevErrorBody(Strict):
    code: str
    message: str
    type: Literal["invalid_request_error", "server_error"]
    param: str | None


class JevError(Strict):
    """Any other ``jev`` schema failure: Jev's ``detail`` object, and ``error`` beside it."""

    detail: JevErrorDetail
    error: JevErrorBody


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
# Wire contract 2.3 (API_VERSION). The router's Go client decodes these: unknown keys
# are ignored, a value of another JSON type fails its whole decode, so every integer
# below is a JSON integer. Fields the contract does not have are marked "Extension".
EXTENSION = "Extension (not in the 2.3 contract; a 2.3 client ignores it): "

CardStatus = Literal["starting", "loading", "warming", "ready", "degraded", "failed"]
"""A model's or the process's state."""


class Window(BaseModel):
    tokens: int = Field(description="Tokens per window, special tokens included.")
    overlap: int = Field(description="Content tokens two neighbouring windows share.")


class HeadCard(BaseModel):
    """One output head of a model."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(description="The head's name; a classify request selects it with head.")
    kind: str = Field(
        description="sequence (one label, softmax), scores (sigmoid per label) or token "
        "(spans), as the contract lists; this runtime also has relevance (a cross-encoder's "
        "one logit) and pooled (an embedder's vectors)."
    )
    labels: list[str] = Field(description="The labels, in the order results list them.")
    inputs: list[str] = Field(
        description="What one input may carry: text, and pair for a head reading text pairs."
    )
    default_threshold: float | None = Field(
        description="The threshold a request that sends none gets (the models file's family "
        "option threshold), else null."
    )
    thresholds: list[float] | None = Field(
        description="The packaged per-label operating point (thresholds.json), in labels "
        "order, else null."
    )
    operating_point_sha256: str | None = Field(
        None, description="SHA-256 of the file the thresholds come from, else null."
    )
    overflow: Literal["reject", "truncate", "window"] = Field(
        description="The policy a request that names none gets for an input over the limit."
    )
    overflow_policies: list[str] | None = Field(
        None, description=EXTENSION + "every overflow policy a request may choose."
    )
    window: Window | None = Field(description="The windows overflow: window reads.")
    reduction: Literal["max", "span_union"] | None = Field(
        description="How windows merge back: max (per label, over windows); null when the "
        "head merges otherwise (see window_reduction)."
    )
    window_reduction: str | None = Field(
        None, description=EXTENSION + "how windows merge back, in this runtime's words."
    )


class EmbeddingCard(BaseModel):
    """What an embedder's vectors are."""

    model_config = ConfigDict(extra="allow")

    dimensions: list[int] = Field(
        description="The vector sizes the model declares: its full size, then any Matryoshka "
        "sizes its package declares (config.json matryoshka_dimensions)."
    )
    layers: list[int] = Field(
        description="The layers vectors can be read at, numbered from 1 (the last is the "
        "number of hidden layers)."
    )
    modalities: list[str] = Field(description="What it embeds: text.")
    normalized: bool = Field(description="Whether vectors have unit L2 norm.")
    pooling: str = Field(description="How token states become one vector: mean, cls, max...")
    input_types: list[str] = Field(
        description="The input_type values it tells apart; empty: not an instructed model."
    )
    max_tokens: int | None = Field(None, description=EXTENSION + "its input limit in tokens.")


class RerankExit(BaseModel):
    layer: int = Field(description="The layer read, numbered from 1.")
    dimension: int = Field(description="Floats per representation read there.")


class RerankCard(BaseModel):
    """The representations rerank reads: a bi-encoder's embeddings, or a cross-encoder's
    hidden states."""

    exits: list[RerankExit] = Field(description="Every representation a request may name.")
    default: RerankExit = Field(description="The one read when a request names none.")


class ModelLimits(BaseModel):
    """A model's limits, all integers."""

    model_config = ConfigDict(extra="allow")

    max_input_tokens: int | None = Field(
        None, description="The most tokens one input may have, special tokens included."
    )
    min_options: int | None = Field(None, description="Decision models: fewest choice options.")
    max_options: int | None = Field(None, description="Decision models: most choice options.")
    min_levels: int | None = Field(None, description="Decision models: fewest score levels.")
    max_levels: int | None = Field(None, description="Decision models: most score levels.")
    max_inputs: int | None = Field(
        None,
        description="The most inputs or documents one classify, embeddings or rerank request "
        "may carry (--max-inputs); a larger one is 400 invalid_request, so a client splits it. "
        "Absent on a card that serves none of those surfaces.",
    )
    max_model_len: int | None = Field(
        None, description=EXTENSION + "decision models: the --max-model-len in effect."
    )
    model_max_tokens: int | None = Field(
        None, description=EXTENSION + "decision models: the model's own token limit."
    )


class GoldenStatus(BaseModel):
    """The golden self-check run while the model warms."""

    model_config = ConfigDict(extra="allow")

    status: Literal["pending", "matched", "unverified", "failed"] = Field(
        description="pending until the check ran; matched (answers agree with a reference "
        "recorded for this device), unverified (none recorded: the answers were only "
        "checked to be well formed and deterministic) or failed."
    )
    checked: int = Field(description="Golden cases run.")
    matched: int = Field(description="Golden cases that agreed with the recorded reference.")
    reference: str | None = Field(
        description="The reference key compared; empty when none is recorded for this "
        "device; null before the check ran."
    )


class ProfileInfo(BaseModel):
    """A numeric profile the model may be served or asked under."""

    model_config = ConfigDict(extra="allow")

    name: str
    numerics: Literal["exact", "approximate"]
    description: str | None = None


class PluginInfo(BaseModel):
    """A plugin composing the model."""

    model_config = ConfigDict(extra="allow")

    group: str = Field(description="family, engine, accelerator, kernel or extension.")
    name: str = Field(description="The object's name in its plugin layer.")
    distribution: str | None = Field(description="The distribution that declares the plugin.")
    version: str | None = Field(description="That distribution's version.")
    capabilities: dict[str, Any] = Field(description="What the object declares about itself.")
    plugin: str | None = Field(None, description=EXTENSION + "the plugin's entry-point name.")


class ModelCard(BaseModel):
    """One served model: identity, what it answers, its limits, composition and state.
    Every field is present whatever the state (null or empty until known)."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(description="The model ID requests use.")
    object: Literal["model"] = Field(description="OpenAI's object type.")
    created: int = Field(
        description=EXTENSION + "when the runtime took the model on (Unix seconds)."
    )
    owned_by: str = Field(
        description="The repository's owner on the Hub, or vllm-srun for a local package."
    )
    family: str | None
    repo: str | None = Field(description="The Hub repository, or null for a local package.")
    revision: str | None = Field(description="The 40-hex commit, or null for a local package.")
    model_sha256: str | None = Field(description="SHA-256 over the package's loadable files.")
    verification: str | None = Field(description=EXTENSION + "how the files were checked.")
    surfaces: list[str]
    question_types: list[str]
    presets: list[str] = Field(description="Named request presets; none in this version.")
    modalities: list[str] = Field(
        description="What a decisions state may hold (text); empty for a model without decisions."
    )
    heads: list[HeadCard]
    embedding: EmbeddingCard | None
    rerank: RerankCard | None = Field(description="Set on every model serving rerank.")
    limits: ModelLimits
    licence: str | None
    profile: str = Field(description="The numeric profile the model is served under.")
    profiles: list[ProfileInfo] = Field(
        description="Every profile the model can be loaded under on its engine; a request "
        "may name only the one it was loaded with."
    )
    numerics: Literal["exact", "approximate"] = Field(
        description=EXTENSION + "the numerics of the profile it is served under."
    )
    engine: str | None
    accelerator: str | None
    accelerator_validated: bool = Field(
        description="Whether this model's golden answers matched a reference recorded on "
        "this accelerator."
    )
    device: str | None
    dtype: str | None
    parameters: int | None
    ready: bool = Field(description="Whether the model answers requests now.")
    status: CardStatus
    reason: str | None = Field(description="Why it is failed, retrying or not ready.")
    golden: GoldenStatus
    plugins: list[PluginInfo]


class ProcessLimits(BaseModel):
    model_config = ConfigDict(extra="allow")

    max_bundle_tasks: int = Field(description="Most tasks in one /v1/bundle request.")
    max_request_bytes: int = Field(description="Largest request body, in bytes.")


class ProcessPlugin(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    distribution: str | None
    version: str | None
    error: str | None


class JevModel(BaseModel):
    """A decision model as Jev clients list it (``GET /v1/models`` ``models``)."""

    name: str = Field(description="The model ID, or the alias jev-latest.")
    description: str
    release_date: str = Field(
        description="YYYY-MM-DD: the UTC date the runtime took the model on (a runtime "
        "does not know a model's release date)."
    )


class ModelList(BaseModel):
    """Every served model's card, and the process limits."""

    model_config = ConfigDict(extra="allow")

    api_version: str = Field(description="The wire contract version, 2.3.0.")
    object: Literal["list"] = "list"
    data: list[ModelCard]
    limits: ProcessLimits
    plugins: list[ProcessPlugin] = Field(
        description=EXTENSION + "every plugin installed, with why any contributes nothing."
    )
    models: list[JevModel] = Field(
        description=EXTENSION + "the decision models as Jev clients read them, and the "
        "alias jev-latest when it reaches one."
    )


class ModelHealth(BaseModel):
    model_config = ConfigDict(extra="allow")

    status: CardStatus
    reason: str | None


class Health(BaseModel):
    """Readiness: 200 when every model is ready, else 503."""

    model_config = ConfigDict(extra="allow")

    api_version: str = Field(description="The wire contract version, 2.3.0.")
    status: CardStatus
    reason: str | None
    model: str | None = Field(description="The model's name in a one-model process, else null.")
    models: dict[str, ModelHealth] = Field(description="Each served model's state, by name.")


class Liveness(BaseModel):
    """The process serves HTTP."""

    model_config = ConfigDict(extra="allow")

    api_version: str = Field(description="The wire contract version, 2.3.0.")
    status: Literal["alive"]
