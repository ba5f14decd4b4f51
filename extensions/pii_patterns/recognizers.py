"""Validated pattern recognizers over raw text: Presidio's predefined ones, no NLP engine.

Presidio (``presidio-analyzer``) ships regular-expression recognizers with
validators: the Luhn checksum for payment cards, the ISO 13616 mod-97 checksum
for IBANs, the SSA's never-issued ranges for US SSNs, the public-suffix list for
e-mail domains, Google's ``phonenumbers`` for phones. Its analyzer engine wants a
spaCy pipeline for tokens, lemmas and context words; this module calls each
recognizer's ``analyze`` directly with an empty :class:`NlpArtifacts` (no spaCy
model is loaded or downloaded; importing ``presidio_analyzer`` imports the spaCy
library only), and applies context itself:

- a result Presidio scores below :data:`MIN_SCORE` ("weak": a bare nine-digit
  number as an SSN) is kept only when one of its recognizer's context words
  (``ssn``, ``social``, ``security``, ...) ends within :data:`CUE_WINDOW`
  characters before it;
- a date is reported only when introduced as a date of birth: a
  :data:`BIRTH_CUE` ends within :data:`CUE_WINDOW` characters before it.

E-mail validation reads the public-suffix snapshot bundled with ``tldextract``
and never fetches the live list (no network at run time).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

MIN_SCORE = 0.4
"""Presidio scores at or above this are kept without context (its "medium" patterns and
every validated result: a passing checksum scores 1.0)."""

CUE_WINDOW = 40
"""Characters before a span searched for a context word or a birth cue."""

BIRTH_CUE = re.compile(
    r"\b(?:born|birth|birthday|birthdate|dob|d\.o\.b)\b\W?[^\d.\n]{0,16}$", re.IGNORECASE
)
"""A date of birth's introduction ending right before the date ("born on", "DOB:",
"date of birth", "birthday is"), with at most 16 characters and no digit or full
stop between the cue and the date."""

MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
WRITTEN_DATE = (
    rf"(?i)\b(?:\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?{MONTH}\.?,?\s+\d{{4}}"
    rf"|{MONTH}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}})\b"
)
"""A date with its month written out ("12 May 1990", "April 3, 1992"), which Presidio's
``DateRecognizer`` patterns leave out; run through Presidio's ``PatternRecognizer``."""

WARM_TEXT = (
    "Card 4111 1111 1111 1111, SSN: 512-43-8821, IBAN DE89 3704 0044 0532 0130 00, "
    "mail ruth@example.com, call (555) 010-2334 or +44 20 7946 0958, ip 192.168.1.20, "
    "see https://example.org/x, born on 12/03/1984, birthday: 12 May 1984, routing number "
    "021000021, account number 000123456789."
)
"""What :meth:`PatternScanner.warm` scans: a find of every kind, so that each recognizer
compiles its patterns and runs its validation once (the suffix list, phone metadata)."""

URL_TAIL = ".,;:!?'\")]}>"
"""Characters trimmed off a URL's end (sentence punctuation Presidio's pattern keeps)."""


@dataclass(frozen=True)
class Recognizer:
    """One kind of pattern span.

    Attributes:
        label: the span label (``CREDIT_CARD``); ``EMAIL``, ``PHONE`` and ``URL``
            use the names PII token models such as Rampart use.
        name: the Presidio recognizer class (``CreditCardRecognizer``).
        entity: the Presidio entity type it reports (``CREDIT_CARD``).
        validation: how a match is checked, one line (shown on the card).
    """

    label: str
    name: str
    entity: str
    validation: str


RECOGNIZERS = (
    Recognizer("CREDIT_CARD", "CreditCardRecognizer", "CREDIT_CARD", "Luhn checksum"),
    Recognizer("IBAN", "IbanRecognizer", "IBAN_CODE", "ISO 13616 mod-97 checksum"),
    Recognizer("SSN", "UsSsnRecognizer", "US_SSN", "SSA never-issued areas and groups"),
    Recognizer("EMAIL", "EmailRecognizer", "EMAIL_ADDRESS", "public-suffix domain"),
    Recognizer("PHONE", "PhoneRecognizer", "PHONE_NUMBER", "phonenumbers parse"),
    Recognizer("IP_ADDRESS", "IpRecognizer", "IP_ADDRESS", "IPv4/IPv6 address parse"),
    Recognizer("URL", "UrlRecognizer", "URL", "scheme or known top-level domain"),
    Recognizer("DATE_OF_BIRTH", "DateRecognizer", "DATE_TIME", "date introduced as a birth date"),
    Recognizer(
        "DATE_OF_BIRTH",
        "WrittenDateRecognizer",
        "DATE_TIME",
        "month-name date introduced as a birth date",
    ),
    Recognizer("ROUTING_NUMBER", "AbaRoutingRecognizer", "ABA_ROUTING_NUMBER", "ABA checksum"),
    Recognizer("BANK_ACCOUNT", "UsBankRecognizer", "US_BANK_NUMBER", "8-17 digits after a cue"),
)
"""Every recognizer, in the order the card lists them."""


@dataclass(frozen=True)
class Found:
    """A pattern span: code-point ``[start, end)`` of the text, ``end`` exclusive.

    Attributes:
        start: first code point, inclusive.
        end: code point after the last, exclusive.
        label: the :class:`Recognizer` label.
        score: Presidio's score in [0, 1] (1.0 for a passing checksum).
        recognizer: the Presidio recognizer class name.
    """

    start: int
    end: int
    label: str
    score: float
    recognizer: str


def _cued(text: str, start: int, words: list[str]) -> bool:
    before = text[max(0, start - CUE_WINDOW) : start].lower()
    return any(re.search(rf"\b{re.escape(word)}\b", before) for word in words)


def _birth(text: str, start: int) -> bool:
    return BIRTH_CUE.search(text[max(0, start - CUE_WINDOW) : start]) is not None


def _trim_url(text: str, start: int, end: int) -> int:
    while end > start and text[end - 1] in URL_TAIL:
        closing = text[end - 1]
        opening = {")": "(", "]": "[", "}": "{"}.get(closing)
        if opening is not None and text[start:end].count(opening) >= text[start:end].count(closing):
            break
        end -= 1
    return end


PRESIDIO_DEVICE = "PRESIDIO_DEVICE"
"""Presidio's device variable: set (to ``cpu``) while it is imported, its NLP engines'
device detector reads it instead of importing torch to look for a GPU."""


@contextlib.contextmanager
def _without_torch() -> Iterator[None]:
    """Import Presidio as a process without torch and transformers would: importing
    ``presidio_analyzer`` imports its NLP engines, whose device detector imports torch and
    whose Hugging Face pipelines import transformers (several seconds and hundreds of MB,
    for engines this module never runs: it calls pattern recognizers only). While this
    runs, ``import torch`` and ``import transformers`` raise ImportError where neither is
    imported yet (Presidio then records them as absent, as it is written to), and
    :data:`PRESIDIO_DEVICE` reads ``cpu`` unless set; both are restored after, so a later
    import of torch or transformers works as ever."""
    blocked = [name for name in ("torch", "transformers") if name not in sys.modules]
    device = os.environ.get(PRESIDIO_DEVICE)
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]
    if device is None:
        os.environ[PRESIDIO_DEVICE] = "cpu"
    try:
        yield
    finally:
        for name in blocked:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]
        if device is None:
            os.environ.pop(PRESIDIO_DEVICE, None)


@functools.cache
def shared_scanner() -> PatternScanner:
    """One :class:`PatternScanner` per process (every token model shares it: the
    recognizers hold no per-model state).

    Raises:
        ImportError: ``presidio-analyzer`` is not installed.
    """
    return PatternScanner()


class PatternScanner:
    """Runs :data:`RECOGNIZERS` over texts (Presidio imported when first built).

    Presidio compiles a recognizer's patterns on its first ``analyze`` and
    ``tldextract`` reads its suffix snapshot on its first look-up: about 0.4 to 1.5 s
    together, which :meth:`warm` spends before a first request would.

    Attributes:
        presidio: the Presidio recognizer objects, in :data:`RECOGNIZERS` order.
        suffixes: the ``tldextract`` extractor e-mail domains are checked with (its
            bundled public-suffix snapshot; never fetched).

    Raises:
        ImportError: ``presidio-analyzer`` is not installed (construction).
    """

    def __init__(self) -> None:
        import tldextract

        with _without_torch():
            from presidio_analyzer import Pattern, PatternRecognizer
            from presidio_analyzer.nlp_engine import NlpArtifacts
            from presidio_analyzer.predefined_recognizers import (
                AbaRoutingRecognizer,
                CreditCardRecognizer,
                DateRecognizer,
                EmailRecognizer,
                IbanRecognizer,
                IpRecognizer,
                PhoneRecognizer,
                UrlRecognizer,
                UsBankRecognizer,
                UsSsnRecognizer,
            )

        offline = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)

        class OfflineEmailRecognizer(EmailRecognizer):
            """Presidio's e-mail recognizer reading tldextract's bundled suffix snapshot."""

            def validate_result(self, pattern_text: str) -> bool:
                return bool(offline(pattern_text.rsplit("@", 1)[-1]).fqdn)

        built: dict[str, Callable[[], Any]] = {
            "CreditCardRecognizer": CreditCardRecognizer,
            "IbanRecognizer": IbanRecognizer,
            "UsSsnRecognizer": UsSsnRecognizer,
            "EmailRecognizer": OfflineEmailRecognizer,
            "PhoneRecognizer": PhoneRecognizer,
            "IpRecognizer": IpRecognizer,
            "UrlRecognizer": UrlRecognizer,
            "DateRecognizer": DateRecognizer,
            "WrittenDateRecognizer": lambda: PatternRecognizer(
                supported_entity="DATE_TIME",
                name="WrittenDateRecognizer",
                patterns=[Pattern("written date", WRITTEN_DATE, 0.6)],
            ),
            "AbaRoutingRecognizer": AbaRoutingRecognizer,
            "UsBankRecognizer": UsBankRecognizer,
        }
        self._recognizers = [(spec, built[spec.name]()) for spec in RECOGNIZERS]
        self.presidio = [recognizer for _, recognizer in self._recognizers]
        self.suffixes = offline
        self._warm = False
        # No spaCy Doc: an empty token list stands in (the pattern recognizers read only
        # the text; context words, which would read tokens, are applied in find()).
        no_tokens: Any = []
        self._artifacts = NlpArtifacts(
            entities=[],
            tokens=no_tokens,
            tokens_indices=[],
            lemmas=[],
            nlp_engine=None,
            language="en",
        )

    def warm(self) -> None:
        """Compile every recognizer's patterns and load the validators' tables now (one
        scan of :data:`WARM_TEXT`), not on the first request; once per scanner."""
        if not self._warm:
            self.find(WARM_TEXT)
            self._warm = True

    def find(self, text: str) -> list[Found]:
        """Every pattern span of ``text`` that passes its validation and context rules.

        Overlapping finds are all returned (merging is :func:`.merge.merged`'s job).
        Returns spans sorted by ``(start, -end, label)``.
        """
        found: list[Found] = []
        for spec, recognizer in self._recognizers:
            results = recognizer.analyze(
                text=text, entities=[spec.entity], nlp_artifacts=self._artifacts
            )
            for result in results:
                start, end, score = int(result.start), int(result.end), float(result.score)
                if spec.label == "DATE_OF_BIRTH":
                    if not _birth(text, start):
                        continue
                elif score < MIN_SCORE and not _cued(
                    text, start, list(getattr(recognizer, "context", None) or [])
                ):
                    continue
                if spec.label == "URL":
                    end = _trim_url(text, start, end)
                if start < end:
                    found.append(Found(start, end, spec.label, min(score, 1.0), spec.name))
        found.sort(key=lambda f: (f.start, -f.end, f.label))
        return found


__all__ = [
    "BIRTH_CUE",
    "CUE_WINDOW",
    "MIN_SCORE",
    "RECOGNIZERS",
    "WARM_TEXT",
    "WRITTEN_DATE",
    "Found",
    "PatternScanner",
    "Recognizer",
    "shared_scanner",
]
