"""Scores for the held-out evaluation: span precision/recall/F1 and decision accuracy.

Spans are ``(start, end, label)`` triples over code points (``end`` exclusive).
Exact: a predicted span counts when a gold span has the same start, end and label.
Overlap: a predicted span counts when it shares at least one code point with a gold
span of the same label, and a gold span is found when such a predicted span exists
(the looser CoNLL-style "partial" match, per span, not per character).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

SpanT = tuple[int, int, str]


@dataclass
class Counts:
    """True positives on each side and the totals (precision and recall keep their own TP:
    under overlap two predicted spans may find one gold span)."""

    tp_pred: int = 0
    tp_gold: int = 0
    pred: int = 0
    gold: int = 0

    def add(self, other: Counts) -> None:
        self.tp_pred += other.tp_pred
        self.tp_gold += other.tp_gold
        self.pred += other.pred
        self.gold += other.gold

    @property
    def precision(self) -> float:
        return self.tp_pred / self.pred if self.pred else 1.0

    @property
    def recall(self) -> float:
        return self.tp_gold / self.gold if self.gold else 1.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0


def _hits(a: SpanT, others: Sequence[SpanT], exact: bool) -> bool:
    if exact:
        return a in others
    return any(o[2] == a[2] and o[0] < a[1] and a[0] < o[1] for o in others)


def span_counts(
    gold: Iterable[Sequence[SpanT]], predicted: Iterable[Sequence[SpanT]], *, exact: bool
) -> dict[str, Counts]:
    """Per label counts over paired documents (gold and predicted spans per text)."""
    by_label: dict[str, Counts] = defaultdict(Counts)
    for gold_spans, pred_spans in zip(gold, predicted, strict=True):
        for span in gold_spans:
            counts = by_label[span[2]]
            counts.gold += 1
            counts.tp_gold += _hits(span, pred_spans, exact)
        for span in pred_spans:
            counts = by_label[span[2]]
            counts.pred += 1
            counts.tp_pred += _hits(span, gold_spans, exact)
    return dict(by_label)


def total(counts: dict[str, Counts], labels: Iterable[str] | None = None) -> Counts:
    """Micro-averaged counts over ``labels`` (every label when ``None``)."""
    out = Counts()
    for label, c in counts.items():
        if labels is None or label in labels:
            out.add(c)
    return out
