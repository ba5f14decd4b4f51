"""The HTTP contract's remaining documents (``/openapi.json``): what the serve layer itself
builds or reads, beside the bodies the plugin API defines.

The surface requests are the plugin API's (:mod:`vllm_srun.plugins.requests`), and so
are the answers families return (:mod:`vllm_srun.plugins.responses`,
:mod:`vllm_srun.plugins.decisions.answers`) and the cards
(:mod:`vllm_srun.plugins.cards`). Here: the decisions request documents (the routes
validate the raw body with :mod:`vllm_srun.plugins.decisions`, so these pydantic models
document it only), the System One batch and ``jev`` shapes, bundles, and the process
documents of ``/v1/models`` and ``/health``. Every response type here is a
:class:`~typing_extensions.TypedDict` the code building it is typed with.

Why one module of 400-odd lines: it is the serve layer's part of the contract, one class
per JSON shape and nothing else, read top to bottom against the OpenAPI snapshot
(``tests/serve/openapi.json``); splitting it would scatter one document.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import ConfigDict, Field, StrictBool
from typing_extensions import TypedDict

from vllm_srun.plugins.cards import EXTENSION, CardStatus, ModelCard
from vllm_srun.plugins.decisions.answers import (
    DecisionsResponse,
    DecisionUsage,
    NoulAnswer,
    QuestionAnswer,
    StateMeta,
)
from vllm_srun.plugins.requests import (
    ClassifyRequest,
    EmbeddingsRequest,
    Milliseconds,
    ProfileName,
    RerankRequest,
    Strict,
)
from vllm_srun.plugins.responses import (
    ClassifyResponse,
    EmbeddingsResponse,
    ErrorBody,
    RerankResponse,
    ResponseMeta,
    closed,
    opened,
)

API_VERSION = "2.3.0"
"""The router's wire contract this runtime serves (``api_version`` on ``/health``,
``/health/live`` and ``/v1/models``; ``info.version`` of the OpenAPI document). A
client refuses another major version."""


# -- decisions requests ---------------------------------------------------------------
# The request models document /v1/decisions; the route validates the raw body with
# vllm_srun.plugins.decisions instead, so a bad question fails only itself
# (invalid_question) and a duplicated key is caught before a parser drops it.
class DecisionOption(Strict):
    key: str
    description: str | None = None


OPTIONS_GIVEN: dict[str, Any] = {
    "anyOf": [
        {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
        for name in ("criteria", "choices", "levels")
    ]
}
"""A question names its options: ``criteria``, ``choices`` or ``levels``, not null (what
the route's validation refuses otherwise, stated in the document)."""


class DecisionQuestion(Strict):
    """One typed question; ``criteria``, or ``choices`` / ``levels``, never both."""

    model_config = ConfigDict(json_schema_extra=OPTIONS_GIVEN)

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

StateObject = Annotated[dict[str, Any], Field(min_length=1)]
"""A state as an object: at least one member (an empty one has nothing to judge)."""

StateArray = Annotated[list[Any], Field(min_length=1)]
"""A state as an array: at least one item (an empty one has nothing to judge)."""


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

    state: NonBlank | StateObject | StateArray
    questions: dict[str, DecisionQuestion] = Field(min_length=1)
    images: NoImages = None


class DecisionsRequest(Strict):
    model: str | None = None
    state: NonBlank | StateObject | StateArray = Field(
        description="Text (not blank), an object or an array, not empty."
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


class SystemOneBatchRequest(Strict):
    """The same questions about each state (``vllm-sr/4.0`` also accepts the older
    question forms; see ``--systemone-schema``)."""

    model: str | None = None
    states: list[NonBlank | StateObject | StateArray] = Field(
        min_length=1, max_length=64, description="The states, each answered in order."
    )
    questions: dict[str, DecisionQuestion] = Field(
        min_length=1, description="Asked about every state, in this order."
    )
    options: DecisionOptions | None = None


@closed
class SystemOneBatchResult(TypedDict):
    index: Annotated[int, Field(description="The state's position in the request's states.")]
    answers: dict[str, QuestionAnswer]


@closed
class SystemOneBatchResponse(TypedDict):
    """The answers about each state of a ``/v1/systemone/batch`` request, in order."""

    model: str
    results: list[SystemOneBatchResult]
    usage: Annotated[
        DecisionUsage, Field(description="The tokens of every state's questions, summed.")
    ]
    meta: NotRequired[ResponseMeta]


# -- the jev schema (--systemone-schema jev; vllm_srun.serve.jev) ---------------------------
@closed
class JevChoiceAnswer(TypedDict):
    type: Literal["choice"]
    choice: str
    probabilities: dict[str, float]
    confidence: Annotated[float, Field(description="(max p - 1/n) / (1 - 1/n), Jev's formula.")]


@closed
class JevScoreAnswer(TypedDict):
    type: Literal["score"]
    score: Annotated[float, Field(description="The expected level, levels numbered from 0.")]
    probabilities: Annotated[dict[str, float], Field(description='Keyed "0".."N-1".')]
    confidence: Annotated[
        float,
        Field(
            description="1 - sum_i p_i |i - m| / S_n (m the most probable level, S_n the same "
            "sum for the uniform distribution), Jev's formula."
        ),
    ]
    legend: dict[str, str]


JevAnswer = JevChoiceAnswer | NoulAnswer | JevScoreAnswer
"""A question's answer in the ``jev`` schema (a failed question fails the request)."""


@closed
class JevStateAnswers(TypedDict):
    """One ``states`` entry's answers in the ``jev`` schema (``x_states``)."""

    answers: dict[str, JevAnswer]
    usage: DecisionUsage
    meta: NotRequired[StateMeta]


@closed
class JevIndexedStateAnswers(JevStateAnswers):
    index: Annotated[int, Field(description="The entry's position in the request's states.")]


@closed
class JevSystemOneResponse(TypedDict):
    """A ``/v1/systemone`` answer in the ``jev`` schema: exactly these fields, this
    runtime's own extras under ``x_`` names."""

    model: str
    answers: dict[str, JevAnswer]
    usage: DecisionUsage
    x_meta: NotRequired[ResponseMeta]
    x_states: NotRequired[
        Annotated[
            dict[str, JevStateAnswers] | list[JevIndexedStateAnswers],
            Field(
                description="The answers of a request's states entries (not Jev's): an object "
                "under the request's names, or an array with each entry's index."
            ),
        ]
    ]


@closed
class JevBatchResult(TypedDict):
    index: int
    answers: dict[str, JevAnswer]


@closed
class JevBatchResponse(TypedDict):
    """A ``/v1/systemone/batch`` answer in the ``jev`` schema."""

    model: str
    results: list[JevBatchResult]
    usage: DecisionUsage
    x_meta: NotRequired[ResponseMeta]


@closed
class JevValidationItem(TypedDict):
    loc: Annotated[list[str | int], Field(description='Where in the body: "body", then the path.')]
    msg: str
    type: Annotated[str, Field(description="invalid_request or invalid_question.")]


@closed
class JevValidationError(TypedDict):
    """A ``jev`` schema validation failure (422): Jev's ``detail`` list, and this
    runtime's ``error`` beside it."""

    detail: list[JevValidationItem]
    error: ErrorBody


@closed
class JevErrorDetail(TypedDict):
    error_type: str
    message: str


@closed
class JevErrorBody(TypedDict):
    code: str
    message: str
    type: Literal["invalid_request_error", "server_error"]
    param: str | None


@closed
class JevError(TypedDict):
    """Any other ``jev`` schema failure: Jev's ``detail`` object, and ``error`` beside it."""

    detail: JevErrorDetail
    error: JevErrorBody


JevErrorDocument = JevError | JevValidationError
"""A failure in the ``jev`` schema: a validation failure (422) or any other."""


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


@closed
class BundleResult(TypedDict):
    """A task's answer, in task order: the surface's response under the task's key with
    status 200, or the error and the status the task would have had alone."""

    id: str
    status: int
    embeddings: NotRequired[EmbeddingsResponse]
    classify: NotRequired[ClassifyResponse]
    rerank: NotRequired[RerankResponse]
    decisions: NotRequired[DecisionsResponse]
    systemone_batch: NotRequired[SystemOneBatchResponse]
    error: NotRequired[ErrorBody]


@closed
class BundleResponse(TypedDict):
    results: list[BundleResult]


# -- models and health --------------------------------------------------------------------
# Wire contract 2.3 (API_VERSION). The router's Go client decodes these: unknown keys
# are ignored, a value of another JSON type fails its whole decode, so every integer
# below is a JSON integer. Fields the contract does not have are marked "Extension".
# The cards themselves are the plugin API's (vllm_srun.plugins.cards); here are the
# process documents the serve layer builds around them (vllm_srun.serve.status).


@opened
class ProcessLimits(TypedDict):
    max_bundle_tasks: Annotated[int, Field(description="Most tasks in one /v1/bundle request.")]
    max_request_bytes: Annotated[int, Field(description="Largest request body, in bytes.")]


@opened
class ProcessPlugin(TypedDict):
    name: str
    distribution: str | None
    version: str | None
    error: str | None


@closed
class JevModel(TypedDict):
    """A decision model as Jev clients list it (``GET /v1/models`` ``models``)."""

    name: Annotated[str, Field(description="The model ID, or the alias jev-latest.")]
    description: str
    release_date: Annotated[
        str,
        Field(
            description="YYYY-MM-DD: the UTC date the runtime took the model on (a runtime "
            "does not know a model's release date)."
        ),
    ]


@opened
class ModelList(TypedDict):
    """Every served model's card, and the process limits."""

    api_version: Annotated[str, Field(description="The wire contract version, 2.3.0.")]
    object: Literal["list"]
    data: list[ModelCard]
    limits: ProcessLimits
    plugins: Annotated[
        list[ProcessPlugin],
        Field(description=EXTENSION + "every plugin installed, with why any contributes nothing."),
    ]
    models: Annotated[
        list[JevModel],
        Field(
            description=EXTENSION + "the decision models as Jev clients read them, and the "
            "alias jev-latest when it reaches one."
        ),
    ]


@opened
class ModelHealth(TypedDict):
    status: CardStatus
    reason: str | None


@opened
class Health(TypedDict):
    """Readiness: 200 when every model is ready, else 503."""

    api_version: Annotated[str, Field(description="The wire contract version, 2.3.0.")]
    status: CardStatus
    reason: str | None
    model: Annotated[
        str | None, Field(description="The model's name in a one-model process, else null.")
    ]
    models: Annotated[
        dict[str, ModelHealth], Field(description="Each served model's state, by name.")
    ]


@opened
class Liveness(TypedDict):
    """The process serves HTTP."""

    api_version: Annotated[str, Field(description="The wire contract version, 2.3.0.")]
    status: Literal["alive"]
