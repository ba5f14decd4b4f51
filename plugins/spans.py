"""Entity spans from per-token BIO label probabilities, aggregated to words.


A token-classification head scores every token; users want entities over the
original string. :func:`decode_spans` maps tokens to words
(:func:`vllm_srun.plugins.words.split_words`, re-exported here with
:func:`~vllm_srun.plugins.words.is_cjk`) by their character offsets, gives each
word one label (``aggregation``), and joins words into spans by the BIO rules.
Every offset is a Unicode code point index into the Python ``str`` (``end``
exclusive): never bytes, never UTF-16 units, so emoji, ZWJ sequences, combining
accents and CJK before an entity leave it where ``text[start:end]`` says.

Pure helpers over numpy array-likes (arrays, nested lists, tuples): stdlib and numpy.

Why one module of 400-odd lines: tokens to words, one label per word and the BIO joining
are one algorithm over the same offsets and probabilities, each step meaningful only to
the next; the word cutting it builds on is :mod:`vllm_srun.plugins.words`.
"""

from __future__ import annotations

import bisect
import math
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from vllm_srun.plugins import responses
from vllm_srun.plugins.words import EMOJI_TAGS, is_cjk, split_words

AGGREGATIONS = ("max", "first", "average", "none")
"""Values of ``decode_spans(aggregation=...)``; ``none`` is raw token-level BIO."""

OUTSIDE = "O"
"""The label of a token or word in no entity."""

CONFIDENT = 0.5
"""Under ``max``, a piece whose entity tag has more than this probability labels its word
even when an ``O`` piece of the word is surer (the ``Ms.`` of ``Ms.Okonkwo``, the ``tel:``
of ``tel:+12125550147``): above one half the tag outweighs every other label of that piece
together."""

BRACKETS = {"(": ")", "[": "]", "{": "}", "\uff08": "\uff09"}
"""Opening bracket to its closing one: a span that holds one of a pair without the other
takes in the partner right outside its edge (``(555) 010-2334``)."""


@dataclass(frozen=True)
class Span:
    """One entity over the original text.

    Attributes:
        start: first code point, inclusive (0 is a valid start).
        end: code point after the last one, exclusive.
        text: ``original[start:end]``; never begins or ends with whitespace.
        label: the entity type without ``B-``/``I-`` (``EMAIL``); under
            ``aggregation="none"`` the full tag (``B-EMAIL``).
        probability: the mean of the span's word probabilities (under
            ``none``, the token's probability of its tag), a finite float.
    """

    start: int
    end: int
    text: str
    label: str
    probability: float

    def to_json(self) -> responses.Span:
        """The span as the wire has it (:class:`~vllm_srun.plugins.responses.Span`),
        ``start`` 0 included."""
        return {
            "start": self.start,
            "end": self.end,
            "text": self.text,
            "label": self.label,
            "probability": self.probability,
        }


def _is_blank(char: str) -> bool:
    """Whitespace or an invisible control/format character (trimmed off token spans)."""
    if char.isspace():
        return True
    category = unicodedata.category(char)
    return category == "Cc" or (
        category == "Cf" and not EMOJI_TAGS[0] <= ord(char) <= EMOJI_TAGS[1]
    )


@dataclass(frozen=True)
class _Tag:
    role: str  # "B", "I" or "O"
    type: str  # entity type; "" for O


def _parse_labels(labels: Sequence[str]) -> list[_Tag]:
    tags: list[_Tag] = []
    seen: set[str] = set()
    for label in labels:
        if not isinstance(label, str):
            raise ValueError(f"labels must be strings, got {label!r}")
        if label in seen:
            raise ValueError(f"label {label!r} appears twice in labels")
        seen.add(label)
        if label == OUTSIDE:
            tags.append(_Tag("O", ""))
        elif label[:2] in ("B-", "I-") and len(label) > 2:
            tags.append(_Tag(label[0], label[2:]))
        else:
            raise ValueError(
                f"label {label!r} is not in BIO form: expected 'O', 'B-<TYPE>' or 'I-<TYPE>'"
            )
    return tags


def _as_probabilities(
    probabilities: npt.ArrayLike, tokens: int, labels: int
) -> npt.NDArray[np.float64]:
    array = np.asarray(probabilities, dtype=np.float64)
    if array.ndim != 2:
        raise ValueError(
            f"probabilities must be 2-D [tokens, labels], got shape {tuple(array.shape)}"
        )
    if array.shape[0] != tokens:
        raise ValueError(f"probabilities has {array.shape[0]} rows but offsets has {tokens} tokens")
    if array.shape[1] != labels:
        raise ValueError(
            f"probabilities has {array.shape[1]} columns but labels has {labels} entries"
        )
    if not np.isfinite(array).all():
        raise ValueError("probabilities must be finite (no NaN or infinity)")
    if array.size and (array.min() < 0.0 or array.max() > 1.0):
        raise ValueError("probabilities must lie in [0, 1]; apply softmax to logits first")
    return array


def _as_offsets(offsets: npt.ArrayLike) -> npt.NDArray[np.int64]:
    array = np.asarray(offsets)
    if array.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if array.ndim != 2 or array.shape[1] != 2:
        raise ValueError(
            f"offsets must be (start, end) pairs, one per token, got shape {tuple(array.shape)}"
        )
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"offsets must be integers, got dtype {array.dtype}")
    return array.astype(np.int64)


def _as_mask(special_mask: npt.ArrayLike | None, tokens: int) -> npt.NDArray[np.bool_]:
    if special_mask is None:
        return np.zeros(tokens, dtype=np.bool_)
    array = np.asarray(special_mask)
    if array.ndim != 1 or array.shape[0] != tokens:
        raise ValueError(
            f"special_mask must have one entry per token ({tokens}), got shape {tuple(array.shape)}"
        )
    return array.astype(np.bool_)


def decode_spans(
    text: str,
    offsets: npt.ArrayLike,
    probabilities: npt.ArrayLike,
    labels: Sequence[str],
    *,
    aggregation: str = "max",
    threshold: float | None = None,
    special_mask: npt.ArrayLike | None = None,
) -> list[Span]:
    """Entity spans over ``text`` from per-token BIO label probabilities.

    Args:
        text: the original string the tokens came from.
        offsets: ``[tokens, 2]`` integer code-point ``(start, end)`` per token,
            ``end`` exclusive, as ``tokenizers`` returns them for the Python
            ``str`` (``Encoding.offsets``, ``return_offsets_mapping``).
        probabilities: float ``[tokens, labels]`` array, already softmaxed (each
            value in [0, 1]); computed in float64.
        labels: the id2label list in column order: ``"O"``, ``"B-<TYPE>"``,
            ``"I-<TYPE>"``, each once.
        aggregation: how a word gets its label from its tokens:

            - ``max``: the label of its most probable token (the token whose
              top probability is highest; ties go to the earlier token):
              that token's argmax label and top probability; but when a token
              whose argmax is an entity tag exceeds :data:`CONFIDENT`, the
              most probable such token labels the word instead, so an ``O``
              piece glued to a name never erases it;
            - ``first``: its first token's argmax label and probability;
            - ``average``: per entity type T, each token scores
              ``p(B-T) + p(I-T)`` (and ``O`` scores ``p(O)``); the word takes
              the type with the highest mean over its tokens (ties go to the
              type whose label comes first in ``labels``), role ``B`` when
              mean ``p(B-T)`` >= mean ``p(I-T)`` else ``I``, probability the
              highest mean;
            - ``none``: no words: one span per token whose argmax tag is not
              ``O``, at the token's offsets less edge whitespace and invisible
              ``Cc``/``Cf`` characters other than the emoji tag characters
              (tokens left empty are skipped; edge punctuation tokens are
              kept), ``label`` the full tag (``B-EMAIL``),
              probability the token's probability of that tag.

            Argmax ties go to the earlier label.
        threshold: drop spans whose probability is below it (``None``: keep all).
        special_mask: one flag per token, true for special tokens (``[CLS]``,
            ``[SEP]``, padding); they are ignored and their offsets unchecked.

    Tokens belong to every word (:func:`split_words`) their offsets overlap;
    tokens overlapping no word (edge punctuation, empty offsets) are ignored,
    so subword pieces never split a word and a span never keeps surrounding
    spaces or edge punctuation. A word no token overlaps is ``O``. Words join
    into spans: ``B-T`` opens one; ``I-T`` continues the span of type T that
    the immediately preceding word is in, else opens one; ``O`` closes. A span
    runs from its first word's start to its last word's end, so it never starts
    or ends inside a word; when it holds a bracket of a :data:`BRACKETS` pair
    without its partner and the partner sits right outside that edge, the span
    takes the partner in (``(555) 010-2334``, not ``555) 010-2334``). Its
    probability is the mean of its words' probabilities.

    Returns:
        Spans in text order.

    Raises:
        ValueError: offsets, probabilities, labels or special_mask disagree in
            length or shape; an unknown ``aggregation``; a label not in BIO
            form (named) or repeated; probabilities not finite or outside
            [0, 1]; an offset outside ``text`` or with start > end; a NaN
            threshold.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(
            f"unknown aggregation {aggregation!r}: expected one of {', '.join(AGGREGATIONS)}"
        )
    if threshold is not None and math.isnan(threshold):
        raise ValueError("threshold must be a number, not NaN")
    tags = _parse_labels(labels)
    spans_at = _as_offsets(offsets)
    tokens = spans_at.shape[0]
    probs = _as_probabilities(probabilities, tokens, len(tags))
    special = _as_mask(special_mask, tokens)
    live = [int(i) for i in np.flatnonzero(~special)]
    for index in live:
        start, end = int(spans_at[index, 0]), int(spans_at[index, 1])
        if not 0 <= start <= end <= len(text):
            raise ValueError(
                f"token {index} has offsets ({start}, {end}); expected 0 <= start <= end <= "
                f"{len(text)}, code points of the text (not bytes or UTF-16 units)"
            )

    if aggregation == "none":
        spans = _token_spans(text, spans_at, probs, labels, tags, live)
    else:
        words = split_words(text)
        members = _word_tokens(words, spans_at, live)
        if aggregation == "average":
            word_tags = _average(probs, tags, members)
        else:
            word_tags = _pick(probs, tags, members, first=aggregation == "first")
        spans = _join(text, words, word_tags)
    if threshold is not None:
        spans = [span for span in spans if span.probability >= threshold]
    return spans


def _token_spans(
    text: str,
    offsets: npt.NDArray[np.int64],
    probs: npt.NDArray[np.float64],
    labels: Sequence[str],
    tags: list[_Tag],
    live: list[int],
) -> list[Span]:
    spans: list[Span] = []
    for index in live:
        best = int(np.argmax(probs[index])) if probs.shape[1] else -1
        if best < 0 or tags[best].role == "O":
            continue
        start, end = int(offsets[index, 0]), int(offsets[index, 1])
        while start < end and _is_blank(text[start]):
            start += 1
        while end > start and _is_blank(text[end - 1]):
            end -= 1
        if start < end:
            spans.append(Span(start, end, text[start:end], labels[best], float(probs[index, best])))
    return spans


def _word_tokens(
    words: list[tuple[int, int]], offsets: npt.NDArray[np.int64], live: list[int]
) -> list[list[int]]:
    """Token indices (in token order) overlapping each word."""
    members: list[list[int]] = [[] for _ in words]
    starts = [start for start, _ in words]
    ends = [end for _, end in words]
    for index in live:
        start, end = int(offsets[index, 0]), int(offsets[index, 1])
        if start >= end:
            continue
        word = bisect.bisect_right(ends, start)  # first word ending after the token starts
        while word < len(words) and starts[word] < end:
            members[word].append(index)
            word += 1
    return members


_Word = tuple[str, str, float]  # role, type, probability


def _pick(
    probs: npt.NDArray[np.float64], tags: list[_Tag], members: list[list[int]], *, first: bool
) -> list[_Word]:
    result: list[_Word] = []
    for tokens in members:
        if not tokens or not tags:
            result.append(("O", "", 0.0))
            continue
        rows = probs[tokens]
        tops = rows.max(axis=1)
        chosen = 0 if first else int(np.argmax(tops))
        if not first and tags[int(np.argmax(rows[chosen]))].role == "O":
            tagged = [i for i, row in enumerate(rows) if tags[int(np.argmax(row))].role != "O"]
            if tagged:
                surest = max(tagged, key=lambda i: (tops[i], -i))
                if tops[surest] > CONFIDENT:
                    chosen = surest
        best = int(np.argmax(rows[chosen]))
        tag = tags[best]
        result.append((tag.role, tag.type, float(tops[chosen])))
    return result


def _average(
    probs: npt.NDArray[np.float64], tags: list[_Tag], members: list[list[int]]
) -> list[_Word]:
    # Candidates in order of first appearance in labels: "" is O.
    types: list[str] = []
    for tag in tags:
        if tag.type not in types:
            types.append(tag.type)
    b_cols = {
        t: [i for i, tag in enumerate(tags) if tag.type == t and tag.role == "B"] for t in types
    }
    i_cols = {
        t: [i for i, tag in enumerate(tags) if tag.type == t and tag.role == "I"] for t in types
    }
    o_cols = [i for i, tag in enumerate(tags) if tag.role == "O"]
    result: list[_Word] = []
    for tokens in members:
        if not tokens or not tags:
            result.append(("O", "", 0.0))
            continue
        means = probs[tokens].mean(axis=0)
        best_type, best_score, best_b, best_i = "", -1.0, 0.0, 0.0
        for t in types:
            if t == "":
                b_mean, i_mean = float(means[o_cols].sum()), 0.0
            else:
                b_mean, i_mean = float(means[b_cols[t]].sum()), float(means[i_cols[t]].sum())
            if b_mean + i_mean > best_score:
                best_type, best_score, best_b, best_i = t, b_mean + i_mean, b_mean, i_mean
        if best_type == "":
            result.append(("O", "", best_score))
        else:
            result.append(("B" if best_b >= best_i else "I", best_type, best_score))
    return result


def _join(text: str, words: list[tuple[int, int]], word_tags: list[_Word]) -> list[Span]:
    """BIO over words: B opens, I continues the same type right before it, O closes."""
    runs: list[tuple[str, int, int, list[float]]] = []  # type, start, end, word scores
    open_run = False
    for (word_start, word_end), (role, kind, score) in zip(words, word_tags, strict=True):
        if role == "O":
            open_run = False
        elif role == "I" and open_run and runs[-1][0] == kind:
            kind, start, _, scores = runs[-1]
            scores.append(score)
            runs[-1] = (kind, start, word_end, scores)
        else:
            runs.append((kind, word_start, word_end, [score]))
            open_run = True
    spans: list[Span] = []
    for kind, start, end, scores in runs:
        start, end = _bracketed(text, start, end)
        spans.append(Span(start, end, text[start:end], kind, sum(scores) / len(scores)))
    return spans


def _bracketed(text: str, start: int, end: int) -> tuple[int, int]:
    """``[start, end)`` widened by one at an edge whose bracket partner it lacks."""
    inside = text[start:end]
    for opening, closing in BRACKETS.items():
        depth = 0
        for char in inside:
            if char == opening:
                depth += 1
            elif char == closing:
                depth -= 1
        if depth < 0 and start > 0 and text[start - 1] == opening:
            start -= 1
        elif depth > 0 and end < len(text) and text[end] == closing:
            end += 1
    return start, end


__all__ = [
    "AGGREGATIONS",
    "BRACKETS",
    "CONFIDENT",
    "OUTSIDE",
    "Span",
    "decode_spans",
    "is_cjk",
    "split_words",
]
