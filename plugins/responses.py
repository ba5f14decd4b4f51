"""The response bodies of the encoder surfaces, as types: what a family's ``finish`` returns.

Each body is a :class:`typing.TypedDict`: a family builds it as a plain dict (no
cost on the answer path), mypy checks its keys and their types against these
classes, and the runtime's OpenAPI document (``/openapi.json``) is generated
from the same classes. A family returns an *answer* (``EmbeddingsAnswer``,
``ClassifyAnswer``, ``RerankAnswer``); the runtime adds ``model`` (and fills
``meta``), which makes it the wire's ``...Response``.

The small builders (:func:`input_usage`, :func:`item_error`,
:func:`embedding_item`, :func:`embedding_error`) write the pieces every
family repeats.

Field names follow the router's model runtime contract 2.3; fields the
contract does not have are marked "Extension" (a 2.3 client ignores them).

Why one module of 400-odd lines: it is the encoder surfaces' part of the contract, one
class per JSON shape and the builders that write them, read top to bottom against the
OpenAPI snapshot; splitting it would scatter one document.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Literal, NotRequired

from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict  # pydantic reads typing's TypedDict only from 3.12

from vllm_srun.plugins.spec import ItemErrorCode, RequestErrorCode, RowError

# defer_build: a validator or schema of a body is built when first used (the OpenAPI
# document, a test's TypeAdapter), not when the HTTP app declares its ~70 responses (about
# 0.15 s of every start on the reference CPU).
closed = with_config(ConfigDict(extra="forbid", defer_build=True))
"""A body that has exactly its declared keys (``additionalProperties: false``)."""

opened = with_config(ConfigDict(extra="allow", defer_build=True))
"""A body a family or an extension may add keys to (documented as Extensions)."""


# -- shared pieces ----------------------------------------------------------------------------
@closed
class ErrorBody(TypedDict):
    code: RequestErrorCode
    message: str
    type: Annotated[
        Literal["invalid_request_error", "server_error"],
        Field(
            description="OpenAI's error type: server_error for a 5xx or overloaded, else "
            "invalid_request_error."
        ),
    ]
    param: Annotated[
        str | None,
        Field(description="The request field at fault (OpenAI's param), null when no one is."),
    ]


@closed
class ErrorResponse(TypedDict):
    """Every request-level failure: ``{"error": {"code", "message", "type", "param"}}``."""

    error: ErrorBody


@closed
class InputUsage(TypedDict):
    """What one input used: its tokens, those run, whether it was cut, how many windows."""

    tokens: Annotated[
        int, Field(description="Tokens of the whole input as one row, special tokens once.")
    ]
    processed_tokens: Annotated[
        int,
        Field(
            description="Tokens actually run: special tokens of every row, each content token once."
        ),
    ]
    truncated: Annotated[
        bool, Field(description="Whether content was cut (options.overflow truncate).")
    ]
    windows: Annotated[int, Field(description="Rows the input ran as (1 unless windowed).")]


@closed
class Usage(TypedDict):
    """Tokens a classify, rerank or decisions request read (an encoder generates none)."""

    input_tokens: int
    output_tokens: Annotated[int, Field(description="Always 0 here.")]


@closed
class EmbeddingsUsage(TypedDict):
    """OpenAI's embeddings usage: both are the tokens the request read."""

    prompt_tokens: int
    total_tokens: int


@closed
class ItemError(TypedDict):
    """An input that failed alone; its siblings are answered."""

    index: int
    error: ItemErrorCode
    message: Annotated[
        str,
        Field(description="Extension (a 2.3 client ignores it): what is wrong and how to fix it."),
    ]


@closed
class Representation(TypedDict):
    """What an embedding is: which model's which exit, at what size, of what input."""

    model_sha256: Annotated[
        str | None,
        Field(
            description="The model's digest (the card's model_sha256; the runtime fills it "
            "in when the family leaves it out)."
        ),
    ]
    layer: Annotated[int | None, Field(description="The exit read (the card's embedding.layers).")]
    dimension: Annotated[int, Field(description="Floats per vector, after dimensions.")]
    normalized: Annotated[bool, Field(description="Whether each vector has unit L2 norm.")]
    modality: Annotated[str, Field(description="What was embedded: text.")]


@opened
class ResponseMeta(TypedDict, total=False):
    """``options.return_meta``: which model answered, how, and how long this request took.

    A family sets only its own keys (classify ``head``, embeddings
    ``representation``, a decisions readout's ``method``, ``questions``, ...); the
    runtime adds the model's identity and the timings. Keys not listed here are
    Extensions: a 2.3 client ignores them.
    """

    model_id: Annotated[str | None, Field(description="The served model's id (the card's id).")]
    revision: Annotated[
        str | None,
        Field(description="The 40-hex commit of the weights; null for a local package."),
    ]
    model_sha256: Annotated[str | None, Field(description="The card's model_sha256.")]
    profile: Annotated[
        str | None,
        Field(description="The numeric profile answered in (exact, batching, max_speed, ...)."),
    ]
    numerics: Annotated[
        str | None,
        Field(
            description="exact (the model's own outputs), or approximate (a zero-shot "
            "readout, such as decisions answered from an embedder's similarities)."
        ),
    ]
    engine: str | None
    accelerator: str | None
    device: str | None
    queue_ms: Annotated[
        float | None,
        Field(description="This request's wait from admission to its first forward, ms."),
    ]
    compute_ms: Annotated[
        float | None, Field(description="Time of the forwards this request's rows ran in, ms.")
    ]
    head: Annotated[str | None, Field(description="Classify: the head that answered.")]
    representation: Annotated[
        Representation | None, Field(description="Embeddings: what the vectors are.")
    ]


# -- embeddings -------------------------------------------------------------------------------
@closed
class Embedding(TypedDict):
    object: Literal["embedding"]
    index: int
    embedding: Annotated[
        list[float] | str,
        Field(description="Floats, or (encoding_format base64) their little-endian float32 bytes."),
    ]
    input: InputUsage


@closed
class EmbeddingError(ItemError):
    object: Literal["embedding"]


@closed
class EmbeddingsAnswer(TypedDict):
    """A family's embeddings answer: the response without ``model``."""

    object: Literal["list"]
    data: list[Embedding | EmbeddingError]
    usage: EmbeddingsUsage
    meta: NotRequired[ResponseMeta]


@closed
class EmbeddingsResponse(EmbeddingsAnswer):
    """OpenAI's embeddings response, one item per input in input order."""

    model: str


# -- classify ---------------------------------------------------------------------------------
@closed
class Span(TypedDict):
    start: Annotated[int, Field(description="Unicode code point, inclusive.")]
    end: Annotated[int, Field(description="Unicode code point, exclusive.")]
    text: str
    label: str
    probability: float
    source: NotRequired[
        Annotated[
            Literal["model", "pattern"],
            Field(
                description="Extension (a 2.3 client ignores it), on models a pattern "
                "extension augments: model (the token head) or pattern (a validated "
                "pattern recognizer)."
            ),
        ]
    ]
    recognizer: NotRequired[
        Annotated[
            str | None,
            Field(
                description="Extension: the pattern recognizer that found the span "
                "(Presidio's class name, e.g. CreditCardRecognizer); null for the model's "
                "spans."
            ),
        ]
    ]


@closed
class ClassifyWindow(TypedDict):
    """One window of an input read with options.overflow window."""

    start: Annotated[
        int, Field(description="First content token of the window (special tokens not counted).")
    ]
    end: Annotated[int, Field(description="Content token after the window's last (exclusive).")]
    probabilities: NotRequired[
        Annotated[
            list[float], Field(description="Sequence heads: this window's label distribution.")
        ]
    ]
    scores: NotRequired[
        Annotated[
            list[float],
            Field(description="Scores heads: this window's label scores (relevance: its score)."),
        ]
    ]


@closed
class TokenProbabilities(TypedDict):
    """One content token of a token head's input (options.return_tokens)."""

    start: Annotated[int, Field(description="Unicode code point, inclusive.")]
    end: Annotated[int, Field(description="Unicode code point, exclusive.")]
    probabilities: Annotated[
        list[float],
        Field(
            description="Per label, in labels order: P(B-label) + P(I-label); 1 minus their "
            "sum is the chance the token is outside every entity."
        ),
    ]


@closed
class ClassifyResult(TypedDict):
    """One input's readout: what its head kind gives (a sequence head ``label`` and
    ``probabilities``; a scores head ``scores`` and, with a threshold, ``selected``; a
    token head ``spans``; a relevance head ``scores``)."""

    index: int
    input: InputUsage
    label: NotRequired[str]
    probabilities: NotRequired[list[float]]
    scores: NotRequired[list[float]]
    selected: NotRequired[list[str]]
    spans: NotRequired[list[Span]]
    tokens: NotRequired[list[TokenProbabilities]]
    windows: NotRequired[
        Annotated[
            list[ClassifyWindow],
            Field(
                description="options.overflow window: every window, in order; the result "
                "merges them (a label's maximum; a token's most central window)."
            ),
        ]
    ]


ClassifyKind = Literal["sequence", "scores", "token", "relevance"]
"""A classify head's kind; ``relevance`` (a cross-encoder scoring pairs) is an Extension."""


@closed
class ClassifyAnswer(TypedDict):
    """A family's classify answer: the response without ``model``."""

    head: str
    kind: Annotated[
        ClassifyKind,
        Field(
            description="relevance (a cross-encoder scoring pairs) is an Extension: a 2.3 "
            "client reads its scores as a scores head's."
        ),
    ]
    labels: list[str]
    results: list[ClassifyResult | ItemError]
    usage: Usage
    meta: NotRequired[ResponseMeta]


@closed
class ClassifyResponse(ClassifyAnswer):
    """A head's readout of each input, in input order."""

    model: str


# -- rerank -----------------------------------------------------------------------------------
@closed
class RerankResult(TypedDict):
    index: int
    relevance_score: Annotated[
        float,
        Field(
            description="A cross-encoder: the sigmoid of its logit, 0 to 1. A bi-encoder: the "
            "cosine of the query's and the document's embeddings, -1 to 1."
        ),
    ]
    logit: Annotated[
        float, Field(description="A cross-encoder: its raw logit. A bi-encoder: the cosine again.")
    ]
    document: NotRequired[str]
    input: Annotated[
        InputUsage,
        Field(description="The pair's tokens (a cross-encoder) or the document's (a bi-encoder)."),
    ]


@closed
class RerankAnswer(TypedDict):
    """A family's rerank answer: the response without ``model``."""

    results: list[RerankResult | ItemError]
    usage: Usage
    meta: NotRequired[ResponseMeta]


@closed
class RerankResponse(RerankAnswer):
    """Documents by descending relevance; failed documents after every scored one."""

    model: str


# -- builders ---------------------------------------------------------------------------------
def input_usage(
    tokens: int, processed_tokens: int | None = None, truncated: bool = False, windows: int = 1
) -> InputUsage:
    """An input's ``input`` object (:class:`InputUsage`), every count an int; by default an
    input read whole as one row (``processed_tokens`` = ``tokens``)."""
    return {
        "tokens": int(tokens),
        "processed_tokens": int(tokens if processed_tokens is None else processed_tokens),
        "truncated": bool(truncated),
        "windows": int(windows),
    }


def item_error(index: int, code: ItemErrorCode, message: str) -> ItemError:
    """An input that failed alone, answered in its place (:class:`ItemError`)."""
    return {"index": index, "error": code, "message": message}


def embedding_item(index: int, vector: list[float] | str, usage: InputUsage) -> Embedding:
    """One embeddings ``data`` item: the vector (floats, or base64 float32 bytes) of input
    ``index`` and what it used."""
    return {"object": "embedding", "index": index, "embedding": vector, "input": usage}


def embedding_error(index: int, code: ItemErrorCode, message: str) -> EmbeddingError:
    """One embeddings ``data`` item for an input that failed alone."""
    return {"object": "embedding", "index": index, "error": code, "message": message}


def embeddings_answer(
    per_input: Sequence[tuple[list[float] | str, InputUsage] | RowError],
) -> EmbeddingsAnswer:
    """An embeddings answer from each input's outcome, in input order.

    Args:
        per_input: per input, its vector (floats, or base64 float32 bytes) and what it
            used (:func:`input_usage`), or the :class:`~vllm_srun.plugins.spec.RowError`
            it failed with (refused by ``plan``, or its forward failed).

    Returns:
        ``{"object": "list", "data", "usage"}``: an :class:`Embedding` per answered
        input, an :class:`EmbeddingError` in the place of a failed one, and a vector
        holding NaN or infinity answered ``invalid_model_output`` (a body never holds
        them); ``usage`` counts the answered inputs' ``processed_tokens``.
    """
    data: list[Embedding | EmbeddingError] = []
    used = 0
    for index, outcome in enumerate(per_input):
        if isinstance(outcome, RowError):
            data.append(embedding_error(index, outcome.code, outcome.message))
            continue
        vector, read = outcome
        if not isinstance(vector, str) and not all(math.isfinite(v) for v in vector):
            data.append(
                embedding_error(index, "invalid_model_output", "the embedding is not finite")
            )
            continue
        data.append(embedding_item(index, vector, read))
        used += read["processed_tokens"]
    return {"object": "list", "data": data, "usage": embeddings_usage(used)}


def usage(input_tokens: int) -> Usage:
    """The ``usage`` of a classify, rerank or decisions answer: the tokens read, and 0
    generated."""
    return {"input_tokens": int(input_tokens), "output_tokens": 0}


def embeddings_usage(tokens: int) -> EmbeddingsUsage:
    """OpenAI's embeddings ``usage``: ``prompt_tokens`` and ``total_tokens``, both ``tokens``."""
    return {"prompt_tokens": int(tokens), "total_tokens": int(tokens)}


SurfaceAnswer = EmbeddingsAnswer | ClassifyAnswer | RerankAnswer
"""What an encoder family's ``finish`` returns (decision families: ``DecisionsAnswer``)."""

__all__ = [
    "ClassifyAnswer",
    "ClassifyKind",
    "ClassifyResponse",
    "ClassifyResult",
    "ClassifyWindow",
    "Embedding",
    "EmbeddingError",
    "EmbeddingsAnswer",
    "EmbeddingsResponse",
    "EmbeddingsUsage",
    "ErrorBody",
    "ErrorResponse",
    "InputUsage",
    "ItemError",
    "Representation",
    "RerankAnswer",
    "RerankResponse",
    "RerankResult",
    "ResponseMeta",
    "Span",
    "SurfaceAnswer",
    "TokenProbabilities",
    "Usage",
    "closed",
    "embedding_error",
    "embedding_item",
    "embeddings_answer",
    "embeddings_usage",
    "input_usage",
    "item_error",
    "opened",
    "usage",
]
