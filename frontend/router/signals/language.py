"""Language signals: the evaluation text's language, as an ISO 639-1 code, from
``lingua-language-detector`` (the Python build of the lingua library upstream's Go router
uses). A rule matches when the detected code is its ``name`` with a confidence at or
above its ``threshold`` (0, the default, reads as 0.3, upstream's).

lingua is an optional dependency (``pip install 'vllm-sr[language]'``): a configuration
with language rules is refused without it. Its detector is built once per process, in low
accuracy mode (fast, small), and warmed before the routes open (:func:`warm`): the first
detection loads the language models, about two seconds.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

DEFAULT_THRESHOLD = 0.3
"""A rule's threshold when it gives 0 (upstream's default)."""

PACKAGE = "lingua-language-detector"


def available() -> bool:
    """Whether lingua is installed (checked without importing it)."""
    return importlib.util.find_spec("lingua") is not None


@functools.lru_cache(maxsize=1)
def detector() -> Any:
    """The process's lingua detector (all languages, low accuracy mode)."""
    from lingua import LanguageDetectorBuilder

    return LanguageDetectorBuilder.from_all_languages().with_low_accuracy_mode().build()


def detect(text: str) -> tuple[str | None, float]:
    """The most likely ISO 639-1 code of ``text`` and its confidence, ``(None, 0.0)`` when
    nothing is detected. CPU-bound: call it off the event loop."""
    values = detector().compute_language_confidence_values(text)
    if not values or values[0].value <= 0:
        return None, 0.0
    best = values[0]
    return best.language.iso_code_639_1.name.lower(), float(best.value)


def warm() -> None:
    """Build the detector and load its models (a detection of a short text)."""
    detect("warm up the language models")
