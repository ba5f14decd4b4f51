"""The management API (default ``127.0.0.1:8080``): what operators ask the frontend.

``GET /health`` answers while the process runs; ``GET /ready`` is 503 until every
managed deployment in use is ready (and again once shutdown starts);
``GET /startup-status`` is upstream's startup document; ``GET /api/v1/status`` the
instance's mode and phase; ``GET /api/v1/inventory/model-runtime`` lists each
deployment in use with its replicas; ``POST /api/v1/routing/preview`` previews a
Router-mode routing (:mod:`vllm_sr.router.preview`). Nothing here shows a socket path or a
credential: an endpoint is ``unix`` or ``scheme://host:port``.
"""

from __future__ import annotations

from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ..router.preview import Preview
from ..startup import StartupStatus


class ManagementSource(Protocol):
    """What the management API reads (the :class:`~vllm_sr.frontend.Frontend`)."""

    status: StartupStatus
    preview: Preview

    @property
    def draining(self) -> bool: ...

    def inventory(self) -> list[dict[str, Any]]:
        """Each deployment's inventory entry (its pool's), in any order."""
        ...

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
        if source.draining:
            message = "shutting down: new requests get 503 while those in flight finish"
            return _json(503, {"ready": False, "phase": "draining", "message": message})
        return _json(503, {"ready": False, "phase": status.phase, "message": status.message})

    @app.get("/startup-status")
    async def startup_status() -> JSONResponse:
        """Phase, message and each managed deployment's state."""
        return _json(200, source.status.document())

    @app.get("/api/v1/status")
    async def instance_status() -> JSONResponse:
        """This instance's mode, default deployment and phase."""
        return _json(200, source.instance_status())

    @app.post("/api/v1/routing/preview")
    async def routing_preview(request: Request) -> Response:
        """What the router would do with a request (Router mode; never calls a backend)."""
        return await source.preview.handle(request)

    @app.get("/api/v1/inventory/model-runtime")
    async def inventory() -> JSONResponse:
        """Each deployment in use, sorted by name, with its replicas."""
        entries = sorted(source.inventory(), key=lambda entry: str(entry.get("name")))
        return _json(200, {"deployments": entries, "count": len(entries)})

    return app
