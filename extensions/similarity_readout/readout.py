"""Decisions from embeddings: cosine similarity between the state and each option.

For a question with options ``o_1..o_N`` about a state ``s``, the host model
embeds

- the state as itself (``state_text``: a string unchanged, an object or array
  as JSON), windowed when it is longer than the model's input limit (the
  host's pooled-window mean);
- each Choice or Score option as ``"{instructions} {key}: {description}"``
  (Score keys are the levels ``0..N-1``); a Choice key without a description
  is expanded into ``"{instructions} This is about {words}."``, its words the
  key with ``_``, ``-`` and ``.`` as spaces, camelCase split and lower case
  (``billing_dispute`` reads "This is about billing dispute.");
- a Noul question's true option as ``"{instructions} {description}"`` (the
  instructions alone without a description), its false option the same way
  only when the client describes it; a question without instructions embeds
  its descriptions alone (a Noul one then has at least one described option,
  and an undescribed side reads the baseline below),

then ``z_i = cos(e(s), e(o_i))`` and ``p = softmax(z / T)`` with the
temperature ``T`` of the question type from ``calibration/temperature.json``.
A Score answer is the expected level ``sum_k k * p_k`` (an ordinal readout),
its ``T`` fitted for the least mean absolute error of that level.
A Noul option with no text of its own reads ``z = b``,
the calibrated ``noul_baseline``: "not this" has no text of its own, so the
state must be more similar to the question than ``b`` for P(true) > 0.5.
That is a zero-shot approximation of a trained readout: the card reports
``numerics: approximate`` and this method. ``T`` was fitted on the labelled
set ``calibration/labelled.jsonl`` with :mod:`.calibrate` (least negative
log-likelihood of the labelled option, MiniLM-L6-v2); the file records the
accuracy measured there.

Every row is the host's: the extension only plans embeddings requests and
reads their answers, so the host's scheduler batches, deduplicates and
caches option rows shared by many questions.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from numpy.typing import NDArray

from vllm_srun.plugins import SurfaceExtension
from vllm_srun.plugins.cards import FamilyCard
from vllm_srun.plugins.decisions import (
    DecisionsAnswer,
    DecisionsMeta,
    DecisionsRequest,
    InvalidQuestion,
    Question,
    QuestionAnswer,
    answer,
    failed_answer,
    response_body,
)
from vllm_srun.plugins.extension import SurfaceModel
from vllm_srun.plugins.loaded import LoadedModel, Plan
from vllm_srun.plugins.requests import EmbeddingsRequest, InputOptions, SurfaceRequest
from vllm_srun.plugins.responses import Embedding, EmbeddingError, EmbeddingsAnswer
from vllm_srun.plugins.spec import RequestError, WorkItem

if TYPE_CHECKING:
    from vllm_srun.plugins.spec import RowOutput

CALIBRATION = Path(__file__).with_name("calibration") / "temperature.json"
HELD_OUT = Path(__file__).with_name("calibration") / "held_out.json"
"""The figures ``make eval`` measured on the held-out set (eval/decisions.jsonl)."""
"""Per-type temperatures and the accuracy measured when they were fitted."""

NAME = "similarity_readout"
METHOD = "softmax over cosine(state, instructions + option) / T, T per question type"


def read_calibration(path: Path = CALIBRATION) -> dict[str, Any]:
    """The calibration file: ``{"temperature": {type: T}, "model", "accuracy", ...}``.

    Raises:
        ValueError: a temperature is missing, not a number or not above 0.
    """
    data = json.loads(path.read_text(encoding="utf-8"))
    temps = data.get("temperature")
    if not isinstance(temps, dict):
        raise ValueError(f"{path}: 'temperature' must be an object of question type to T")
    for kind in ("choice", "noul", "score"):
        value = temps.get(kind)
        if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
            raise ValueError(f"{path}: temperature.{kind} must be a number above 0")
    return dict(data)


def read_held_out(path: Path) -> dict[str, Any] | None:
    """The held-out figures ``make eval`` wrote (``None`` when the file is absent)."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return dict(data) if isinstance(data, dict) else None


def option_texts(question: Question) -> list[str | None]:
    """The text embedded for each option of ``question`` (see the module docstring).

    ``None`` stands for a Noul false option without a description: it reads
    the calibrated baseline instead of a similarity.
    """
    asked = question.instructions
    if question.type == "noul":
        texts: list[str | None] = []
        for option in question.options:
            if option.description is None:
                # a Noul without instructions has a described option (the schema's rule)
                texts.append(None if option.key == "false" or not asked else asked)
            else:
                texts.append(_joined(asked, option.description))
        return texts
    return [
        _joined(asked, f"This is about {key_words(o.key)}.")
        if o.description is None
        else _joined(asked, f"{o.key}: {o.description}")
        for o in question.options
    ]


def _joined(instructions: str, text: str) -> str:
    """``"{instructions} {text}"``, or ``text`` alone for a question without instructions."""
    return f"{instructions} {text}" if instructions else text


def key_words(key: str) -> str:
    """A bare option key as words: ``_``, ``-`` and ``.`` runs become spaces, a camelCase
    boundary a space, all lower case (``creativeWriting`` and ``creative_writing`` give
    ``creative writing``); a key that leaves nothing reads as itself."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", key)
    words = " ".join(re.sub(r"[_\-.]+", " ", spaced).split()).lower()
    return words or key


class SimilarityReadout(SurfaceExtension):
    """The ``similarity_readout`` surface extension: ``decisions`` for pooled-head models."""

    name = NAME
    surfaces = ("decisions",)
    numerics = "approximate"
    method = METHOD

    def qualifies(self, card: FamilyCard) -> str | None:
        """``None`` for a model that serves ``embeddings`` with a pooled head, else why not."""
        if "embeddings" not in (card.get("surfaces") or ()):
            return "the model serves no embeddings"
        if not card.get("embedding"):
            return "the model has no pooled head"
        return None

    def attach(self, host: LoadedModel[Any], card: FamilyCard) -> SimilarityDecisions:
        """A decisions model that embeds through ``host``."""
        return SimilarityDecisions(host, read_calibration())


@dataclass
class EntryPlan:
    """Where one state entry's rows sit among the plan's embeddings inputs."""

    questions: list[Question | InvalidQuestion]
    state_input: int
    option_inputs: dict[str, list[int | None]] = field(default_factory=dict)


@dataclass
class SimilarityPlan(Plan):
    """A planned decisions request: two host embeddings plans and what each input is."""

    request: DecisionsRequest
    states: Any
    options: Any
    entries: list[EntryPlan]
    items: list[WorkItem] = field(init=False)

    def __post_init__(self) -> None:
        # The host rows: every state first, then every option text.
        self.items = [*self.states.items, *self.options.items]

    @property
    def queue_entries(self) -> int:
        """Each state entry counts as one request against ``--max-queue``."""
        return len(self.request.entries)


class SimilarityDecisions(SurfaceModel[SimilarityPlan]):
    """Answers ``decisions`` for one host model (the loaded-model protocol, planning only).

    Args:
        host: the family's loaded model (plans and finishes ``embeddings``).
        calibration: :func:`read_calibration`'s result.
    """

    surfaces = ("decisions",)

    def __init__(self, host: LoadedModel[Any], calibration: Mapping[str, Any]) -> None:
        self.host = host
        self.calibration = dict(calibration)
        self.temperature: dict[str, float] = dict(calibration["temperature"])
        self.noul_baseline = float(calibration.get("noul_baseline", 0.0))

    def card(self) -> dict[str, object]:
        """What the model card says about these answers."""
        return {
            "question_types": ["choice", "noul", "score"],
            "temperature": dict(self.temperature),
            "noul_baseline": self.noul_baseline,
            "calibration": {
                k: self.calibration[k]
                for k in ("model", "examples", "accuracy")
                if k in self.calibration
            },
            "held_out": read_held_out(HELD_OUT),
        }

    def plan(self, surface: str, request: SurfaceRequest) -> SimilarityPlan:
        """Embeddings rows for every state and every option of every valid question.

        Args:
            surface: ``decisions``.
            request: a :class:`DecisionsRequest`.

        Raises:
            RequestError: ``unsupported_surface`` for another surface.
        """
        if surface != "decisions" or not isinstance(request, DecisionsRequest):
            raise RequestError("unsupported_surface", f"{NAME} answers decisions, not {surface}")
        parsed = request
        states: list[str] = []
        options: list[str] = []
        option_index: dict[str, int] = {}
        entries = []
        for entry in parsed.entries:
            plan = EntryPlan(list(entry.questions), len(states))
            states.append(entry.state_text())
            for question in entry.valid:
                rows: list[int | None] = []
                for text in option_texts(question):
                    if text is None:
                        rows.append(None)
                        continue
                    if text not in option_index:
                        option_index[text] = len(options)
                        options.append(text)
                    rows.append(option_index[text])
                plan.option_inputs[question.name] = rows
            entries.append(plan)
        states_plan = self.host.plan(
            "embeddings", EmbeddingsRequest(input=states, options=InputOptions(overflow="window"))
        )
        options_plan = self.host.plan(
            "embeddings", EmbeddingsRequest(input=options, options=InputOptions(overflow="reject"))
        )
        return SimilarityPlan(parsed, states_plan, options_plan, entries)

    def finish(self, plan: SimilarityPlan, outputs: list[RowOutput]) -> DecisionsAnswer:
        """The decisions response body (without ``model``)."""
        similarities, tokens = self.similarities(plan, outputs)
        answered = []
        for entry in similarities:
            answers: dict[str, QuestionAnswer] = {}
            for name, (question, found) in entry.items():
                if isinstance(question, InvalidQuestion):
                    answers[name] = question.answer()
                elif isinstance(found, tuple):
                    answers[name] = failed_answer(question.type, *found)
                else:
                    answers[name] = answer(question, found, self.temperature[question.type])
            answered.append(answers)
        body = response_body(plan.request, answered, tokens)
        if plan.request.return_meta:
            meta: DecisionsMeta = {
                "readout": NAME,
                "numerics": "approximate",
                "method": METHOD,
                "temperature": dict(self.temperature),
            }
            body["meta"] = meta
        return body

    def similarities(
        self, plan: SimilarityPlan, outputs: list[RowOutput]
    ) -> tuple[list[dict[str, tuple[Any, Any]]], list[int]]:
        """Cosine similarities of the state to each option, per question, and the tokens used.

        Returns:
            One mapping per state entry, question name to ``(question, found)``,
            where ``found`` is a float64 ``[options]`` numpy array of cosines in
            ``[-1, 1]``, a ``(code, message)`` failure, or ``None`` for an
            invalid question; and the input tokens each entry read as its own
            request would: its state and each distinct option text its valid
            questions embed (a text two entries share counts in both).
        """

        split = len(plan.states.items)
        states = cast(EmbeddingsAnswer, self.host.finish(plan.states, list(outputs[:split])))
        options = cast(EmbeddingsAnswer, self.host.finish(plan.options, list(outputs[split:])))
        return self._found(plan, states["data"], options["data"])

    def _found(
        self,
        plan: SimilarityPlan,
        states: list[Embedding | EmbeddingError],
        options: list[Embedding | EmbeddingError],
    ) -> tuple[list[dict[str, tuple[Any, Any]]], list[int]]:
        """:meth:`similarities` from the host's embeddings of every state and option text."""
        tokens = [
            _tokens(states[entry.state_input])
            + sum(
                _tokens(options[i])
                for i in {i for rows in entry.option_inputs.values() for i in rows}
                if i is not None
            )
            for entry in plan.entries
        ]
        # Each text's unit vector once, however many questions use it.
        units: list[NDArray[np.float64] | None] = [
            None if "error" in item else _unit(cast(list[float], item["embedding"]))
            for item in options
        ]
        found: list[dict[str, tuple[Any, Any]]] = []
        for entry in plan.entries:
            state = states[entry.state_input]
            anchor = None if "error" in state else _unit(cast(list[float], state["embedding"]))
            per_question: dict[str, tuple[Any, Any]] = {}
            for question in entry.questions:
                if isinstance(question, InvalidQuestion):
                    per_question[question.name] = (question, None)
                    continue
                inputs = entry.option_inputs[question.name]
                failed = _failure(state, "the state") or next(
                    (
                        f
                        for i in inputs
                        if i is not None and (f := _failure(options[i], "an option"))
                    ),
                    None,
                )
                if failed is not None or anchor is None:
                    per_question[question.name] = (question, failed)
                    continue
                cosines = np.array(
                    [
                        self.noul_baseline
                        if i is None
                        else _dot(anchor, cast("NDArray[np.float64]", units[i]))
                        for i in inputs
                    ],
                    dtype=np.float64,
                )
                per_question[question.name] = (question, np.clip(cosines, -1.0, 1.0))
            found.append(per_question)
        return found, tokens


def _unit(vector: Sequence[float]) -> NDArray[np.float64]:
    """``vector / max(||vector||, 1e-12)`` in float64 (``torch.nn.functional.normalize``)."""
    values = np.asarray(vector, dtype=np.float64)
    unit: NDArray[np.float64] = values / max(math.sqrt(_dot(values, values)), 1e-12)
    return unit


def _dot(a: NDArray[np.float64], b: NDArray[np.float64]) -> float:
    """``sum a_i b_i`` in float64, summed in numpy's own fixed order (not BLAS's, whose
    kernel may depend on the arrays' alignment): the same bits for the same vectors."""
    return float(np.multiply(a, b).sum())


def _tokens(item: Mapping[str, Any]) -> int:
    used = item.get("input") or {}
    return int(used.get("processed_tokens", 0)) if isinstance(used, Mapping) else 0


def _failure(item: Mapping[str, Any], what: str) -> tuple[str, str] | None:
    """An embeddings item's error as a question error ``(code, message)``, or ``None``.

    ``what`` names the text (``the state``, ``an option``). The embeddings
    surface's advice (``options.overflow``, ``options.max_tokens``) does not
    apply to decisions, so the message says what to shorten instead.
    """
    if "error" not in item:
        return None
    code = str(item["error"])
    if code in ("max_length_exceeded", "scan_budget_exceeded"):
        facts = str(item.get("message", "")).split(". ")[0]  # drop the embeddings advice
        return (
            "max_length_exceeded",
            f"{what} is longer than this model reads ({facts}); shorten "
            f"{'it' if what == 'the state' else 'the instructions or the description'}",
        )
    if code == "invalid_input":  # the text cannot be tokenised (a lone surrogate)
        return "invalid_question", f"{what} cannot be read: {item.get('message', '')}"
    if code in ("deadline_exceeded", "invalid_model_output"):
        return code, str(item.get("message", ""))
    return "unavailable", str(item.get("message", ""))  # internal_error: the forward failed
