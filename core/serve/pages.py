"""The runtime's own pages: ``GET /`` (what this server is and what it serves), and
``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) over ``/openapi.json``.

Both documentation pages load their scripts, style sheet and icon from this process, under
:data:`ASSETS` (the Swagger UI and ReDoc bundles the ``fastapi-offline`` distribution
ships), never from a CDN: they work on a machine without internet. Swagger UI's online
validator badge is off (``validatorUrl: null``), so nothing on either page names another
origin, and their :data:`SAME_ORIGIN_ONLY` policy keeps a browser from fetching anything
that ReDoc's script names itself (the Redocly logo).

``GET /`` answers a small HTML page to a client that prefers ``text/html`` (a browser),
and JSON otherwise (:func:`prefers_html`). None of these routes is in the OpenAPI
document.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response

from vllm_srun import __version__
from vllm_srun.service.runtime import Runtime

from .schemas import API_VERSION

ASSETS = "/docs/assets"
"""Where the documentation pages' files are served (``swagger-ui-bundle.js``,
``swagger-ui.css``, ``redoc.standalone.js``, ``favicon.png``)."""

ASSET_PACKAGE = ("fastapi_offline", "static")
"""The package and folder holding those files."""

SAME_ORIGIN_ONLY = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self' 'unsafe-inline'; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; "
    "worker-src 'self' blob:"
}
"""The pages' policy: a browser fetches nothing from another origin for them (ReDoc's
sidebar asks for the Redocly logo from a CDN; the browser refuses it, and ReDoc shows
the link without the logo). Inline scripts and styles are the pages' own."""

SERVICE = "vllm-srun"
DESCRIPTION = "Model runtime for semantic routers: encoder task models behind one contract."

LINKS: tuple[tuple[str, str, str], ...] = (
    ("models", "/v1/models", "every model's card, the limits and the plugins"),
    ("health", "/health", "200 once every model is ready; each model's state"),
    ("liveness", "/health/live", "200 while the process serves HTTP"),
    ("docs", "/docs", "the API, to read and try (Swagger UI)"),
    ("redoc", "/redoc", "the API reference (ReDoc)"),
    ("openapi", "/openapi.json", "the OpenAPI document"),
    ("openapi_yaml", "/openapi.yaml", "the same document, as YAML"),
    ("metrics", "/metrics", "Prometheus text"),
)
"""What ``GET /`` links to: JSON key, path, what it is."""


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


Item = tuple[str, str | None, str]
"""One entry of a page's list: its text, the address it links to (``None``: none) and a
note after it (``""``: none)."""


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


def index_document(runtime: Runtime, root: str = "") -> dict[str, Any]:
    """``GET /`` as JSON: ``service``, ``description``, ``version`` (this package's),
    ``api_version`` (the wire contract's), ``models`` (each served model's ``id`` and the
    ``href`` of its card) and ``links`` (name to path, below ``root``, the proxy prefix)."""
    return {
        "service": SERVICE,
        "description": DESCRIPTION,
        "version": __version__,
        "api_version": API_VERSION,
        "models": [
            {"id": name, "href": f"{root}/v1/models/{quote(name, safe='/')}"}
            for name in runtime.models
        ],
        "links": {key: root + path for key, path, _ in LINKS},
    }


def index_html(document: dict[str, Any], root: str = "") -> str:
    """``GET /`` as HTML, from :func:`index_document`'s ``document`` (``root``: the proxy
    prefix, for the icon's address)."""
    models: list[Item] = [(m["id"], m["href"], "") for m in document["models"]]
    described = {key: text for key, _, text in LINKS}
    links: list[Item] = [(path, path, described[key]) for key, path in document["links"].items()]
    intro = (
        f"{document['description']} Version {document['version']}, "
        f"wire contract {document['api_version']}."
    )
    sections = [("Models", models or [("none", None, "")]), ("Links", links)]
    return html_page(document["service"], intro, sections, icon=f"{root}{ASSETS}/favicon.png")


def install_pages(app: FastAPI, runtime: Runtime) -> None:
    """Add ``GET /``, ``/docs``, ``/redoc`` and the files under :data:`ASSETS` to ``app``
    (built with ``docs_url=None, redoc_url=None``).

    Raises:
        AssertionError: the asset package or its folder is missing (Starlette's check).
    """
    app.mount(ASSETS, StaticFiles(packages=[ASSET_PACKAGE]), name="docs-assets")

    def root_of(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    # HEAD too, as every GET page of the frontend answers it (a link checker, a probe).
    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def index(request: Request) -> Response:
        """What this server is and what it serves (HTML to a browser, else JSON)."""
        root = root_of(request)
        document = index_document(runtime, root)
        headers = {"Cache-Control": "no-store", "Vary": "Accept"}
        if prefers_html(request.headers.get("accept")):
            return HTMLResponse(index_html(document, root), headers=headers | SAME_ORIGIN_ONLY)
        return JSONResponse(document, headers=headers)

    @app.api_route("/docs", methods=["GET", "HEAD"], include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        """Swagger UI over ``/openapi.json``, its files from :data:`ASSETS`."""
        root = root_of(request)
        page = get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS}/favicon.png",
            oauth2_redirect_url=None,
            swagger_ui_parameters={"validatorUrl": None},
        )
        page.headers.update(SAME_ORIGIN_ONLY)
        return page

    @app.api_route("/redoc", methods=["GET", "HEAD"], include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        """ReDoc over ``/openapi.json``, its script from :data:`ASSETS` (no web fonts)."""
        root = root_of(request)
        page = get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS}/favicon.png",
            with_google_fonts=False,
        )
        page.headers.update(SAME_ORIGIN_ONLY)
        return page
