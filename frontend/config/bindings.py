"""Bindings checked against a model's card: a known mismatch is refused.

A binding asks a deployment for one kind of answer (its contract). Once the
deployment's card is known, :func:`binding_problem` says whether the model gives
that answer: the surface or head kind the contract needs, the head the binding
names, and an input limit no larger than the model's.
"""

from __future__ import annotations

from typing import Any

from .schema import Binding, Deployment

HEAD_KINDS = {
    "label_distribution.v1": "sequence",
    "label_scores.v1": "scores",
    "token_spans.v1": "token",
    "relevance_scores.v1": "relevance",
}
"""The head kind each head-reading contract needs."""


def binding_problem(
    name: str, binding: Binding, deployment: Deployment, card: dict[str, Any]
) -> str | None:
    """Why ``card`` cannot answer the binding ``name``, or ``None`` when it can.

    The message starts with ``a binding does not match the model`` (the troubleshooting
    guide's words) and names the binding, the deployment and what is missing.
    """
    where = (
        f"a binding does not match the model: {name} ({binding.contract}) on {binding.deployment}"
    )
    surfaces = card.get("surfaces") or []
    heads = [h for h in card.get("heads") or [] if isinstance(h, dict)]
    contract = binding.contract
    if contract == "decision.v1":
        if "decisions" not in surfaces:
            return f"{where}: the model answers no decisions (it serves {_listed(surfaces)})"
    elif contract == "embedding.v1":
        if not card.get("embedding"):
            return f"{where}: the model gives no embeddings (it serves {_listed(surfaces)})"
    else:
        kind = HEAD_KINDS[contract]
        if binding.head is not None:
            named = [h for h in heads if h.get("name") == binding.head]
            if not named:
                return f"{where}: the model has no head {binding.head} (heads: {_names(heads)})"
            if named[0].get("kind") != kind:
                return (
                    f"{where}: head {binding.head} is a {named[0].get('kind')} head, not a "
                    f"{kind} head"
                )
        elif not any(h.get("kind") == kind for h in heads):
            return f"{where}: the model has no {kind} head (heads: {_names(heads)})"
    if binding.head is not None and contract in ("decision.v1", "embedding.v1"):
        return f"{where}: {contract} reads no head; remove head {binding.head}"
    wanted = deployment.input.max_tokens if deployment.input is not None else None
    limits = card.get("limits") or {}
    limit = limits.get("max_input_tokens") if isinstance(limits, dict) else None
    if wanted is not None and isinstance(limit, int) and wanted > limit:
        return (
            f"{where}: input.max_tokens {wanted} is above the model's input limit {limit}; "
            "lower it or bind a model made for longer inputs"
        )
    return None


def _listed(items: list[Any]) -> str:
    return ", ".join(str(i) for i in items) or "nothing"


def _names(heads: list[dict[str, Any]]) -> str:
    return ", ".join(f"{h.get('name')} ({h.get('kind')})" for h in heads) or "none"
