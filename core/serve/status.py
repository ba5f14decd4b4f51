"""What operators read: ``/health`` and the ``/v1/models`` cards, from the runtime's states."""

from __future__ import annotations

from typing import Any

from . import autotune
from .runtime import ModelState, Runtime
from .schemas import API_VERSION


def health_document(runtime: Runtime) -> tuple[int, dict[str, Any]]:
    """``/health``: 200 only when every model is ready."""
    models = {n: {"status": s.status, "reason": s.reason} for n, s in runtime.models.items()}
    states = {s.status for s in runtime.models.values()}
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
    body = {"status": status, "api_version": API_VERSION, "reason": reason, "models": models}
    return (200 if status == "ready" else 503), body


def _failures(runtime: Runtime) -> str:
    """``model a failed to load: <reason>; model b failed to load: <reason>``: the form
    the frontend and the router print for each failed model."""
    return "; ".join(
        f"model {name} failed to load: {state.reason}"
        for name, state in runtime.models.items()
        if state.status == "failed"
    )


def cards(runtime: Runtime) -> list[dict[str, Any]]:
    """Every model's ``/v1/models`` card."""
    return [model_card(state) for state in runtime.models.values()]


def model_card(state: ModelState) -> dict[str, Any]:
    """One model's card: every field present whatever its state (``null`` or empty until
    it is known), then what the loaded model reports (kept after a failed self-check)."""
    card: dict[str, Any] = {
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
        "heads": [],
        "embedding": None,
        "limits": {},
        "licence": None,
        "profile": "exact",
        "profiles": ["exact"],
        "engine": None,
        "accelerator": None,
        "device": None,
        "dtype": state.config.dtype,
        "parameters": None,
        "status": state.status,
        "reason": state.reason,
        "golden": state.golden.card(),
        "extensions": [],
        "engine_args": state.config.card(),
        "options": dict(state.config.options),
        "adapter": None,
        "autotune_cache": autotune.applied(),
    }
    details = state.served.card() if state.served is not None else state.details
    if details is not None:
        card.update(details)
        card["id"] = state.name
    repo = card.get("repo")
    if isinstance(repo, str) and "/" in repo:
        card["owned_by"] = repo.split("/", 1)[0]  # the Hub organisation, as OpenAI names owners
    return card
