"""The Dashboard's routes on the management API without a browser: the page and its files
(same-origin only, a Content Security Policy that says so), the document it reads
(``GET /api/v1/dashboard``) for a Router-mode frontend on the steerable worker, who may
read it, and its pieces (rule text, figures).

The browser tests are :mod:`test_dashboard_browser`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from vllm_sr._version import __version__
from vllm_sr.config.routing import RuleNode
from vllm_sr.dashboard.routes import CONTENT_SECURITY_POLICY, allowed
from vllm_sr.dashboard.snapshot import declared_in, figures, rule_text

from .conftest import free_ports
from .router_support import StubServer, ThreadedFrontend
from .test_reload import router_document

# -- a Router-mode frontend in this process ------------------------------------------------------


@pytest.fixture(scope="module")
def router() -> Iterator[ThreadedFrontend]:
    stub = StubServer()
    [port] = free_ports(1)
    document = router_document(stub.stub.endpoint, port)
    document["listeners"][0]["api_keys"] = ["listener-key"]
    frontend = ThreadedFrontend(document).start()
    try:
        frontend.wait_ready()
        yield frontend
    finally:
        frontend.stop()
        stub.stop()


def read(frontend: ThreadedFrontend, path: str, **headers: str) -> httpx.Response:
    return httpx.get(f"{frontend.mgmt_url}{path}", headers=headers, timeout=10)


def test_the_page_references_only_its_own_files_which_are_served(router) -> None:
    page = read(router, "/dashboard")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "connect-src 'self'" in CONTENT_SECURITY_POLICY
    assert page.headers["cache-control"] == "no-store"
    references = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sorted(references) == [
        "/dashboard/static/dashboard.css",
        "/dashboard/static/dashboard.js",
        "data:,",
    ]
    assert "http://" not in page.text and "https://" not in page.text
    kinds = {
        "/dashboard/static/dashboard.css": "text/css",
        "/dashboard/static/dashboard.js": "text/javascript",
    }
    for reference, kind in kinds.items():
        asset = read(router, reference)
        assert asset.status_code == 200, reference
        assert asset.headers["content-type"].split(";")[0] == kind
        assert "http://" not in asset.text and "https://" not in asset.text, reference


def test_the_page_answers_head_with_its_headers(router) -> None:
    answer = httpx.head(f"{router.mgmt_url}/dashboard", timeout=10)
    assert answer.status_code == 200
    assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert answer.headers["content-type"] == "text/html; charset=utf-8"
    assert answer.content == b""


def test_the_document_shows_the_router_its_routes_signals_and_figures(router) -> None:
    answer = read(router, "/api/v1/dashboard", Authorization="Bearer listener-key")
    assert answer.status_code == 200, answer.text
    assert answer.headers["cache-control"] == "no-store"
    body = answer.json()
    assert (body["mode"], body["version"], body["phase"], body["ready"]) == (
        "router",
        __version__,
        "ready",
        True,
    )
    config = body["config"]
    assert config["activation_status"] == "active" and config["config_version"] == 1
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", config["source_config_hash"])
    assert body["routing"] == {
        "strategy": "priority",
        "decisions": [
            {
                "name": "coding",
                "priority": 100,
                "conditions": "keyword:code",
                "models": ["a-chat"],
                "algorithm": "static",
                "plugins": [],
            },
            {
                "name": "weather",
                "priority": 50,
                "conditions": "embedding:rain",
                "models": ["a-chat"],
                "algorithm": "static",
                "plugins": [],
            },
        ],
        "signals": [
            {"kind": "keywords", "name": "code", "deployment": None},
            {"kind": "embeddings", "name": "rain", "deployment": "primary"},
        ],
    }
    [deployment] = body["deployments"]
    assert deployment["name"] == "primary" and deployment["generation"] == "active"
    assert (deployment["artifact"], deployment["public_id"]) == ("fake/primary", "fake/primary")
    assert deployment["bound"] == ["embedding"] and deployment["published"] == []
    assert deployment["scalable"] is True
    assert (deployment["desired_replicas"], deployment["ready_replicas"]) == (1, 1)
    [replica] = deployment["replicas"]
    assert replica["state"] == "ready" and replica["restarts"] == 0
    assert body["declared"] == [] and body["saved_only"] == []
    assert deployment["editable"] is True  # the saved document declares it
    assert body["persisted"] is False  # an in-memory configuration, no --config file
    assert body["default_model"] == "a-chat"
    [listener] = body["listeners"]
    assert listener == {
        "name": "chat",
        "address": "127.0.0.1",
        "port": router.config.listeners[0].port,
        "api_keys": 1,
        "models": [],
        "runtime": [],
        "systemone": [],
    }
    assert "listener-key" not in answer.text
    # The embedding route's candidates were embedded once before the routes opened.
    assert body["figures"]["primary"]["ready"] == 1.0
    assert body["figures"]["primary"]["restarts"] == 0.0
    assert body["figures"]["primary"]["requests"] == {"ok": 1.0}


def test_the_figures_follow_the_requests_the_metrics_count(router) -> None:
    before = read(router, "/api/v1/dashboard", **{"Api-Key": "listener-key"}).json()
    ok = before["figures"]["primary"]["requests"]["ok"]
    answer = httpx.post(
        f"{router.mgmt_url}/api/v1/routing/preview", json={"text": "will it rain"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    after = read(router, "/api/v1/dashboard", **{"Api-Key": "listener-key"}).json()
    assert after["figures"]["primary"]["requests"]["ok"] == ok + 1


def test_a_configuration_request_nested_too_deeply_is_400_and_the_api_keeps_answering(
    router,
) -> None:
    plan = f"{router.mgmt_url}/api/v1/config/plan"
    with httpx.Client(timeout=30) as client:  # one connection: a 500 would have closed it
        body = client.post(plan, content=b"[" * 100_000)
        assert body.status_code == 400, body.text
        assert body.json()["error"]["code"] == "INVALID_REQUEST"
        text = client.post(plan, json={"yaml": "[" * 400 + "]" * 400})
        assert text.status_code == 400, text.text
        assert text.json()["error"]["message"] == (
            "the document is not YAML: the document nests more than 64 levels deep (its "
            "aliases followed)"
        )
        assert client.get(f"{router.mgmt_url}/health").status_code == 200


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("127.0.0.1:{port}", 200),
        ("localhost:{port}", 200),
        ("LOCALHOST.", 200),
        ("127.8.9.10", 200),
        ("[::1]:{port}", 200),
        ("rebound.example:{port}", 403),  # a name an attacker points at 127.0.0.1
        ("10.1.2.3:{port}", 403),
        ("[::ffff:7f00:1]", 403),
        ("", 403),
    ],
)
def test_a_loopback_bound_management_api_answers_loopback_names_only(router, host, status):
    port = router.mgmt_port
    with httpx.Client(timeout=10) as client:
        for path in ("/api/v1/config", "/dashboard", "/health"):
            answer = client.get(
                f"{router.mgmt_url}{path}", headers={"Host": host.format(port=port)}
            )
            assert answer.status_code == status, (path, answer.text)
        if status == 403:
            error = answer.json()["error"]
            assert error["code"] == "HOST_NOT_ALLOWED"
            assert error["message"] == (
                f"Host {host.format(port=port)!r} is not a name of this machine's loopback, "
                "where this API listens: use 127.0.0.1 or localhost (to reach it from "
                "elsewhere, start vllm-sr with VLLM_SR_PUBLISH_MANAGEMENT_API=true)"
            )


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Api-Key": "listener-ke"},
        {"Authorization": "Basic x"},
    ],
)
def test_without_a_configured_key_the_document_is_401(router, headers: dict[str, str]) -> None:
    answer = read(router, "/api/v1/dashboard", **headers)
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == 'Bearer realm="vllm-sr management"'
    error = answer.json()["error"]
    assert error["code"] == "UNAUTHORIZED"
    assert error["message"] == (
        "send Authorization: Bearer <key>: the management token (VSR_MGMT_TOKEN) or an API "
        "key of one of the listeners"
    )
    assert read(router, "/dashboard").status_code == 200  # the page itself holds no data


def source(token: str | None, keys: list[list[str]]) -> Any:
    listeners = [SimpleNamespace(api_keys=k) for k in keys]
    return SimpleNamespace(
        config=SimpleNamespace(listeners=listeners), reloads=SimpleNamespace(token=token)
    )


def request(**headers: str) -> Any:
    return SimpleNamespace(headers={k.lower(): v for k, v in headers.items()})


def test_the_management_token_or_any_listeners_key_opens_the_document() -> None:
    guarded = source("mgmt-token", [["a"], ["b", "c"]])
    assert allowed(request(Authorization="Bearer mgmt-token"), guarded)
    assert allowed(request(Authorization="bearer c"), guarded)
    assert allowed(request(**{"Api-Key": "a"}), guarded)
    assert not allowed(request(), guarded)
    assert not allowed(request(Authorization="Bearer mgmt"), guarded)
    assert allowed(request(), source(None, [[], []]))  # nothing configured: open
    assert not allowed(request(), source("t", []))


# -- its pieces ----------------------------------------------------------------------------------


def node(document: dict[str, Any]) -> RuleNode:
    return RuleNode.model_validate(document)


@pytest.mark.parametrize(
    ("rules", "text"),
    [
        (None, "always"),
        ({"operator": "AND", "conditions": []}, "always"),
        ({"type": "keyword", "name": "code"}, "keyword:code"),
        (
            {
                "operator": "OR",
                "conditions": [
                    {"type": "pii", "name": "contact"},
                    {
                        "operator": "NOT",
                        "conditions": [
                            {"type": "decision", "name": "kind", "label": "code"},
                        ],
                    },
                    {"type": "decision", "name": "level", "predicate": {"gte": 0.5, "lt": 0.9}},
                ],
            },
            "(pii:contact OR NOT decision:kind[code] OR decision:level gte 0.5 lt 0.9)",
        ),
    ],
)
def test_rule_text(rules: dict[str, Any] | None, text: str) -> None:
    assert rule_text(node(rules) if rules is not None else None) == text


def test_figures_read_the_registry_by_deployment_and_leave_zero_counts_out() -> None:
    registry = CollectorRegistry()
    ready = Gauge("vsr_model_runtime_ready", "", ["deployment"], registry=registry)
    requests = Counter(
        "vsr_model_runtime_requests", "", ["deployment", "outcome"], registry=registry
    )
    unknown = Counter(
        "vsr_model_runtime_unknown_answers", "", ["deployment", "reason"], registry=registry
    )
    ready.labels("a").set(1)
    ready.labels("b").set(0)
    requests.labels("a", "ok").inc(3)
    requests.labels("a", "timeout").inc(0)
    unknown.labels("b", "unavailable").inc(2)
    assert figures(registry) == {
        "a": {"ready": 1.0, "requests": {"ok": 3.0}},
        "b": {"ready": 0.0, "unknown_answers": {"unavailable": 2.0}},
    }


def test_reading_the_configuration_leaves_the_event_loop_free() -> None:
    """A large document takes a pure-Python YAML parser most of a second (500 deployments:
    0.4 s here): read on the event loop, it held every listener's requests meanwhile."""
    import asyncio
    import threading

    from vllm_sr.api.management import build_management_app

    entered, gate = threading.Event(), threading.Event()

    class SlowReloads:
        token = None
        config_version = 1
        source = SimpleNamespace(etag='"e"')

        def current(self) -> dict[str, Any]:
            entered.set()
            gate.wait(10)
            return {"listeners": []}

    app = build_management_app(SimpleNamespace(draining=False, reloads=SlowReloads()))  # type: ignore[arg-type]

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            read = asyncio.create_task(client.get("/api/v1/config"))
            assert await asyncio.to_thread(entered.wait, 10)  # the read is parsing
            health = await client.get("/health")
            assert health.json() == {"status": "ok"}
            assert not read.done()  # still parsing, and /health answered meanwhile
            gate.set()
            answer = await asyncio.wait_for(read, 10)
            assert (answer.status_code, answer.json()) == (200, {"listeners": []})
            assert answer.headers["etag"] == '"e"'

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("text", "names"),
    [
        (b"global: {model_catalog: {deployments: {a: {}, b: {provider: x}}}}", {"a", "b"}),
        (b"listeners: []", set()),
        (b"", set()),
        (b"global: [1]", set()),
        (b"global: {model_catalog: {deployments: [a]}}", set()),
        (b": not yaml: [", set()),
    ],
)
def test_the_saved_deployments_are_read_from_any_document(text: bytes, names: set[str]) -> None:
    assert declared_in(text) == names
