"""One question as the token sequence a Laya model reads, with a marker per option.

The sequence (the ``laya`` package's ``build_sequence`` layout) is::

    [CLS] <type> question: <instructions> [SEP]
          [MASK] <option 0> [MASK] <option 1> ... [SEP] <state> [SEP]

- each option is one ``[MASK]`` (its marker, whose output the head scores) followed by
  its text's first :data:`OPTION_TOKENS` tokens, the text led by a space;
- the question and its options share ``head_max_len`` tokens: when the options leave
  fewer than :data:`MIN_QUESTION_ROOM` of them, every option is cut to
  ``max(4, (head_max_len - 16) // options)`` tokens (its marker included); the question's
  own tokens are then cut to what is left, but never below :data:`MIN_QUESTION_TOKENS`;
- the state fills what is left of ``max_len`` after the head and the closing ``[SEP]``:
  its first tokens, or its last ones for an array state (a conversation keeps its newest
  turns); the rest is left out and counted (:attr:`Sequence.state_dropped`);
- a marker past ``max_len`` cannot be read: such a question has no answer.

Every text (state, instructions, options) reads the tokenizer's mask token as a space,
as the package does, so no request text makes a marker; other special tokens in request
text are read as text (the package would read them as those tokens).

In the ``parallel`` layout the options do not see each other: every option starts at the
same position (the one after the question's ``[SEP]``), what follows the options continues
after the longest one, and :attr:`Sequence.groups` numbers each option's tokens (``s + 1``
for option ``s``, from its marker to the next; 0 for shared tokens), so that the encoder
masks attention between two different options (:mod:`.model` passes both to the engine).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

from vllm_srun.plugins.decisions import Question
from vllm_srun.plugins.spec import WorkItem

OPTION_TOKENS = 48
"""The most tokens of one option's text (the package tokenizes each with
``truncation=True, max_length=48``)."""

MIN_QUESTION_ROOM = 16
"""Below this many tokens left for the question, the package cuts every option."""

MIN_OPTION_TOKENS = 4
"""Tokens an option keeps at least when options are cut (its marker included)."""

MIN_QUESTION_TOKENS = 8
"""Tokens of the question's own text kept at least, however long its options."""

NOUL_DEFAULTS = {"false": "no, the statement does not hold", "true": "yes, the statement holds"}
"""What a Noul option says when the question does not describe it (the package's text)."""


@dataclass(frozen=True)
class Tokens:
    """The tokenizer as a question's sequence needs it.

    Attributes:
        backend: the ``tokenizers.Tokenizer`` (truncation and padding off, request text read
            as text: ``encode_special_tokens`` on).
        cls_id, sep_id, mask_id, pad_id: the special tokens' ids.
        mask_text: the mask token's text, read as a space in every request text.
        cut_left: the tokenizer truncates from the left (``tokenizer_config.json``'s
            ``truncation_side``); an option's text then keeps its last tokens.
    """

    backend: Any
    cls_id: int
    sep_id: int
    mask_id: int
    pad_id: int
    mask_text: str
    cut_left: bool = False

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens (the mask token read as a space)."""
        read = text.replace(self.mask_text, " ")
        return list(self.backend.encode(read, add_special_tokens=False).ids)

    def option(self, text: str) -> list[int]:
        """An option's tokens: its text led by a space, at most :data:`OPTION_TOKENS`."""
        ids = self.encode(" " + text)
        if len(ids) <= OPTION_TOKENS:
            return ids
        return ids[-OPTION_TOKENS:] if self.cut_left else ids[:OPTION_TOKENS]


def option_texts(question: Question) -> list[str]:
    """The text of each option in ``question.options`` order.

    Choice ``key`` or ``key: description``; Score ``level k: description``; Noul
    ``false: ...`` then ``true: ...`` (:data:`NOUL_DEFAULTS` where undescribed).
    """
    if question.type == "choice":
        return [
            o.key if o.description is None else f"{o.key}: {o.description}"
            for o in question.options
        ]
    if question.type == "score":
        return [f"level {k}: {o.description}" for k, o in enumerate(question.options)]
    return [f"{o.key}: {o.description or NOUL_DEFAULTS[o.key]}" for o in question.options]


@dataclass(frozen=True)
class Head:
    """A question's half of its sequence (its ids end with the ``[SEP]`` after the options).

    Attributes:
        ids: ``[CLS]``, the question, ``[SEP]``, each option's marker and text, ``[SEP]``.
        markers: each option's marker position, in option order.
        distinct: how many options still differ once cut (two options cut to the same
            tokens read alike).
    """

    ids: tuple[int, ...]
    markers: tuple[int, ...]
    distinct: int


def question_head(tokens: Tokens, question: Question, head_max_len: int) -> Head:
    """Lay out the question and its options (see the module's description)."""
    options = [[tokens.mask_id, *tokens.option(text)] for text in option_texts(question)]
    room = head_max_len - sum(map(len, options))
    if room < MIN_QUESTION_ROOM:
        keep = max(MIN_OPTION_TOKENS, (head_max_len - MIN_QUESTION_ROOM) // max(1, len(options)))
        options = [option[:keep] for option in options]
        room = head_max_len - sum(map(len, options))
    text = tokens.encode(f"{question.type} question: {question.instructions}")
    ids = [tokens.cls_id, *text[: max(MIN_QUESTION_TOKENS, room)], tokens.sep_id]
    markers = []
    for option in options:
        markers.append(len(ids))
        ids.extend(option)
    ids.append(tokens.sep_id)
    return Head(tuple(ids), tuple(markers), len({tuple(o) for o in options}))


@dataclass(frozen=True)
class Sequence:
    """A question's whole sequence.

    Attributes:
        ids: the token ids, at most ``max_len``.
        markers: the marker positions that fit, in option order.
        options: the question's option count (more than ``len(markers)`` when some did
            not fit).
        positions: the position ids (parallel layout), or ``None`` (``0..len-1``).
        groups: each token's option group (parallel layout: 0 shared, ``s + 1`` option
            ``s``), or ``None``.
        state_tokens: the state's token count.
        state_dropped: the state tokens left out for want of room.
    """

    ids: tuple[int, ...]
    markers: tuple[int, ...]
    options: int
    positions: tuple[int, ...] | None
    groups: tuple[int, ...] | None
    state_tokens: int
    state_dropped: int

    @property
    def complete(self) -> bool:
        """Whether every option's marker fits."""
        return len(self.markers) == self.options


def build_sequence(
    tokens: Tokens,
    head: Head,
    state_ids: Seq[int],
    max_len: int,
    *,
    keep_end: bool = False,
    parallel: bool = False,
) -> Sequence:
    """A question's sequence from its head and its state's token ids.

    Args:
        tokens: the tokenizer.
        head: :func:`question_head`.
        state_ids: the state's ids (:meth:`Tokens.encode` of its text).
        max_len: the sequence's budget in tokens.
        keep_end: keep the state's last tokens rather than its first (an array state).
        parallel: lay the options out in parallel (:func:`parallel_layout`).
    """
    room = max(0, max_len - len(head.ids) - 1)
    kept = list(state_ids[max(0, len(state_ids) - room) :] if keep_end else state_ids[:room])
    ids = [*head.ids, *kept, tokens.sep_id]
    positions = groups = None
    if parallel:
        laid = parallel_layout(head.markers, len(head.ids), len(ids))
        positions, groups = laid[0][:max_len], laid[1][:max_len]
    return Sequence(
        ids=tuple(ids[:max_len]),
        markers=tuple(m for m in head.markers if m < max_len),
        options=len(head.markers),
        positions=positions,
        groups=groups,
        state_tokens=len(state_ids),
        state_dropped=len(state_ids) - len(kept),
    )


def parallel_layout(
    markers: Seq[int], head_len: int, length: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Position ids and option groups of a sequence of ``length`` in the parallel layout.

    Tokens before the first marker keep their positions (group 0). Option ``s`` spans
    from its marker to the next marker (the last one to the head's closing ``[SEP]`` at
    ``head_len - 1``): its tokens take positions from the first marker's on (group
    ``s + 1``). The closing ``[SEP]``, the state and the rest continue after the longest
    option (group 0).
    """
    if not markers:
        return tuple(range(length)), (0,) * length
    start = markers[0]
    ends = [*markers[1:], head_len - 1]
    positions = list(range(start))
    groups = [0] * start
    for group, (first, stop) in enumerate(zip(markers, ends, strict=True), start=1):
        positions.extend(range(start, start + stop - first))
        groups.extend([group] * (stop - first))
    after = start + max(stop - first for first, stop in zip(markers, ends, strict=True))
    positions.extend(range(after, after + length - len(positions)))
    groups.extend([0] * (length - len(groups)))
    return tuple(positions), tuple(groups)


@dataclass(frozen=True)
class LayaRow(WorkItem):
    """One question's row: its sequence and what the head reads of it.

    Attributes:
        markers: the option markers' positions.
        kind: the head's type-embedding row (:data:`.checkpoint.QUESTION_TYPES` index).
        positions: position ids (parallel layout), or ``None``.
        groups: option groups (parallel layout), or ``None``.
    """

    markers: tuple[int, ...] = ()
    kind: int = 0
    positions: tuple[int, ...] | None = None
    groups: tuple[int, ...] | None = None


def row_key(sequence: Sequence, kind: int) -> str:
    """The content key of a question's row: BLAKE2b over everything its output depends
    on (the ids, the markers, the question type, and the parallel layout when there is
    one)."""
    digest = hashlib.blake2b(array("q", sequence.ids).tobytes(), digest_size=16)
    digest.update(b"|m")
    digest.update(array("q", sequence.markers).tobytes())
    digest.update(f"|t{kind}".encode())
    if sequence.positions is not None and sequence.groups is not None:
        digest.update(b"|p")
        digest.update(array("q", sequence.positions).tobytes())
        digest.update(b"|g")
        digest.update(array("q", sequence.groups).tobytes())
    return digest.hexdigest()


def row(sequence: Sequence, kind: int) -> LayaRow:
    """The work row of a question's sequence (its key from :func:`row_key`)."""
    return LayaRow(
        sequence.ids,
        None,
        row_key(sequence, kind),
        markers=sequence.markers,
        kind=kind,
        positions=sequence.positions,
        groups=sequence.groups,
    )
