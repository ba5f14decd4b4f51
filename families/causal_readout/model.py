"""A loaded decision model: plan a decisions request, run rows, finish the answers.

One work row per question: the rendered prompt's token ids plus the label ids
to read (:class:`ReadoutRow`), keyed by content so equal questions run once
and a result cache can reuse them. With shared context, the questions of one
state share their longest common token prefix (the template's head and the
state): the engine computes it once and every question continues from it.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from vllm_srun.plugins.decisions import (
    QUESTION_ERRORS,
    QUESTION_TYPES,
    DecisionsRequest,
    InvalidQuestion,
    Question,
    StateEntry,
    answer,
    failed_answer,
    parse_request,
    response_body,
    state_answers,
)
from vllm_srun.plugins.loaded import LoadedModel, ModelCard, Plan
from vllm_srun.plugins.requests import SurfaceRequest
from vllm_srun.plugins.spec import DecoderBatch, DecoderModel, RequestError, RowOutput, WorkItem

from .package import Description
from .prompts import Labels, Renderer, message

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
        read_ids: the vocabulary ids of the option labels, in option order.

    Its ``prefix`` (:class:`~vllm_srun.plugins.spec.WorkItem`) is how many leading
    tokens it shares with the other questions of its state; such rows run as
    continuations of one prefix computed once.
    """

    read_ids: tuple[int, ...] = ()


def row_key(ids: Sequence[int], read_ids: Sequence[int], prefix: int) -> str:
    """Content key of a row: BLAKE2b over its token ids, label ids and prefix length."""
    digest = hashlib.blake2b(array("q", ids).tobytes(), digest_size=16)
    digest.update(b"|")
    digest.update(array("q", read_ids).tobytes())
    digest.update(f"|{prefix}".encode())
    return digest.hexdigest()


@dataclass
class Slot:
    """A question's place in the answers.

    Attributes:
        question: the question, valid or not.
        row: its row's index in the plan's items, when it runs.
        error: ``(code, message)`` when it fails before running.
        labels: the labels its answer is read from.
    """

    question: Question | InvalidQuestion
    row: int | None = None
    error: tuple[str, str] | None = None
    labels: Labels | None = None


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
        engine_model: the engine's decoder; ``forward`` returns float32 CPU logits.
        max_model_len: the ``--max-model-len`` load option, or ``None`` (the model's limit).
        shared_context: the ``--enable-shared-context`` load option; ``None`` is on.
        weights: what the weights are when the package was converted (the card's
            ``weights``: a GGUF file's format, quantisation and conversion), or ``None``.

    Raises:
        ValueError: ``max_model_len N is above the model's limit`` (or below 1).
    """

    surfaces = (SURFACE,)

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
        self.weights = weights

    # -- the card -------------------------------------------------------------------------
    def card(self) -> ModelCard:
        """The family's part of the ``/v1/models`` card."""
        return {
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
                "temperature": dict(self.temperatures),
            },
            **({"weights": dict(self.weights)} if self.weights is not None else {}),
        }

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
        prompts: list[tuple[Slot, list[int]]] = []
        for question in entry.questions:
            slot = Slot(question)
            slots.append(slot)
            if isinstance(question, InvalidQuestion):
                continue
            labels = self.renderer.labels(question.type, len(question.options))
            if labels is None:
                slot.error = (
                    "unavailable",
                    f"this model's tokenizer has no single-token labels for "
                    f"{len(question.options)} options of a {question.type} question; "
                    "ask with fewer options",
                )
                continue
            slot.labels = labels
            ids = self.renderer.encode(message(state, question, labels.shown))
            if len(ids) > limit:
                which = "max_model_len" if self.max_model_len is not None else "the model's limit"
                slot.error = (
                    "max_length_exceeded",
                    f"the question is {len(ids)} tokens with its state; this model takes at "
                    f"most {limit} ({which}); shorten the state or the question",
                )
                continue
            prompts.append((slot, ids))
        prefix = _common_prefix([ids for _, ids in prompts]) if shared else 0
        plan = EntryPlan(entry, slots, prefix)
        seen: set[str] = set()
        for slot, ids in prompts:
            assert slot.labels is not None
            key = row_key(ids, slot.labels.token_ids, prefix)
            slot.row = len(items)
            items.append(
                ReadoutRow(tuple(ids), None, key, prefix=prefix, read_ids=slot.labels.token_ids)
            )
            if key not in seen:
                seen.add(key)
                plan.input_tokens += len(ids) - prefix
        if seen:
            plan.input_tokens += prefix
        return plan

    # -- run ------------------------------------------------------------------------------
    def run(self, items: list[WorkItem]) -> list[torch.Tensor]:
        """Label logits per row: float32 ``[options]``, in option order.

        Rows that share a prefix run as one forward continuing it; the others
        run left-padded in one forward, in the order given.
        """
        groups: dict[tuple[int, ...], list[int]] = {}
        for index, item in enumerate(items):
            groups.setdefault(tuple(item.input_ids[: item.prefix]), []).append(index)
        outputs: list[torch.Tensor | None] = [None] * len(items)
        for prefix_ids, indices in groups.items():
            rows = [items[i] for i in indices]
            logits = self._forward(rows, prefix_ids)
            for i, row, values in zip(indices, rows, logits, strict=True):
                outputs[i] = values[: len(_read_ids(row))]
        return [o for o in outputs if o is not None]

    def _forward(self, rows: list[WorkItem], prefix_ids: tuple[int, ...]) -> torch.Tensor:
        skip = len(prefix_ids)
        width = max(row.tokens - skip for row in rows)
        reads = max(len(_read_ids(row)) for row in rows)
        ids = torch.full((len(rows), width), self.renderer.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        read = torch.zeros((len(rows), reads), dtype=torch.long)
        for r, row in enumerate(rows):
            suffix = row.input_ids[skip:]
            ids[r, width - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
            mask[r, width - len(suffix) :] = 1
            labels = _read_ids(row)
            read[r, : len(labels)] = torch.tensor(labels, dtype=torch.long)
        batch = DecoderBatch(
            ids,
            mask,
            prefix_ids=torch.tensor(prefix_ids, dtype=torch.long) if prefix_ids else None,
            read_ids=read,
        )
        return self.engine_model.forward(batch)

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
    def finish(self, plan: ReadoutPlan, outputs: list[RowOutput]) -> dict[str, Any]:
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
                state["meta"] = {"questions": self._meta(entry)["questions"]}
        return body

    def _answers(self, entry: EntryPlan, outputs: list[RowOutput]) -> dict[str, Any]:
        answers: dict[str, Any] = {}
        for slot in entry.slots:
            question = slot.question
            if isinstance(question, InvalidQuestion):
                answers[question.name] = question.answer()
            elif slot.error is not None:
                answers[question.name] = failed_answer(question.type, *slot.error)
            else:
                assert slot.row is not None
                output = outputs[slot.row]
                if isinstance(output, torch.Tensor):
                    answers[question.name] = answer(
                        question, output, self.temperatures[question.type]
                    )
                else:
                    code = output.code if output.code in QUESTION_ERRORS else "unavailable"
                    answers[question.name] = failed_answer(question.type, code, output.message)
        return answers

    def _meta(self, entry: EntryPlan) -> dict[str, Any]:
        questions = {
            slot.question.name: {
                "labels": list(slot.labels.shown),
                "tokens": list(slot.labels.texts),
                "temperature": self.temperatures[cast(str, slot.question.type)],
            }
            for slot in entry.slots
            if slot.labels is not None
        }
        return {
            "method": "causal_readout",
            "numerics": "exact",
            "template": "chat" if self.renderer.chat else "plain",
            "shared_context": self.shared_context,
            "prefix_tokens": entry.prefix,
            "questions": questions,
        }


def _read_ids(row: WorkItem) -> tuple[int, ...]:
    if not isinstance(row, ReadoutRow):
        raise TypeError("causal_readout runs its own ReadoutRow rows only")
    return row.read_ids
