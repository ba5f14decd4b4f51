"""The routing series on the metrics listener (ROUTER-SPEC §3.3; upstream's names in
``pkg/observability/metrics``), beside the ``vsr_model_runtime_*`` ones."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from ..bodies import is_utf8

if TYPE_CHECKING:
    from .forward import Answer
    from .route import Routed

CONDITION_OF = {
    "keywords": "keyword",
    "embeddings": "embedding",
    "domains": "domain",
    "jailbreak": "jailbreak",
    "pii": "pii",
    "context": "context",
    "decision": "decision",
    "language": "language",
}


UNSERVED_NAMES = 64
"""How many distinct unserved request model names get their own ``llm_request_errors``
series; later ones are counted under :data:`OTHER_MODEL` (a client cannot grow the
registry without bound)."""

OTHER_MODEL = "(other)"


class RoutingMetrics:
    """The ``llm_*`` series, registered on ``registry``.

    Labelled children are looked up once and kept (prometheus_client's ``labels()``
    validates and locks on every call: a tenth of a routed request's metrics cost).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._unserved: set[str] = set()
        self.requests = Counter(
            "llm_model_requests", "Chat requests sent to a model.", ["model"], registry=r
        )
        self.errors = Counter(
            "llm_request_errors",
            "Chat requests that failed, by model and reason.",
            ["model", "reason"],
            registry=r,
        )
        self.routing_latency = Histogram(
            "llm_model_routing_latency_seconds",
            "Seconds spent on signals and decisions per routed request.",
            registry=r,
        )
        self.signal_total = Counter(
            "llm_signal_extraction",
            "Signal rules evaluated.",
            ["signal_type", "signal_name"],
            registry=r,
        )
        self.signal_latency = Histogram(
            "llm_signal_extraction_latency_seconds",
            "Seconds a signal type took to evaluate.",
            ["signal_type"],
            registry=r,
        )
        self.signal_match = Counter(
            "llm_signal_match",
            "Signal rules that matched.",
            ["signal_type", "signal_name"],
            registry=r,
        )
        self.decision_total = Counter(
            "llm_decision_evaluation", "Decision evaluations (one per routed request).", registry=r
        )
        self.decision_latency = Histogram(
            "llm_decision_evaluation_latency_seconds",
            "Seconds spent evaluating decisions per routed request.",
            registry=r,
        )
        self.decision_match = Counter(
            "llm_decision_match", "Requests routed by a decision.", ["decision_name"], registry=r
        )
        self.decision_confidence = Histogram(
            "llm_decision_confidence",
            "Confidence of the winning decision.",
            ["decision_name"],
            buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
            registry=r,
        )
        self.decision_unknown = Counter(
            "llm_decision_unknown",
            "rules.on_unknown policies applied.",
            ["decision", "policy"],
            registry=r,
        )
        self.plugin_total = Counter(
            "llm_plugin_execution",
            "Decision plugins run.",
            ["plugin_type", "decision_name", "status"],
            registry=r,
        )
        self.cache_hits = Counter(
            "llm_cache_plugin_hits",
            "Response cache hits.",
            ["decision_name", "plugin_type"],
            registry=r,
        )
        self.cache_misses = Counter(
            "llm_cache_plugin_misses",
            "Response cache misses.",
            ["decision_name", "plugin_type"],
            registry=r,
        )
        self.completion_latency = Histogram(
            "llm_model_completion_latency_seconds",
            "Seconds until a backend's response headers arrived.",
            ["model"],
            registry=r,
        )
        self.ttft = Histogram(
            "llm_model_ttft_seconds",
            "Seconds until a streamed backend answer's headers arrived.",
            ["model"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "llm_model_prompt_tokens", "Prompt tokens a backend reported.", ["model"], registry=r
        )
        self.completion_tokens = Counter(
            "llm_model_completion_tokens",
            "Completion tokens a backend reported.",
            ["model"],
            registry=r,
        )

    def routed(self, routed: Routed) -> None:
        """Count one routed request: its signals, decisions and policies."""
        self.routing_latency.observe(routed.seconds)
        self.decision_total.inc()
        self.decision_latency.observe(routed.decision_seconds)
        results = routed.results
        for kind, names in results.evaluated.items():
            for name in names:
                self._of(self.signal_total, CONDITION_OF.get(kind, kind), name).inc()
        for kind, names in results.matched.items():
            for name in names:
                if kind == "decision" and ":" in name:
                    continue
                self._of(self.signal_match, CONDITION_OF.get(kind, kind), name).inc()
        for kind, measured in results.metrics.items():
            if "execution_time_ms" in measured:
                self._of(self.signal_latency, kind).observe(measured["execution_time_ms"] / 1000)
        for decision, policy in routed.ranking.policies.items():
            self._of(self.decision_unknown, decision, policy).inc()
        chosen = routed.ranking.chosen
        if routed.decision is not None and chosen is not None:
            # Every match, scored or not (upstream's RecordDecisionMatch).
            self._of(self.decision_match, routed.decision.name).inc()
            self._of(self.decision_confidence, routed.decision.name).observe(chosen.confidence)

    def _of(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, kept after the first lookup."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def unserved(self, model: str) -> None:
        """A request for a model this router does not serve (``model_not_found``)."""
        if model not in self._unserved:
            if len(self._unserved) >= UNSERVED_NAMES or len(model) > 200 or not is_utf8(model):
                model = OTHER_MODEL
            else:
                self._unserved.add(model)
        self.error(model, "model_not_found")

    def sent(self, model: str) -> None:
        self._of(self.requests, model).inc()

    def error(self, model: str, reason: str) -> None:
        self._of(self.errors, model, reason).inc()

    def plugin(self, kind: str, decision: str, status: str) -> None:
        self._of(self.plugin_total, kind, decision, status).inc()

    def cache(self, decision: str, hit: bool) -> None:
        self._of(self.cache_hits if hit else self.cache_misses, decision, "response_cache").inc()
        self.plugin("response_cache", decision, "hit" if hit else "miss")

    def backend(self, model: str, answer: Answer) -> None:
        """A backend's answer: its latency, and the tokens a JSON answer's ``usage`` reports."""
        if answer.stream is not None:
            self._of(self.ttft, model).observe(answer.backend_seconds)
            return
        self._of(self.completion_latency, model).observe(answer.backend_seconds)
        if not answer.content_type.startswith("application/json"):
            return
        usage = usage_of(answer.body)
        if isinstance(usage.get("prompt_tokens"), int):
            self._of(self.prompt_tokens, model).inc(usage["prompt_tokens"])
        if isinstance(usage.get("completion_tokens"), int):
            self._of(self.completion_tokens, model).inc(usage["completion_tokens"])


_DECODER = json.JSONDecoder()


def usage_of(body: bytes) -> dict[str, Any]:
    """A ``chat.completion``'s ``usage`` object, or ``{}``.

    Only the object after the last ``"usage"`` key is decoded (OpenAI-compatible servers
    write it after ``choices``); when that is not a JSON object, or the key is missing
    there, the whole body is parsed.
    """
    at = body.rfind(b'"usage"')
    if at >= 0:
        try:
            text = body[at + 7 :].decode()
            colon = text.index(":")
            start = len(text) - len(text[colon + 1 :].lstrip())
            found, _ = _DECODER.raw_decode(text, start)
            if isinstance(found, dict):
                return found
        except (ValueError, UnicodeDecodeError):
            pass
    try:
        whole = json.loads(body)
    except ValueError:
        return {}
    usage = whole.get("usage") if isinstance(whole, dict) else None
    return usage if isinstance(usage, dict) else {}
