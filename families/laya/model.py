"""A loaded Laya model: plan a decisions request, run its rows, finish the answers.

One row per question (:mod:`.sequences`): the question, its options' markers and its
state, keyed by content, so equal questions run once and a result cache can reuse them.
``run`` pads the rows of many requests into one engine forward, then runs the decision
head (:mod:`.head`) on each row's own tokens. ``finish`` turns each row's option logits
into the answer with the checkpoint's temperature for the question's type and option
count (:meth:`.checkpoint.AgentConfig.temperature_for`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from vllm_srun.plugins.cards import DecisionsCard, FamilyCard
from vllm_srun.plugins.collate import right_padded
from vllm_srun.plugins.decisions import (
    MAX_CHOICES,
    MAX_LEVELS,
    MIN_CHOICES,
    MIN_LEVELS,
    QUESTION_TYPES,
    DecisionsAnswer,
    DecisionsMeta,
    DecisionsRequest,
    InvalidQuestion,
    Question,
    QuestionAnswer,
    QuestionReadout,
    StateEntry,
    answer,
    failed_answer,
    parse_request,
    response_body,
    state_answers,
)
from vllm_srun.plugins.loaded import LoadedModel, Plan
from vllm_srun.plugins.requests import SurfaceRequest
from vllm_srun.plugins.spec import EncoderModel, RequestError, RowError, RowOutput, WorkItem

from . import checkpoint
from .checkpoint import AgentConfig
from .head import DecisionHead
from .sequences import (
    MIN_OPTION_TOKENS,
    MIN_QUESTION_ROOM,
    MIN_QUESTION_TOKENS,
    OPTION_TOKENS,
    LayaRow,
    Sequence,
    Tokens,
    build_sequence,
    option_texts,
    question_head,
    row,
)

SURFACE = "decisions"
METHOD = "laya"

PROBE_REQUEST: dict[str, Any] = {
    "state": "Batch invariance probe: a row alone and inside a batch must agree, whatever "
    "else the batch holds and however long the other rows are.",
    "questions": {
        "short": {"type": "noul", "instructions": "Is it short?"},
        "team": {
            "type": "choice",
            "instructions": "Which team should handle this message about a late parcel?",
            "criteria": {"billing": "Payments and refunds", "shipping": None, "technical": None},
        },
        "urgency": {
            "type": "score",
            "instructions": "How urgent is it?",
            "levels": ["not urgent", "somewhat urgent", "urgent", "an emergency"],
        },
    },
}
"""Questions of several lengths the load-time batch-invariance probe runs alone and together."""


def max_options(max_len: int, head_max_len: int, ceiling: int = MAX_CHOICES) -> int:
    """The most options whose markers always fit in ``max_len`` tokens, whatever their
    texts (at most ``ceiling``).

    A head of options that need no cutting ends within ``head_max_len + 2`` tokens. Cut
    options (:mod:`.sequences`) hold at most ``max(4, (head_max_len - 16) // n)`` tokens
    each and the question at most ``max(8, room)``, so the last marker sits at most at
    ``2 + max(8 + (n - 1) * keep, head_max_len - 1)``.
    """
    best = 0
    for count in range(1, ceiling + 1):
        keep = max(MIN_OPTION_TOKENS, (head_max_len - MIN_QUESTION_ROOM) // count)
        uncut = head_max_len + 2
        cut = 2 + max(MIN_QUESTION_TOKENS + (count - 1) * keep, head_max_len - 1)
        if max(uncut, cut) <= max_len - 1:
            best = count
        else:
            break
    return best


@dataclass
class Slot:
    """A question's place in the answers: the question, its row, or why it has none."""

    question: Question | InvalidQuestion
    row: int | None = None
    error: tuple[str, str] | None = None
    sequence: Sequence | None = None


@dataclass
class EntryPlan:
    """One state's questions and the tokens their rows read."""

    entry: StateEntry
    slots: list[Slot]
    input_tokens: int = 0


@dataclass
class LayaPlan(Plan):
    """A planned decisions request.

    Attributes:
        request: the validated request.
        entries: the top-level state first, then each ``states`` entry.
        items: the rows to run (one per answerable question).
    """

    request: DecisionsRequest
    entries: list[EntryPlan]
    items: list[WorkItem] = field(default_factory=list)

    @property
    def queue_entries(self) -> int:
        """Each state entry counts as one request against ``--max-queue``."""
        return len(self.entries)


class LayaModel(LoadedModel[LayaPlan]):
    """A Laya checkpoint behind the loaded-model verbs.

    Args:
        config: the checkpoint's ``rl_agent_config.json``.
        tokens: its tokenizer (:class:`.sequences.Tokens`).
        head: its decision head.
        engine_model: the engine's encoder (task ``encoder``: hidden states).
        max_model_len: the ``--max-model-len`` load option (the sequence budget, at most the
            checkpoint's ``max_len``), or ``None``.
        weights: the card's ``weights`` (:meth:`.conversion.Conversion.card`), or ``None``.

    Raises:
        ValueError: ``max_model_len`` above the checkpoint's ``max_len`` or below 8.
    """

    surfaces = (SURFACE,)
    pads_to_width = True

    def __init__(
        self,
        config: AgentConfig,
        tokens: Tokens,
        head: DecisionHead,
        engine_model: EncoderModel,
        max_model_len: int | None = None,
        weights: dict[str, object] | None = None,
    ) -> None:
        if max_model_len is not None and not 8 <= max_model_len <= config.max_len:
            raise ValueError(
                f"max_model_len must be 8 to the model's limit ({config.max_len} tokens), "
                f"not {max_model_len}"
            )
        self.config = config
        self.tokens = tokens
        self.head = head
        self.engine_model = engine_model
        self.max_model_len = max_model_len
        self.limit = max_model_len or config.max_len
        self.weights = weights

    # -- the card ---------------------------------------------------------------------------
    def temperatures(self) -> dict[str, float]:
        """The applied temperatures: per question type, then per ``<type>:<bucket>`` the
        checkpoint fitted (:mod:`.checkpoint`)."""
        return {**self.config.temperature, **self.config.by_options}

    def card(self) -> FamilyCard:
        """The family's part of the ``/v1/models`` card."""
        decisions: DecisionsCard = {
            "method": METHOD,
            "numerics": "exact",
            "readout": "option_markers",
            "shared_context": False,
            "calibrated": True,
            "temperature": self.temperatures(),
        }
        extras = cast(dict[str, object], decisions)  # the wire type allows more keys
        extras |= {
            "option_layout": self.config.layout,
            "max_len": self.limit,
            "head_max_len": self.config.head_max_len,
            "option_tokens": OPTION_TOKENS,
            "state_overflow": "truncate",
            "shipped_temperatures": self.config.shipped,
        }
        card: FamilyCard = {
            "surfaces": list(self.surfaces),
            "question_types": list(QUESTION_TYPES),
            "heads": [],
            "embedding": None,
            "limits": {
                "max_input_tokens": self.limit,
                "max_model_len": self.max_model_len,
                "model_max_tokens": self.config.max_len,
                "min_options": MIN_CHOICES,
                "max_options": max_options(self.limit, self.config.head_max_len),
                "min_levels": MIN_LEVELS,
                "max_levels": MAX_LEVELS,
            },
            "decisions": decisions,
        }
        if self.weights is not None:
            card["weights"] = dict(self.weights)
        return card

    # -- plan -------------------------------------------------------------------------------
    def plan(self, surface: str, request: SurfaceRequest) -> LayaPlan:
        """One row per answerable question of every state entry.

        Raises:
            RequestError: ``unsupported_surface`` for another surface.
        """
        if surface != SURFACE or not isinstance(request, DecisionsRequest):
            raise RequestError("unsupported_surface", f"this model serves {SURFACE}, not {surface}")
        plan = LayaPlan(request, [])
        for entry in request.entries:
            plan.entries.append(self._plan_entry(entry, plan.items, self.limit))
        return plan

    def _plan_entry(self, entry: StateEntry, items: list[WorkItem], limit: int) -> EntryPlan:
        state = self.tokens.encode(entry.state_text())
        planned = EntryPlan(entry, [])
        for question in entry.questions:
            slot = Slot(question)
            planned.slots.append(slot)
            if isinstance(question, InvalidQuestion):
                continue
            head = question_head(self.tokens, question, self.config.head_max_len)
            sequence = build_sequence(
                self.tokens,
                head,
                state,
                limit,
                keep_end=isinstance(entry.state, list),
                parallel=self.config.parallel,
            )
            if not sequence.complete:
                slot.error = (
                    "max_length_exceeded",
                    f"only {len(sequence.markers)} of the question's {sequence.options} options "
                    f"fit in this model's {limit} tokens; ask with fewer or shorter options",
                )
                continue
            slot.sequence = sequence
            slot.row = len(items)
            items.append(row(sequence, checkpoint.QUESTION_TYPES.index(question.type)))
            planned.input_tokens += len(sequence.ids)
        return planned

    # -- run --------------------------------------------------------------------------------
    def run(self, items: list[WorkItem], width: int | None = None) -> list[npt.NDArray[np.float32]]:
        """Per row, float32 ``[options]`` logits: one engine forward of the rows padded on
        the right (to ``width`` tokens, default the longest row's; in the parallel layout
        with each row's position ids and option groups, padding at position and group 0),
        then the head on each row's real tokens."""
        if not items:
            return []
        rows = [_row(item) for item in items]
        batch = right_padded(rows, self.tokens.pad_id, width)
        if self.config.parallel:
            batch.position_ids = np.zeros_like(batch.input_ids)
            batch.attention_groups = np.zeros_like(batch.input_ids)
            for r, item in enumerate(rows):
                positions, groups = _layout(item)
                batch.position_ids[r, : item.tokens] = positions
                batch.attention_groups[r, : item.tokens] = groups
        hidden = self.engine_model.encode(batch)
        if hidden.shape[0] != len(rows):
            raise ValueError(f"the engine answered {hidden.shape[0]} rows for {len(rows)}")
        return [
            self.head.logits(hidden[r, : item.tokens], _markers(item), item.kind)
            for r, item in enumerate(rows)
        ]

    def probe_items(self) -> list[WorkItem]:
        """Rows of several lengths for the load-time batch-invariance probe (at the
        checkpoint's own budget, whatever ``--max-model-len`` admits)."""
        items: list[WorkItem] = []
        for entry in parse_request(PROBE_REQUEST).entries:
            self._plan_entry(entry, items, self.config.max_len)
        return items

    # -- finish -----------------------------------------------------------------------------
    def finish(self, plan: LayaPlan, outputs: list[RowOutput]) -> DecisionsAnswer:
        """The response body (without ``model``): ``answers``, ``usage``, and ``states`` /
        ``meta`` when the request asked. A question whose row failed answers with that
        error in its place."""
        answered = [self._answers(entry, outputs) for entry in plan.entries]
        tokens = [entry.input_tokens for entry in plan.entries]
        body = response_body(plan.request, answered, tokens)
        if plan.request.return_meta:
            body["meta"] = self._meta(plan.entries[0])
            for state, entry in zip(state_answers(body), plan.entries[1:], strict=True):
                state["meta"] = {"questions": self._readouts(entry)}
        return body

    def _answers(self, entry: EntryPlan, outputs: list[RowOutput]) -> dict[str, QuestionAnswer]:
        answers: dict[str, QuestionAnswer] = {}
        for slot in entry.slots:
            question = slot.question
            if isinstance(question, InvalidQuestion):
                answers[question.name] = question.answer()
            elif slot.error is not None or slot.row is None:
                code, message = slot.error or ("unavailable", "the question was not run")
                answers[question.name] = failed_answer(question.type, code, message)
            else:
                output = outputs[slot.row]
                if isinstance(output, RowError):  # failed_answer maps a row's own code
                    answers[question.name] = failed_answer(
                        question.type, output.code, output.message
                    )
                    continue
                answers[question.name] = answer(
                    question, np.asarray(output), self._temperature(question)
                )
        return answers

    def _temperature(self, question: Question) -> float:
        return self.config.temperature_for(question.type, len(question.options))

    def _readouts(self, entry: EntryPlan) -> dict[str, QuestionReadout]:
        """How each answered question was read (``meta.questions``): its option keys, the
        option texts the model read, and the temperature applied."""
        return {
            slot.question.name: {
                "labels": list(slot.question.keys),
                "tokens": option_texts(slot.question),
                "temperature": self._temperature(slot.question),
            }
            for slot in entry.slots
            if isinstance(slot.question, Question) and slot.sequence is not None
        }

    def _meta(self, entry: EntryPlan) -> DecisionsMeta:
        """The answer's ``meta``: how the answers were read, and how much of the state each
        question left out for want of room."""
        meta: DecisionsMeta = {
            "method": METHOD,
            "numerics": "exact",
            "readout": "option_markers",
            "shared_context": False,
            "questions": self._readouts(entry),
        }
        dropped = {
            slot.question.name: slot.sequence.state_dropped
            for slot in entry.slots
            if slot.sequence is not None and slot.sequence.state_dropped
        }
        cast(dict[str, object], meta)["state_tokens_dropped"] = dropped
        return meta


def _markers(item: LayaRow) -> tuple[int, ...]:
    """The row's markers that fall within its tokens (all of a planned row's; the runtime's
    probes also run copies of a row made longer or shorter, whose markers past the end
    are left out, or the first token read when none is left)."""
    inside = tuple(m for m in item.markers if m < item.tokens)
    return inside or (0,)


def _layout(item: LayaRow) -> tuple[list[int], list[int]]:
    """The row's parallel-layout positions and groups at its length (a planned row's as
    they are; a probe's longer copy continues its positions in group 0, a shorter one is
    cut)."""
    positions = list((item.positions or ())[: item.tokens])
    groups = list((item.groups or ())[: item.tokens])
    start = positions[-1] + 1 if positions else 0
    positions += range(start, start + item.tokens - len(positions))
    groups += [0] * (item.tokens - len(groups))
    return positions, groups


def _row(item: WorkItem) -> LayaRow:
    if not isinstance(item, LayaRow):
        raise TypeError("the laya family runs its own LayaRow rows only")
    return item
