"""Routing one Chat request: the texts read, the signals evaluated, the decisions ranked,
the model chosen (ROUTER-SPEC §2.3-§2.7). Shared by the Chat route and the preview.

:class:`Router` is one configuration generation's routing: what the document says, the
signals' :class:`~.signals.evaluate.Setup`, and the backends' HTTP client.
:meth:`Router.route` turns a request's messages into a :class:`Routed`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config.routing import Decision, ModelRef, ProviderModel, Providers, Routing
from .deadline import signal_deadline
from .decisions import Ranking, SignalResults, rank, referenced_signals
from .signals.evaluate import Evaluation, Setup
from .texts import Texts, request_texts

DEFAULT_AUTO_NAME = "MoM"
"""``global.router.auto_model_name`` when unset."""


def auto_names(auto_model_name: str | None, names: Sequence[str] | None) -> tuple[str, ...]:
    """The model names that ask the router to choose: an explicit list replaces the
    default ``[vllm-sr/auto, auto, <auto_model_name>]``."""
    if names:
        return tuple(names)
    return ("vllm-sr/auto", "auto", auto_model_name or DEFAULT_AUTO_NAME)


@dataclass
class Routed:
    """One request routed.

    Attributes:
        texts: what the signals read.
        results: what the signals found.
        ranking: every decision evaluated and the winner.
        decision: the winning decision, or ``None`` (default model, or no route).
        model: the model chosen, or ``None`` (no route, or a model-less fast response).
        ref: the ``modelRefs`` entry chosen, or ``None``.
        status: ``selected``, ``fallback`` (the default model) or ``failed``.
        seconds: how long routing took.
        decision_seconds: how long the decisions took to evaluate and rank (of ``seconds``).
    """

    texts: Texts
    results: SignalResults
    ranking: Ranking
    decision: Decision | None
    model: ProviderModel | None
    ref: ModelRef | None
    status: str
    seconds: float
    decision_seconds: float = 0.0

    @property
    def failed(self) -> Decision | None:
        """The ``fail_request`` decision that was unresolved, or ``None``."""
        return self.ranking.failed.decision if self.ranking.failed is not None else None

    @property
    def confidence(self) -> float | None:
        """The winner's confidence when it is scored, else ``None``."""
        chosen = self.ranking.chosen
        if chosen is None or chosen.decision.catch_all or chosen.evidence is None:
            return None
        return chosen.confidence


@dataclass
class Router:
    """One configuration generation's routing.

    Attributes:
        routing: ``routing``.
        providers: ``providers``.
        setup: what the signals read (pools, bindings, modules, candidates).
        auto: the auto model names.
        include_config_models: list provider models in ``GET /v1/models``.
        strategy: ``priority`` or ``confidence``.
    """

    routing: Routing
    providers: Providers
    setup: Setup
    auto: tuple[str, ...] = ("vllm-sr/auto", "auto", DEFAULT_AUTO_NAME)
    include_config_models: bool = False
    strategy: str = "priority"
    used: dict[str, set[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.used = referenced_signals(self.routing.decisions)

    def is_auto(self, model: str) -> bool:
        return model in self.auto

    async def route(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        request_deadline: float | None = None,
        every_signal: bool = False,
    ) -> Routed:
        """Evaluate the signals the decisions reference (every signal for the preview),
        rank the decisions and choose the model.

        Args:
            messages: the request's ``messages``.
            request_deadline: ``time.monotonic()`` of the request's own deadline, or ``None``.
            every_signal: evaluate every configured signal, and trace each decision (the
                preview).
        """
        started = time.monotonic()
        texts = request_texts(messages)
        deadline = signal_deadline(started, self.setup.timeout_ms, request_deadline)
        wanted = None if every_signal else self.used
        results = await Evaluation(self.setup, texts, wanted, deadline).run()
        ranked = time.monotonic()
        ranking = rank(self.routing.decisions, results, self.strategy, traced=every_signal)
        decision_seconds = time.monotonic() - ranked
        decision = ranking.chosen.decision if ranking.chosen is not None else None
        model = ref = None
        status = "failed"
        if ranking.failed is None:
            if decision is not None:
                ref = decision.modelRefs[0] if decision.modelRefs else None
                model = self.providers.find(ref.model) if ref is not None else None
                status = "selected"
            elif self.providers.defaults.fallback is not None:
                model = self.providers.find(self.providers.defaults.fallback)
                status = "fallback"
        return Routed(
            texts,
            results,
            ranking,
            decision,
            model,
            ref,
            status,
            time.monotonic() - started,
            decision_seconds,
        )
