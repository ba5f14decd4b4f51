"""The parsed form of a decisions request: questions, state entries, the request itself.

:func:`~vllm_srun.plugins.decisions.parse_request` (in :mod:`.schema`) builds
these from a body; a family reads them to plan its rows and hands a
:class:`Question` back to :func:`~vllm_srun.plugins.decisions.answer`:

- :class:`DecisionsRequest`: the options and one :class:`StateEntry` per state
  (the top-level ``state`` first, then each ``states`` entry);
- :class:`StateEntry`: the state as sent and its questions in request order,
  each a :class:`Question` or, when it broke the schema, an
  :class:`InvalidQuestion` that answers ``invalid_question`` in its place;
- :class:`Question`: name, type, instructions and its :class:`Option` tuple in
  readout order (one logit per option, in this order, makes the answer).

Also here: the question types, the codes a failed question answers with
(:func:`failed_answer`) and :func:`state_text`, the state as a model reads it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from vllm_srun.plugins.spec import MESSAGE_LIMIT, clip

from .answers import FailedAnswer, QuestionError, QuestionType
from .body import Path

QUESTION_TYPES = ("choice", "noul", "score")
"""The System One question types."""

QUESTION_ERRORS = (
    "invalid_question",
    "max_length_exceeded",
    "deadline_exceeded",
    "invalid_model_output",
    "unavailable",
)
"""Codes a failed question answers with (``{type, error, message}``)."""

NOUL_KEYS = ("false", "true")
"""A Noul question's two options, in readout order (``noul`` is the second's probability)."""


@dataclass(frozen=True)
class Option:
    """One option of a question: what the answer is keyed by, and what it means.

    Attributes:
        key: the option's key (Choice: the client's key; Noul: ``false``/``true``;
            Score: the level ``"0"``..``"N-1"``).
        description: what the option means, or ``None``.
    """

    key: str
    description: str | None


@dataclass(frozen=True)
class Question:
    """A valid question.

    Attributes:
        name: the question's name in ``questions``.
        type: ``choice``, ``noul`` or ``score``.
        instructions: the question itself (non-blank).
        options: Choice: the client's options in order; Noul: ``false`` then
            ``true``; Score: levels ``"0"``..``"N-1"``, level 0 first.
    """

    name: str
    type: str
    instructions: str
    options: tuple[Option, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        """Option keys in readout order."""
        return tuple(option.key for option in self.options)


@dataclass(frozen=True)
class InvalidQuestion:
    """A question that breaks the schema; it answers ``invalid_question`` in its place.

    Attributes:
        name: the question's name.
        type: its ``type`` when that was one of :data:`QUESTION_TYPES`, else ``None``.
        message: what is wrong, naming the field (``questions.q1.criteria has 1 option; ...``).
    """

    name: str
    type: str | None
    message: str

    def answer(self) -> FailedAnswer:
        """The failed answer ``{type, error: "invalid_question", message}``."""
        return failed_answer(self.type, "invalid_question", self.message)


@dataclass(frozen=True)
class StateEntry:
    """One state and the questions asked about it, in request order.

    Attributes:
        state: the state as sent: a string, an object or an array.
        questions: each question, valid or not, in request order.
        where: the JSON path of the entry: ``()`` for the top level, ``("states", 0)``
            for an entry of a ``states`` array, ``("states", "alpha")`` for one of a
            ``states`` object.
    """

    state: str | dict[str, Any] | list[Any]
    questions: tuple[Question | InvalidQuestion, ...]
    where: Path = ()

    @property
    def key(self) -> str | int | None:
        """The entry's place in ``states``: its name (a ``states`` object) or its
        index (an array); ``None`` for the top-level state."""
        return self.where[1] if len(self.where) > 1 else None

    @property
    def valid(self) -> tuple[Question, ...]:
        """The valid questions, in request order."""
        return tuple(q for q in self.questions if isinstance(q, Question))

    def state_text(self) -> str:
        """The state as the model reads it (see :func:`state_text`)."""
        return state_text(self.state)


@dataclass(frozen=True)
class DecisionsRequest:
    """A validated decisions request.

    Attributes:
        model: the ``model`` field, or ``None``.
        entries: the top-level state first, then each ``states`` entry.
        deadline_ms: ``options.deadline_ms``, or ``None``.
        profile: ``options.profile``: the numeric profile the request expects (it must
            be the one the model was loaded with), or ``None`` for whichever it was.
        return_meta: ``options.return_meta``.
        has_states: whether the request carried ``states`` (the response then
            carries ``states`` too).
        named_states: whether ``states`` was an object of named entries (the
            response's ``states`` is then an object under the same names) rather
            than an array (answered as an array, each entry with its ``index``).
        problems: the message of every invalid question, in request order.
    """

    model: str | None
    entries: tuple[StateEntry, ...]
    deadline_ms: float | None = None
    profile: str | None = None
    return_meta: bool = False
    has_states: bool = False
    named_states: bool = False
    problems: tuple[str, ...] = field(default=(), compare=False)

    @property
    def questions(self) -> int:
        """Questions in the request, valid or not, over every entry."""
        return sum(len(entry.questions) for entry in self.entries)


def state_text(state: str | Mapping[str, Any] | Sequence[Any]) -> str:
    """A state as the text a model reads.

    A string is returned unchanged; an object or an array is serialised as JSON
    with ``json.dumps(state, ensure_ascii=False, separators=(", ", ": "))``
    (the client's key order kept, non-ASCII text kept as is).
    """
    if isinstance(state, str):
        return state
    return json.dumps(state, ensure_ascii=False, separators=(", ", ": "))


def failed_answer(kind: str | None, code: str, message: str) -> FailedAnswer:
    """A failed question ``{"type", "error", "message"}`` (``code``: :data:`QUESTION_ERRORS`;
    ``message`` cut at :data:`~vllm_srun.plugins.spec.MESSAGE_LIMIT` characters). A
    ``kind`` that is not a question type answers ``type: null``; a ``code`` that is not a
    question error (a row's ``internal_error``) answers ``unavailable``."""
    if kind not in QUESTION_TYPES:
        kind = None
    if code not in QUESTION_ERRORS:  # a row's own code (internal_error, ...): not one a
        code = "unavailable"  # question answers with; the message still says what happened
    return {
        "type": cast(QuestionType | None, kind),
        "error": cast(QuestionError, code),
        "message": clip(message, MESSAGE_LIMIT),
    }
