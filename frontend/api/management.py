"""The management API (default ``127.0.0.1:8080``): what operators ask the frontend.

``GET /health`` answers while the process runs; ``GET /ready`` is 503 until every
managed deployment in use is ready (and again once shutdown starts);
``GET /startup-status`` is upstream's startup document; ``GET /api/v1/status`` the
instance's mode and phase; ``GET /api/v1/inventory/model-runtime`` lists each
deployment in use with its replicas; ``POST /api/v1/routing/preview`` previews a
Router-mode routing (:mod:`vllm_sr.router.preview`); ``GET /dashboard`` is the Dashboard
(:mod:`vllm_sr.dashboard`). Nothing here shows a socket path or a credential: an endpoint
is ``unix`` or ``scheme://host:port``.

The configuration routes (:mod:`vllm_sr.reload`, ROUTER-SPEC §3.2): ``GET /api/v1/config``
(the persisted document, keys redacted, with its ``ETag``), ``POST /api/v1/config/plan``,
``PUT`` (replace) and ``PATCH`` (merge) ``/api/v1/config`` with ``If-Match``, and
``GET /api/v1/config/hash``. When the frontend was started with ``VSR_MGMT_TOKEN`` set, they
ask for ``Authorization: Bearer <that token>`` (401 ``UNAUTHORIZED`` otherwise). Their errors
are ``{"error": {"code", "message", "timestamp"}}`` (``reasons`` too for a configuration
that is not valid, needs a restart or failed), and every answer carries
``x-vsr-config-version``.

**Loopback only, by name too.** Bound to a loopback address (the default), the API
answers only requests whose ``Host`` is a loopback name (``localhost``, ``127.0.0.1``,
``[::1]``, any port); any other ``Host`` is 403 ``HOST_NOT_ALLOWED``. Otherwise a web page
whose name an attacker re-points at 127.0.0.1 (DNS rebinding) would be same-origin with
the API in the operator's browser, and could read and change the configuration where no
management token is set. Published (``VLLM_SR_PUBLISH_MANAGEMENT_API=true``), any ``Host``
is answered.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hmac
import ipaddress
import json
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from ..bodies import BodyTooLarge, read_body
from ..config_document import ConfigRefused
from ..dashboard import dashboard_routes
from ..dashboard.snapshot import DashboardSource
from ..pages import MANAGEMENT_LINKS, add_index
from ..reload import Reloads
from ..router.preview import Preview
from ..startup import StartupStatus

MAX_CONFIG_BODY = 4 * 1024 * 1024
"""The largest configuration request body read (413 beyond)."""


class ManagementSource(DashboardSource, Protocol):
    """What the management API reads (the :class:`~vllm_sr.frontend.Frontend`): the
    Dashboard's source (configuration, reloads, metrics, routes, inventory, instance
    status), and the startup status and the preview."""

    status: StartupStatus
    preview: Preview

    @property
    def draining(self) -> bool: ...


def _json(status: int, body: dict[str, Any]) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers={"Cache-Control": "no-store"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, without a port) names this machine's
    loopback: ``localhost`` and its subdomains, ``127.0.0.0/8``, ``::1``."""
    host = host.strip().rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name of a ``Host`` header, without its port (``[::1]:8080`` is ``::1``)."""
    header = header.strip()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class LoopbackHosts:
    """ASGI middleware of a server bound to a loopback address: a request whose ``Host``
    is not a loopback name (:func:`is_loopback`) is 403 ``HOST_NOT_ALLOWED`` (see the
    module docstring: DNS rebinding). A request without ``Host`` (HTTP/1.0) passes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = Headers(scope=scope).get("host")
            if host is not None and not is_loopback(host_name(host)):
                stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
                message = (
                    f"Host {host!r} is not a name of this machine's loopback, where this API "
                    "listens: use 127.0.0.1 or localhost (to reach it from elsewhere, start "
                    "vllm-sr with VLLM_SR_PUBLISH_MANAGEMENT_API=true)"
                )
                error = {
                    "code": "HOST_NOT_ALLOWED",
                    "message": message,
                    "timestamp": stamp.replace("+00:00", "Z"),
                }
                await _json(403, {"error": error})(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_management_app(source: ManagementSource, *, loopback_only: bool = False) -> FastAPI:
    """The management API's application, reading ``source`` on each request; with
    ``loopback_only`` (it listens on a loopback address), answering only requests to a
    loopback name (:class:`LoopbackHosts`)."""
    app = FastAPI(
        title="vllm-sr management API",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    if loopback_only:
        app.add_middleware(LoopbackHosts)

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 while the frontend runs (also while it waits for its models)."""
        return _json(200, {"status": "draining" if source.draining else "ok"})

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """200 once every managed deployment in use is ready, and while each has a ready
        replica (a pool whose every replica stopped answering makes it 503 again)."""
        status = source.status
        unserved = status.unserved() if status.ready else ""
        if status.ready and not source.draining and not unserved:
            return _json(200, {"ready": True, "phase": status.phase})
        if unserved and not source.draining:
            return _json(503, {"ready": False, "phase": status.phase, "message": unserved})
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

    config_routes(app, source.reloads)
    dashboard_routes(app, source)

    @app.get("/api/v1/inventory/model-runtime")
    async def inventory() -> JSONResponse:
        """Each deployment in use, sorted by name, with its replicas."""
        entries = sorted(source.inventory(), key=lambda entry: str(entry.get("name")))
        return _json(200, {"deployments": entries, "count": len(entries)})

    add_index(app, "management", MANAGEMENT_LINKS, list_routes=True)
    return app


def config_routes(app: FastAPI, reloads: Reloads) -> None:
    """Add the configuration routes (see the module docstring) to ``app``."""

    def headers(extra: dict[str, str] | None = None) -> dict[str, str]:
        return {
            "Cache-Control": "no-store",
            "x-vsr-config-version": str(reloads.config_version),
            **(extra or {}),
        }

    def refused(err: ConfigRefused) -> JSONResponse:
        stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        error: dict[str, Any] = {"code": err.code, "message": err.message, "timestamp": stamp}
        if err.reasons is not None:
            error["reasons"] = err.reasons
        return JSONResponse({"error": error}, err.status, headers=headers(err.headers))

    def authorize(request: Request) -> None:
        if reloads.token is None:
            return
        scheme, _, given = request.headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), reloads.token.encode()
        ):
            raise ConfigRefused(
                401,
                "UNAUTHORIZED",
                "send Authorization: Bearer <the management token> (VSR_MGMT_TOKEN)",
                headers={"WWW-Authenticate": 'Bearer realm="vllm-sr management"'},
            )

    async def body_of(request: Request, *, mode_allowed: bool) -> tuple[str, str]:
        try:
            raw = await read_body(request, MAX_CONFIG_BODY)
        except BodyTooLarge as err:
            raise ConfigRefused(413, "REQUEST_TOO_LARGE", str(err)) from None
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):  # not UTF-8, not JSON, nested too deeply
            raise ConfigRefused(
                400, "INVALID_REQUEST", 'the body must be JSON: {"yaml": "<the document>"}'
            ) from None
        text = body.get("yaml") if isinstance(body, dict) else None
        if not isinstance(text, str):
            raise ConfigRefused(
                400, "INVALID_REQUEST", 'yaml is required: {"yaml": "<the document>"}'
            )
        mode = body.get("mode", "replace") if mode_allowed else "replace"
        if not isinstance(mode, str):
            raise ConfigRefused(400, "INVALID_REQUEST", "mode must be replace or merge")
        return text, mode

    @app.get("/api/v1/config")
    async def read_config(request: Request) -> Response:
        """The persisted configuration (keys redacted), with its ``ETag``."""
        try:
            authorize(request)
            document = await asyncio.to_thread(reloads.current)  # a large one parses in s
        except ConfigRefused as err:
            return refused(err)
        return JSONResponse(document, 200, headers=headers({"ETag": reloads.source.etag}))

    @app.post("/api/v1/config/plan")
    async def plan_config(request: Request) -> Response:
        """Whether a document is valid and changes the configuration."""
        try:
            authorize(request)
            text, mode = await body_of(request, mode_allowed=True)
            plan = await asyncio.to_thread(reloads.plan, text, mode)  # a large one takes s
        except ConfigRefused as err:
            return refused(err)
        return JSONResponse(plan, 200, headers=headers())

    async def mutate(request: Request, mode: str) -> Response:
        try:
            authorize(request)
            text, _ = await body_of(request, mode_allowed=False)
            status, result = await reloads.apply(text, mode, request.headers.get("if-match"))
        except ConfigRefused as err:
            return refused(err)
        return JSONResponse(result, status, headers=headers({"ETag": reloads.source.etag}))

    @app.put("/api/v1/config")
    async def replace_config(request: Request) -> Response:
        """Replace the configuration and activate it."""
        return await mutate(request, "replace")

    @app.patch("/api/v1/config")
    async def merge_config(request: Request) -> Response:
        """Merge a patch into the configuration and activate it."""
        return await mutate(request, "merge")

    @app.get("/api/v1/config/hash")
    async def config_hash(request: Request) -> Response:
        """The persisted, generated and active hashes and the activation's state."""
        try:
            authorize(request)
        except ConfigRefused as err:
            return refused(err)
        return JSONResponse(reloads.hash_document(), 200, headers=headers())
