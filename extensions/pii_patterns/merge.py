"""One list of spans from a model's and the pattern recognizers' (no duplicates).

Rules, in order, for spans that overlap (share at least one code point):

1. a pattern span of a kind the model has no label for (a payment card, an IBAN,
   an SSN, a date of birth on Rampart) replaces every model span it overlaps:
   the model's span over it is necessarily a mislabel (Rampart reads a test
   card as ``BUILDING_NUMBER`` + ``PHONE``);
2. otherwise the longer span wins; at equal length a pattern's span wins over
   a model's of another label (the recognizer validated that exact text: a URL
   the model read as a ZIP code) and the model's wins over a pattern's of its
   own label (no duplicate); between two patterns the higher score, then the
   earlier recognizer in :data:`~.recognizers.RECOGNIZERS`.

Each kept span says where it came from: ``source`` ``model`` or ``pattern``,
and ``recognizer`` (the Presidio class for a pattern, ``null`` for the model).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from vllm_srun.plugins.responses import Span

from .recognizers import RECOGNIZERS, Found

_ORDER = {spec.name: index for index, spec in enumerate(RECOGNIZERS)}


def _overlap(a: Span, b: Span) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


def _rank(
    span: Span,
    model_labels: Collection[str],
    model_kinds: Mapping[tuple[int, int], str],
) -> tuple[int, int, int, float, int]:
    pattern = span.get("source") == "pattern"
    unknown = pattern and span["label"] not in model_labels
    extent = (span["start"], span["end"])
    # at equal extent: a pattern of another label (2), the model (1), a pattern of its label (0)
    if pattern:
        order = 2 if extent in model_kinds and model_kinds[extent] != span["label"] else 0
    else:
        order = 1
    return (
        1 if unknown else 0,
        extent[1] - extent[0],
        order,
        span["probability"],
        -_ORDER.get(str(span.get("recognizer")), 0),
    )


def merged(
    text: str,
    model_spans: Sequence[Span],
    found: Sequence[Found],
    model_labels: Collection[str],
) -> list[Span]:
    """The model's spans and the pattern finds as one list, in text order.

    Args:
        text: the input the spans index (code points).
        model_spans: the host's span dicts (``start``, ``end``, ``text``, ``label``,
            ``probability``).
        found: the pattern finds (:meth:`.recognizers.PatternScanner.find`).
        model_labels: the entity types the model can emit (``EMAIL``, ``PHONE``, ...).

    Returns:
        Span dicts with ``source`` and ``recognizer`` added, sorted by ``(start, end)``;
        no two overlap.
    """
    candidates: list[Span] = [from_model(span) for span in model_spans]
    candidates += [
        {
            "start": f.start,
            "end": f.end,
            "text": text[f.start : f.end],
            "label": f.label,
            "probability": f.score,
            "source": "pattern",
            "recognizer": f.recognizer,
        }
        for f in found
    ]
    kinds = {(s["start"], s["end"]): s["label"] for s in model_spans}
    kept: list[Span] = []
    ranked = sorted(candidates, key=lambda s: _rank(s, model_labels, kinds), reverse=True)
    for span in ranked:
        if not any(_overlap(span, other) for other in kept):
            kept.append(span)
    kept.sort(key=lambda s: (s["start"], s["end"]))
    return kept


def from_model(span: Span) -> Span:
    """A model's span marked as one (``source: model``, ``recognizer: null``)."""
    return {**span, "source": "model", "recognizer": None}


__all__ = ["from_model", "merged"]
