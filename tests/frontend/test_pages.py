"""``GET /`` of the frontend's servers (listener, management API, metrics endpoint): what
each is and what it serves, as JSON or, to a browser, a small HTML page that loads nothing;
a listener's without an API key, naming the routes its grant publishes now."""

from __future__ import annotations

import warnings
from html.parser import HTMLParser
from types import SimpleNamespace
from typing import Any

import pytest

with warnings.catch_warnings():  # starlette's notice about httpx2 is not ours to act on
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from fastapi.routing import APIRoute

from vllm_sr import __version__
from vllm_sr.api.management import build_management_app
from vllm_sr.api.native import Listener
from vllm_sr.api.published import Grant, Published
from vllm_sr.config.schema import parse_config
from vllm_sr.metrics import Metrics, metrics_app
from vllm_sr.pages import prefers_html
from vllm_sr.reload import ConfigSource, Reloads
from vllm_sr.router.cache import ResponseCache
from vllm_sr.router.chat import ListenerChat
from vllm_sr.router.forward import Backends

BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,*/*;q=0.8"
POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
LISTENER = (
    "A listener of the frontend: the routes its grant publishes "
    "(each asks for the listener's API key where it has keys)."
)
SYSTEMONE = [
    "GET /v1/systemone/models",
    "POST /v1/systemone",
    "POST /v1/decisions",
    "POST /v1/systemone/batch",
]
RUNTIME = ["POST /v1/embeddings", "POST /v1/classify", "POST /v1/rerank", "POST /v1/bundle"]
MANAGEMENT_LINKS = {
    "dashboard": "/dashboard",
    "health": "/health",
    "ready": "/ready",
    "startup_status": "/startup-status",
    "status": "/api/v1/status",
    "inventory": "/api/v1/inventory/model-runtime",
    "config": "/api/v1/config",
    "config_hash": "/api/v1/config/hash",
}


class Page(HTMLParser):
    """A page's title, every address it names (``src``, ``href``), its links with their
    text and its list entries' text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.title = ""
        self.addresses: list[str] = []
        self.anchors: list[tuple[str, str]] = []
        self.items: list[str] = []
        self._open: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.addresses += [str(found[k]) for k in ("src", "href") if found.get(k) is not None]
        if tag == "a":
            self.anchors.append((str(found["href"]), ""))
        if tag == "li":
            self.items.append("")
        self._open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if self._open and self._open[-1] == tag:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        if "title" in self._open:
            self.title += data
        if "a" in self._open:
            self.anchors[-1] = (self.anchors[-1][0], self.anchors[-1][1] + data)
        if "li" in self._open:
            self.items[-1] += data


def html_of(client: TestClient) -> Page:
    """``GET /`` as a browser asks for it, checked for what every such page carries."""
    response = client.get("/", headers={"accept": BROWSER})
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert response.headers["cache-control"] == "no-store"
    assert response.headers["vary"] == "Accept"
    assert response.headers["content-security-policy"] == POLICY
    assert "http://" not in response.text and "https://" not in response.text
    assert "<script" not in response.text
    page = Page(response.text)
    assert page.addresses[0] == "data:,"  # the icon: no /favicon.ico asked for
    return page


def json_of(client: TestClient, **headers: str) -> Any:
    response = client.get("/", headers=headers)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.headers["cache-control"] == "no-store"
    assert response.headers["vary"] == "Accept"
    return response.json()


# -- a listener ---------------------------------------------------------------------------------
def test_a_listener_names_its_grants_routes_without_asking_for_its_key():
    listener = Listener(Grant("http", api_keys=("key-1",), systemone=("a",), runtime=("b",)), {})
    client = TestClient(listener.app)
    assert client.get("/v1/models").status_code == 401  # the routes themselves want the key
    expected = {
        "service": "vllm-sr",
        "server": "listener",
        "description": LISTENER,
        "version": __version__,
        "listener": "http",
        "mode": "engine",
        "links": {"models": "/v1/models", "systemone_models": "/v1/systemone/models"},
        "routes": ["GET /v1/models", *SYSTEMONE, *RUNTIME],
    }
    assert json_of(client) == expected
    assert json_of(client, accept="*/*") == expected
    assert json_of(client, accept="application/json") == expected
    page = html_of(client)
    assert page.title == "vllm-sr listener http"
    assert page.anchors == [
        ("/v1/models", "/v1/models"),
        ("/v1/systemone/models", "/v1/systemone/models"),
    ]
    assert page.items == [
        "/v1/models: the models this listener publishes",
        "/v1/systemone/models: its System One models",
        "GET /v1/models",
        *SYSTEMONE,
        *RUNTIME,
    ]
    body = client.get("/", headers={"accept": BROWSER}).text
    assert "key-1" not in body and "key-1" not in str(json_of(client))
    assert f"{LISTENER} Version {__version__}. Engine mode." in body.replace("&#x27;", "'")


@pytest.mark.parametrize(
    ("grant", "routes", "links"),
    [
        (Grant("s", systemone=("a",)), ["GET /v1/models", *SYSTEMONE], 2),
        (Grant("r", runtime=("a",)), ["GET /v1/models", *RUNTIME], 1),
        (Grant("bare"), [], 0),
    ],
)
def test_a_listener_lists_only_what_its_grant_publishes(grant, routes, links):
    body = json_of(TestClient(Listener(grant, {}).app))
    assert body["routes"] == routes
    assert list(body["links"]) == ["models", "systemone_models"][:links]


def test_a_router_mode_listener_names_chat_and_a_reload_changes_what_it_lists():
    chat = ListenerChat("chat", (), None, lambda: None, Backends(), ResponseCache(0))
    listener = Listener(Grant("chat", api_keys=("key-1",)), {}, chat=chat)
    client = TestClient(listener.app)  # through the Chat fast path
    body = json_of(client)
    assert (body["listener"], body["mode"]) == ("chat", "router")
    assert body["routes"] == ["POST /v1/chat/completions", "GET /v1/models"]
    assert body["links"] == {"models": "/v1/models"}
    assert html_of(client).title == "vllm-sr listener chat"
    listener.publish(Published(Grant("chat", systemone=("a",)), {}, chat))
    assert json_of(client)["routes"] == [
        "POST /v1/chat/completions",
        "GET /v1/models",
        *SYSTEMONE,
    ]


# -- the management API and the metrics endpoint ----------------------------------------------
@pytest.fixture
def management() -> Any:
    reloads = Reloads(None, ConfigSource(b"", parse_config), None)  # type: ignore[arg-type]
    source = SimpleNamespace(draining=False, reloads=reloads)
    return build_management_app(source)  # type: ignore[arg-type]


def test_the_management_api_links_its_pages_and_lists_every_route(management):
    client = TestClient(management)
    body = json_of(client)
    routes = body.pop("routes")
    assert body == {
        "service": "vllm-sr",
        "server": "management",
        "description": ("The frontend's management API: readiness, deployments and configuration."),
        "version": __version__,
        "links": MANAGEMENT_LINKS,
    }
    # every route of the app, read when asked (a route added later is listed too)
    assert routes == [
        f"{method} {route.path}"
        for route in management.routes
        if isinstance(route, APIRoute) and route.path != "/"
        for method in sorted((route.methods or set()) - {"HEAD"})
    ]
    assert set(routes) >= {
        "GET /health",
        "GET /ready",
        "GET /startup-status",
        "GET /api/v1/status",
        "POST /api/v1/routing/preview",
        "GET /api/v1/config",
        "POST /api/v1/config/plan",
        "PUT /api/v1/config",
        "PATCH /api/v1/config",
        "GET /api/v1/config/hash",
        "GET /api/v1/inventory/model-runtime",
    }
    for path in MANAGEMENT_LINKS.values():
        assert f"GET {path}" in routes, path
    page = html_of(client)
    assert page.title == "vllm-sr management"
    assert page.anchors == [(path, path) for path in MANAGEMENT_LINKS.values()]
    assert page.items[:2] == [
        "/dashboard: the Dashboard: what runs, and its deployments",
        "/health: 200 while the frontend runs",
    ]
    assert page.items[len(MANAGEMENT_LINKS) :] == routes


def test_the_management_index_asks_for_no_token():
    """The token guards the configuration routes only."""
    frontend = SimpleNamespace(active=None)
    reloads = Reloads(frontend, ConfigSource(b"", parse_config), "secret")  # type: ignore[arg-type]
    app = build_management_app(SimpleNamespace(draining=False, reloads=reloads))  # type: ignore[arg-type]
    client = TestClient(app)
    assert client.get("/api/v1/config/hash").status_code == 401
    body = json_of(client)
    assert body["server"] == "management"
    assert "secret" not in str(body)


def test_the_metrics_endpoint_links_to_its_exposition():
    client = TestClient(metrics_app(Metrics()))
    assert json_of(client) == {
        "service": "vllm-sr",
        "server": "metrics",
        "description": "The frontend's metrics endpoint.",
        "version": __version__,
        "links": {"metrics": "/metrics"},
    }
    page = html_of(client)
    assert page.title == "vllm-sr metrics"
    assert page.anchors == [("/metrics", "/metrics")]
    assert page.items == ["/metrics: Prometheus text (the vsr_model_runtime_* series)"]
    assert client.get("/metrics").status_code == 200


@pytest.mark.parametrize(
    ("accept", "html"),
    [
        (None, False),
        ("*/*", False),
        ("application/json", False),
        ("text/html", True),
        (BROWSER, True),
        ("text/html;q=0", False),
        ("text/html, application/json", False),
        ("application/json;q=0.9, text/html", True),
    ],
)
def test_html_only_when_the_client_ranks_it_above_json(accept, html):
    assert prefers_html(accept) is html
