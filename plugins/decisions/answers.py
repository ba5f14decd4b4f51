"""The answer shapes of System One questions, as types: what a decision family returns.

A decision family's ``finish`` returns a :class:`DecisionsAnswer` (the
``/v1/decisions`` response without ``model``); each question answers with a
:class:`ChoiceAnswer`, :class:`NoulAnswer`, :class:`ScoreAnswer` or, alone,
:class:`FailedAnswer`. The builders in :mod:`.readout` write them; the runtime's
OpenAPI document is generated from these classes (see
:mod:`vllm_srun.plugins.responses` for the convention).
"""

from __future__ import annotations

from typing import Annotated, Literal, NotRequired, TypeAlias

from pydantic import Field
from typing_extensions import TypedDict

from vllm_srun.plugins.responses import ResponseMeta, closed, opened

QuestionType: TypeAlias = Literal["choice", "noul", "score"]
"""A System One question type (:data:`~.questions.QUESTION_TYPES`)."""

QuestionError: TypeAlias = Literal[
    "invalid_question",
    "max_length_exceeded",
    "deadline_exceeded",
    "invalid_model_output",
    "unavailable",
]
"""A failed question's code (:data:`~.questions.QUESTION_ERRORS`)."""


@closed
class ChoiceAnswer(TypedDict):
    type: Literal["choice"]
    choice: str
    probabilities: dict[str, float]
    confidence: Annotated[float, Field(description="1 - normalised entropy of the probabilities.")]


@closed
class NoulAnswer(TypedDict):
    type: Literal["noul"]
    noul: Annotated[float, Field(description="P(true).")]


@closed
class ScoreAnswer(TypedDict):
    type: Literal["score"]
    score: Annotated[
        float,
        Field(description="The expected level, levels numbered from 0 (0 <= score <= N-1)."),
    ]
    probabilities: dict[str, float]
    confidence: float
    legend: dict[str, str | None]


@closed
class FailedAnswer(TypedDict):
    type: QuestionType | None
    error: QuestionError
    message: str


QuestionAnswer: TypeAlias = ChoiceAnswer | NoulAnswer | ScoreAnswer | FailedAnswer
"""One question's answer, or why it alone failed."""


@closed
class DecisionUsage(TypedDict):
    """The tokens one state and its questions read (``output_tokens``: always 0, nothing
    is generated)."""

    input_tokens: int
    output_tokens: int


@closed
class QuestionReadout(TypedDict):
    """How one question's answer was read out of a decoder (``meta.questions``)."""

    labels: Annotated[list[str], Field(description="The option labels shown, in order.")]
    tokens: Annotated[list[str], Field(description="The text each label was read as.")]
    temperature: float


@opened
class DecisionsMeta(ResponseMeta, total=False):
    """What a decision family puts in an answer's ``meta``: how it read the answers out
    (Extensions: a 2.3 client ignores them; the answer's ``meta`` is documented as
    :class:`~vllm_srun.plugins.responses.ResponseMeta`, which allows them)."""

    method: Annotated[str, Field(description="How the answers were read out.")]
    readout: str
    template: str
    shared_context: bool
    prefix_tokens: int
    temperature: dict[str, float]
    questions: dict[str, QuestionReadout]


@closed
class StateMeta(TypedDict, total=False):
    """``meta`` of one ``states`` entry: how its questions were read out."""

    questions: dict[str, QuestionReadout]


@closed
class StateAnswer(TypedDict):
    """One ``states`` entry as a family answers it: as its own request would be."""

    answers: dict[str, QuestionAnswer]
    usage: Annotated[
        DecisionUsage, Field(description="The tokens this entry read, and only this entry.")
    ]
    meta: NotRequired[StateMeta]


@closed
class IndexedStateAnswer(StateAnswer):
    """An entry of a ``states`` array, answered in the same place."""

    index: Annotated[int, Field(description="The entry's position in the request's states.")]


DECISIONS_USAGE = (
    "The tokens the request's own state and questions read; each states entry reports its "
    "own usage (their sum is what the whole request read)."
)
STATES = (
    "Each states entry's answer, in the form the request's states had: an object under the "
    "same names, or an array with each entry's index."
)


@closed
class DecisionsAnswer(TypedDict):
    """A decision family's answer: the ``/v1/decisions`` response without ``model``."""

    answers: dict[str, QuestionAnswer]
    usage: Annotated[DecisionUsage, Field(description=DECISIONS_USAGE)]
    states: NotRequired[
        Annotated[dict[str, StateAnswer] | list[IndexedStateAnswer], Field(description=STATES)]
    ]
    meta: NotRequired[ResponseMeta]


@closed
class AnsweredDecisions(DecisionsAnswer):
    """A decisions answer with the ``model`` that gave it: what the runtime answers
    before the route puts it in its own shape (:class:`DecisionsResponse`, each
    ``states`` entry naming the model too; or a System One batch)."""

    model: str


@closed
class DecisionStateResponse(StateAnswer):
    """One ``states`` entry answered as its own request would be."""

    model: Annotated[str, Field(description="The model that answered the entry.")]


@closed
class DecisionStateAnswers(IndexedStateAnswer):
    """An entry of a ``states`` array, answered in the same place."""

    model: Annotated[str, Field(description="The model that answered the entry.")]


@closed
class DecisionsResponse(TypedDict):
    """Each question's answer, in request order; each ``states`` entry names the model
    that answered it (the runtime adds ``model`` to the family's answer)."""

    model: str
    answers: dict[str, QuestionAnswer]
    usage: Annotated[DecisionUsage, Field(description=DECISIONS_USAGE)]
    states: NotRequired[
        Annotated[
            dict[str, DecisionStateResponse] | list[DecisionStateAnswers],
            Field(description=STATES),
        ]
    ]
    meta: NotRequired[ResponseMeta]


__all__ = [
    "AnsweredDecisions",
    "ChoiceAnswer",
    "DecisionStateAnswers",
    "DecisionStateResponse",
    "DecisionUsage",
    "DecisionsAnswer",
    "DecisionsMeta",
    "DecisionsResponse",
    "FailedAnswer",
    "IndexedStateAnswer",
    "NoulAnswer",
    "QuestionAnswer",
    "QuestionError",
    "QuestionReadout",
    "QuestionType",
    "ScoreAnswer",
    "StateAnswer",
    "StateMeta",
]
