"""What the Dashboard shows, as one JSON document (``GET /api/v1/dashboard``).

:func:`snapshot` reads the frontend as the management API does: its mode and phase, the
configuration's hashes and activation, each deployment in use (its pool's inventory
entry, with where the configuration publishes it), the deployments declared but not in
use, the listeners' grants, in Router mode the decisions and signals, and the
``vsr_model_runtime_*`` figures read from the same registry ``/metrics`` renders (so the
page and a scrape never disagree). Nothing in it is a credential or a socket path: a
listener's API keys are counted, never shown.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, Protocol

import yaml
from prometheus_client import CollectorRegistry

from .._version import __version__
from ..config.routing import SIGNAL_KINDS, RuleNode
from ..config.schema import Config
from ..config_document import safe_yaml
from ..generation import Generation
from ..metrics import Metrics
from ..reload import Reloads
from ..router.route import Router

FIGURES = {
    "vsr_model_runtime_ready": ("ready", None),
    "vsr_model_runtime_restarts_total": ("restarts", None),
    "vsr_model_runtime_requests_total": ("requests", "outcome"),
    "vsr_model_runtime_unknown_answers_total": ("unknown_answers", "reason"),
}
"""The series the Dashboard shows: sample name to (figure, the label it is split by).
Every one is per ``deployment``."""


class DashboardSource(Protocol):
    """What the Dashboard reads (the :class:`~vllm_sr.frontend.Frontend`)."""

    config: Config
    reloads: Reloads
    metrics: Metrics
    preparing: Generation | None

    @property
    def router(self) -> Router | None: ...

    def inventory(self) -> list[dict[str, Any]]:
        """Each deployment's inventory entry (its pool's), in any order."""
        ...

    def instance_status(self) -> dict[str, Any]:
        """``GET /api/v1/status``: ``mode``, ``phase``, ``ready``, ``message``,
        ``config_version`` among others."""
        ...


def snapshot(source: DashboardSource) -> dict[str, Any]:
    """The Dashboard's document.

    Keys: ``mode`` (``engine`` or ``router``), ``version``, ``phase``, ``ready``,
    ``message``, ``config`` (``GET /api/v1/config/hash`` plus ``config_version``),
    ``listeners``, ``deployments`` (in use, sorted by name, then generation; each read
    against its own generation's configuration, and ``editable`` when the saved document
    declares it, so that a change can name it), ``declared`` (declared, not in use),
    ``saved_only`` (in the saved document, not in the configuration serving: what a
    failed activation left there), ``routing`` (Router mode, else ``None``) and
    ``figures``.
    """
    config = source.config
    status = source.instance_status()
    saved = saved_deployments(source.reloads)
    preparing = source.preparing
    configs = {"active": config, "preparing": preparing.config if preparing else config}
    grants = {role: published_on(own) for role, own in configs.items()}  # once per generation
    deployments = []
    for entry in sorted(
        source.inventory(), key=lambda e: (str(e.get("name")), e.get("generation") != "active")
    ):
        name = str(entry.get("name"))
        role = "preparing" if entry.get("generation") == "preparing" else "active"
        own = configs[role]
        declared = own.catalog.deployments.get(name)
        deployments.append(
            {
                **entry,
                "artifact": declared.artifact if declared else None,
                "public_id": declared.public_id() if declared else None,
                "published": grants[role].get(name, []),
                "bound": bindings_of(own, name),
                "editable": name in saved,
                "scalable": declared is not None
                and name in saved
                and not any(p.attached for p in declared.placements()),
            }
        )
    in_use = {d["name"] for d in deployments}
    unused = [
        {
            "name": name,
            "artifact": d.artifact,
            "public_id": d.public_id(),
            "editable": name in saved,
        }
        for name, d in sorted(config.catalog.deployments.items())
        if name not in in_use
    ]
    return {
        "mode": status["mode"],
        "version": __version__,
        "phase": status["phase"],
        "ready": status["ready"],
        "message": status["message"],
        "config": {**source.reloads.hash_document(), "config_version": status["config_version"]},
        "persisted": source.reloads.source.path is not None,
        "default_decision_deployment": config.catalog.decision_deployment,
        "default_model": config.providers.defaults.default_model,
        "listeners": listeners_of(config),
        "deployments": deployments,
        "declared": unused,
        "saved_only": sorted(saved - set(config.catalog.deployments)),
        "routing": routing_of(source.router),
        "figures": figures(source.metrics.registry),
    }


def saved_deployments(reloads: Reloads) -> frozenset[str]:
    """The deployment names the saved document declares (a document that does not
    parse declares none)."""
    return declared_in(reloads.source.text)


@functools.lru_cache(maxsize=8)
def declared_in(text: bytes) -> frozenset[str]:
    """The names under ``global.model_catalog.deployments`` of the document ``text``,
    parsed once per distinct text (the page reads every second)."""
    try:
        document = safe_yaml(text.decode()) if text.strip() else {}
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError):
        return frozenset()
    glob = document.get("global") if isinstance(document, dict) else None
    catalog = glob.get("model_catalog") if isinstance(glob, dict) else None
    found = catalog.get("deployments") if isinstance(catalog, dict) else None
    return frozenset(str(name) for name in found) if isinstance(found, dict) else frozenset()


def listeners_of(config: Config) -> list[dict[str, Any]]:
    """Each listener: name, address, port, its grants and how many API keys guard it."""
    return [
        {
            "name": listener.name,
            "address": listener.address,
            "port": listener.port,
            "api_keys": len(listener.api_keys),
            "models": list(listener.models),
            "runtime": list(listener.runtime.models),
            "systemone": list(listener.systemone.models),
        }
        for listener in config.listeners
    ]


def published_on(config: Config) -> dict[str, list[dict[str, str]]]:
    """Each deployment's native grants: ``[{"listener", "grant"}]`` (``runtime`` or
    ``systemone``), by deployment name."""
    found: dict[str, list[dict[str, str]]] = {}
    for listener in config.listeners:
        for grant, models in (
            ("runtime", listener.runtime.models),
            ("systemone", listener.systemone.models),
        ):
            for public_id in models:
                name = config.deployment_for_public_id(public_id)
                if name is not None:
                    found.setdefault(name, []).append({"listener": listener.name, "grant": grant})
    return found


def bindings_of(config: Config, deployment: str) -> list[str]:
    """The task bindings (``pii_classifier``, ``embedding``, ...) that name ``deployment``."""
    return sorted(n for n, b in config.catalog.bindings.items() if b.deployment == deployment)


def rule_text(node: RuleNode | None) -> str:
    """A decision's rule tree as one line: leaves ``type:name`` (``[label]``, a
    predicate), combinations ``(a AND b)``, ``NOT a``; no rules is ``always``."""
    if node is None:
        return "always"
    if node.is_leaf:
        text = f"{node.type}:{node.name}"
        if node.label:
            text += f"[{node.label}]"
        if node.predicate is not None:
            bounds = node.predicate.model_dump(exclude_none=True)
            text += " " + " ".join(f"{k} {v}" for k, v in bounds.items())
        return text
    children = node.conditions or []
    if not children:
        return "always"
    if node.op == "NOT":
        return "NOT " + rule_text(children[0])
    inner = f" {node.op} ".join(rule_text(c) for c in children)
    return inner if len(children) == 1 else f"({inner})"


def routing_of(router: Router | None) -> dict[str, Any] | None:
    """Router mode's decisions (name, priority, conditions as :func:`rule_text`, model
    names, algorithm, plugin types) and signals (kind, name, the deployment answering it
    or ``None``)."""
    if router is None:
        return None
    decisions = [
        {
            "name": d.name,
            "priority": d.priority,
            "conditions": rule_text(d.rules),
            "models": [ref.model for ref in d.modelRefs],
            "algorithm": d.algorithm.type,
            "plugins": [plugin.type for plugin in d.plugins],
        }
        for d in router.routing.decisions
    ]
    signals = []
    for kind in SIGNAL_KINDS:
        for rule in getattr(router.routing.signals, kind):
            deployment = router.setup.answered_by(kind, rule if kind == "decision" else None)
            signals.append({"kind": kind, "name": rule.name, "deployment": deployment})
    return {"strategy": router.strategy, "decisions": decisions, "signals": signals}


def figures(registry: CollectorRegistry) -> dict[str, dict[str, Any]]:
    """The :data:`FIGURES` series by deployment: ``ready`` and ``restarts`` a number,
    ``requests`` and ``unknown_answers`` a count per outcome or reason (zero counts left
    out)."""
    found: dict[str, dict[str, Any]] = {}
    for name, labels, value in _samples(registry.collect()):
        figure, split = FIGURES[name]
        deployment = found.setdefault(labels.get("deployment", ""), {})
        if split is None:
            deployment[figure] = value
        elif value:
            deployment.setdefault(figure, {})[labels.get(split, "")] = value
    return found


def _samples(metrics: Iterable[Any]) -> Iterable[tuple[str, dict[str, str], float]]:
    for metric in metrics:
        for sample in metric.samples:
            if sample.name in FIGURES:
                yield sample.name, sample.labels, sample.value
