"""A configuration generation's :class:`~.route.Router`, composed from the validated
configuration and the deployments' pools, and made ready (embedding rules' candidates
embedded once) before its Chat routes open."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..config.schema import Config
from .cache import ResponseCache
from .route import Router, auto_names
from .signals import language
from .signals.calls import Pool, Unanswered
from .signals.evaluate import Binding, Guard, Modules, Setup, prepare_candidates


class RouterUnready(Exception):
    """A router that cannot serve: the message says which deployment and why."""


def router_mode(config: Config) -> bool:
    """Whether ``config`` starts Router mode: the router enabled and Chat backends declared."""
    return config.router_enabled and bool(config.providers.models)


def compose(
    config: Config,
    pools: Mapping[str, Pool],
    cards: Mapping[str, dict[str, Any] | None],
    unknown: Callable[[str, str], None],
) -> Router:
    """The router of ``config`` over ``pools`` (deployment key to pool).

    Args:
        config: the validated configuration.
        pools: the pools of the deployments in use.
        cards: each deployment's model card (``None`` while unknown).
        unknown: counts an unanswered model call (``deployment``, ``reason``).

    Raises:
        RouterUnready: embedding rules (or a semantic response cache) with no ``embedding``
            binding, on a default decision deployment whose card gives no embeddings.
    """
    catalog = config.catalog
    modules = catalog.modules
    bindings: dict[str, Binding] = {}
    for name in ("domain_classifier", "prompt_guard", "pii_classifier", "embedding"):
        bound = catalog.bindings.get(name)
        if bound is None or bound.deployment not in pools:
            continue
        deployment = catalog.deployments[bound.deployment]
        given = deployment.input
        bindings[name] = Binding(
            bound.deployment,
            head=bound.head,
            max_tokens=given.max_tokens if given is not None and given.max_tokens else None,
            overflow=given.overflow if given is not None else None,
        )
    default = catalog.decision_deployment
    if "embedding" not in bindings and default in pools:
        card = cards.get(default)
        if card is None or card.get("embedding"):
            bindings["embedding"] = Binding(default)
    router_settings = config.global_.router
    setup = Setup(
        routing=config.routing,
        modules=Modules(
            prompt_guard=Guard(
                modules.prompt_guard.threshold,
                modules.prompt_guard.on_error,
                modules.prompt_guard.on_unscanned,
            ),
            pii=Guard(
                modules.classifier.pii.threshold,
                modules.classifier.pii.on_error,
                modules.classifier.pii.on_unscanned,
            ),
            domain_threshold=modules.classifier.domain.threshold,
            domain_on_error=modules.classifier.domain.on_error,
            top_k=catalog.embeddings.semantic.embedding_config.top_k,
        ),
        pools=pools,
        decision_deployment=default,
        bindings=bindings,
        timeout_ms=catalog.signal_timeout_ms or 0,
        unknown=unknown,
    )
    router = Router(
        routing=config.routing,
        providers=config.providers,
        setup=setup,
        auto=auto_names(router_settings.auto_model_name, router_settings.auto_model_names),
        include_config_models=router_settings.include_config_models_in_list,
        strategy=config.strategy,
    )
    needs_embedding = bool(router.used.get("embeddings")) or any(
        (p := d.plugin("response_cache")) is not None
        and p.configuration.get("mode", "semantic") != "exact"
        for d in config.routing.decisions
    )
    if needs_embedding and "embedding" not in bindings:
        raise RouterUnready(
            "embedding signals and semantic response caches need "
            "global.model_catalog.bindings.embedding (contract embedding.v1), or a default "
            f"decision deployment ({default}) whose model gives embeddings"
        )
    return router


async def prepare(router: Router, seconds: float = 60.0) -> None:
    """Embed the embedding rules' candidates (once per generation), and load the language
    detector's models when language rules exist.

    Raises:
        RouterUnready: the embedding deployment did not answer.
    """
    if router.routing.signals.language:
        await asyncio.to_thread(language.warm)
    try:
        await prepare_candidates(router.setup, time.monotonic() + seconds)
    except (Unanswered, KeyError, IndexError, TypeError) as err:
        raise RouterUnready(
            f"the embedding rules' candidates could not be embedded: {err}"
        ) from err


def response_cache(config: Config) -> ResponseCache:
    """The response cache ``global.stores.response_cache`` sizes."""
    store = config.global_.stores.response_cache
    threshold = store.similarity_threshold
    return ResponseCache(
        max_entries=store.max_entries,
        ttl_seconds=store.ttl_seconds,
        eviction=store.eviction_policy,
        threshold=0.5 if threshold is None else threshold,
    )
