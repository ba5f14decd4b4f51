"""System One decisions: the request schema and the readout maths every decision family shares.

A decisions request asks typed questions about a ``state``::

    {"state": "My card was charged twice",
     "questions": {"team": {"type": "choice", "instructions": "Which team?",
                            "criteria": {"billing": "Payments", "shipping": null}}},
     "states": {"eu": {"state": {...}, "questions": {...}}},
     "options": {"deadline_ms": 500, "profile": "exact", "return_meta": true}}

``states`` (an object of named entries, or an array of them) asks about further
states, each answered as its own request would be; ``images`` may be left out or
empty (no decision model here reads images).

A family reads a request, plans one row per valid question, and turns one logit
per option into each answer. Import everything from this package; it is split
by concept into:

- :mod:`.body`: reading raw body bytes. :func:`loads_checked` parses JSON and
  reports every duplicate object key by its path (``json.loads`` alone keeps
  the last one silently); :func:`non_finite`, :func:`describe_path`, :data:`Path`;
- :mod:`.questions`: the parsed request (:class:`DecisionsRequest`,
  :class:`StateEntry`, :class:`Question`, :class:`Option`,
  :class:`InvalidQuestion`), the question types and :func:`failed_answer`;
- :mod:`.schema`: the rules. :func:`parse_request` validates a parsed body; a
  bad question becomes an :class:`InvalidQuestion` in its place (answered
  ``invalid_question``, never failing its siblings); a malformed request, or
  one whose every question is invalid, raises
  :class:`~vllm_srun.plugins.spec.RequestError` ``invalid_request`` listing
  each reason. :func:`parse_body` reads the bytes and validates them, for the
  serve layer;
- :mod:`.readout`: :func:`softmax`, :func:`confidence` and the ``*_answer``
  builders, from logits to the answer shapes of the surface,
  :func:`response_body` (each entry with its own ``usage``; ``states`` answered
  as an array or under its names, as asked) and :func:`state_answers`.

Answer shapes, typed in :mod:`.answers` (``probabilities`` in option order; Score levels
keyed ``"0"``..``"N-1"``):

- Choice ``{"type": "choice", "choice", "probabilities", "confidence"}``;
- Noul ``{"type": "noul", "noul"}``, ``noul`` = P(true);
- Score ``{"type": "score", "score", "probabilities", "confidence", "legend"}``,
  ``score`` the expected level;
- a failed question ``{"type", "error", "message"}``.
"""

from __future__ import annotations

from .answers import (
    ChoiceAnswer,
    DecisionsAnswer,
    DecisionsMeta,
    DecisionUsage,
    FailedAnswer,
    IndexedStateAnswer,
    NoulAnswer,
    QuestionAnswer,
    QuestionReadout,
    ScoreAnswer,
    StateAnswer,
    StateMeta,
)
from .body import Path, describe_path, loads_checked, non_finite
from .questions import (
    NOUL_KEYS,
    QUESTION_ERRORS,
    QUESTION_TYPES,
    DecisionsRequest,
    InvalidQuestion,
    Option,
    Question,
    StateEntry,
    failed_answer,
    state_text,
)
from .readout import (
    answer,
    choice_answer,
    confidence,
    noul_answer,
    response_body,
    score_answer,
    softmax,
    state_answers,
    usage,
)
from .schema import (
    MAX_CHOICES,
    MAX_LEVELS,
    MIN_CHOICES,
    MIN_LEVELS,
    InvalidQuestions,
    is_blank,
    is_encodable,
    parse_body,
    parse_request,
)

__all__ = [
    "MAX_CHOICES",
    "MAX_LEVELS",
    "MIN_CHOICES",
    "MIN_LEVELS",
    "NOUL_KEYS",
    "QUESTION_ERRORS",
    "QUESTION_TYPES",
    "ChoiceAnswer",
    "DecisionUsage",
    "DecisionsAnswer",
    "DecisionsMeta",
    "DecisionsRequest",
    "FailedAnswer",
    "IndexedStateAnswer",
    "InvalidQuestion",
    "InvalidQuestions",
    "NoulAnswer",
    "Option",
    "Path",
    "Question",
    "QuestionAnswer",
    "QuestionReadout",
    "ScoreAnswer",
    "StateAnswer",
    "StateEntry",
    "StateMeta",
    "answer",
    "choice_answer",
    "confidence",
    "describe_path",
    "failed_answer",
    "is_blank",
    "is_encodable",
    "loads_checked",
    "non_finite",
    "noul_answer",
    "parse_body",
    "parse_request",
    "response_body",
    "score_answer",
    "softmax",
    "state_answers",
    "state_text",
    "usage",
]
