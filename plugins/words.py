"""The words of a text, as code-point spans: what entity spans are built from.

:func:`split_words` cuts a text into words the way BERT's basic tokenizer sees
them (whitespace runs, each CJK ideograph a word of its own) and trims each
word's edge punctuation and invisible characters, so an entity never keeps a
trailing comma or a zero-width space. Offsets are Unicode code point indices
into the Python ``str`` (``end`` exclusive), as everywhere in
:mod:`vllm_srun.plugins.spans`, which joins these words into entity spans.

Pure helpers: stdlib only.
"""

from __future__ import annotations

import unicodedata

_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)
"""Code point ranges of BERT's ``BasicTokenizer._is_chinese_char``."""

EMOJI_TAGS = (0xE0020, 0xE007F)
"""Tag characters (Cf) that end emoji tag sequences (subdivision flags): kept in words."""


def is_cjk(char: str) -> bool:
    """True for a CJK ideograph as BERT's tokenizer defines them (each is a word)."""
    cp = ord(char)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def _is_edge(char: str) -> bool:
    """A character trimmed from a word's edges.

    Punctuation (Unicode category ``P*``) plus ``<`` and ``>`` (``Sm``, so
    ``<a@b.co>`` loses its brackets; ``+`` is ``Sm`` and stays), and invisible
    controls and format characters (``Cc``, ``Cf``: zero-width space, ZWJ,
    BOM, bidi marks; BERT's tokenizer drops them) except emoji tag characters.
    """
    if char in "<>":
        return True
    category = unicodedata.category(char)
    if category.startswith("P") or category == "Cc":
        return True
    return category == "Cf" and not EMOJI_TAGS[0] <= ord(char) <= EMOJI_TAGS[1]


POSSESSIVE = ("'s", "\u2019s")
"""English possessive clitics (ASCII and typographic apostrophe) cut off a word's end:
BERT's basic tokenizer splits at the apostrophe, so ``Okonkwo's`` is ``Okonkwo`` plus a
clitic, and an entity ends before it."""


def _trimmed(text: str, start: int, end: int, words: list[tuple[int, int]]) -> None:
    """Append ``[start, end)`` less its edge characters and a possessive clitic after a
    letter (:data:`POSSESSIVE`, any case), unless nothing is left."""
    while start < end and _is_edge(text[start]):
        start += 1
    while end > start and _is_edge(text[end - 1]):
        end -= 1
    if end - start > 2 and text[end - 2 : end].lower() in POSSESSIVE and text[end - 3].isalpha():
        end -= 2
        while end > start and _is_edge(text[end - 1]):
            end -= 1
    if start < end:
        words.append((start, end))


def split_words(text: str) -> list[tuple[int, int]]:
    """The words of ``text`` as code-point ``(start, end)`` pairs, ``end`` exclusive.

    A word is a run of non-whitespace (``str.isspace``) with its edge
    punctuation trimmed (category ``P*`` plus ``<`` and ``>``; ``+`` and other
    symbols stay, so ``+1-212-555-0147`` is whole) and its edge invisible
    characters trimmed (``Cc``/``Cf``, zero-width space, ZWJ, BOM; not the
    emoji tag characters U+E0020 to U+E007F). Inner punctuation stays
    (``dana.whitfield@example.org``). A possessive ``'s`` or ``\u2019s`` after a letter
    ends the word before its apostrophe (``Okonkwo's`` gives ``Okonkwo``). Each CJK
    ideograph (BERT's ``_is_chinese_char`` ranges) is a word of its own and splits the run
    around it. A run with nothing left after trimming is no word.

    Returns:
        Sorted, non-overlapping pairs; ``text[start:end]`` is the word. Empty,
        whitespace-only and zero-width-only text give ``[]``.
    """
    words: list[tuple[int, int]] = []
    run = -1  # start of the current non-CJK run, or -1
    for i, char in enumerate(text):
        if char.isspace():
            if run >= 0:
                _trimmed(text, run, i, words)
                run = -1
        elif is_cjk(char):
            if run >= 0:
                _trimmed(text, run, i, words)
                run = -1
            words.append((i, i + 1))
        elif run < 0:
            run = i
    if run >= 0:
        _trimmed(text, run, len(text), words)
    return words


__all__ = ["EMOJI_TAGS", "POSSESSIVE", "is_cjk", "split_words"]
