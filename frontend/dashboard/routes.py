"""The Dashboard's routes on the management API.

- ``GET /dashboard``: the page (static HTML, no data in it), with a Content Security
  Policy that lets it load and call nothing but its own origin;
- ``GET /dashboard/static/<file>``: its script and style sheet, shipped in the package;
- ``GET /api/v1/dashboard``: what the page shows (:func:`~.snapshot.snapshot`), read
  again each time the page refreshes.

**Who may read it.** Where credentials are configured, ``/api/v1/dashboard`` asks for
one: the management token (``VSR_MGMT_TOKEN``) or an API key of any listener, sent as
``Authorization: Bearer <key>`` or ``Api-Key: <key>`` (401 ``UNAUTHORIZED`` otherwise;
the page asks for it then and keeps it for the browser tab only). Without either it is
open, like the rest of the management API, which listens on loopback unless published.
The page changes deployments through the configuration API, whose own rules apply (the
management token where set).
"""

from __future__ import annotations

import datetime as dt
import hmac
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.staticfiles import StaticFiles

from .snapshot import DashboardSource, snapshot

STATIC = Path(__file__).parent / "static"
"""The page, its script and its style sheet."""

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""The page may fetch, run and style only what its own origin serves."""


def credentials(source: DashboardSource) -> list[str]:
    """What opens ``/api/v1/dashboard``: the management token and every listener's API
    keys (read from the configuration in force; empty: open)."""
    keys = [key for listener in source.config.listeners for key in listener.api_keys]
    token = source.reloads.token
    return ([token] if token else []) + keys


def presented(request: Request) -> str | None:
    """The key a request presents (``Authorization: Bearer`` or ``Api-Key``), or ``None``."""
    scheme, _, given = request.headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer" and given.strip():
        return given.strip()
    return request.headers.get("api-key") or None


def allowed(request: Request, source: DashboardSource) -> bool:
    """Whether ``request`` may read the Dashboard's data (constant-time comparisons)."""
    accepted = credentials(source)
    if not accepted:
        return True
    given = presented(request)
    if given is None:
        return False
    found = False
    for key in accepted:  # every key compared: the time says nothing of which matched
        found |= hmac.compare_digest(given.encode(), key.encode())
    return found


def dashboard_routes(app: FastAPI, source: DashboardSource) -> None:
    """Add the Dashboard's routes (see the module docstring) to the management ``app``."""
    app.mount("/dashboard/static", StaticFiles(directory=STATIC), name="dashboard-static")

    @app.api_route("/dashboard", methods=["GET", "HEAD"], include_in_schema=False)
    async def page() -> Response:
        """The Dashboard page (it reads ``/api/v1/dashboard`` once loaded)."""
        return FileResponse(
            STATIC / "index.html",
            media_type="text/html; charset=utf-8",
            headers={
                "Content-Security-Policy": CONTENT_SECURITY_POLICY,
                "X-Content-Type-Options": "nosniff",
                "Cache-Control": "no-store",
                "Referrer-Policy": "no-referrer",
            },
        )

    @app.get("/api/v1/dashboard", include_in_schema=False)
    async def data(request: Request) -> JSONResponse:
        """What the page shows, or 401 where a credential is configured and not given."""
        headers = {"Cache-Control": "no-store"}
        if not allowed(request, source):
            stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
            message = (
                "send Authorization: Bearer <key>: the management token (VSR_MGMT_TOKEN) or "
                "an API key of one of the listeners"
            )
            body = {"error": {"code": "UNAUTHORIZED", "message": message, "timestamp": stamp}}
            headers["WWW-Authenticate"] = 'Bearer realm="vllm-sr management"'
            return JSONResponse(body, 401, headers=headers)
        return JSONResponse(snapshot(source), 200, headers=headers)
