"""The typed request of each surface: what a family's ``plan`` receives.

The serving layer validates every HTTP body into one of these classes once:
pydantic checks each field's type and range (the OpenAPI document is generated
from the same classes), and :meth:`SurfaceBody.check` applies the few rules a
JSON Schema cannot state (a non-empty ``input``). A family then checks only
what depends on its model: ``dimensions`` against its size, ``head`` against
its heads, token counts against its limit.

``/v1/decisions`` bodies are read from their raw bytes instead (a duplicated
key must be caught before a JSON parser drops it, and a bad question fails
only itself): their typed request is
:class:`vllm_srun.plugins.decisions.DecisionsRequest`.

Callers without HTTP (the conformance kit, calibration, tests) build the same
objects from a parsed JSON body with :func:`read_request`.

Why this module is over 400 lines: it is the request half of the contract,
one pydantic class per JSON shape with the rules and the wording of their
errors beside them, read top to bottom against the OpenAPI document; split,
one request's rules would sit in several files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import PydanticCustomError

from vllm_srun.plugins.decisions import DecisionsRequest, parse_request
from vllm_srun.plugins.profiles import PROFILE_NAME, not_a_profile_name
from vllm_srun.plugins.spec import RequestError, clip, listed

Overflow = Literal["reject", "truncate", "window"]
"""What happens to an input longer than the model's limit: ``reject`` (an item
error naming both counts), ``truncate`` (keep the beginning) or ``window``
(overlapping windows, merged back by the head)."""

OVERFLOW_MODES: tuple[Overflow, ...] = get_args(Overflow)
"""Every :data:`Overflow` mode, the default (``reject``) first."""

Aggregation = Literal["max", "first", "average", "none"]
"""How a token head's word pieces become word labels (the Hugging Face
token-classification pipeline's ``aggregation_strategy`` names; ``max`` default)."""

AGGREGATIONS: tuple[Aggregation, ...] = get_args(Aggregation)

EncodingFormat = Literal["float", "base64"]
"""OpenAI's ``encoding_format``: a JSON array of floats, or the little-endian
float32 bytes in base64."""

Milliseconds = StrictFloat
"""A duration in ms: a JSON number (an integer too), never a string or a boolean
(``true`` is not 1 ms)."""

ProfileName = Annotated[str, Field(pattern=PROFILE_NAME.pattern)]
"""A numeric profile's name (``exact``, ``batching``, ``max_speed``): lower-case letters,
digits and ``_`` (:data:`vllm_srun.plugins.profiles.PROFILE_NAME`)."""


class Strict(BaseModel):
    """Unknown fields are an error: a typo must not be silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class WindowOptions(Strict):
    """How ``overflow: window`` cuts an input (both default to the model's choice)."""

    tokens: StrictInt | None = Field(
        default=None, ge=1, description="Window length in tokens, specials included."
    )
    overlap: StrictInt | None = Field(
        default=None, ge=0, description="Content tokens neighbouring windows share."
    )


class InputOptions(Strict):
    """``options`` every text surface takes."""

    overflow: Overflow = Field(
        default="reject",
        description="An input over the model's limit: reject (the item error "
        "max_length_exceeded), truncate (keep the beginning) or window (overlapping windows; "
        "Extension on embeddings and rerank: a 2.3 client ignores it there).",
    )
    max_tokens: StrictInt | None = Field(
        default=None,
        ge=1,
        description="reject and truncate: a lower limit than the model's (with truncate it "
        "must leave room for the model's special tokens: 3 or more for BERT-style models); "
        "window: the scan budget in content tokens (default 32768).",
    )
    window: WindowOptions | None = None
    deadline_ms: Milliseconds | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Answer within this many ms, or deadline_exceeded.",
    )
    return_meta: StrictBool | None = Field(
        default=None,
        description="true: the response carries meta, the model's identity (model_id, "
        "revision, model_sha256, profile, numerics, engine, accelerator, device), this "
        "request's queue_ms and compute_ms, and the surface's own keys (classify: head; "
        "embeddings: representation).",
    )
    profile: ProfileName | None = Field(
        default=None,
        description="The numerics profile the request expects; it must be the one the model "
        'was loaded with (only "exact" exists), else 400 invalid_request.',
    )

    @property
    def meta(self) -> bool:
        """``return_meta`` (``null`` and absent are false)."""
        return bool(self.return_meta)


class ClassifyOptions(InputOptions):
    """``/v1/classify`` options: input options plus the heads' readout settings."""

    threshold: StrictFloat | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    aggregation: Aggregation | None = Field(
        default=None,
        description="Extension (a 2.3 client ignores it): how a token head's word pieces "
        "become word labels (max, first, average, none).",
    )
    patterns: StrictBool | None = Field(
        default=None,
        description="Extension (a 2.3 client ignores it): false leaves out the pii_patterns "
        "recognizers' spans on a model that has them (the card's extensions); default true.",
    )
    return_tokens: StrictBool | None = Field(
        default=None,
        description="Token heads: each result lists tokens, every content token's code-point "
        "start and end with its probability per label (in labels order). Other heads ignore it.",
    )


class SurfaceBody(BaseModel):
    """What every surface request has: ``model`` and ``options.deadline_ms``."""

    surface: ClassVar[str]
    model: str | None = None
    options: InputOptions | None = None

    @property
    def deadline_ms(self) -> float | None:
        """``options.deadline_ms`` (ms), or ``None``."""
        return None if self.options is None else self.options.deadline_ms

    @property
    def input_options(self) -> InputOptions:
        """``options``, or the defaults when absent."""
        return self.options if self.options is not None else InputOptions()

    @property
    def input_count(self) -> int:
        """How many inputs (rerank: documents) the request holds."""
        raise NotImplementedError

    def check(self) -> None:
        """The rules a JSON Schema does not state (none here).

        Raises:
            RequestError: ``invalid_request`` naming the field and the fix.
        """


RULE = "request_rule"
"""The pydantic error type of a rule worded whole (its message names the field)."""


def _is_id(value: Any) -> bool:
    return type(value) is int and value >= 0


PART_FIELDS: dict[str, tuple[str, ...]] = {
    "text": ("type", "text"),
    "image_url": ("type", "image_url"),
    "input_audio": ("type", "input_audio"),
}
"""The content part types an embeddings input may be, each with its fields."""

PART_OBJECT_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "image_url": (("url",), ("url", "detail")),
    "input_audio": (("data", "format"), ("data", "format")),
}
"""The object inside an ``image_url`` or ``input_audio`` part: required and known keys
(every value a string)."""


def _part_problem(item: dict[str, Any], where: str) -> str | None:
    """What is wrong with one content part ``item`` at ``where`` (``input[2]``), or ``None``."""
    if "type" not in item:
        return (
            f'{where}.type is missing; a content part is {{"type": "text", "text": "..."}} '
            f"(or {', '.join(t for t in PART_FIELDS if t != 'text')})"
        )
    kind = item["type"]
    if not isinstance(kind, str) or kind not in PART_FIELDS:
        shown = clip(kind) if isinstance(kind, str) else json.dumps(kind)[:40]
        return (
            f"{where}.type {shown!r} is not a content part type; send one of "
            f"{', '.join(PART_FIELDS)}"
        )
    fields = PART_FIELDS[kind]
    extra = [key for key in item if key not in fields]
    if extra:
        return (
            f"{where}.{clip(extra[0])}: not a field of a {kind} part (it has {', '.join(fields)})"
        )
    if kind == "text":
        return None if isinstance(item.get("text"), str) else f"{where}.text must be a string"
    required, known = PART_OBJECT_FIELDS[kind]
    inner = item.get(kind)
    shape = "{" + ", ".join(f'"{key}": "..."' for key in required) + "}"
    if not isinstance(inner, dict):
        return f"{where}.{kind} must be an object {shape}"
    unknown = [key for key in inner if key not in known]
    if unknown:
        return (
            f"{where}.{kind}.{clip(unknown[0])}: not a field of {kind} (it has {', '.join(known)})"
        )
    for key in known:
        if (key in required or inner.get(key) is not None) and not isinstance(inner.get(key), str):
            return f"{where}.{kind}.{key} must be a string"
    return None


def _texts_rule(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """``input`` of embeddings: one message naming the first bad item (``input[2].type``),
    instead of one per member of the union (and per token id)."""
    try:
        return handler(value)
    except ValidationError:
        if not isinstance(value, list):
            raise PydanticCustomError(RULE, "input must be a string or a non-empty list") from None
        textual = bool(value) and isinstance(value[0], str | dict)
        for index, item in enumerate(value):
            where = f"input[{index}]"
            if isinstance(item, dict):
                problem = _part_problem(item, where)
                if problem is not None:
                    raise PydanticCustomError(RULE, problem) from None
            elif textual:
                if isinstance(item, str):
                    continue
                raise PydanticCustomError(
                    RULE,
                    f'{where} must be a string or a content part {{"type": "text", "text": "..."}}',
                ) from None
            elif isinstance(item, list):
                bad = next((j for j, i in enumerate(item) if not _is_id(i)), None)
                if bad is not None:
                    raise PydanticCustomError(
                        RULE, f"{where}[{bad}] must be a token id (an integer >= 0)"
                    ) from None
            elif not _is_id(item):
                raise PydanticCustomError(
                    RULE,
                    f"{where} must be a string, a content part, a token id (an integer >= 0) or "
                    "a list of token ids; send texts or token ids, not both",
                ) from None
        raise PydanticCustomError(
            RULE,
            "input must hold texts (strings or content parts), token ids, or lists of token "
            "ids: one kind",
        ) from None


def _pairs_rule(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """``input`` of classify: one message naming the first bad item."""
    try:
        return handler(value)
    except ValidationError:
        if not isinstance(value, list):
            raise PydanticCustomError(RULE, "input must be a string or a non-empty list") from None
        for index, item in enumerate(value):
            if isinstance(item, dict) and isinstance(item.get("text"), str):
                if set(item) - {"text", "text_pair"}:
                    extra = sorted(set(item) - {"text", "text_pair"})[0]
                    raise PydanticCustomError(
                        RULE, f"input[{index}].{extra}: not a field of this request"
                    ) from None
                if not isinstance(item.get("text_pair", ""), str | None):
                    raise PydanticCustomError(
                        RULE, f"input[{index}].text_pair must be a string"
                    ) from None
            elif not isinstance(item, str):
                raise PydanticCustomError(
                    RULE, f"input[{index}] must be a string or {{text, text_pair}}"
                ) from None
        raise


def _non_empty(value: str | list[Any]) -> None:
    """One rule on every surface: the list of inputs a request asks about is never
    empty (``input`` of embeddings and classify, ``documents`` of rerank, the
    questions of a decisions request); an empty one is 400 ``invalid_request``."""
    if isinstance(value, list) and not value:
        raise RequestError("invalid_request", "input must be a string or a non-empty list", "input")


TokenId = Annotated[StrictInt, Field(ge=0)]
"""A token id of the model's vocabulary (checked against its size by the model)."""


class TextPart(Strict):
    """An input given as a content part: ``{"type": "text", "text": "..."}``."""

    type: Literal["text"]
    text: str

    @property
    def modality(self) -> str:
        """``text``."""
        return "text"


class ImageUrl(Strict):
    """Where an image is: an ``https:`` or ``data:`` URL."""

    url: str
    detail: str | None = None


class ImageUrlPart(Strict):
    """An image input: ``{"type": "image_url", "image_url": {"url": "..."}}``."""

    type: Literal["image_url"]
    image_url: ImageUrl

    @property
    def modality(self) -> str:
        """``image``."""
        return "image"


class InputAudio(Strict):
    """Audio bytes in base64 and their ``format`` (``wav``)."""

    data: str
    format: str


class InputAudioPart(Strict):
    """An audio input: ``{"type": "input_audio", "input_audio": {"data", "format"}}``."""

    type: Literal["input_audio"]
    input_audio: InputAudio

    @property
    def modality(self) -> str:
        """``audio``."""
        return "audio"


ContentPart = Annotated[TextPart | ImageUrlPart | InputAudioPart, Field(discriminator="type")]
"""One embeddings input as a content part; its ``modality`` is ``text``, ``image`` or
``audio``. A model embeds the modalities its card's ``embedding.modalities`` lists."""


class EmbeddingsRequest(SurfaceBody):
    """OpenAI-compatible; unknown OpenAI fields (``user``) are accepted and ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    surface: ClassVar[str] = "embeddings"

    input: Annotated[
        str | list[str] | list[str | ContentPart] | list[TokenId] | list[list[TokenId]],
        WrapValidator(_texts_rule),
    ] = Field(
        description="A text, a list of inputs each a text or a content part "
        '({"type": "text", "text": "..."}; image_url and input_audio parts fail as items on '
        "a model whose embedding.modalities lack them), one input as token ids (a list of "
        "integers: the whole row, special tokens included, as the model's tokenizer gives it), "
        "or several (a list of such lists)."
    )
    model: str | None = None
    dimensions: StrictInt | None = Field(
        default=None,
        ge=1,
        description="Keep the first this many dimensions (re-normalised when the model "
        "normalises); at most the exit's dimension.",
    )
    layer: StrictInt | None = Field(
        default=None,
        description="The exit (layer) to read; it must be one of the card's embedding.layers "
        "(the model's last layer), else 400 naming them. Default: the model's exit.",
    )
    input_type: Literal["query", "document"] | None = Field(
        default=None,
        description="What the inputs are; a symmetric embedder (the card's "
        "embedding.input_types) embeds both alike.",
    )
    encoding_format: EncodingFormat = "float"
    truncate: StrictBool | None = Field(
        default=None,
        description="Extension (a 2.3 client ignores it): Text Embeddings Inference's "
        "spelling, true is options.overflow truncate, false is reject.",
    )
    options: InputOptions | None = None

    @property
    def token_ids(self) -> list[list[int]] | None:
        """``input`` as rows of token ids, or ``None`` when it holds texts."""
        if not isinstance(self.input, list) or not self.input:
            return None
        first = self.input[0]
        if isinstance(first, int):
            return [[int(i) for i in self.input if isinstance(i, int)]]
        if isinstance(first, list):
            return [list(row) for row in self.input if isinstance(row, list)]
        return None

    @property
    def contents(self) -> list[str | TextPart | ImageUrlPart | InputAudioPart]:
        """Each input when ``input`` holds texts: a string or a content part, in order
        (empty when it holds token ids)."""
        if isinstance(self.input, str):
            return [self.input]
        return [
            item
            for item in self.input
            if isinstance(item, str | TextPart | ImageUrlPart | InputAudioPart)
        ]

    @property
    def texts(self) -> list[str]:
        """The text of every text input (a string or a text part), in order; empty when
        ``input`` holds token ids. Image and audio parts are left out: see :attr:`contents`."""
        return [
            item if isinstance(item, str) else item.text
            for item in self.contents
            if isinstance(item, str | TextPart)
        ]

    @property
    def input_count(self) -> int:
        """How many inputs: rows of token ids, or texts and content parts."""
        rows = self.token_ids
        return len(rows) if rows is not None else len(self.contents)

    @property
    def plain(self) -> bool:
        """Whether the request is in OpenAI's plain form (no ``options``): an unusable
        input then fails the request with 400, as OpenAI does, instead of answering
        an item error in its place."""
        return self.options is None

    @property
    def input_options(self) -> InputOptions:
        """``options`` with ``truncate`` read as ``overflow``; the defaults when absent."""
        options = self.options if self.options is not None else InputOptions()
        if self.truncate is None or "overflow" in options.model_fields_set:
            return options
        return options.model_copy(update={"overflow": "truncate" if self.truncate else "reject"})

    def check(self) -> None:
        """``input`` is not empty (nor any list of token ids in it); ``truncate``
        agrees with ``options.overflow`` when both are given.

        Raises:
            RequestError: ``invalid_request``.
        """
        _non_empty(self.input)
        for index, row in enumerate(self.token_ids or ()):
            if not row:
                raise RequestError(
                    "invalid_request", f"input[{index}] is an empty list of token ids"
                )
        options = self.options
        if (
            self.truncate is not None
            and options is not None
            and (
                "overflow" in options.model_fields_set
                and options.overflow != ("truncate" if self.truncate else "reject")
            )
        ):
            raise RequestError(
                "invalid_request",
                f"truncate {str(self.truncate).lower()} and options.overflow {options.overflow} "
                "disagree; send one of them",
            )


class TextPair(Strict):
    """A text and, for a pair head (sequence, scores, relevance), its second text."""

    text: str
    text_pair: str | None = None


class ClassifyRequest(SurfaceBody, Strict):
    """``/v1/classify``: texts (or pairs) for one head."""

    surface: ClassVar[str] = "classify"

    input: Annotated[str | list[str | TextPair], WrapValidator(_pairs_rule)]
    model: str | None = None
    head: str | None = None
    options: ClassifyOptions | None = None

    @property
    def pairs(self) -> list[TextPair]:
        """``input`` as a list of :class:`TextPair` (plain texts have no pair)."""
        if isinstance(self.input, str):
            return [TextPair(text=self.input)]
        return [p if isinstance(p, TextPair) else TextPair(text=p) for p in self.input]

    @property
    def input_count(self) -> int:
        """How many inputs (a single text is one)."""
        return 1 if isinstance(self.input, str) else len(self.input)

    @property
    def classify_options(self) -> ClassifyOptions:
        """``options``, or the defaults when absent."""
        return self.options if self.options is not None else ClassifyOptions()

    def check(self) -> None:
        """``input`` is not an empty list.

        Raises:
            RequestError: ``invalid_request``.
        """
        _non_empty(self.input)


class RerankRequest(SurfaceBody, Strict):
    """``/v1/rerank``: documents to order by relevance to a query."""

    surface: ClassVar[str] = "rerank"

    query: str
    documents: list[str]
    model: str | None = None
    top_n: StrictInt | None = Field(default=None, ge=1)
    return_documents: StrictBool = False
    layer: StrictInt | None = Field(
        default=None,
        description="The exit (layer) to score at; it must be one of the card's rerank.exits, "
        "else 400 naming them. Default: rerank.default.",
    )
    dimensions: StrictInt | None = Field(
        default=None,
        ge=1,
        description="The dimension of that exit (the card's rerank.exits); another is 400.",
    )
    options: InputOptions | None = None

    @property
    def input_count(self) -> int:
        """How many documents."""
        return len(self.documents)

    def check(self) -> None:
        """``documents`` is not empty: like every surface's inputs (see :func:`_non_empty`).

        Raises:
            RequestError: ``invalid_request``.
        """
        if not self.documents:
            raise RequestError("invalid_request", "documents must be a non-empty list", "documents")


TextRequest = EmbeddingsRequest | ClassifyRequest | RerankRequest
"""The pydantic-validated requests (every surface but decisions)."""

SurfaceRequest = TextRequest | DecisionsRequest
"""What a family's ``plan`` receives."""

TEXT_REQUESTS: dict[str, type[TextRequest]] = {
    "embeddings": EmbeddingsRequest,
    "classify": ClassifyRequest,
    "rerank": RerankRequest,
}
"""The request class of each pydantic-validated surface."""


PROFILE_NAME_ERRORS = ("string_pattern_mismatch", "string_type")
"""pydantic's error types for a request's profile that is not a profile name."""


def validation_problems(errors: list[Any]) -> str:
    """pydantic's errors as one line: ``location: what is wrong`` per problem, ``; ``-joined.

    ``errors`` is ``ValidationError.errors()`` (or FastAPI's, whose locations
    start with ``body``, left out here). The first :data:`~vllm_srun.plugins.spec.PROBLEMS_SHOWN`
    distinct problems are listed, then ``and N more``: the message never grows
    with the request (2,048 bad token ids are 5 lines and a count).
    """
    problems = []
    for error in errors:
        location = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
        if error.get("type") == RULE:
            problems.append(str(error.get("msg")))
            continue
        if error.get("type") == "extra_forbidden":
            problems.append(f"{location}: not a field of this request (check the spelling)")
            continue
        if location == "" and error.get("type") in ("model_attributes_type", "dict_type"):
            problems.append(
                "the body must be a JSON object; send it with content-type: application/json"
            )
            continue
        if location == "" and error.get("type") == "missing":
            problems.append("the body is empty; send a JSON object")
            continue
        if location.endswith(".profile") and error.get("type") in (
            "string_pattern_mismatch",
            "string_type",
        ):
            problems.append(not_a_profile_name(location, error.get("input")))
            continue
        if error.get("type") == "json_invalid":
            context = error.get("ctx", {}).get("error", "")
            problems.append(f"malformed JSON: {context}".rstrip(": "))
            continue
        problems.append(f"{location or 'body'}: {error.get('msg', 'invalid')}")
    return listed([clip(p, 300) for p in dict.fromkeys(problems)]) or "invalid request"


def read_request(surface: str, body: Mapping[str, Any] | SurfaceRequest) -> SurfaceRequest:
    """The typed request of ``surface`` from a parsed JSON body (a typed one passes through).

    Args:
        surface: ``embeddings``, ``classify``, ``rerank`` or ``decisions``.
        body: the JSON object, as ``json.loads`` returns it.

    Raises:
        RequestError: ``invalid_request`` with the problems (as the HTTP
            surface words them); ``unsupported_surface`` for an unknown surface.
    """
    if isinstance(body, (BaseModel, DecisionsRequest)):
        return body
    if surface == "decisions":
        return parse_request(body)
    model = TEXT_REQUESTS.get(surface)
    if model is None:
        raise RequestError("unsupported_surface", f"no surface named {surface!r}")
    if not isinstance(body, Mapping):
        raise RequestError("invalid_request", "the request must be a JSON object")
    try:
        request = model.model_validate(body)
    except ValidationError as err:
        raise RequestError("invalid_request", validation_problems(err.errors())) from err
    request.check()
    return request


__all__ = [
    "AGGREGATIONS",
    "OVERFLOW_MODES",
    "PART_FIELDS",
    "TEXT_REQUESTS",
    "Aggregation",
    "ClassifyOptions",
    "ClassifyRequest",
    "ContentPart",
    "EmbeddingsRequest",
    "EncodingFormat",
    "ImageUrl",
    "ImageUrlPart",
    "InputAudio",
    "InputAudioPart",
    "InputOptions",
    "Milliseconds",
    "Overflow",
    "ProfileName",
    "RerankRequest",
    "Strict",
    "SurfaceBody",
    "SurfaceRequest",
    "TextPair",
    "TextPart",
    "TextRequest",
    "WindowOptions",
    "read_request",
    "validation_problems",
]
