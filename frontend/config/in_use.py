"""Which deployments a configuration uses: only those start a worker.

A deployment is in use when a listener publishes it (a native ``systemone`` grant,
or this project's ``runtime`` grant, both by public model id) or when Engine mode
needs it as the default decision deployment. In Router mode the deployments its routes
need are in use as well (:func:`routing_deployments`). Any other declaration starts nothing and
never holds up startup.
"""

from __future__ import annotations

from .routing import CONDITION_TYPES
from .schema import Config


def deployments_in_use(config: Config) -> list[str]:
    """The deployments to run, in declaration order.

    A public id no deployment answers to is skipped: publishing a name does not
    create a deployment (the native API lists only ids that resolve).
    """
    wanted: set[str] = set()
    for listener in config.listeners:
        for public_id in (*listener.systemone.models, *listener.runtime.models):
            name = config.deployment_for_public_id(public_id)
            if name is not None:
                wanted.add(name)
    catalog = config.catalog
    if catalog.decision_deployment in catalog.deployments and not config.router_enabled:
        wanted.add(catalog.decision_deployment)
    if config.router_enabled:
        wanted.update(routing_deployments(config))
    return [name for name in catalog.deployments if name in wanted]


def routing_deployments(config: Config) -> set[str]:
    """The deployments Router mode's routes need (ROUTER-SPEC §1.5): the binding of each
    signal kind some decision references (the embedding binding also for a semantic
    response cache), each referenced question's ``deployment``, and the default decision
    deployment for referenced questions without one and for the built-in questions of
    unbound domain and jailbreak signals (and embeddings, when nothing is bound for them).
    Signals no decision references start nothing."""
    catalog = config.catalog
    bindings = catalog.bindings
    default = catalog.decision_deployment
    used: dict[str, set[str]] = {}
    semantic_cache = False
    for decision in config.routing.decisions:
        if decision.rules is not None:
            for leaf in decision.rules.leaves():
                kind = CONDITION_TYPES.get(leaf.type or "")
                if kind is not None and leaf.name is not None:
                    used.setdefault(kind, set()).add(leaf.name)
        cache = decision.plugin("response_cache")
        if cache is not None and cache.configuration.get("mode", "semantic") != "exact":
            semantic_cache = True
    wanted: set[str] = set()

    def bound_or_default(binding: str) -> None:
        wanted.add(bindings[binding].deployment if binding in bindings else default)

    if used.get("domains"):
        bound_or_default("domain_classifier")
    if used.get("jailbreak"):
        bound_or_default("prompt_guard")
    if used.get("pii") and "pii_classifier" in bindings:
        wanted.add(bindings["pii_classifier"].deployment)
    if used.get("embeddings") or semantic_cache:
        bound_or_default("embedding")
    for rule in config.routing.signals.decision:
        if rule.name in used.get("decision", set()):
            wanted.add(rule.deployment or default)
    return {name for name in wanted if name in catalog.deployments}


def managed_in_use(config: Config) -> list[str]:
    """The deployments in use that have at least one managed worker: the ones startup
    waits for."""
    deployments = config.catalog.deployments
    return [name for name in deployments_in_use(config) if deployments[name].managed]


def unserved_grants(config: Config) -> list[str]:
    """A warning per listener grant naming a public id no deployment answers to (the
    listener does not publish it): ``listeners.<name>.<grant>.models[<i>]: ...``. The
    Jev alias ``jev-latest`` is not a deployment's id and is never warned about."""
    warnings = []
    for listener in config.listeners:
        for grant in ("systemone", "runtime"):
            for index, model in enumerate(getattr(listener, grant).models):
                if model == "jev-latest" or config.deployment_for_public_id(model) is not None:
                    continue
                warnings.append(
                    f"listeners.{listener.name}.{grant}.models[{index}]: no deployment "
                    f"answers to {model}, so the listener does not publish it (set a "
                    "deployment's public_name or artifact to it)"
                )
    return warnings
