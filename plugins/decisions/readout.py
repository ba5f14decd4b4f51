"""The readout maths: one logit per option to the answer shapes of the surface.

``p = softmax(logits / T)`` in float64 over a question's options (in
:attr:`~.questions.Question.options` order), then:

- Choice ``{"type": "choice", "choice", "probabilities", "confidence"}``: the
  most probable key (the first on a tie), ``probabilities`` by key;
- Noul ``{"type": "noul", "noul"}``, ``noul`` = P(true);
- Score ``{"type": "score", "score", "probabilities", "confidence", "legend"}``:
  ``score`` the expected level ``sum_k k * p_k``, levels numbered from 0 and keyed
  ``"0"``..``"N-1"`` (as the upstream router and the Jev schema number them);
- a logit that is not finite answers ``invalid_model_output``
  (:func:`~.questions.failed_answer`).

``confidence`` is one minus the normalised entropy. :func:`response_body`
assembles the answers of every state entry and the ``usage`` object.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .answers import (
    ChoiceAnswer,
    DecisionsAnswer,
    DecisionUsage,
    FailedAnswer,
    IndexedStateAnswer,
    NoulAnswer,
    QuestionAnswer,
    QuestionType,
    ScoreAnswer,
    StateAnswer,
)
from .questions import DecisionsRequest, Question, failed_answer


def softmax(logits: ArrayLike, temperature: float = 1.0) -> NDArray[np.float64]:
    """Probabilities over options from one logit per option.

    ``p_i = exp((z_i - max z) / T) / sum_j exp((z_j - max z) / T)``, computed in
    float64 (so the probabilities sum to 1 within 1e-12, well inside the
    surface's 1e-6).

    Args:
        logits: ``[options]`` logits (any shape is flattened), any float dtype: a
            numpy array, a sequence of floats, or anything ``numpy.asarray`` reads.
        temperature: ``T > 0``; above 1 flattens, below 1 sharpens.

    Returns:
        float64 ``[options]`` probabilities (a numpy array).

    Raises:
        ValueError: a non-positive or non-finite temperature, or fewer than one logit.
    """
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number above 0, not {temperature!r}")
    values = np.asarray(logits, dtype=np.float64).reshape(-1)
    if values.size < 1:
        raise ValueError("softmax needs at least one logit")
    scaled = (values - values.max()) / temperature
    weights = np.exp(scaled)
    probabilities: NDArray[np.float64] = weights / weights.sum()
    return probabilities


def confidence(probabilities: ArrayLike) -> float:
    """One minus the normalised entropy: ``1 - H(p) / ln N``, ``H(p) = -sum p_i ln p_i``.

    1 for a one-hot distribution, 0 for the uniform one (Shannon entropy
    divided by its maximum ``ln N``; ``0 ln 0 = 0``). Clamped to ``[0, 1]``.

    Args:
        probabilities: ``[options]`` probabilities (any shape is flattened), read as float64.

    Raises:
        ValueError: fewer than two probabilities.
    """
    p = np.asarray(probabilities, dtype=np.float64).reshape(-1)
    if p.size < 2:
        raise ValueError("confidence needs at least two probabilities")
    terms = np.where(p > 0, p * np.log(np.maximum(p, 1e-300)), 0.0)
    entropy = float(-terms.sum())
    return min(1.0, max(0.0, 1.0 - entropy / math.log(p.size)))


def _checked(logits: ArrayLike, count: int) -> NDArray[np.float64] | None:
    """``logits`` as float64 ``[count]``, or ``None`` when their number is not ``count``
    or one is not finite."""
    values = np.asarray(logits, dtype=np.float64).reshape(-1)
    if values.size != count or not bool(np.isfinite(values).all()):
        return None
    return values


def _invalid_output(kind: QuestionType) -> FailedAnswer:
    return failed_answer(kind, "invalid_model_output", "the model's logits are not finite")


def choice_answer(
    keys: Sequence[str], logits: ArrayLike, temperature: float = 1.0
) -> ChoiceAnswer | FailedAnswer:
    """A Choice answer: the most probable key (the first on a tie), probabilities by key.

    Args:
        keys: the option keys, in the order of ``logits``.
        logits: one logit per option.
        temperature: the softmax temperature (see :func:`softmax`).

    Returns:
        ``{"type": "choice", "choice", "probabilities": {key: p}, "confidence"}``,
        or an ``invalid_model_output`` failure when a logit is not finite.
    """
    values = _checked(logits, len(keys))
    if values is None:
        return _invalid_output("choice")
    p = softmax(values, temperature)
    best = int(np.argmax(p))  # the first on a tie
    return {
        "type": "choice",
        "choice": keys[best],
        "probabilities": {key: float(v) for key, v in zip(keys, p.tolist(), strict=True)},
        "confidence": confidence(p),
    }


def noul_answer(logits: ArrayLike, temperature: float = 1.0) -> NoulAnswer | FailedAnswer:
    """A Noul answer: ``{"type": "noul", "noul": P(true)}``.

    Args:
        logits: ``[false, true]`` logits (the order of :data:`NOUL_KEYS`).
        temperature: the softmax temperature.
    """
    values = _checked(logits, 2)
    if values is None:
        return _invalid_output("noul")
    return {"type": "noul", "noul": float(softmax(values, temperature)[1])}


def score_answer(
    descriptions: Sequence[str | None],
    logits: ArrayLike,
    temperature: float = 1.0,
) -> ScoreAnswer | FailedAnswer:
    """A Score answer over levels ``0..N-1``.

    ``score = sum_k k * p_k`` with ``k`` from 0 (the expected level, in ``[0, N-1]``);
    ``probabilities`` and ``legend`` are keyed ``"0"``..``"N-1"``.

    Args:
        descriptions: level descriptions, level 0 first.
        logits: one logit per level, level 0 first.
        temperature: the softmax temperature.
    """
    values = _checked(logits, len(descriptions))
    if values is None:
        return _invalid_output("score")
    p = softmax(values, temperature)
    levels = np.arange(len(descriptions), dtype=np.float64)
    keys = [str(k) for k in range(len(descriptions))]
    return {
        "type": "score",
        "score": float((p * levels).sum()),
        "probabilities": {k: float(v) for k, v in zip(keys, p.tolist(), strict=True)},
        "confidence": confidence(p),
        "legend": dict(zip(keys, descriptions, strict=True)),
    }


def answer(question: Question, logits: ArrayLike, temperature: float = 1.0) -> QuestionAnswer:
    """The answer to ``question`` from one logit per option (in ``question.options`` order)."""
    if question.type == "choice":
        return choice_answer(question.keys, logits, temperature)
    if question.type == "noul":
        return noul_answer(logits, temperature)
    return score_answer([o.description for o in question.options], logits, temperature)


def usage(input_tokens: int, output_tokens: int = 0) -> DecisionUsage:
    """The response's ``usage`` object ``{"input_tokens", "output_tokens"}``."""
    return {"input_tokens": input_tokens, "output_tokens": output_tokens}


def response_body(
    request: DecisionsRequest,
    answered: Sequence[dict[str, QuestionAnswer]],
    input_tokens: int | Sequence[int],
) -> DecisionsAnswer:
    """The response body (without ``model`` and ``meta``) from each entry's answers.

    Every entry is answered as its own request would be, ``usage`` included:
    the top-level ``usage`` counts the request's own ``state`` and questions
    only, and each ``states`` entry carries the ``usage`` of its own
    (their sum is what the whole request read, tokens two entries share
    counted in each).

    Args:
        request: the validated request.
        answered: one ``{question name: answer}`` per entry, in
            ``request.entries`` order (the top-level state first).
        input_tokens: the prompt tokens each entry read, in the same order;
            a single int for a request of one entry (no ``states``, or an
            empty ``states``).

    Returns:
        ``{"answers", "usage"}``, plus ``"states"`` when the request had
        ``states``: an array ``[{"index", "answers", "usage"}]`` (``index``
        counting the entries from 0) when ``states`` was an array, an object
        ``{name: {"answers", "usage"}}`` under the request's names when it
        was an object.

    Raises:
        ValueError: ``answered`` or ``input_tokens`` does not hold one item per entry.
    """
    entries = len(request.entries)
    counts = [input_tokens] if isinstance(input_tokens, int) else list(input_tokens)
    if len(answered) != entries or len(counts) != entries:
        raise ValueError(
            f"response_body needs one answers mapping and one token count per entry "
            f"({entries}), not {len(answered)} and {len(counts)}; pass a list of counts "
            "when the request has states"
        )
    body: DecisionsAnswer = {"answers": answered[0], "usage": usage(counts[0])}
    if not request.has_states:
        return body
    if request.named_states:
        body["states"] = {
            str(request.entries[i].key): {"answers": answered[i], "usage": usage(counts[i])}
            for i in range(1, entries)
        }
    else:
        indexed: list[IndexedStateAnswer] = [
            {"index": i - 1, "answers": answered[i], "usage": usage(counts[i])}
            for i in range(1, entries)
        ]
        body["states"] = indexed
    return body


def state_answers(body: DecisionsAnswer) -> list[StateAnswer]:
    """The ``states`` entries of a response body in request order, whichever form
    (array or named object) :func:`response_body` gave them; a family adds each
    entry's ``meta`` through them. Empty without ``states``."""
    states = body.get("states")
    if isinstance(states, dict):
        return list(states.values())
    return list(states or ())
