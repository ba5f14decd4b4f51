"""``GET /`` of each of the frontend's servers: what the server is and what it serves.

A client that prefers ``text/html`` (a browser, :func:`prefers_html`) gets a small HTML
page with nothing loaded from elsewhere; any other client gets the same as JSON::

    {"service": "vllm-sr", "server": "management", "description": ..., "version": ...,
     "links": {name: path}, "routes": ["GET /health", ...]}

``links`` are the server's ``GET`` pages by name; ``routes`` (the listener and the
management API) every route it answers. A listener lists the routes its grant publishes
now (:func:`listener_document`), never its models or keys, and answers ``GET /`` without
an API key. No document holds a credential or a socket path.

The runtime (``vllm_srun.serve.pages``) answers its own ``GET /`` the same way; the
frontend imports nothing of the runtime, so the two small renderers are separate.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from ._version import __version__

SERVICE = "vllm-sr"

MANAGEMENT_LINKS: tuple[tuple[str, str, str], ...] = (
    ("dashboard", "/dashboard", "the Dashboard: what runs, and its deployments"),
    ("health", "/health", "200 while the frontend runs"),
    ("ready", "/ready", "200 once every managed deployment in use is ready"),
    ("startup_status", "/startup-status", "the phase and each deployment's state"),
    ("status", "/api/v1/status", "this instance's mode, default deployment and phase"),
    ("inventory", "/api/v1/inventory/model-runtime", "each deployment in use, its replicas"),
    ("config", "/api/v1/config", "the configuration in force (keys redacted)"),
    ("config_hash", "/api/v1/config/hash", "the configuration's hashes and activation"),
)
"""What the management API's ``GET /`` links to: JSON key, path, what it is."""

METRICS_LINKS: tuple[tuple[str, str, str], ...] = (
    ("metrics", "/metrics", "Prometheus text (the vsr_model_runtime_* series)"),
)
"""What the metrics server's ``GET /`` links to."""

LISTENER_LINKS: tuple[tuple[str, str, str], ...] = (
    ("models", "/v1/models", "the models this listener publishes"),
    ("systemone_models", "/v1/systemone/models", "its System One models"),
)
"""The ``GET`` pages a listener may publish, linked when its grant publishes them."""

DESCRIPTIONS = {
    "management": "The frontend's management API: readiness, deployments and configuration.",
    "metrics": "The frontend's metrics endpoint.",
    "listener": "A listener of the frontend: the routes its grant publishes "
    "(each asks for the listener's API key where it has keys).",
}

NOTHING_ELSE = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
}
"""The HTML pages' policy: no script, nothing fetched; their own inline style and empty
icon only."""

Item = tuple[str, str | None, str]
"""One entry of a page's list: its text, the address it links to (``None``: none) and a
note after it (``""``: none)."""


def prefers_html(accept: str | None) -> bool:
    """Whether an ``Accept`` header ranks ``text/html`` above ``application/json``.

    Each media type gets the quality of the most specific range that matches it
    (``text/html``, then ``text/*``, then ``*/*``; none: 0). A tie, an absent header and
    ``*/*`` (curl, HTTP libraries) choose JSON; a browser's header chooses HTML.
    """
    ranges: dict[str, float] = {}
    for part in (accept or "*/*").split(","):
        media, *params = (piece.strip() for piece in part.split(";"))
        quality = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if media:
            ranges[media.lower()] = max(quality, ranges.get(media.lower(), 0.0))

    def rank(media: str) -> float:
        kind = media.split("/")[0]
        for candidate in (media, f"{kind}/*", "*/*"):
            if candidate in ranges:
                return ranges[candidate]
        return 0.0

    html = rank("text/html")
    return html > 0 and html > rank("application/json")


def html_page(
    title: str,
    intro: str,
    sections: Sequence[tuple[str, Sequence[Item]]],
    icon: str = "data:,",
) -> str:
    """A small self-contained HTML page: ``title`` as its heading, ``intro`` under it,
    then each section's heading and list of :data:`Item`; ``icon`` its icon's address
    (the default, an empty one, keeps a browser from asking for ``/favicon.ico``). Every
    text and address is escaped; nothing is loaded from elsewhere."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f'<title>{escape(title)}</title><link rel="icon" href="{escape(icon)}">',
        "<style>body{font-family:system-ui,sans-serif;max-width:48em;margin:2em auto;"
        "padding:0 1em;line-height:1.5}</style>",
        f"</head><body><h1>{escape(title)}</h1><p>{escape(intro)}</p>",
    ]
    for heading, items in sections:
        parts.append(f"<h2>{escape(heading)}</h2><ul>")
        for text, href, note in items:
            shown = escape(text) if href is None else f'<a href="{escape(href)}">{escape(text)}</a>'
            parts.append(f"<li>{shown}{': ' + escape(note) if note else ''}</li>")
        parts.append("</ul>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def document(
    server: str,
    links: Sequence[tuple[str, str, str]],
    routes: Sequence[str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The JSON of ``GET /`` for ``server`` (a key of :data:`DESCRIPTIONS`): ``links`` by
    name, ``routes`` when given (``"METHOD /path"``), and ``extra`` keys after
    ``version``."""
    body: dict[str, Any] = {
        "service": SERVICE,
        "server": server,
        "description": DESCRIPTIONS[server],
        "version": __version__,
        **extra,
        "links": {key: path for key, path, _ in links},
    }
    if routes is not None:
        body["routes"] = list(routes)
    return body


def html(body: dict[str, Any], links: Sequence[tuple[str, str, str]]) -> str:
    """:func:`document`'s ``body`` as an HTML page (``links`` gives each link's note)."""
    notes = {key: note for key, _, note in links}
    title = f"{body['service']} {body['server']}"
    if body.get("listener"):
        title += f" {body['listener']}"
    intro = f"{body['description']} Version {body['version']}."
    if body.get("mode"):
        intro += f" {str(body['mode']).capitalize()} mode."
    items: list[Item] = [(path, path, notes[key]) for key, path in body["links"].items()]
    sections: list[tuple[str, Sequence[Item]]] = [("Links", items or [("none", None, "")])]
    if "routes" in body:
        sections.append(("Routes", [(r, None, "") for r in body["routes"]] or [("none", None, "")]))
    return html_page(title, intro, sections)


def answer(
    request: Request, body: dict[str, Any], links: Sequence[tuple[str, str, str]]
) -> Response:
    """``body`` as HTML or JSON, as the request's ``Accept`` prefers (never cached)."""
    headers = {"Cache-Control": "no-store", "Vary": "Accept"}
    if prefers_html(request.headers.get("accept")):
        return HTMLResponse(html(body, links), headers=headers | NOTHING_ELSE)
    return JSONResponse(body, headers=headers)


def app_routes(app: FastAPI) -> list[str]:
    """Every route of ``app`` but ``GET /`` as ``"METHOD /path"``, in the app's order
    (``HEAD`` left out)."""
    return [
        f"{method} {route.path}"
        for route in app.routes
        if isinstance(route, APIRoute) and route.path != "/"
        for method in sorted((route.methods or set()) - {"HEAD"})
    ]


def listener_document(listener: str, router_mode: bool, routes: Sequence[str]) -> dict[str, Any]:
    """A listener's ``GET /`` JSON: its name, its mode (``router`` or ``engine``), the
    ``routes`` its grant publishes now and, of :data:`LISTENER_LINKS`, those among them."""
    links = [link for link in LISTENER_LINKS if f"GET {link[1]}" in routes]
    mode = "router" if router_mode else "engine"
    return document("listener", links, routes, listener=listener, mode=mode)


def add_index(
    app: FastAPI, server: str, links: Sequence[tuple[str, str, str]], *, list_routes: bool = False
) -> None:
    """Add ``GET /`` to ``app``: the index of ``server`` with ``links``, and with
    ``list_routes`` every route of ``app`` (:func:`app_routes`, read when asked: routes
    added later are listed too)."""

    async def index(request: Request) -> Response:
        routes = app_routes(app) if list_routes else None
        return answer(request, document(server, links, routes), links)

    app.router.add_route("/", index, methods=["GET"], include_in_schema=False)
