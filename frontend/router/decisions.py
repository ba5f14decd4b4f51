"""Decisions: rule trees evaluated three-valued, ``rules.on_unknown`` applied, the
matched decisions ranked (ROUTER-SPEC §2.5, §2.6; upstream ``pkg/decision``).

A leaf is true or false from what the signals found (:class:`SignalResults`), and
unknown only when its signal failed and the decision's root sets ``on_unknown``;
without a policy a failed leaf resolves at once: true when the failure made it match
(``on_error: block``, an unscanned guard) or the leaf says ``on_error: match``, else
false. ``AND`` is false on any false child, else unknown on any unknown, else true (its
confidence the mean of its children's); ``OR`` is true on any true child (the most
confident one's confidence), else unknown on any unknown, else false; ``NOT`` swaps true
and false (confidence 1, unscored) and keeps unknown. An unknown root takes the
decision's policy: ``no_match`` false, ``match`` true (confidence 1), ``fail_request``
fails the request.

Ranking among matched decisions, the first key that differs wins: catch-alls last;
``priority`` descending; confidence descending, only when the pool is comparable (every
decision that is not a catch-all scored by exactly one evidence leaf, all of one kind:
probabilities or similarities; jailbreak risk never compares); ``name`` ascending.
``strategy: confidence`` swaps the second and third keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config.routing import CONDITION_TYPES, Decision, RuleNode

TRUE, FALSE, UNKNOWN = "true", "false", "unknown"

SCORED = {"domain": "probability", "decision": "probability", "embedding": "similarity"}
"""Leaf types whose confidence is a score, and the kind of score (comparable only within
a kind). ``jailbreak`` is scored (its risk) but never comparable."""


@dataclass
class SignalResults:
    """What the signals found for one request.

    Attributes:
        matched: per signal list (``keywords``, ``decision``, ...) the rule names that
            matched; a ``decision`` rule adds ``<n>`` and, for a Choice, ``<n>:<key>`` of
            the chosen key. A failure that matches (``block``, unscanned) is listed too.
        confidences: ``"<type>:<name>"`` to the rule's score (domain probability,
            embedding similarity, decision value, jailbreak risk).
        values: ``"decision:<n>"`` (P(yes), the expected level, or P(chosen)) and
            ``"decision:<n>:<key>"`` (each option's probability).
        errors: ``"<type>:<name>"`` to the code of a signal that failed (ROUTER-SPEC §2.5).
        metrics: per signal type, ``{"execution_time_ms", "confidence"}`` (the preview's).
        labels: extra facts for headers: the detected domain (``domain``), the context
            token count (``context_tokens``).
        evaluated: per signal list, the rule names evaluated for this request (what
            ``llm_signal_extraction_total`` counts).
    """

    matched: dict[str, set[str]] = field(default_factory=dict)
    confidences: dict[str, float] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    labels: dict[str, Any] = field(default_factory=dict)
    evaluated: dict[str, set[str]] = field(default_factory=dict)

    def match(self, kind: str, name: str) -> None:
        """Record that rule ``name`` of list ``kind`` matched."""
        self.matched.setdefault(kind, set()).add(name)

    def has(self, kind: str, name: str) -> bool:
        return name in self.matched.get(kind, ())


@dataclass
class Node:
    """One evaluated node: its state, confidence and the trace the preview shows (empty
    when no trace was asked for)."""

    state: str
    confidence: float
    scored: bool
    trace: dict[str, Any]


@dataclass
class Outcome:
    """One decision evaluated.

    Attributes:
        decision: the decision.
        state: the root's state before the policy (``true``, ``false``, ``unknown``).
        matched: whether it matches after the policy.
        confidence: the root's confidence.
        policy: the ``on_unknown`` applied, or ``None``.
        evidence: the score kind of its single evidence leaf, or ``None`` when it has none,
            several, or a jailbreak one (then it is not comparable).
        trace: the preview's ``eval_trace`` entry.
    """

    decision: Decision
    state: str
    matched: bool
    confidence: float
    policy: str | None
    evidence: str | None
    trace: dict[str, Any]

    @property
    def failed(self) -> bool:
        """Whether the request must fail: the root was unknown under ``fail_request``."""
        return self.policy == "fail_request"


def _leaf(leaf: RuleNode, results: SignalResults, policy: str | None, traced: bool) -> Node:
    kind = CONDITION_TYPES[leaf.type or ""]
    name = leaf.name or ""
    key = f"{leaf.type}:{name}"
    error = results.errors.get(key)
    scored = leaf.type in SCORED or leaf.type == "jailbreak"
    confidence = results.confidences.get(key, 1.0) if scored else 1.0
    if error is not None and policy is not None:
        state = UNKNOWN
    elif leaf.type == "decision":
        state = TRUE if _decision_leaf(leaf, results) else FALSE
        if leaf.label is not None:
            confidence = results.values.get(f"decision:{name}:{leaf.label}", confidence)
    else:
        state = TRUE if results.has(kind, name) else FALSE
    if error is not None and state == FALSE and leaf.on_error == "match":
        state = TRUE
    scored = scored and key in results.confidences and error is None
    if not scored:
        confidence = 1.0
    trace: dict[str, Any] = {}
    if traced:
        trace = {"node_type": "leaf", "signal_type": leaf.type, "signal_name": name}
        if leaf.label is not None:
            trace["label"] = leaf.label
        if error is not None:
            trace["signal_error"] = error
        trace.update(
            state=state, matched=state == TRUE, confidence=confidence, confidence_scored=scored
        )
    return Node(state, confidence, scored, trace)


def _decision_leaf(leaf: RuleNode, results: SignalResults) -> bool:
    name = leaf.name or ""
    if leaf.label is not None:
        chosen = results.has("decision", f"{name}:{leaf.label}")
        if not chosen:
            return False
        if leaf.predicate is not None:
            value = results.values.get(f"decision:{name}:{leaf.label}")
            return value is not None and leaf.predicate.holds(value)
        return True
    if leaf.predicate is not None:
        value = results.values.get(f"decision:{name}")
        return value is not None and leaf.predicate.holds(value)
    return results.has("decision", name)


def evaluate_node(
    node: RuleNode, results: SignalResults, policy: str | None, traced: bool = True
) -> Node:
    """The state, confidence and (when ``traced``) trace of ``node`` (see the module
    docstring)."""
    if node.is_leaf:
        return _leaf(node, results, policy, traced)
    children = [evaluate_node(child, results, policy, traced) for child in node.conditions or ()]
    op = node.op
    if op == "NOT":
        [child] = children
        state = {TRUE: FALSE, FALSE: TRUE, UNKNOWN: UNKNOWN}[child.state]
        confidence, scored = 1.0, False
    elif op == "OR":
        winners = [c for c in children if c.state == TRUE]
        if winners:
            best = max(winners, key=lambda c: c.confidence)
            state, confidence, scored = TRUE, best.confidence, best.scored
        else:
            state = UNKNOWN if any(c.state == UNKNOWN for c in children) else FALSE
            confidence, scored = 0.0, False
    else:
        if any(c.state == FALSE for c in children):
            state = FALSE
        elif any(c.state == UNKNOWN for c in children):
            state = UNKNOWN
        else:
            state = TRUE
        confidence = sum(c.confidence for c in children) / len(children) if children else 0.0
        scored = any(c.scored for c in children)
        if state != TRUE:
            confidence = 0.0 if state == FALSE else confidence
    trace: dict[str, Any] = {}
    if traced:
        trace = {
            "node_type": op,
            "state": state,
            "matched": state == TRUE,
            "confidence": confidence,
            "children": [c.trace for c in children],
        }
    return Node(state, confidence, scored, trace)


def evidence_kind(decision: Decision) -> str | None:
    """The score kind of a decision's single evidence leaf (``probability`` or
    ``similarity``), or ``None`` when it has none, several, or a jailbreak one."""
    if decision.rules is None:
        return None
    scored = [leaf for leaf in decision.rules.leaves() if leaf.type in (*SCORED, "jailbreak")]
    if len(scored) != 1 or scored[0].type == "jailbreak":
        return None
    return SCORED[scored[0].type or ""]


def evaluate(decision: Decision, results: SignalResults, traced: bool = True) -> Outcome:
    """One decision against the signals' results (its trace only when ``traced``)."""
    policy = decision.on_unknown
    trace: dict[str, Any]
    if decision.catch_all:
        trace = {
            "decision_name": decision.name,
            "state": TRUE,
            "matched": True,
            "confidence": 0.0,
            "root_trace": {"node_type": "fallback", "state": TRUE, "matched": True},
        }
        return Outcome(decision, TRUE, True, 0.0, None, None, trace)
    assert decision.rules is not None
    root = evaluate_node(decision.rules, results, policy, traced)
    matched = root.state == TRUE
    confidence = root.confidence
    applied = None
    evidence = evidence_kind(decision)
    if root.state == UNKNOWN:
        applied = policy
        if policy == "match":
            # Matched by policy: confidence 1, unscored (no evidence to rank or report).
            matched, confidence, evidence = True, 1.0, None
    trace = {}
    if traced:
        trace = {
            "decision_name": decision.name,
            "state": root.state,
            "matched": matched,
            "confidence": confidence,
        }
        if policy is not None:
            trace["on_unknown"] = policy
        trace["root_trace"] = root.trace
    return Outcome(decision, root.state, matched, confidence, applied, evidence, trace)


@dataclass
class Ranking:
    """Every decision evaluated, and the outcome of routing.

    Attributes:
        outcomes: every decision's outcome, in configuration order.
        chosen: the winning decision's outcome, or ``None``.
        failed: a ``fail_request`` decision whose root was unknown (the request fails,
            whatever else matched), or ``None``.
        policies: ``{decision: policy}`` for every ``on_unknown`` applied, in order.
    """

    outcomes: list[Outcome]
    chosen: Outcome | None
    failed: Outcome | None
    policies: dict[str, str]


def rank(
    decisions: Sequence[Decision],
    results: SignalResults,
    strategy: str | None = None,
    traced: bool = True,
) -> Ranking:
    """Evaluate ``decisions`` and pick the winner (see the module docstring).

    Args:
        decisions: ``routing.decisions`` in configuration order.
        results: what the signals found.
        strategy: ``priority`` (default) or ``confidence``.
        traced: build each outcome's trace (the preview's ``eval_trace``); a routed
            request does without.
    """
    outcomes = [evaluate(d, results, traced) for d in decisions]
    policies = {o.decision.name: o.policy for o in outcomes if o.policy is not None}
    failed = next((o for o in outcomes if o.failed), None)
    matched = [o for o in outcomes if o.matched]
    scored = [o for o in matched if not o.decision.catch_all]
    kinds = {o.evidence for o in scored}
    comparable = bool(scored) and None not in kinds and len(kinds) == 1

    def key(outcome: Outcome) -> tuple[Any, ...]:
        confidence = -outcome.confidence if comparable and not outcome.decision.catch_all else 0
        priority = -outcome.decision.priority
        middle = (confidence, priority) if strategy == "confidence" else (priority, confidence)
        return (outcome.decision.catch_all, *middle, outcome.decision.name)

    chosen = min(matched, key=key) if matched else None
    return Ranking(outcomes, chosen, failed, policies)


def referenced_signals(decisions: Iterable[Decision]) -> dict[str, set[str]]:
    """Per signal list, the rule names some decision's tree references (the signals a
    routed request evaluates; the preview evaluates every one)."""
    used: dict[str, set[str]] = {}
    for decision in decisions:
        if decision.rules is None:
            continue
        for leaf in decision.rules.leaves():
            kind = CONDITION_TYPES.get(leaf.type or "")
            if kind is not None and leaf.name is not None:
                used.setdefault(kind, set()).add(leaf.name)
    return used


def used_signals(decision: Decision) -> dict[str, list[str]]:
    """The preview's ``used_signals`` of one decision: per signal list, sorted names."""
    found = referenced_signals([decision])
    return {kind: sorted(names) for kind, names in found.items()}


def headers_value(policies: Mapping[str, str]) -> str:
    """``x-vsr-applied-unknown-policy``: ``decision=policy`` pairs joined by commas."""
    return ",".join(f"{name}={policy}" for name, policy in policies.items())
