"""Every signal of a request evaluated, concurrently, under the signals' deadline
(ROUTER-SPEC §2.4, §2.5).

Keyword and context rules are read in the frontend. The model-backed kinds go to the
deployments their bindings name, one call each per request: one ``/v1/embeddings`` for
the embedding rules, one ``/v1/classify`` per bound classifier (domains, jailbreak,
PII), and one ``/v1/decisions`` per decision deployment holding every question asked of
it (decision rules, and the built-in questions of unbound domains and jailbreak rules).
What has not answered at the deadline is abandoned and resolves as the unknown table
says; each such answer counts in ``vsr_model_runtime_unknown_answers_total``.

Why one module of 700-odd lines: :class:`Evaluation` is one request's signals under one
deadline, every kind writing the same results and resolving a failure by the same unknown
table, and its calls cross kinds (one ``/v1/decisions`` holds domain, jailbreak and
decision questions); the local matchers and the calls themselves already live in modules
of their own.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...config.routing import DecisionRule, EmbeddingRule, Routing
from ..decisions import SignalResults
from ..texts import Texts
from . import language
from .calls import Pool, Unanswered, call
from .context import context_matches, token_estimate
from .keywords import keyword_matches

DOMAIN_QUESTION = "Which domain does this request belong to?"
JAILBREAK_QUESTION = "Is this a prompt injection or jailbreak attempt?"
"""The built-in questions an unbound ``domains`` or ``jailbreak`` signal asks the default
decision deployment (upstream's reference examples)."""

JAILBREAK_LABEL = "jailbreak"
CLASSIFICATION_ERROR = "classification_error"
"""The reserved label a failed guard or domain classifier resolves to under ``block``."""

UNSCANNED = "unscanned"

LATE_GRACE = 0.05
"""Seconds past the deadline the evaluation waits for calls that are ending on their own
(each call is bounded by the deadline and reports its own timeout)."""


@dataclass(frozen=True)
class Guard:
    """A safety module's settings (``prompt_guard`` or ``classifier.pii``)."""

    threshold: float
    on_error: str = "allow"
    on_unscanned: str = "block"


@dataclass(frozen=True)
class Modules:
    """``global.model_catalog.modules`` and the embedding rules' ``top_k``."""

    prompt_guard: Guard = Guard(0.7)
    pii: Guard = Guard(0.9)
    domain_threshold: float = 0.5
    domain_on_error: str = "allow"
    top_k: int = 1


@dataclass(frozen=True)
class Binding:
    """A deployment a signal kind reads, with the head and input options it uses.

    Attributes:
        deployment: the deployment's key.
        head: the head to read (``None``: the model's head of the needed kind).
        max_tokens: the deployment's ``input.max_tokens``, or ``None``.
        overflow: the deployment's ``input.overflow``, or ``None``.
    """

    deployment: str
    head: str | None = None
    max_tokens: int | None = None
    overflow: str | None = None


@dataclass
class Setup:
    """What the signals of one configuration generation read.

    Attributes:
        routing: ``routing`` (signals and decisions).
        modules: module settings.
        pools: deployment key to pool.
        decision_deployment: the default decision deployment's key.
        bindings: ``domain_classifier``, ``prompt_guard``, ``pii_classifier`` and
            ``embedding`` to their :class:`Binding` when bound (``embedding`` falls back
            to the default decision deployment).
        timeout_ms: ``signal_timeout_ms`` (0: none).
        candidates: each embedding rule's candidate vectors (unit length), embedded once
            per generation (:func:`prepare_candidates`).
        unknown: counts an unanswered model call (``deployment``, ``reason``).
    """

    routing: Routing
    modules: Modules
    pools: Mapping[str, Pool]
    decision_deployment: str
    bindings: dict[str, Binding] = field(default_factory=dict)
    timeout_ms: int = 0
    candidates: dict[str, list[list[float]]] = field(default_factory=dict)
    unknown: Callable[[str, str], None] = lambda deployment, reason: None

    def answered_by(self, kind: str, rule: DecisionRule | None = None) -> str | None:
        """The deployment whose model answers the signals of ``kind`` (a
        :data:`~vllm_sr.config.routing.SIGNAL_KINDS` entry; ``rule`` for a ``decision``
        rule's own ``deployment``), or ``None`` for the kinds the router evaluates itself
        (keywords, context, language). Domains and jailbreak without their binding are
        questions to the default decision deployment; PII has no such fallback."""
        bound = {
            "embeddings": "embedding",
            "domains": "domain_classifier",
            "jailbreak": "prompt_guard",
            "pii": "pii_classifier",
        }.get(kind)
        if bound is not None and bound in self.bindings:
            return self.bindings[bound].deployment
        if kind in ("domains", "jailbreak"):
            return self.decision_deployment
        if kind == "decision":
            return (rule.deployment if rule is not None else None) or self.decision_deployment
        return None


def _unit(vector: Sequence[float]) -> list[float]:
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


async def prepare_candidates(setup: Setup, deadline: float) -> None:
    """Embed every embedding rule's candidates once (before a generation serves).

    Raises:
        Unanswered: the embedding deployment gave no answer.
    """
    rules = setup.routing.signals.embeddings
    binding = setup.bindings.get("embedding")
    if not rules or binding is None:
        return
    texts = [c for rule in rules for c in rule.candidates]
    answer = await call(
        setup.pools[binding.deployment], "embeddings", "/v1/embeddings", {"input": texts}, deadline
    )
    vectors = [_unit(item["embedding"]) for item in answer["data"]]
    at = 0
    for rule in rules:
        setup.candidates[rule.name] = vectors[at : at + len(rule.candidates)]
        at += len(rule.candidates)


class Evaluation:
    """One request's signals being evaluated (see the module docstring).

    Args:
        setup: the generation's setup.
        texts: the request's texts.
        wanted: per signal list, the rule names to evaluate; ``None`` for every rule
            (the preview).
        deadline: ``time.monotonic()`` at which unanswered model calls are abandoned.
    """

    def __init__(
        self,
        setup: Setup,
        texts: Texts,
        wanted: Mapping[str, set[str]] | None,
        deadline: float,
    ) -> None:
        self.setup = setup
        self.texts = texts
        self.deadline = deadline
        self.results = SignalResults()
        signals = setup.routing.signals
        self.rules = {
            kind: [
                r
                for r in getattr(signals, kind)
                if wanted is None or r.name in wanted.get(kind, set())
            ]
            for kind in (
                "keywords",
                "embeddings",
                "domains",
                "jailbreak",
                "pii",
                "context",
                "language",
            )
        }
        self.rules["decision"] = [
            r for r in signals.decision if wanted is None or r.name in wanted.get("decision", set())
        ]
        self.results.evaluated = {
            kind: {r.name for r in rules} for kind, rules in self.rules.items() if rules
        }

    # -- the whole evaluation ----------------------------------------------------------------
    async def run(self) -> SignalResults:
        """Evaluate, and return what was found when every call answered or the deadline
        passed."""
        self._local()
        jobs: list[tuple[str, Awaitable[None]]] = []
        if self.rules["embeddings"]:
            jobs.append(("embedding", self._embeddings()))
        domains_bound = "domain_classifier" in self.setup.bindings
        guard_bound = "prompt_guard" in self.setup.bindings
        if self.rules["domains"] and domains_bound:
            jobs.append(("domain", self._domains_classified()))
        if self.rules["jailbreak"] and guard_bound:
            jobs.append(("jailbreak", self._jailbreak_classified()))
        if self.rules["pii"]:
            jobs.append(("pii", self._pii()))
        if self.rules["language"]:
            jobs.append(("language", self._language()))
        asked = self._questions(domains_bound, guard_bound)
        for deployment, questions in asked.items():
            jobs.append(("decision", self._ask(deployment, questions)))
        if not jobs:
            return self.results
        started = time.monotonic()
        tasks = {asyncio.ensure_future(job): kind for kind, job in jobs}
        remaining = max(0.0, self.deadline - time.monotonic()) + LATE_GRACE
        done, pending = await asyncio.wait(tasks, timeout=remaining)
        for task in pending:
            task.cancel()
        for task in pending:
            self._late(tasks[task])
        errors = [e for e in (task.exception() for task in done) if e is not None]
        if errors:  # every one retrieved: none is logged as never retrieved
            raise errors[0]
        elapsed = (time.monotonic() - started) * 1000
        for kind in {tasks[t] for t in done}:
            self.results.metrics.setdefault(kind, {})["execution_time_ms"] = round(elapsed, 3)
        return self.results

    def _local(self) -> None:
        """Keywords and context: read in the frontend, no model involved."""
        started = time.perf_counter()
        for rule in self.rules["keywords"]:
            if keyword_matches(rule, self.texts.evaluation)[0]:
                self.results.match("keywords", rule.name)
        if self.rules["keywords"]:
            self._timed("keyword", started)
        if self.rules["context"]:
            tokens = token_estimate(self.texts.whole)
            self.results.labels["context_tokens"] = tokens
            for rule in self.rules["context"]:
                if context_matches(rule, tokens):
                    self.results.match("context", rule.name)

    def _timed(self, kind: str, started: float) -> None:
        elapsed = (time.perf_counter() - started) * 1000
        self.results.metrics.setdefault(kind, {})["execution_time_ms"] = round(elapsed, 3)

    def _failed(self, kind: str, code: str, err: Unanswered | None) -> None:
        """Every rule of list ``kind`` failed with ``code``; the call counted unknown."""
        condition = {"embeddings": "embedding", "domains": "domain"}.get(kind, kind)
        for rule in self.rules[kind]:
            self.results.errors[f"{condition}:{rule.name}"] = code
        if err is not None:
            self.setup.unknown(err.deployment, err.reason)

    def _late(self, kind: str) -> None:
        """A model call still pending at the deadline (each call is bounded by it, so only
        a call stuck past it lands here): its rules resolve as unanswered in time."""
        binding = {
            "embedding": "embedding",
            "domain": "domain_classifier",
            "jailbreak": "prompt_guard",
            "pii": "pii_classifier",
        }.get(kind)
        if kind == "decision":
            for rule in self.rules["decision"]:
                key = f"decision:{rule.name}"
                if key not in self.results.errors and key not in self.results.values:
                    self.results.errors[key] = "decision_timeout"
            if self.rules["domains"] and "domain_classifier" not in self.setup.bindings:
                self._domain_failed(None)
            if self.rules["jailbreak"] and "prompt_guard" not in self.setup.bindings:
                self._unscanned("jailbreak", "deadline")
            self.setup.unknown(self.setup.decision_deployment, "timeout")
            return
        if kind in ("jailbreak", "pii"):
            self._unscanned(kind, "deadline")
        elif kind == "domain":
            self._domain_failed(None)
        elif kind == "language":
            self._failed("language", "language_evaluation_failed", None)
        else:
            self._failed("embeddings", "embedding_evaluation_failed", None)
        bound = self.setup.bindings.get(binding or "")
        if bound is not None:
            self.setup.unknown(bound.deployment, "timeout")

    # -- language ----------------------------------------------------------------------------
    async def _language(self) -> None:
        """The evaluation text's language (lingua, in a thread: it is CPU-bound)."""
        try:
            code, confidence = await asyncio.to_thread(language.detect, self.texts.evaluation)
        except Exception:  # a detector that cannot run: the rules fail, nothing else does
            self._failed("language", "language_evaluation_failed", None)
            return
        if code is None:
            return
        self.results.labels["language"] = code
        self.results.metrics.setdefault("language", {})["confidence"] = confidence
        for rule in self.rules["language"]:
            threshold = rule.threshold or language.DEFAULT_THRESHOLD
            if rule.name.lower() == code and confidence >= threshold:
                self.results.match("language", rule.name)

    # -- embeddings --------------------------------------------------------------------------
    async def _embeddings(self) -> None:
        binding = self.setup.bindings.get("embedding")
        if binding is None:
            self._failed("embeddings", "embedding_evaluation_failed", None)
            return
        pool = self.setup.pools[binding.deployment]
        try:
            answer = await call(
                pool,
                "embeddings",
                "/v1/embeddings",
                {"input": [self.texts.evaluation]},
                self.deadline,
            )
            query = _unit(answer["data"][0]["embedding"])
        except Unanswered as err:
            self._failed("embeddings", "embedding_evaluation_failed", err)
            return
        except (KeyError, IndexError, TypeError):
            self._failed(
                "embeddings",
                "embedding_evaluation_failed",
                Unanswered(binding.deployment, "failed"),
            )
            return
        scored: list[tuple[float, EmbeddingRule]] = []
        for rule in self.rules["embeddings"]:
            vectors = self.setup.candidates.get(rule.name) or []
            similarities = [_cosine(query, v) for v in vectors]
            if not similarities:
                continue
            if rule.aggregation_method == "mean":
                score = sum(similarities) / len(similarities)
            else:
                score = max(similarities)
            self.results.confidences[f"embedding:{rule.name}"] = score
            if score >= rule.threshold:
                scored.append((score, rule))
        scored.sort(key=lambda item: (-item[0], item[1].name))
        top_k = self.setup.modules.top_k
        for _, rule in scored[: top_k or None]:
            self.results.match("embeddings", rule.name)

    # -- classifiers -------------------------------------------------------------------------
    async def _classify(
        self, binding: Binding, pieces: Sequence[str], kind: str
    ) -> list[dict[str, Any]]:
        """Classify ``pieces`` on the bound deployment; an input over the model's limit is
        read again in windows (guards: every window read). Returns one result per piece.

        Raises:
            Unanswered: the call failed.
            Unscanned: a guard's input could not be read in full.
        """
        pool = self.setup.pools[binding.deployment]
        body: dict[str, Any] = {"input": list(pieces)}
        if binding.head is not None:
            body["head"] = binding.head
        options: dict[str, Any] = {}
        if binding.max_tokens is not None:
            options["max_tokens"] = binding.max_tokens
        if binding.overflow is not None:
            options["overflow"] = binding.overflow
        if options:
            body["options"] = options
        answer = await call(pool, "classify", "/v1/classify", body, self.deadline)
        results = list(answer.get("results") or [])
        retry = [i for i, r in enumerate(results) if r.get("error") == "max_length_exceeded"]
        if retry and kind != "domain":
            # Only a deployment that rejects (or truncates) long inputs gets here: under
            # ``overflow: window`` its ``max_tokens`` would be the scan budget and the
            # first call would have windowed already. Its ``max_tokens`` is then the
            # longest single read it allows, so it sizes each window; the scan budget is
            # the model's. (Sent as the budget, it would refuse every input the retry
            # exists for with ``scan_budget_exceeded``.)
            window: dict[str, Any] = {"overflow": "window"}
            if binding.max_tokens is not None:
                window["window"] = {"tokens": binding.max_tokens}
            again = await call(
                pool,
                "classify",
                "/v1/classify",
                {**body, "input": [pieces[i] for i in retry], "options": window},
                self.deadline,
            )
            for at, result in zip(retry, again.get("results") or [], strict=False):
                results[at] = result
        for result in results:
            code = result.get("error")
            if code == "max_length_exceeded":
                raise Unscanned("input_limit")
            if code == "scan_budget_exceeded":
                raise Unscanned("scan_budget")
            if code is not None:
                raise Unanswered(binding.deployment, "failed", str(code))
            read = result.get("input") or {}
            if kind != "domain" and (read.get("truncated") or read.get("tokens_lower_bound")):
                raise Unscanned("input_limit")
        return results

    async def _domains_classified(self) -> None:
        binding = self.setup.bindings["domain_classifier"]
        try:
            [result] = await self._classify(binding, [self.texts.evaluation], "domain")
        except (Unanswered, Unscanned) as err:
            self._domain_failed(err if isinstance(err, Unanswered) else None)
            return
        distribution = result.get("probabilities") or {}
        self._domain_label(distribution)

    def _domain_label(self, distribution: Mapping[str, float]) -> None:
        if not distribution:
            return
        label = max(distribution, key=lambda k: (distribution[k], k))
        probability = float(distribution[label])
        if probability < self.setup.modules.domain_threshold:
            return
        self.results.labels["domain"] = label
        self.results.metrics.setdefault("domain", {})["confidence"] = probability
        for rule in self.rules["domains"]:
            if label == rule.name or label in rule.mmlu_categories:
                self.results.match("domains", rule.name)
                self.results.confidences[f"domain:{rule.name}"] = probability

    def _domain_failed(self, err: Unanswered | None) -> None:
        self._failed("domains", "domain_evaluation_failed", err)
        if self.setup.modules.domain_on_error == "block":
            self.results.labels["domain"] = CLASSIFICATION_ERROR
            for rule in self.rules["domains"]:
                if rule.name == CLASSIFICATION_ERROR:
                    self.results.match("domains", rule.name)
                    self.results.confidences[f"domain:{rule.name}"] = 1.0

    async def _jailbreak_classified(self) -> None:
        binding = self.setup.bindings["prompt_guard"]
        pieces = self.texts.pieces(any(r.include_history for r in self.rules["jailbreak"]))
        if not pieces:
            return
        try:
            results = await self._classify(binding, pieces, "jailbreak")
        except Unscanned as err:
            self._unscanned("jailbreak", err.reason)
            return
        except Unanswered as err:
            self._guard_unanswered("jailbreak", err)
            return
        risks = [float((r.get("probabilities") or {}).get(JAILBREAK_LABEL, 0.0)) for r in results]
        self._jailbreak_risks(risks, len(self.texts.pieces(False)))

    def _jailbreak_risks(self, risks: Sequence[float], own: int) -> None:
        """Match each jailbreak rule on the highest risk over the pieces it reads (the
        evaluation text's first ``own`` pieces, then the history under ``include_history``)."""
        guard = self.setup.modules.prompt_guard
        for rule in self.rules["jailbreak"]:
            read = risks if rule.include_history else risks[:own]
            if not read:
                continue
            risk = max(read)
            self.results.confidences[f"jailbreak:{rule.name}"] = risk
            threshold = rule.threshold if rule.threshold is not None else guard.threshold
            if risk >= threshold:
                self.results.match("jailbreak", rule.name)

    async def _pii(self) -> None:
        binding = self.setup.bindings.get("pii_classifier")
        if binding is None:
            self._failed("pii", "pii_evaluation_failed", None)
            return
        pieces = self.texts.pieces(any(r.include_history for r in self.rules["pii"]))
        if not pieces:
            return
        try:
            results = await self._classify(binding, pieces, "pii")
        except Unscanned as err:
            self._unscanned("pii", err.reason)
            return
        except Unanswered as err:
            self._guard_unanswered("pii", err)
            return
        own = len(self.texts.pieces(False))
        guard = self.setup.modules.pii
        for rule in self.rules["pii"]:
            threshold = rule.threshold if rule.threshold is not None else guard.threshold
            read = results if rule.include_history else results[:own]
            found = {
                str(span.get("label"))
                for result in read
                for span in result.get("spans") or []
                if float(span.get("probability", 0.0)) >= threshold
            }
            if found - set(rule.pii_types_allowed):
                self.results.match("pii", rule.name)

    def _guard_unanswered(self, kind: str, err: Unanswered) -> None:
        """A guard's call went unanswered: past the deadline its input was not read in
        full (unscanned, ``deadline``; counted as a ``timeout``), any other failure is a
        backend error (``on_error``)."""
        if err.reason == "timeout":
            self._unscanned(kind, "deadline")
            self.setup.unknown(err.deployment, err.reason)
        else:
            self._guard_failed(kind, err)

    def _guard_failed(self, kind: str, err: Unanswered | None) -> None:
        """A guard's backend failed: ``allow`` resolves its rules false, ``block`` matches
        them (``classification_error``, confidence 1)."""
        self._failed(kind, f"{kind}_evaluation_failed", err)
        guard = self.setup.modules.prompt_guard if kind == "jailbreak" else self.setup.modules.pii
        if guard.on_error != "allow":
            for rule in self.rules[kind]:
                self.results.match(kind, rule.name)
                self.results.confidences[f"{kind}:{rule.name}"] = 1.0

    def _unscanned(self, kind: str, reason: str) -> None:
        """A guard's input was not read in full (``input_limit``, ``scan_budget``,
        ``deadline``): its rules match as unscanned, unless the module's ``on_unscanned:
        allow`` hands them to ``on_error``."""
        for rule in self.rules[kind]:
            self.results.errors[f"{kind}:{rule.name}"] = reason
        self.results.labels.setdefault("unscanned", {})[kind] = reason
        guard = self.setup.modules.prompt_guard if kind == "jailbreak" else self.setup.modules.pii
        blocks = guard.on_unscanned != "allow" or guard.on_error != "allow"
        if blocks:
            for rule in self.rules[kind]:
                self.results.match(kind, rule.name)

    # -- questions ---------------------------------------------------------------------------
    def _questions(self, domains_bound: bool, guard_bound: bool) -> dict[str, list[Asked]]:
        """Every question to ask, grouped by deployment (one call each)."""
        asked: dict[str, list[Asked]] = {}
        default = self.setup.decision_deployment
        for rule in self.rules["decision"]:
            deployment = rule.deployment or default
            whole = rule.deployment is None
            asked.setdefault(deployment, []).append(Asked("rule", rule, whole))
        if self.rules["domains"] and not domains_bound:
            asked.setdefault(default, []).append(Asked("domain", None, False))
        if self.rules["jailbreak"] and not guard_bound:
            asked.setdefault(default, []).append(Asked("jailbreak", None, False))
        return asked

    async def _ask(self, deployment: str, questions: Sequence[Asked]) -> None:
        """One ``/v1/decisions`` call holding every question for ``deployment``: the
        evaluation text as ``state``, the whole text and history pieces as named
        ``states`` entries."""
        own: dict[str, Any] = {}
        whole: dict[str, Any] = {}
        history: dict[str, Any] = {}
        for item in questions:
            if item.kind == "rule":
                assert item.rule is not None
                target = whole if item.whole else own
                target[f"rule:{item.rule.name}"] = _routing_question(item.rule.question)
            elif item.kind == "domain":
                # Every declared domain is a choice (the label set of a domain classifier),
                # not only the rules evaluated: with those alone the answer would be forced.
                choices = [
                    {"key": r.name, "description": r.description}
                    for r in self.setup.routing.signals.domains
                ]
                own["domain"] = {
                    "type": "choice",
                    "instructions": DOMAIN_QUESTION,
                    "choices": choices,
                }
            else:
                own["jailbreak"] = {"type": "noul", "instructions": JAILBREAK_QUESTION}
                if any(r.include_history for r in self.rules["jailbreak"]):
                    for index, piece in enumerate(self.texts.history):
                        history[f"history:{index}"] = {
                            "state": piece,
                            "questions": {"jailbreak": own["jailbreak"]},
                        }
        body: dict[str, Any] = {}
        states: dict[str, Any] = {}
        if own:
            body = {"state": self.texts.evaluation or " ", "questions": own}
        if whole:
            if body:
                states["whole"] = {"state": self.texts.whole or " ", "questions": whole}
            else:
                body = {"state": self.texts.whole or " ", "questions": whole}
        states.update(history)
        if states:
            body["states"] = states
        timeouts = [
            q.rule.timeout_ms
            for q in questions
            if q.kind == "rule" and q.rule is not None and q.rule.deployment
        ]
        deadline = self.deadline
        if timeouts:
            deadline = min(deadline, time.monotonic() + min(timeouts) / 1000)
        pool = self.setup.pools.get(deployment)
        try:
            if pool is None:
                raise Unanswered(deployment, "unavailable", "the deployment has no pool")
            answer = await call(pool, "decisions", "/v1/decisions", body, deadline)
        except Unanswered as err:
            self._questions_failed(questions, err)
            return
        answers: dict[str, Any] = dict(answer.get("answers") or {})
        states_answered = answer.get("states") or {}
        if isinstance(states_answered, dict) and "whole" in states_answered and own:
            answers.update(states_answered["whole"].get("answers") or {})
        for item in questions:
            if item.kind == "rule":
                assert item.rule is not None
                self._rule_answer(item.rule, answers.get(f"rule:{item.rule.name}"))
            elif item.kind == "domain":
                found = answers.get("domain") or {}
                if "error" in found or "probabilities" not in found:
                    self._domain_failed(None)
                else:
                    self._domain_label(found["probabilities"])
            else:
                risks = [_noul(answers.get("jailbreak"))]
                for index in range(len(self.texts.history)):
                    entry = (
                        states_answered.get(f"history:{index}")
                        if isinstance(states_answered, dict)
                        else None
                    )
                    risks.append(_noul((entry or {}).get("answers", {}).get("jailbreak")))
                if any(r is None for r in risks):
                    self._guard_failed("jailbreak", None)
                else:
                    self._jailbreak_risks([r for r in risks if r is not None], 1)

    def _questions_failed(self, questions: Sequence[Asked], err: Unanswered) -> None:
        code = {"timeout": "decision_timeout"}.get(err.reason, "decision_unavailable")
        for item in questions:
            if item.kind == "rule":
                assert item.rule is not None
                self.results.errors[f"decision:{item.rule.name}"] = code
            elif item.kind == "domain":
                self._domain_failed(None)
            elif err.reason == "timeout":  # a safety question not answered in time
                self._unscanned("jailbreak", "deadline")
            else:
                self._guard_failed("jailbreak", None)
        self.setup.unknown(err.deployment, err.reason)

    def _rule_answer(self, rule: DecisionRule, found: Any) -> None:
        """A decision rule's answer: its published values, and whether it matches."""
        key = f"decision:{rule.name}"
        if not isinstance(found, dict) or "error" in found:
            self.results.errors[key] = "decision_missing_answer"
            return
        kind = rule.question.get("type")
        predicate = rule.predicate
        if kind == "noul":
            value = float(found.get("noul", 0.0))
            matched = value >= 0.5 if predicate is None else predicate.holds(value)
            self.results.values[key] = value
            if matched:
                self.results.match("decision", rule.name)
        elif kind == "score":
            value = float(found.get("score", 0.0))
            self.results.values[key] = value
            if predicate is not None and predicate.holds(value):
                self.results.match("decision", rule.name)
        else:
            probabilities = found.get("probabilities") or {}
            chosen = found.get("choice")
            for option, p in probabilities.items():
                self.results.values[f"{key}:{option}"] = float(p)
            value = float(probabilities.get(chosen, 0.0))
            self.results.values[key] = value
            if predicate is None or predicate.holds(value):
                self.results.match("decision", rule.name)
                self.results.match("decision", f"{rule.name}:{chosen}")
        self.results.confidences[key] = self.results.values[key]


@dataclass(frozen=True)
class Asked:
    """One question of a ``/v1/decisions`` call: a decision rule's, or the built-in one of
    an unbound ``domain`` or ``jailbreak`` signal."""

    kind: str
    rule: DecisionRule | None
    whole: bool


class Unscanned(Exception):
    """A guard's input was not read in full: ``input_limit``, ``scan_budget`` or ``deadline``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _noul(answer: Any) -> float | None:
    if isinstance(answer, dict) and isinstance(answer.get("noul"), int | float):
        return float(answer["noul"])
    return None


ROUTING_QUESTION_KEYS = ("type", "instructions", "criteria", "choices", "levels")


def _routing_question(question: Mapping[str, Any]) -> dict[str, Any]:
    """A decision rule's question as the runtime takes it (choices as ``{key, description}``)."""
    asked = {k: v for k, v in question.items() if k in ROUTING_QUESTION_KEYS}
    choices = asked.get("choices")
    if isinstance(choices, list):
        asked["choices"] = [c if isinstance(c, dict) else {"key": str(c)} for c in choices]
    return asked
