"""A loaded decision model: plan a decisions request, run rows, finish the answers.

One work row per question: the rendered prompt's token ids plus the label ids
to read (:class:`ReadoutRow`), keyed by content so equal questions run once
and a result cache can reuse them. With shared context, the questions of one
state share their longest common token prefix (the template's head and the
state): the engine computes it once and every question continues from it.

Why one module of nearly 500 lines: it is the family's loaded model, whose plan, run and
finish share the rows and slots a plan makes; the package, the prompts, the readout
maths and GGUF weights are the family's other modules.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from vllm_srun.plugins.cards import FamilyCard
from vllm_srun.plugins.collate import left_padded
from vllm_srun.plugins.decisions import (
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
    softmax,
    state_answers,
)
from vllm_srun.plugins.loaded import LoadedModel, Plan
from vllm_srun.plugins.requests import SurfaceRequest
from vllm_srun.plugins.spec import DecoderModel, RequestError, RowError, RowOutput, WorkItem

from .package import Description
from .prompts import Labels, Renderer, message
from .readouts import CONTENT_FREE, host_logits, log_softmax, option_message, option_texts

SURFACE = "decisions"

PROBE_REQUEST: dict[str, Any] = {
    "state": "Batch invariance probe: a row alone and inside a batch must agree.",
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
            "criteria": ["not urgent", "somewhat urgent", "urgent", "an emergency"],
        },
    },
}
"""Questions of several lengths the load-time batch-invariance probe runs alone and together."""


@dataclass(frozen=True)
class ReadoutRow(WorkItem):
    """One question's row: its prompt, the label ids to read, and its shared prefix.

    Attributes:
        read_ids: the vocabulary ids of the option labels, in option order (an option
            scoring row: the one next token of its option's reply).
        normalise: read log-probabilities over the whole vocabulary at ``read_ids``
            (option scoring) rather than raw logits (labels).

    Its ``prefix`` (:class:`~vllm_srun.plugins.spec.WorkItem`) is how many leading
    tokens it shares with the other questions of its state; such rows run as
    continuations of one prefix computed once.
    """

    read_ids: tuple[int, ...] = ()
    normalise: bool = False


def row_key(
    ids: Sequence[int], read_ids: Sequence[int], prefix: int, normalise: bool = False
) -> str:
    """Content key of a row: BLAKE2b over its token ids, label ids, prefix length and
    whether it reads log-probabilities."""
    digest = hashlib.blake2b(array("q", ids).tobytes(), digest_size=16)
    digest.update(b"|")
    digest.update(array("q", read_ids).tobytes())
    digest.update(f"|{prefix}".encode())
    if normalise:
        digest.update(b"|logprob")
    return digest.hexdigest()


READOUTS = ("letters", "letters_cf", "option_sum", "option_mean")
"""How a question's option scores are read (``calibration.json``'s ``readout``):

- ``letters`` (the default): the next-token logit of each option's label, one row;
- ``letters_cf``: the label log-probabilities (over the labels) less those of the same
  question about the content-free state ``N/A`` (contextual calibration, Zhao et al.
  2021); two rows, the second the same for every request asking that question;
- ``option_sum``: the log-probability of each option's own text as the reply
  (:func:`.readouts.option_message`), summed over its tokens (one row per token);
- ``option_mean``: the same divided by the option's token count.

:mod:`.readouts` explains them and ``bench/decoder_readouts.py`` measures them."""


@dataclass
class Slot:
    """A question's place in the answers.

    Attributes:
        question: the question, valid or not.
        row: its row's index in the plan's items, when it runs.
        error: ``(code, message)`` when it fails before running.
        labels: the labels its answer is read from (label readouts).
        rows: every row its answer reads, in plan order (``row`` is the first).
        owners: per row of ``rows``, the option whose reply token it reads (option
            readouts; 0 for a label row).
        lengths: per option, its reply's token count (option readouts).
    """

    question: Question | InvalidQuestion
    row: int | None = None
    error: tuple[str, str] | None = None
    labels: Labels | None = None
    rows: tuple[int, ...] = ()
    owners: tuple[int, ...] = ()
    lengths: tuple[int, ...] = ()


@dataclass
class EntryPlan:
    """One state's questions: their slots, the shared prefix, the tokens run."""

    entry: StateEntry
    slots: list[Slot]
    prefix: int = 0
    input_tokens: int = 0


@dataclass
class ReadoutPlan(Plan):
    """A planned decisions request.

    Attributes:
        request: the validated request.
        entries: the top-level state first, then each ``states`` entry.
        items: the rows to run (each valid, fitting question once).
    """

    request: DecisionsRequest
    entries: list[EntryPlan]
    items: list[WorkItem] = field(default_factory=list)

    @property
    def queue_entries(self) -> int:
        """Each state entry counts as one request against ``--max-queue``."""
        return len(self.entries)


def _common_prefix(rows: list[list[int]]) -> int:
    """Length of the longest token prefix every row shares, leaving each row one token."""
    if len(rows) < 2:
        return 0
    shortest = min(len(r) for r in rows)
    length = 0
    while length < shortest - 1 and all(r[length] == rows[0][length] for r in rows):
        length += 1
    return length


class ReadoutModel(LoadedModel[ReadoutPlan]):
    """A decoder behind the loaded-model verbs (``plan``, ``run``, ``finish``).

    Args:
        description: what the package is (limit, temperatures).
        renderer: the package's tokenizer, rendering prompts and choosing labels.
        engine_model: the engine's decoder; ``forward`` returns float32 torch logits, read
            as a numpy array on the host right after it (:func:`.readouts.host_logits`).
        max_model_len: the ``--max-model-len`` load option, or ``None`` (the model's limit).
        shared_context: the ``--enable-shared-context`` load option; ``None`` is on.
        weights: what the weights are when the package was converted (the card's
            ``weights``: a GGUF file's format, quantisation and conversion), or ``None``.

    Raises:
        ValueError: ``max_model_len N is above the model's limit`` (or below 1).
    """

    surfaces = (SURFACE,)
    pads_to_width = True

    def __init__(
        self,
        description: Description,
        renderer: Renderer,
        engine_model: DecoderModel,
        max_model_len: int | None = None,
        shared_context: bool | None = None,
        weights: dict[str, Any] | None = None,
    ) -> None:
        limit = description.token_limit
        if max_model_len is not None:
            if max_model_len > limit:
                raise ValueError(
                    f"max_model_len {max_model_len} is above the model's limit ({limit} tokens); "
                    f"lower it to at most {limit} or leave it out"
                )
            if max_model_len < 1:
                raise ValueError(f"max_model_len must be at least 1, not {max_model_len}")
        self.description = description
        self.renderer = renderer
        self.engine_model = engine_model
        self.max_model_len = max_model_len
        self.limit = max_model_len if max_model_len is not None else limit
        self.shared_context = True if shared_context is None else bool(shared_context)
        self.temperatures = dict(description.temperatures)
        self.readout = description.readout
        self.weights = weights

    # -- the card -------------------------------------------------------------------------
    def card(self) -> FamilyCard:
        """The family's part of the ``/v1/models`` card."""
        card: FamilyCard = {
            "surfaces": list(self.surfaces),
            "question_types": list(QUESTION_TYPES),
            "heads": [],
            "embedding": None,
            "limits": {
                "max_input_tokens": self.limit,
                "max_model_len": self.max_model_len,
                "model_max_tokens": self.description.token_limit,
            },
            "decisions": {
                "method": "causal_readout",
                "numerics": "exact",
                "template": "chat" if self.renderer.chat else "plain",
                "shared_context": self.shared_context,
                "calibrated": self.description.calibrated,
                "readout": self.readout,
                "temperature": dict(self.temperatures),
            },
        }
        if self.weights is not None:
            card["weights"] = dict(self.weights)
        return card

    # -- plan -----------------------------------------------------------------------------
    def plan(self, surface: str, request: SurfaceRequest) -> ReadoutPlan:
        """Render and tokenise a decisions request (validated by
        :func:`vllm_srun.plugins.decisions.parse_body` or ``parse_request``).

        Raises:
            RequestError: ``unsupported_surface`` for another surface.
        """
        if surface != SURFACE or not isinstance(request, DecisionsRequest):
            raise RequestError("unsupported_surface", f"this model serves {SURFACE}, not {surface}")
        parsed = request
        plan = ReadoutPlan(parsed, [])
        for entry in parsed.entries:
            plan.entries.append(
                self._plan_entry(entry, plan.items, self.limit, self.shared_context)
            )
        return plan

    def _plan_entry(
        self, entry: StateEntry, items: list[WorkItem], limit: int, shared: bool
    ) -> EntryPlan:
        state = entry.state_text()
        slots: list[Slot] = []
        prompts: list[tuple[Slot, list[int], tuple[int, ...], bool, int]] = []
        for question in entry.questions:
            slot = Slot(question)
            slots.append(slot)
            if isinstance(question, InvalidQuestion):
                continue
            rows = self._question_rows(state, question, slot)
            if slot.error is not None:
                continue
            longest = max(len(ids) for ids, _, _, _ in rows)
            if longest > limit:
                which = "max_model_len" if self.max_model_len is not None else "the model's limit"
                slot.error = (
                    "max_length_exceeded",
                    f"the question is {longest} tokens with its state; this model takes at "
                    f"most {limit} ({which}); shorten the state or the question",
                )
                continue
            prompts.extend((slot, ids, read, norm, owner) for ids, read, norm, owner in rows)
        prefix = _common_prefix([ids for _, ids, _, _, _ in prompts]) if shared else 0
        plan = EntryPlan(entry, slots, prefix)
        seen: set[str] = set()
        for slot, ids, read, normalise, owner in prompts:
            key = row_key(ids, read, prefix, normalise)
            if slot.row is None:
                slot.row = len(items)
            slot.rows = (*slot.rows, len(items))
            slot.owners = (*slot.owners, owner)
            items.append(
                ReadoutRow(tuple(ids), None, key, prefix=prefix, read_ids=read, normalise=normalise)
            )
            if key not in seen:
                seen.add(key)
                plan.input_tokens += len(ids) - prefix
        if seen:
            plan.input_tokens += prefix
        return plan

    def _question_rows(
        self, state: str, question: Question, slot: Slot
    ) -> list[tuple[list[int], tuple[int, ...], bool, int]]:
        """The rows of one question under this model's readout: ``(ids, read ids,
        normalise, owner)``; sets ``slot.error`` (and returns nothing) when its options
        have no single-token labels."""
        count = len(question.options)
        if self.readout in ("option_sum", "option_mean"):
            prompt = self.renderer.encode(option_message(state, question))
            replies = [
                list(self.renderer.text.encode(text, add_special_tokens=False).ids)
                for text in option_texts(question)
            ]
            slot.lengths = tuple(len(r) for r in replies)
            return [
                (prompt + reply[:j], (token,), True, k)
                for k, reply in enumerate(replies)
                for j, token in enumerate(reply)
            ]
        labels = self.renderer.labels(question.type, count)
        if labels is None:
            slot.error = (
                "unavailable",
                f"this model's tokenizer has no single-token labels for {count} options of a "
                f"{question.type} question; ask with fewer options",
            )
            return []
        slot.labels = labels
        states = [state, *CONTENT_FREE] if self.readout == "letters_cf" else [state]
        return [
            (
                self.renderer.encode(message(text, question, labels.shown)),
                labels.token_ids,
                False,
                k,
            )
            for k, text in enumerate(states)
        ]

    # -- run ------------------------------------------------------------------------------
    def run(self, items: list[WorkItem], width: int | None = None) -> list[NDArray[np.float32]]:
        """Per row, a float32 numpy ``[reads]``: label logits in option order, or an option
        scoring row's log-probability of its one reply token.

        Rows that share a prefix run as one forward continuing it; the others
        run left-padded in one forward, in the order given. ``width`` pads every
        row (prefix included) to that many tokens (default: the longest row's).
        """
        groups: dict[tuple[int, ...], list[int]] = {}
        for index, item in enumerate(items):
            groups.setdefault(tuple(item.input_ids[: item.prefix]), []).append(index)
        outputs: list[NDArray[np.float32] | None] = [None] * len(items)
        for prefix_ids, indices in groups.items():
            rows = [items[i] for i in indices]
            forward = self._forward(rows, prefix_ids, width or 0)
            for i, values in zip(indices, forward, strict=True):
                outputs[i] = values
        return [o for o in outputs if o is not None]

    def _forward(
        self, rows: list[WorkItem], prefix_ids: tuple[int, ...], padded_to: int
    ) -> list[NDArray[np.float32]]:
        """One forward of ``rows`` continuing ``prefix_ids``: each row's float32 reads."""
        import torch  # the decoder's batch is torch's (the native engine)

        whole = any(_row(row).normalise for row in rows)
        reads = max(len(_row(row).read_ids) for row in rows)
        read = torch.zeros((len(rows), reads), dtype=torch.long)
        for r, row in enumerate(rows):
            labels = _row(row).read_ids
            read[r, : len(labels)] = torch.tensor(labels, dtype=torch.long)
        batch = left_padded(rows, self.renderer.pad_id, padded_to, skip=len(prefix_ids))
        batch.prefix_ids = torch.tensor(prefix_ids, dtype=torch.long) if prefix_ids else None
        batch.read_ids = None if whole else read
        logits = host_logits(self.engine_model.forward(batch))
        values: list[NDArray[np.float32]] = []
        # zip(strict=True): an engine answering another number of rows is an error, never
        # answers shifted onto the wrong questions.
        for r, (row, _) in enumerate(zip(rows, logits, strict=True)):
            wanted = list(_row(row).read_ids)
            if not whole:
                values.append(logits[r, : len(wanted)])
            elif _row(row).normalise:  # log-probabilities over the whole vocabulary
                values.append(log_softmax(logits[r])[wanted].astype(np.float32))
            else:
                values.append(logits[r, wanted])
        return values

    def probe_items(self) -> list[WorkItem]:
        """Rows of several lengths for the load-time batch-invariance probe.

        Unshared, and under the model's own limit rather than ``max_model_len``:
        the probe measures the model's numerics, whatever an operator admits.
        """
        items: list[WorkItem] = []
        for entry in parse_request(PROBE_REQUEST).entries:
            self._plan_entry(entry, items, self.description.token_limit, shared=False)
        return items

    # -- finish ---------------------------------------------------------------------------
    def finish(self, plan: ReadoutPlan, outputs: list[RowOutput]) -> DecisionsAnswer:
        """The response body (without ``model``): ``answers``, ``usage``, and
        ``states`` / ``meta`` when the request asked.

        A question whose row failed (:class:`~vllm_srun.plugins.spec.RowError`)
        answers with that error in its place; its siblings answer normally.
        """
        answered = [self._answers(entry, outputs) for entry in plan.entries]
        tokens = [entry.input_tokens for entry in plan.entries]
        body = response_body(plan.request, answered, tokens)
        if plan.request.return_meta:
            body["meta"] = self._meta(plan.entries[0])
            for state, entry in zip(state_answers(body), plan.entries[1:], strict=True):
                state["meta"] = {"questions": self._questions(entry)}
        return body

    def _answers(self, entry: EntryPlan, outputs: list[RowOutput]) -> dict[str, QuestionAnswer]:
        answers: dict[str, QuestionAnswer] = {}
        for slot in entry.slots:
            question = slot.question
            if isinstance(question, InvalidQuestion):
                answers[question.name] = question.answer()
            elif slot.error is not None:
                answers[question.name] = failed_answer(question.type, *slot.error)
            else:
                parts = [outputs[r] for r in slot.rows]
                failed = next((o for o in parts if isinstance(o, RowError)), None)
                if failed is not None:  # failed_answer maps a row's own code to unavailable
                    answers[question.name] = failed_answer(
                        question.type, failed.code, failed.message
                    )
                    continue
                scores = self._scores(slot, [np.asarray(o) for o in parts])
                answers[question.name] = answer(question, scores, self.temperatures[question.type])
        return answers

    def _scores(self, slot: Slot, parts: list[NDArray[Any]]) -> NDArray[Any]:
        """One score per option from a question's row outputs (see :data:`READOUTS`):
        a label row's float32 logits as they are, else float64 scores; each computed
        from this question's own rows alone."""
        if slot.labels is not None and len(parts) == 1:  # a label row: its logits
            return parts[0]
        if slot.labels is not None:  # letters_cf: less the content-free state's
            own = log_softmax(parts[0])
            free = np.stack([softmax(p) for p in parts[1:]]).mean(0)
            scores: NDArray[np.float64] = own - np.log(free)
            return scores
        total = np.zeros(len(slot.lengths), dtype=np.float64)
        for owner, logprob in zip(slot.owners, parts, strict=True):
            total[owner] += float(logprob[0])
        if self.readout == "option_mean":
            total /= np.asarray(slot.lengths, dtype=np.float64)
        return total

    def _questions(self, entry: EntryPlan) -> dict[str, QuestionReadout]:
        """How each valid question of ``entry`` was read out: its labels, their texts and
        the temperature (``meta.questions``)."""
        return {
            slot.question.name: {
                "labels": list(slot.labels.shown),
                "tokens": list(slot.labels.texts),
                "temperature": self.temperatures[cast(str, slot.question.type)],
            }
            for slot in entry.slots
            if slot.labels is not None
        }

    def _meta(self, entry: EntryPlan) -> DecisionsMeta:
        """The answer's ``meta``: how this family read the answers out."""
        return {
            "method": "causal_readout",
            "numerics": "exact",
            "template": "chat" if self.renderer.chat else "plain",
            "shared_context": self.shared_context,
            "readout": self.readout,
            "prefix_tokens": entry.prefix,
            "questions": self._questions(entry),
        }


def _row(row: WorkItem) -> ReadoutRow:
    if not isinstance(row, ReadoutRow):
        raise TypeError("causal_readout runs its own ReadoutRow rows only")
    return row
