"""The ``pii_patterns`` extension: pattern spans merged into a token model's ``classify``.

It qualifies for any model with a token head (``heads[].kind == "token"``)
and augments ``classify``: the host plans and runs the request as ever, then
each string input's spans are merged with :class:`.recognizers.PatternScanner`
finds (:func:`.merge.merged`). ``options.patterns: false`` returns the host's
answer with each span marked ``source: model``; token-level answers
(``aggregation: none``), pair inputs and failed items are left as the host gave them.

Under ``options.overflow: truncate`` only the text the model read counts: every
span of the answer ends at or before :meth:`Plan.read_end
<vllm_srun.plugins.loaded.Plan.read_end>` (the end of the last token read). A
pattern that crosses that point is dropped, not cut: its validation (a
checksum, a domain) held for characters the model never read. The scanner reads
at most :data:`SCAN_PAST_CUT` characters past it, only to tell a pattern ending
there from one crossing it. A truncated result whose host does not say where
its reading stopped gets no pattern spans.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from vllm_srun.plugins import SurfaceExtension
from vllm_srun.plugins.cards import FamilyCard
from vllm_srun.plugins.extension import SurfaceModel
from vllm_srun.plugins.loaded import LoadedModel, Plan
from vllm_srun.plugins.requests import ClassifyRequest, SurfaceRequest
from vllm_srun.plugins.responses import ClassifyAnswer, ClassifyResult, SurfaceAnswer
from vllm_srun.plugins.spec import WorkItem

from .merge import from_model, merged
from .recognizers import RECOGNIZERS, PatternScanner, shared_scanner

if TYPE_CHECKING:
    from vllm_srun.plugins.spec import RowOutput

NAME = "pii_patterns"
SCAN_PAST_CUT = 256
"""Characters past the end of a truncated input's read text the scanner also reads, so
that a pattern crossing the cut is seen crossing it (and dropped); a longer one shows
as a find ending past the cut, dropped too."""

METHOD = (
    "Presidio's validated pattern recognizers (no NLP engine) merged with the model's spans: "
    "a kind the model lacks replaces what it overlaps, else the longer span wins"
)


def _entity_types(card: FamilyCard) -> set[str]:
    types: set[str] = set()
    for head in card.get("heads") or ():
        if head.get("kind") == "token":
            for label in head.get("labels") or ():
                types.add(label[2:] if label[:2] in ("B-", "I-") else label)
    return types


class PiiPatterns(SurfaceExtension):
    """The ``pii_patterns`` surface extension (augments ``classify`` of token models)."""

    name = NAME
    augments = ("classify",)
    numerics = "approximate"
    method = METHOD

    def qualifies(self, card: FamilyCard) -> str | None:
        """``None`` for a model with a token head that serves ``classify``, else why not."""
        if "classify" not in (card.get("surfaces") or ()):
            return "the model serves no classify"
        if not any(head.get("kind") == "token" for head in card.get("heads") or ()):
            return "the model has no token head"
        return None

    def attach(self, host: LoadedModel[Any], card: FamilyCard) -> PatternSpans:
        """A classify model over ``host`` that merges pattern spans into its answers.

        Raises:
            ImportError: ``presidio-analyzer`` is missing (the model serves without it).
        """
        return PatternSpans(host, shared_scanner(), _entity_types(card))


@dataclass
class PatternPlan(Plan):
    """The host's classify plan plus the texts and whether patterns are on."""

    inner: Plan
    texts: list[str | None]
    patterns: bool
    items: list[WorkItem] = field(init=False)

    def __post_init__(self) -> None:
        self.items = list(self.inner.items)

    @property
    def queue_entries(self) -> int:
        """The host plan's count."""
        return self.inner.queue_entries

    def read_end(self, index: int) -> int | None:
        """The host plan's say."""
        return self.inner.read_end(index)


class PatternSpans(SurfaceModel[PatternPlan]):
    """``classify`` through the host, spans merged with pattern finds.

    Args:
        host: the token model's loaded model (plans, runs and finishes the rows).
        scanner: the pattern recognizers.
        model_labels: the entity types the host's token heads emit.
    """

    def __init__(
        self, host: LoadedModel[Any], scanner: PatternScanner, model_labels: set[str]
    ) -> None:
        self.host = host
        self.scanner = scanner
        self.model_labels = model_labels

    def plan(self, surface: str, request: SurfaceRequest) -> PatternPlan:
        """The host's plan for the request, remembering its string inputs.

        Raises:
            RequestError: as the host's planner raises.
        """
        inner: Plan = self.host.plan(surface, request)
        texts: list[str | None] = []
        patterns = False
        if isinstance(request, ClassifyRequest):
            options = request.classify_options
            patterns = options.patterns is not False and options.aggregation != "none"
            texts = [p.text if p.text_pair is None else None for p in request.pairs]
        return PatternPlan(inner=inner, texts=texts, patterns=patterns)

    def finish(self, plan: PatternPlan, outputs: list[RowOutput]) -> SurfaceAnswer:
        """The host's answer, each result's spans merged with the pattern finds.

        A truncated input's spans all end at or before where its reading stopped
        (:meth:`PatternPlan.read_end`); a pattern crossing that point is dropped.
        """
        body = self.host.finish(plan.inner, outputs)
        if "results" not in body:  # an embeddings answer: no spans to merge
            return cast(SurfaceAnswer, body)
        # Only a token head's classify results carry spans (a rerank result never does).
        for result in cast(ClassifyAnswer, body)["results"]:
            if "spans" not in result:
                continue
            result = cast(ClassifyResult, result)
            spans = result["spans"]
            index = result["index"]
            text = plan.texts[index] if index < len(plan.texts) else None
            tagged = any(s["label"][:2] in ("B-", "I-") for s in spans)
            cut = plan.read_end(index)
            unknown_cut = cut is None and result["input"]["truncated"]
            if plan.patterns and text is not None and not tagged and not unknown_cut:
                found = self.scanner.find(text if cut is None else text[: cut + SCAN_PAST_CUT])
                if cut is not None:
                    found = [f for f in found if f.end <= cut]
                spans = merged(text, spans, found, self.model_labels)
            else:
                spans = [from_model(s) for s in spans]
            if cut is not None:
                spans = [s for s in spans if s["end"] <= cut]
            result["spans"] = spans
        return cast(ClassifyAnswer, body)

    def warm(self) -> None:
        """Compile the recognizers' patterns and load their tables before the first request
        (:meth:`.recognizers.PatternScanner.warm`)."""
        self.scanner.warm()

    def card(self) -> dict[str, object]:
        """The recognizers (label, Presidio class and validation of each) and the held-out
        figures ``make eval`` wrote (``held_out``, ``null`` when it has not run)."""
        held_out = Path(__file__).with_name("held_out.json")
        return {
            "held_out": json.loads(held_out.read_text("utf-8")) if held_out.is_file() else None,
            "recognizers": [
                {"label": r.label, "recognizer": r.name, "validation": r.validation}
                for r in RECOGNIZERS
            ],
        }


__all__ = ["METHOD", "NAME", "SCAN_PAST_CUT", "PatternPlan", "PatternSpans", "PiiPatterns"]
