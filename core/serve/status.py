"""What operators read: ``/health`` and the ``/v1/models`` cards, from the runtime's states.

Both follow wire contract 2.3 (:data:`~.schemas.API_VERSION`), which the router's
generated Go client decodes: a value of the wrong JSON type (a float where an
integer goes, a list where a string goes) fails its whole decode. The documents are
typed with the contract's shapes (:class:`~vllm_srun.plugins.cards.ModelCard`,
:class:`~.schemas.Health`), and so is the family's part of every card
(:class:`~vllm_srun.plugins.cards.FamilyCard`): a family writes the 2.3 forms itself.
"""

from __future__ import annotations

from typing import get_args

from vllm_srun.plugins.cards import CardStatus, ModelCard, PluginGroup, PluginInfo, ProfileInfo
from vllm_srun.plugins.decisions import MAX_CHOICES, MAX_LEVELS, MIN_CHOICES, MIN_LEVELS
from vllm_srun.plugins.host import Catalog
from vllm_srun.service.runtime import ModelState, Runtime

from . import autotune
from .schemas import API_VERSION, Health, ModelHealth

CARD_STATUSES: tuple[CardStatus, ...] = get_args(CardStatus)
"""Every state a card or ``/health`` reports."""

PLUGIN_GROUPS: tuple[tuple[PluginGroup, str], ...] = (
    ("family", "families"),
    ("engine", "engines"),
    ("accelerator", "accelerators"),
)
"""The card's plugin groups named by one card field each, with their catalog layer."""


def card_status(status: str) -> CardStatus:
    """A model state's name as the contract types it (:data:`CARD_STATUSES`).

    Raises:
        ValueError: a state the contract has no name for (a runtime bug).
    """
    for known in CARD_STATUSES:
        if status == known:
            return known
    raise ValueError(f"model state {status!r} is none of {', '.join(CARD_STATUSES)}")


def health_document(runtime: Runtime) -> tuple[int, Health]:
    """``/health``: 200 only when every model is ready, else 503.

    Returns:
        The status code and the body: ``api_version``, ``status`` (``starting``,
        ``loading``, ``warming``, ``ready``, ``degraded`` or ``failed``),
        ``reason``, ``model`` (the served model's name in a one-model process,
        else ``None``) and ``models`` (each model's ``status`` and ``reason``).
    """
    models: dict[str, ModelHealth] = {
        n: {"status": card_status(s.status), "reason": s.reason} for n, s in runtime.models.items()
    }
    states = {s.status for s in runtime.models.values()}
    status: CardStatus
    reason = None
    if not runtime.accepting:
        status, reason = "failed", "shutting down"
    elif not runtime.started:
        status = "starting"
    elif states == {"ready"}:
        status = "ready"
    elif states == {"failed"}:
        status, reason = "failed", "every model failed to load: " + _failures(runtime)
    elif "loading" in states:
        status = "loading"
    elif "warming" in states:
        status = "warming"
    else:
        status, reason = "degraded", "some models failed to load: " + _failures(runtime)
    single = next(iter(runtime.models)) if len(runtime.models) == 1 else None
    body: Health = {
        "status": status,
        "api_version": API_VERSION,
        "reason": reason,
        "model": single,
        "models": models,
    }
    return (200 if status == "ready" else 503), body


def _failures(runtime: Runtime) -> str:
    """``model a failed to load: <reason>; model b failed to load: <reason>``: the form
    the frontend and the router print for each failed model."""
    return "; ".join(
        f"model {name} failed to load: {state.reason}"
        for name, state in runtime.models.items()
        if state.status == "failed"
    )


def cards(runtime: Runtime) -> list[ModelCard]:
    """Every model's ``/v1/models`` card."""
    return [
        model_card(state, runtime.catalog, runtime.config.max_inputs)
        for state in runtime.models.values()
    ]


def profiles(profile: str) -> list[ProfileInfo]:
    """The card's ``profiles`` before the model is loaded (its engine, which declares
    them, is not chosen yet): the configured ``profile`` alone, its numerics unknown
    until then unless it is ``exact``."""
    return [
        {
            "name": profile,
            "numerics": "exact" if profile == "exact" else "approximate",
            "description": "not loaded yet",
        }
    ]


def model_card(
    state: ModelState, catalog: Catalog | None = None, max_inputs: int | None = None
) -> ModelCard:
    """One model's card (wire contract 2.3 ``ModelCard`` plus this runtime's extensions).

    Every field is present whatever the model's state (``null`` or empty until it
    is known); then come what the loaded model reports (kept after a failed
    self-check) and what is derived from both: ``ready``, ``plugins`` (from
    ``catalog``; empty without one), the decision limits and modalities of a
    model answering decisions, ``accelerator_validated``, and ``limits.max_inputs``
    (``max_inputs``, the process's ``--max-inputs``) on a model serving classify,
    embeddings or rerank.
    """
    card: ModelCard = {
        "id": state.name,
        "object": "model",
        "created": state.created,
        "owned_by": "vllm-srun",
        "family": None,
        "repo": None,
        "revision": state.config.revision,
        "model_sha256": None,
        "verification": None,
        "surfaces": [],
        "question_types": [],
        "presets": [],
        "modalities": [],
        "heads": [],
        "embedding": None,
        "rerank": None,
        "limits": {},
        "licence": None,
        "profile": state.config.profile,
        "profiles": profiles(state.config.profile),
        "numerics": "exact" if state.config.profile == "exact" else "approximate",
        "engine": None,
        "engine_reason": None,
        "accelerator": None,
        "accelerator_validated": False,
        "device": None,
        "dtype": state.config.dtype,
        "parameters": None,
        "ready": False,
        "status": card_status(state.status),
        "reason": state.reason,
        "golden": state.golden.card(),
        "plugins": [],
        "extensions": [],
        "engine_args": state.config.card(),
        "options": dict(state.config.options),
        "adapter": None,
        "autotune_cache": autotune.applied(),
        "deviation_from_exact": None,
    }
    details = state.served.card() if state.served is not None else state.details
    if details is not None:
        card = {**card, **details, "id": state.name}
    card["deviation_from_exact"] = (
        None
        if card["numerics"] == "exact"
        else {
            "max_abs": state.golden.deviation,
            "measured_on": "golden questions",
            "golden_cases": state.golden.checked,
            "reference": state.golden.reference,
        }
    )
    repo = card["repo"]
    if repo is not None and "/" in repo:
        card["owned_by"] = repo.split("/", 1)[0]  # the Hub organisation, as OpenAI names owners
    limits = card["limits"] = card["limits"].copy()  # the family's own stays as it wrote it
    if "decisions" in card["surfaces"]:
        card["modalities"] = card["modalities"] or ["text"]
        limits.setdefault("min_options", MIN_CHOICES)
        limits.setdefault("max_options", MAX_CHOICES)
        limits.setdefault("min_levels", MIN_LEVELS)
        limits.setdefault("max_levels", MAX_LEVELS)
    if max_inputs is not None and set(card["surfaces"]) & {"classify", "embeddings", "rerank"}:
        limits.setdefault("max_inputs", max_inputs)
    card["ready"] = state.status == "ready"
    # Validated: this model answered its golden requests as recorded on this accelerator.
    card["accelerator_validated"] = state.golden.status == "matched"
    if catalog is not None:
        card["plugins"] = composing_plugins(card, catalog)
    return card


def composing_plugins(card: ModelCard, catalog: Catalog) -> list[PluginInfo]:
    """The plugins a model is composed of (the card's ``plugins``): its family, engine,
    accelerator, kernels and attached extensions, as far as the card names them.

    Each entry: ``group`` (``family``, ``engine``, ``accelerator``, ``kernel`` or
    ``extension``), ``name`` (the object's registry name), ``distribution`` and
    ``version`` of the distribution declaring it (``None`` when no installed plugin
    owns the name), ``capabilities`` (what the object declares about itself), and
    ``plugin``, the entry-point name (an extension of the contract).
    """
    named = {"family": card["family"], "engine": card["engine"], "accelerator": card["accelerator"]}
    wanted: list[tuple[PluginGroup, str, str]] = [
        (group, layer, name)
        for group, layer in PLUGIN_GROUPS
        if (name := named.get(group)) is not None
    ]
    kernels = card.get("kernels", {})
    wanted += [("kernel", "kernels", f"{slot}.{name}") for slot, name in kernels.items()]
    for extension in card["extensions"]:
        wanted.append(("extension", "surface_extensions", extension["name"]))
    listed: list[PluginInfo] = []
    for group, layer, name in wanted:
        owner = catalog.owner(layer, name)
        listed.append(
            {
                "group": group,
                "name": name,
                "distribution": None if owner is None else owner.distribution,
                "version": None if owner is None else owner.version,
                "capabilities": _capabilities(group, catalog.layers.get(layer, {}).get(name)),
                "plugin": None if owner is None else owner.name,
            }
        )
    return listed


def _capabilities(group: PluginGroup, obj: object) -> dict[str, object]:
    """What a composed object declares about itself, by group (empty when unknown)."""
    if obj is None:
        return {}
    if group == "family":
        return {"surfaces": list(getattr(obj, "surfaces", ()))}
    if group == "engine":
        return {"kernel_slots": list(getattr(obj, "kernel_slots", ()))}
    if group == "accelerator":
        return {"golden_tolerance": float(getattr(obj, "golden_tolerance", 0.0))}
    if group == "kernel":
        return {
            "slot": str(getattr(obj, "slot", "")),
            "bit_exact": bool(getattr(obj, "bit_exact", False)),
            "reference": bool(getattr(obj, "reference", False)),
        }
    return {
        "surfaces": list(getattr(obj, "surfaces", ())),
        "numerics": str(getattr(obj, "numerics", "")),
        "method": str(getattr(obj, "method", "")),
    }
