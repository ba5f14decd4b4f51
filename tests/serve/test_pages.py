"""The runtime's own pages: ``/docs`` and ``/redoc`` load every file from the runtime
itself (nothing from another origin, so they work offline), and ``GET /`` says what the
server is and what it serves, as JSON or, to a browser, HTML."""

from __future__ import annotations

import importlib.util
import re
import shutil
from html.parser import HTMLParser
from typing import Any

import pytest

from vllm_srun import __version__
from vllm_srun.serve.pages import prefers_html

from .conftest import MakeRuntime, make_client

BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,*/*;q=0.8"
"""What Firefox and Chromium send for a page."""

JAVASCRIPT = ("text/javascript", "application/javascript")
"""A script's media type: RFC 9239's name, or the older one a platform's table may give."""

POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:"
)
"""The pages' Content-Security-Policy: nothing from another origin."""

LINKS = {
    "models": "/v1/models",
    "health": "/health",
    "liveness": "/health/live",
    "docs": "/docs",
    "redoc": "/redoc",
    "openapi": "/openapi.json",
    "openapi_yaml": "/openapi.yaml",
    "metrics": "/metrics",
}


class References(HTMLParser):
    """Every ``src`` and ``href`` of a page, the text of each link and the page title."""

    def __init__(self) -> None:
        super().__init__()
        self.addresses: list[str] = []
        self.anchors: list[tuple[str, str]] = []
        self.title = ""
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        for name in ("src", "href"):
            if found.get(name) is not None:
                self.addresses.append(str(found[name]))
        if tag == "a":
            self.anchors.append((str(found["href"]), ""))
            self._in = "a"
        elif tag == "title":
            self._in = "title"

    def handle_endtag(self, tag: str) -> None:
        if tag in ("a", "title"):
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "a":
            href, text = self.anchors[-1]
            self.anchors[-1] = (href, text + data)
        elif self._in == "title":
            self.title += data


def references(html: str) -> References:
    parser = References()
    parser.feed(html)
    return parser


def test_docs_loads_every_file_from_the_runtime_and_each_answers(make_runtime: MakeRuntime):
    client = make_client(make_runtime(load=False))
    page = client.get("/docs")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["content-security-policy"] == POLICY
    assert "http://" not in page.text and "https://" not in page.text
    found = references(page.text)
    assert found.title == "vllm-srun - Swagger UI"
    assert found.addresses == [
        "/docs/assets/swagger-ui.css",
        "/docs/assets/favicon.png",
        "/docs/assets/swagger-ui-bundle.js",
    ]
    assert re.findall(r"url: '([^']*)'", page.text) == ["/openapi.json"]
    assert '"validatorUrl": null' in page.text  # no badge fetched from swagger.io
    expected = {
        "/docs/assets/swagger-ui.css": ("text/css",),
        "/docs/assets/favicon.png": ("image/png",),
        "/docs/assets/swagger-ui-bundle.js": JAVASCRIPT,
    }
    for address, media in expected.items():
        asset = client.get(address)
        assert asset.status_code == 200, address
        assert asset.headers["content-type"].split(";")[0] in media, address
        assert int(asset.headers["content-length"]) == len(asset.content) > 0
    script = client.get("/docs/assets/swagger-ui-bundle.js").text
    assert "SwaggerUIBundle" in script  # the global the page calls
    assert ".swagger-ui" in client.get("/docs/assets/swagger-ui.css").text
    assert client.get("/docs/assets/favicon.png").content[:8] == b"\x89PNG\r\n\x1a\n"
    assert client.get("/openapi.json").json()["info"]["title"] == "vllm-srun"


def test_redoc_loads_its_script_from_the_runtime_without_web_fonts(make_runtime: MakeRuntime):
    client = make_client(make_runtime(load=False))
    page = client.get("/redoc")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["content-security-policy"] == POLICY
    assert "http://" not in page.text and "https://" not in page.text
    found = references(page.text)
    assert found.title == "vllm-srun - ReDoc"
    assert found.addresses == ["/docs/assets/favicon.png", "/docs/assets/redoc.standalone.js"]
    assert '<redoc spec-url="/openapi.json"></redoc>' in page.text
    script = client.get("/docs/assets/redoc.standalone.js")
    assert script.status_code == 200
    assert script.headers["content-type"].split(";")[0] in JAVASCRIPT
    assert "Redoc" in script.text


def test_an_unknown_asset_and_a_path_out_of_the_folder_are_the_runtimes_404(
    make_runtime: MakeRuntime,
):
    client = make_client(make_runtime(load=False))
    for address, shown in [
        ("/docs/assets/nothing.js", "/docs/assets/nothing.js"),
        ("/docs/assets/..%2F__init__.py", "/docs/assets/../__init__.py"),
    ]:
        missing = client.get(address)
        assert missing.status_code == 404, address
        assert missing.json() == {
            "error": {
                "code": "invalid_request",
                "message": f"GET {shown}: Not Found",
                "type": "invalid_request_error",
                "param": None,
            }
        }


def test_the_pages_are_not_in_the_openapi_document(make_runtime: MakeRuntime):
    client = make_client(make_runtime(load=False))
    paths = client.get("/openapi.json").json()["paths"]
    assert not {"/", "/docs", "/redoc"} & set(paths)
    assert not [p for p in paths if p.startswith("/docs")]


def test_the_index_as_json_names_the_server_its_models_and_links(make_runtime: MakeRuntime):
    runtime = make_runtime(("sequence", "pooled"), load=False)
    client = make_client(runtime)
    for accept in (None, "*/*", "application/json", "text/html;q=0.5, application/json"):
        headers = {} if accept is None else {"accept": accept}
        index = client.get("/", headers=headers)
        assert index.status_code == 200, accept
        assert index.headers["content-type"] == "application/json"
        assert index.headers["cache-control"] == "no-store"
        assert index.headers["vary"] == "Accept"
        assert index.json() == {
            "service": "vllm-srun",
            "description": (
                "Model runtime for semantic routers: encoder task models behind one contract."
            ),
            "version": __version__,
            "api_version": "2.3.0",
            "models": [
                {"id": "sequence", "href": "/v1/models/sequence"},
                {"id": "pooled", "href": "/v1/models/pooled"},
            ],
            "links": LINKS,
        }
    for path in LINKS.values():
        assert client.get(path).status_code in (200, 503), path  # /health: 503 until loaded
    assert client.get("/v1/models/sequence").json()["id"] == "sequence"


def test_the_index_as_html_links_what_the_runtime_serves(make_runtime: MakeRuntime):
    client = make_client(make_runtime(("sequence",), load=False))
    index = client.get("/", headers={"accept": BROWSER})
    assert index.status_code == 200
    assert index.headers["content-type"] == "text/html; charset=utf-8"
    assert index.headers["vary"] == "Accept"
    assert index.headers["content-security-policy"] == POLICY
    assert "http://" not in index.text and "https://" not in index.text
    found = references(index.text)
    assert found.title == "vllm-srun"
    assert found.addresses == ["/docs/assets/favicon.png", "/v1/models/sequence", *LINKS.values()]
    assert found.anchors == [("/v1/models/sequence", "sequence")] + [(p, p) for p in LINKS.values()]
    assert f"Version {__version__}, wire contract 2.3.0." in index.text
    assert '<li><a href="/metrics">/metrics</a>: Prometheus text</li>' in index.text


def test_the_index_and_the_pages_name_addresses_below_the_proxy_prefix(
    make_runtime: MakeRuntime,
):
    from fastapi.testclient import TestClient

    from vllm_srun.serve.app import build_app

    client = TestClient(build_app(make_runtime(("sequence",), load=False)), root_path="/srun")
    index = client.get("/").json()
    assert index["models"] == [{"id": "sequence", "href": "/srun/v1/models/sequence"}]
    assert index["links"]["docs"] == "/srun/docs"
    found = references(client.get("/docs").text)
    assert found.addresses == [
        "/srun/docs/assets/swagger-ui.css",
        "/srun/docs/assets/favicon.png",
        "/srun/docs/assets/swagger-ui-bundle.js",
    ]


def test_a_model_name_is_escaped_in_the_page_and_quoted_in_its_address(
    make_runtime: MakeRuntime, packages
):
    from vllm_srun.config import ModelConfig

    name = 'org/a<b>"c d'
    runtime = make_runtime(
        models=[ModelConfig(model=str(packages["sequence"]), name=name)], load=False
    )
    client = make_client(runtime)
    assert client.get("/").json()["models"] == [
        {"id": name, "href": "/v1/models/org/a%3Cb%3E%22c%20d"}
    ]
    page = client.get("/", headers={"accept": "text/html"}).text
    assert "<b>" not in page
    assert references(page).anchors[0] == ("/v1/models/org/a%3Cb%3E%22c%20d", name)


@pytest.mark.parametrize(
    ("accept", "html"),
    [
        (None, False),
        ("", False),
        ("*/*", False),
        ("application/json", False),
        ("text/html", True),
        (BROWSER, True),
        ("text/*", True),
        ("text/html;q=0", False),
        ("text/html;q=0.5, application/json", False),
        ("application/json;q=0.5, text/html", True),
        ("text/html, application/json", False),  # a tie: JSON
        ("TEXT/HTML;Q=1", True),
        ("text/html;q=x", False),
    ],
)
def test_the_index_prefers_html_only_when_the_client_ranks_it_first(accept, html):
    assert prefers_html(accept) is html


# -- in a real browser ----------------------------------------------------------------------
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(
    CHROMIUM is None or importlib.util.find_spec("playwright") is None,
    reason="needs Chromium (Debian's chromium) and the playwright package",
)
def test_a_browser_renders_docs_and_redoc_with_no_request_leaving_the_runtime(
    make_runtime: MakeRuntime, live_server
):
    """Chromium loads ``/docs``, ``/redoc`` and ``/`` from a live runtime: every request
    that reaches the network goes to the runtime's own origin (anything else is recorded
    and refused), both pages render every operation of the OpenAPI document, and no script
    fails."""
    from playwright.sync_api import sync_playwright

    server = live_server(make_runtime(("sequence",), load=False))
    operations = sum(
        len(p) for p in make_client(server.runtime).get("/openapi.json").json()["paths"].values()
    )
    elsewhere: list[str] = []
    failures: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.on("pageerror", lambda error: failures.append(str(error)))

            def gate(route: Any) -> None:
                if route.request.url.startswith(server.url + "/"):
                    route.continue_()
                else:
                    elsewhere.append(route.request.url)
                    route.abort()

            page.route("**/*", gate)
            page.goto(server.url + "/docs")
            page.wait_for_selector(".opblock", timeout=30_000)
            assert page.locator(".opblock").count() == operations
            assert page.locator(".info .title").inner_text().startswith("vllm-srun")
            page.goto(server.url + "/redoc")
            page.wait_for_selector("h1", timeout=30_000)
            assert page.locator("h1").first.inner_text() == "vllm-srun (2.3.0)"
            assert page.locator("li[data-item-id^='operation/']").count() == operations
            page.goto(server.url + "/")
            assert page.locator("h1").inner_text() == "vllm-srun"
            hrefs = page.locator("a").evaluate_all("links => links.map(a => a.href)")
            assert hrefs == [server.url + p for p in ["/v1/models/sequence", *LINKS.values()]]
        finally:
            browser.close()
    assert elsewhere == []
    assert failures == []


def test_the_index_and_the_documentation_pages_answer_head(make_runtime: MakeRuntime):
    client = make_client(make_runtime(("sequence",), load=False))
    for path, kind in [
        ("/", "application/json"),
        ("/docs", "text/html; charset=utf-8"),
        ("/redoc", "text/html; charset=utf-8"),
    ]:
        answer = client.head(path)
        assert answer.status_code == 200, path
        assert answer.headers["content-type"] == kind, path
    assert client.head("/", headers={"Accept": "text/html"}).headers["content-type"] == (
        "text/html; charset=utf-8"
    )
