"""Keyword signals (upstream ``pkg/classification/keyword_classifier``).

With ``method`` omitted a keyword is literal text (regex-quoted), bounded by ``\\b`` on
each side that ends in a word character when it holds no Han character (so ``code`` is not
found in ``decoder``, while a Chinese keyword is found inside a sentence); ``method:
regex`` makes each keyword a regular expression as written. Matching ignores case
unless ``case_sensitive``. ``operator`` OR matches when any keyword is found, AND when
all are, NOR when none is.
"""

from __future__ import annotations

import functools
import re

from ...config.routing import KeywordRule

HAN = re.compile(
    r"[\u2e80-\u2fdf\u3005\u3007\u3021-\u3029\u3038-\u303b\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]"
)
"""Han (CJK ideograph) characters: a keyword holding one gets no word boundaries."""


def keyword_pattern(keyword: str, *, regex: bool, case_sensitive: bool) -> re.Pattern[str]:
    """The compiled pattern of one keyword (see the module docstring)."""
    flags = 0 if case_sensitive else re.IGNORECASE
    if regex:
        return re.compile(keyword, flags)
    body = re.escape(keyword)
    if re.search(r"\w", keyword) and not HAN.search(keyword):
        # \b on a side only where the keyword ends in a word character: upstream bounds
        # both sides, which makes a keyword like "c++" unmatchable before a space
        start = r"\b" if re.match(r"\w", keyword) else ""
        end = r"\b" if re.search(r"\w$", keyword) else ""
        body = f"{start}{body}{end}"
    return re.compile(body, flags)


@functools.lru_cache(maxsize=4096)
def _compiled(
    keywords: tuple[str, ...], regex: bool, case_sensitive: bool
) -> tuple[re.Pattern[str], ...]:
    return tuple(keyword_pattern(k, regex=regex, case_sensitive=case_sensitive) for k in keywords)


def keyword_matches(rule: KeywordRule, text: str) -> tuple[bool, list[str]]:
    """Whether ``rule`` matches ``text``, and the keywords found (in rule order)."""
    patterns = _compiled(tuple(rule.keywords), rule.method == "regex", rule.case_sensitive)
    found = [k for k, p in zip(rule.keywords, patterns, strict=True) if p.search(text)]
    if rule.operator == "AND":
        return len(found) == len(rule.keywords), found
    if rule.operator == "NOR":
        return not found, found
    return bool(found), found
