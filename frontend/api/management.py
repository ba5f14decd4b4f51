"""The management API (default ``127.0.0.1:8080``): what operators ask the frontend.

``GET /health`` answers while the process runs; ``GET /ready`` is 503 until every
managed deployment in use is ready (and again once shutdown starts);
``GET /startup-status`` is upstream's startup document; ``GET /api/v1/status`` the
instance's mode and phase; ``GET /api/v1/inventory/model-runtime`` lists each
deployment in use with its replicas. Nothing here shows a socket path or a
credential: an endpoint is ``unix`` or ``scheme://host:port``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from ..config.schema import Deployment
from ..startup import DeploymentView, StartupStatus


class ManagementSource(Protocol):
    """What the management API reads (the :class:`~vllm_sr.frontend.Frontend`)."""

    status: StartupStatus

    @property
    def draining(self) -> bool: ...

    def inventory(self) -> list[dict[str, Any]]: ...

    def instance_status(self) -> dict[str, Any]: ...


def _json(status: int, body: dict[str, Any]) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers={"Cache-Control": "no-store"})


def build_management_app(source: ManagementSource) -> FastAPI:
    """The management API's application, reading ``source`` on each request."""
    app = FastAPI(
        title="vllm-sr management API",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 while the frontend runs (also while it waits for its models)."""
        return _json(200, {"status": "draining" if source.draining else "ok"})

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """200 once every managed deployment in use is ready and serving; else 503."""
        status = source.status
        if status.ready and not source.draining:
            return _json(200, {"ready": True, "phase": status.phase})
        phase = "draining" if source.draining else status.phase
        return _json(503, {"ready": False, "phase": phase, "message": status.message})

    @app.get("/startup-status")
    async def startup_status() -> JSONResponse:
        """Phase, message and each managed deployment's state."""
        return _json(200, source.status.document())

    @app.get("/api/v1/status")
    async def instance_status() -> JSONResponse:
        """This instance's mode, default deployment and phase."""
        return _json(200, source.instance_status())

    @app.get("/api/v1/inventory/model-runtime")
    async def inventory() -> JSONResponse:
        """Each deployment in use, sorted by name, with its replicas."""
        entries = sorted(source.inventory(), key=lambda entry: str(entry.get("name")))
        return _json(200, {"deployments": entries, "count": len(entries)})

    return app


CARD_STRINGS = ("family", "repo", "revision", "device", "profile", "engine")
"""Card fields the inventory shows as text (empty until a card is seen)."""


def card_summary(card: dict[str, Any] | None) -> dict[str, Any]:
    """The card fields an inventory entry shows: empty until the model is ready."""
    card = card or {}
    heads = [
        {"name": h.get("name"), "kind": h.get("kind"), "labels": list(h.get("labels") or [])}
        for h in card.get("heads") or []
        if isinstance(h, dict)
    ]
    embedding = card.get("embedding")
    rerank = card.get("rerank")
    summary: dict[str, Any] = {k: str(card.get(k) or "") for k in CARD_STRINGS}
    summary.update(
        surfaces=list(card.get("surfaces") or []),
        heads=heads,
        embedding=None
        if not isinstance(embedding, dict)
        else {
            "dimensions": list(embedding.get("dimensions") or []),
            "layers": list(embedding.get("layers") or []),
            "modalities": list(embedding.get("modalities") or []),
        },
        rerank=None
        if not isinstance(rerank, dict)
        else {
            "default_layer": (rerank.get("default") or {}).get("layer"),
            "layers": [e.get("layer") for e in rerank.get("exits") or [] if isinstance(e, dict)],
        },
    )
    return summary


def inventory_entry(
    view: DeploymentView,
    deployment: Deployment,
    replica_load: Callable[[str], tuple[int, int]] | None = None,
) -> dict[str, Any]:
    """A deployment's inventory entry built from its workers (the shape of §1.8).

    Args:
        replica_load: a replica id's in-flight count and estimated work (bytes
            outstanding); zero without it.
    """
    workers = view.workers
    state, reason = view.state()
    ready_workers = [w for w in workers if w.ready]
    card = ready_workers[0].card if ready_workers else None
    first = workers[0]
    replicas = []
    for worker in workers:
        inflight, work = replica_load(worker.replica_id) if replica_load else (0, 0)
        replicas.append(
            {
                "id": worker.replica_id,
                "managed": worker.managed,
                "device": (worker.card or {}).get("device") or worker.device or "",
                "ready": worker.ready,
                "state": worker.state,
                "reason": worker.reason,
                "inflight": inflight,
                "estimated_work": work,
                "restarts": worker.restarts,
            }
        )
    entry: dict[str, Any] = {
        "name": view.name,
        "managed": first.managed,
        "process": first.process,
        "served_name": first.served_name,
        "endpoint": first.shown_endpoint(),
        "ready": bool(ready_workers),
        "state": state,
        "reason": reason,
        "restarts": sum(w.restarts for w in workers),
        "desired_replicas": len(workers),
        "ready_replicas": len(ready_workers),
        **card_summary(card),
    }
    if not entry["profile"]:
        entry["profile"] = deployment.profile
    if not entry["device"]:
        entry["device"] = first.device or ""
    if replicas:
        entry["replicas"] = replicas
    return entry
