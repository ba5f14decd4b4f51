"""Every response body of every route, success and error, matches the OpenAPI snapshot.

Real uvicorn servers answer over TCP and over a Unix socket; each response is
validated with ``jsonschema`` against the snapshot's schema for its route and
status (``#/components/schemas/...`` resolved in the snapshot document), and
the test fails unless every documented (route, status) that the server can
produce was produced over both transports.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

import httpx
import pytest

from vllm_srun.serve.config import ModelConfig

from .conftest import HEADS, Contract, control, snapshot, unanswered, wait_until

pytestmark = pytest.mark.slow

LONG = " ".join(["the relevant document"] * 40)
TRANSPORTS = ("tcp", "uds")
SURFACE_ERRORS = (400, 404, 413, 422, 429, 500, 503)

# One request per route that answers 200, with a per-item error inside where the
# surface has them, and one for each way a surface fails.
SUCCESS: dict[str, list[dict[str, Any]]] = {
    "/v1/embeddings": [
        {"model": "pooled", "input": ["good movie", "", LONG], "user": "ignored"},
        {"model": "pooled", "input": "okay", "dimensions": 8, "encoding_format": "base64"},
        {"model": "pooled", "input": [LONG], "options": {"overflow": "window"}},
    ],
    "/v1/classify": [
        {"model": "sequence", "input": ["good movie", "okay"]},
        {"model": "sequence", "input": [{"text": "good", "text_pair": "movie"}, {"text": "a"}]},
        {"model": "scores", "input": ["bad film", LONG * 2]},
        {"model": "scores", "input": "bad film", "options": {"threshold": 0.1}},
        {
            "model": "token",
            "input": "dana whitfield from new york",
            "options": {"threshold": 0.0, "aggregation": "first"},
        },
        {"model": "token", "input": [LONG], "options": {"overflow": "window", "threshold": 0}},
    ],
    "/v1/rerank": [
        {"model": "relevance", "query": "good food", "documents": ["good food", LONG * 2, "x"]},
        {
            "model": "pooled",
            "query": "good food",
            "documents": ["the food", "a movie", LONG],
            "top_n": 1,
            "return_documents": True,
        },
    ],
    "/v1/bundle": [
        {
            "tasks": [
                {"id": "e", "embeddings": {"model": "pooled", "input": "good"}},
                {"id": "c", "classify": {"model": "pooled", "input": "good"}},
                {"id": "r", "rerank": {"model": "relevance", "query": "q", "documents": ["d"]}},
            ],
            "options": {"deadline_ms": 10000},
        },
        {
            "tasks": [
                {"id": "missing", "classify": {"model": "nope", "input": "good"}},
                {"id": "late", "classify": {"model": "late", "input": "good"}},
            ]
        },
    ],
}
INVALID = {
    "/v1/embeddings": {"model": "pooled", "input": "x", "dimensions": 33},
    "/v1/classify": {"model": "sequence", "input": "x", "colour": "red"},
    "/v1/rerank": {"model": "relevance", "query": "q", "documents": ["d"], "top_n": 0},
    "/v1/bundle": {
        "tasks": [
            {
                "id": "two",
                "embeddings": {"model": "pooled", "input": "x"},
                "classify": {"model": "sequence", "input": "x"},
            }
        ]
    },
}
UNSUPPORTED = {
    "/v1/embeddings": {"model": "sequence", "input": "x"},
    "/v1/classify": {"model": "pooled", "input": "x"},
    "/v1/rerank": {"model": "sequence", "query": "q", "documents": ["d"]},
}
# The model whose forward is held to fill the queue, and a request for it.
HELD = {
    "/v1/embeddings": ("pooled", {"model": "pooled", "input": "good movie"}),
    "/v1/classify": ("sequence", {"model": "sequence", "input": "good movie"}),
    "/v1/rerank": ("relevance", {"model": "relevance", "query": "q", "documents": ["d", "e"]}),
}


def with_model(body: dict[str, Any], model: str) -> dict[str, Any]:
    return {**body, "model": model}


def distinct(body: dict[str, Any], n: int, transport: str) -> dict[str, Any]:
    """``body`` with an input unique to ``n`` and ``transport`` (never a result cache hit)."""
    text = f"{['good', 'bad', 'okay'][n]} {transport} text"
    if "query" in body:
        return {**body, "query": text}
    return {**body, "input": text}


@pytest.fixture(scope="module")
def contract() -> dict[str, Contract]:
    document = snapshot()
    return {transport: Contract(document) for transport in TRANSPORTS}


@pytest.fixture
def served(make_runtime, packages, controlled_loader, live_server):
    """Every head, and ``late``: a model whose loading waits for ``late_loaded``."""
    late_loaded = threading.Event()

    def loader(model: str, **kwargs: Any):
        if kwargs.get("name") == "late":
            assert late_loaded.wait(60)
        return controlled_loader(model, **kwargs)

    models = [ModelConfig(model=str(packages[h]), name=h) for h in HEADS]
    models.append(ModelConfig(model=str(packages["sequence"]), name="late"))
    runtime = make_runtime(
        models=models,
        loader=loader,
        load=False,
        max_queue=2,
        max_request_bytes=16384,
        max_bundle_tasks=3,
    )
    runtime.start_loading()
    wait_until(lambda: runtime.models["relevance"].status == "ready", 60, "models to load")
    server = live_server(runtime)
    yield runtime, server, late_loaded
    late_loaded.set()


def check(contract: Contract, client: httpx.Client, method: str, path: str, **kw) -> Any:
    response = client.request(method, path, **kw)
    contract.validate(method, path, response)
    return response


def fill_the_queue(runtime, server, contract, transport, path):
    """Hold the forward, admit two requests (``--max-queue 2``), the third is 429."""
    model, body = HELD[path]
    forward = control(runtime, model)
    with concurrent.futures.ThreadPoolExecutor(2) as pool, forward.held():

        def send(n: int) -> httpx.Response:
            with server.client(transport) as client:
                return client.post(path, json=distinct(body, n, transport))

        first = pool.submit(send, 0)
        assert forward.entered.wait(10)
        second = pool.submit(send, 1)
        wait_until(lambda: unanswered(runtime, model) == 2, 10, "two admitted requests")
        with server.client(transport) as client:
            refused = check(contract, client, "POST", path, json=distinct(body, 2, transport))
        forward.release()
        admitted = [first.result(30), second.result(30)]
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "overloaded"
    for response in admitted:
        assert response.status_code == 200, response.text
        contract.validate("POST", path, response)


def test_every_response_matches_the_snapshot_over_tcp_and_a_unix_socket(served, contract):
    runtime, server, late_loaded = served
    # While `late` loads: /health 503, a request for it 503 not_ready.
    for transport in TRANSPORTS:
        with server.client(transport) as client:
            health = check(contract[transport], client, "GET", "/health")
            assert health.status_code == 503
            assert health.json()["models"]["late"]["status"] == "loading"
            for path in UNSUPPORTED:
                body = with_model(UNSUPPORTED[path], "late")
                response = check(contract[transport], client, "POST", path, json=body)
                assert response.status_code == 503
                assert response.json()["error"]["code"] == "not_ready"
            models = check(contract[transport], client, "GET", "/v1/models")
            assert models.status_code == 200
    late_loaded.set()
    wait_until(lambda: runtime.models["late"].status == "ready", 30, "late to load")

    for transport in TRANSPORTS:
        c = contract[transport]
        with server.client(transport) as client:
            assert check(c, client, "GET", "/health").status_code == 200
            assert check(c, client, "GET", "/health/live").status_code == 200
            assert check(c, client, "GET", "/v1/models").status_code == 200
            assert check(c, client, "GET", "/metrics").status_code == 200
            for path, bodies in SUCCESS.items():
                for body in bodies:
                    response = check(c, client, "POST", path, json=body)
                    assert response.status_code == 200, response.text
            for path, body in INVALID.items():
                assert check(c, client, "POST", path, json=body).status_code == 400
                malformed = check(c, client, "POST", path, content=b'{"input": ')
                assert malformed.status_code == 400
                huge = check(c, client, "POST", path, content=b"[" + b" " * 20000 + b"]")
                assert huge.status_code == 413
            for path, body in UNSUPPORTED.items():
                assert check(c, client, "POST", path, json=body).status_code == 422
                missing = check(c, client, "POST", path, json=with_model(body, "nope"))
                assert missing.status_code == 404
                forward = control(runtime, HELD[path][0])
                forward.fail_finish = RuntimeError("finish broke")
                try:
                    broken = check(c, client, "POST", path, json=HELD[path][1])
                finally:
                    forward.fail_finish = None
                assert broken.status_code == 500, broken.text
                assert broken.json()["error"]["code"] == "internal_error"
            too_many = {"tasks": [{"id": str(i), "embeddings": {"input": "x"}} for i in range(4)]}
            assert check(c, client, "POST", "/v1/bundle", json=too_many).status_code == 413
        for path in HELD:
            fill_the_queue(runtime, server, c, transport, path)

    expected = {("GET", "/health", 200), ("GET", "/health", 503), ("GET", "/health/live", 200)}
    expected |= {("GET", "/v1/models", 200), ("GET", "/metrics", 200)}
    expected |= {("POST", "/v1/bundle", s) for s in (200, 400, 413)}
    expected |= {("POST", p, s) for p in UNSUPPORTED for s in (200, *SURFACE_ERRORS)}
    for transport in TRANSPORTS:
        assert contract[transport].checked == expected, transport
