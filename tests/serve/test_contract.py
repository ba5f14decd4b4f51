"""Every response body of every route, success and error, matches the OpenAPI snapshot.

Real uvicorn servers answer over TCP and over a Unix socket; each response is
validated with ``jsonschema`` against the snapshot's schema for its route and
status (``#/components/schemas/...`` resolved in the snapshot document), and
the test fails unless every documented (route, status) that the server can
produce was produced over both transports.
"""

from __future__ import annotations

import base64
import concurrent.futures
import struct
import threading
from typing import Any

import httpx
import pytest

from vllm_srun.compose.loader import LoadOptions
from vllm_srun.config import ModelConfig

from . import reference
from .conftest import HEADS, Contract, control, snapshot, unanswered, wait_until
from .reference import close

pytestmark = pytest.mark.slow

LONG = " ".join(["the relevant document"] * 40)
TRANSPORTS = ("tcp", "uds")
SURFACE_ERRORS = (400, 404, 413, 422, 429, 500, 503)

# One request per route that answers 200, with a per-item error inside where the
# surface has them, and one for each way a surface fails.
SUCCESS: dict[str, list[dict[str, Any]]] = {
    "/v1/embeddings": [
        {"model": "pooled", "input": ["good movie", "", LONG], "user": "ignored", "options": {}},
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


# The error each refused request answers: code and message (the message as a whole, or its
# beginning where it quotes a parser).
INVALID_MESSAGES = {
    "/v1/embeddings": "dimensions must be an integer from 1 to 32, not 33",
    "/v1/classify": "colour: not a field of this request (check the spelling)",
    "/v1/rerank": "top_n: Input should be greater than or equal to 1",
    "/v1/bundle": "tasks[0] (two) must have exactly one of embeddings, classify, rerank, "
    "decisions, systemone_batch",
}
UNSUPPORTED_MESSAGES = {
    "/v1/embeddings": "this model serves classify, not embeddings",
    "/v1/classify": "this model serves embeddings, rerank, not classify",
    "/v1/rerank": "this model serves classify, not rerank",
}
SERVED = "sequence, scores, token, pooled, relevance, late"


def error_of(response: httpx.Response, status: int, code: str) -> str:
    """The message of an error document, after checking its status and code."""
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code, response.text
    return response.json()["error"]["message"]  # type: ignore[no-any-return]


def decoded(embedding: Any) -> Any:
    """A base64 embedding as its little-endian float32 values; a list as it is."""
    if isinstance(embedding, str):
        raw = base64.b64decode(embedding)
        return list(struct.unpack(f"<{len(raw) // 4}f", raw))
    return embedding


def assert_same(got: Any, want: Any, path: str = "answer") -> None:
    """Equal answers: floats within the reference tolerance, everything else exactly."""
    if isinstance(want, float):
        assert isinstance(got, float) and abs(got - want) <= reference.TOLERANCE, (path, got, want)
    elif isinstance(want, dict):
        assert set(got) == set(want), (path, sorted(got), sorted(want))
        for key in want:
            if key == "embedding":
                assert_same(decoded(got[key]), decoded(want[key]), f"{path}.{key}")
            else:
                assert_same(got[key], want[key], f"{path}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (path, got, want)
        for index, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{path}[{index}]")
    else:
        assert type(got) is type(want) and got == want, (path, got, want)


def in_process(runtime, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The answer of the served model itself to ``body``, without HTTP."""
    request = {k: v for k, v in body.items() if k not in ("model", "user")}
    served = runtime.models[body["model"]].served
    return served.answer(path.rsplit("/", 1)[1], request)  # type: ignore[no-any-return]


def assert_reference_values(packages, path: str, index: int, answer: dict[str, Any]) -> None:
    """``SUCCESS[path][index]``'s answer against the ``transformers`` reference."""
    pooled, sequence = packages["pooled"], packages["sequence"]
    what = (path, index)
    if what == ("/v1/embeddings", 0):
        good, empty, long = answer["data"]
        assert close(good["embedding"], reference.embedding(pooled, "good movie"))
        assert close(empty["embedding"], reference.embedding(pooled, ""))
        assert long["error"] == "max_length_exceeded"
        # [CLS] good movie [SEP] and [CLS] [SEP]; the refused input counts nothing
        assert answer["usage"] == {"prompt_tokens": 6, "total_tokens": 6}
    elif what == ("/v1/embeddings", 1):
        [item] = answer["data"]
        assert close(decoded(item["embedding"]), reference.embedding(pooled, "okay", 8))
    elif what == ("/v1/embeddings", 2):
        [item] = answer["data"]
        assert item["input"]["tokens"] == reference.tokens(pooled, LONG) > 48
        assert item["input"]["truncated"] is False and item["input"]["windows"] > 1
    elif what == ("/v1/classify", 0):
        for result, text in zip(answer["results"], ["good movie", "okay"], strict=True):
            want = reference.probabilities(sequence, text)
            assert close(result["probabilities"], want), text
            assert result["label"] == ("negative", "neutral", "positive")[want.index(max(want))]
    elif what == ("/v1/classify", 1):
        pair, single = answer["results"]
        assert close(pair["probabilities"], reference.probabilities(sequence, "good", "movie"))
        assert close(single["probabilities"], reference.probabilities(sequence, "a"))
    elif what == ("/v1/classify", 2):
        scored, long = answer["results"]
        want = reference.scores(packages["scores"], "bad film")
        assert close(scored["scores"], want)
        thresholds = {"toxic": 0.5, "insult": 0.4, "threat": 0.9}  # the package's thresholds.json
        labels = ("toxic", "insult", "threat")
        selected = [label for label, v in zip(labels, want, strict=True) if v >= thresholds[label]]
        assert scored["selected"] == selected
        assert long["error"] == "max_length_exceeded"
    elif what == ("/v1/classify", 3):
        [scored] = answer["results"]
        want = reference.scores(packages["scores"], "bad film")
        assert close(scored["scores"], want) and min(want) >= 0.1
        assert scored["selected"] == ["toxic", "insult", "threat"]
    elif what == ("/v1/classify", 4):
        [result] = answer["results"]
        text = "dana whitfield from new york"
        for span in result["spans"]:
            assert text[span["start"] : span["end"]] == span["text"]
    elif what == ("/v1/rerank", 0):
        documents = SUCCESS[path][0]["documents"]
        scored, failed = answer["results"][:2], answer["results"][2]
        assert sorted(r["index"] for r in scored) == [0, 2] and failed["index"] == 1
        for result in scored:
            score, logit = reference.relevance(
                packages["relevance"], "good food", documents[result["index"]]
            )
            assert abs(result["relevance_score"] - score) <= reference.TOLERANCE
            assert abs(result["logit"] - logit) <= reference.TOLERANCE
        assert failed["error"] == "max_length_exceeded"
    elif what == ("/v1/rerank", 1):
        query = reference.embedding(pooled, "good food")
        [top] = answer["results"]
        cosine = reference.cosine(query, reference.embedding(pooled, "the food"))
        assert cosine > reference.cosine(query, reference.embedding(pooled, "a movie")) + 0.1
        assert top["index"] == 0 and top["document"] == "the food"
        assert abs(top["relevance_score"] - cosine) <= reference.TOLERANCE
    elif what == ("/v1/bundle", 0):
        embedded, unsupported, reranked = answer["results"]
        assert (embedded["id"], embedded["status"]) == ("e", 200)
        [item] = embedded["embeddings"]["data"]
        assert close(item["embedding"], reference.embedding(pooled, "good"))
        assert (unsupported["id"], unsupported["status"]) == ("c", 422)
        assert unsupported["error"] == {
            "code": "unsupported_surface",
            "message": "this model serves embeddings, rerank, not classify",
            "type": "invalid_request_error",
            "param": None,
        }
        assert (reranked["id"], reranked["status"]) == ("r", 200)
        [result] = reranked["rerank"]["results"]
        score, _ = reference.relevance(packages["relevance"], "q", "d")
        assert abs(result["relevance_score"] - score) <= reference.TOLERANCE
    elif what == ("/v1/bundle", 1):
        missing, late = answer["results"]
        assert (missing["id"], missing["status"]) == ("missing", 404)
        assert missing["error"] == {
            "code": "model_not_found",
            "message": f"model 'nope' is not served here (served: {SERVED})",
            "type": "invalid_request_error",
            "param": "model",
        }
        assert (late["id"], late["status"]) == ("late", 200)
        [result] = late["classify"]["results"]
        assert close(result["probabilities"], reference.probabilities(sequence, "good"))


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

    def loader(model: str, options: LoadOptions, **kwargs: Any):
        if options.name == "late":
            assert late_loaded.wait(60)
        return controlled_loader(model, options, **kwargs)

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
    message = error_of(refused, 429, "overloaded")
    assert message.startswith(f"model {model} has 2 requests and "), message
    assert " tokens queued (limits 2 and " in message and message.endswith("); retry later")
    for response in admitted:
        assert response.status_code == 200, response.text
        contract.validate("POST", path, response)


def test_every_response_matches_the_snapshot_over_tcp_and_a_unix_socket(served, contract, packages):
    runtime, server, late_loaded = served
    # While `late` loads: /health 503, a request for it 503 not_ready.
    for transport in TRANSPORTS:
        with server.client(transport) as client:
            health = check(contract[transport], client, "GET", "/health")
            assert health.status_code == 503
            assert (health.json()["status"], health.json()["reason"]) == ("loading", None)
            assert health.json()["models"]["late"] == {"status": "loading", "reason": None}
            assert health.json()["models"]["pooled"] == {"status": "ready", "reason": None}
            for path in UNSUPPORTED:
                body = with_model(UNSUPPORTED[path], "late")
                response = check(contract[transport], client, "POST", path, json=body)
                assert error_of(response, 503, "not_ready") == "model late is loading"
            models = check(contract[transport], client, "GET", "/v1/models")
            assert models.status_code == 200
            cards = {card["id"]: card["status"] for card in models.json()["data"]}
            assert cards == {**dict.fromkeys(HEADS, "ready"), "late": "loading"}
    late_loaded.set()
    wait_until(lambda: runtime.models["late"].status == "ready", 30, "late to load")

    for transport in TRANSPORTS:
        c = contract[transport]
        with server.client(transport) as client:
            health = check(c, client, "GET", "/health")
            assert health.status_code == 200
            assert health.json() == {
                "status": "ready",
                "api_version": "2.3.0",
                "reason": None,
                "model": None,  # several models: each by name under models
                "models": {n: {"status": "ready", "reason": None} for n in (*HEADS, "late")},
            }
            assert check(c, client, "GET", "/health/live").status_code == 200
            models = check(c, client, "GET", "/v1/models")
            assert models.status_code == 200
            assert [card["id"] for card in models.json()["data"]] == [*HEADS, "late"]
            assert check(c, client, "GET", "/metrics").status_code == 200
            for path, bodies in SUCCESS.items():
                for index, body in enumerate(bodies):
                    response = check(c, client, "POST", path, json=body)
                    assert response.status_code == 200, response.text
                    assert_reference_values(packages, path, index, response.json())
                    if path != "/v1/bundle":  # the transport changes no value
                        assert_same(response.json(), in_process(runtime, path, body))
            for path, body in INVALID.items():
                response = check(c, client, "POST", path, json=body)
                assert error_of(response, 400, "invalid_request") == INVALID_MESSAGES[path]
                # sent without a JSON content type, the body is not read as an object
                malformed = check(c, client, "POST", path, content=b'{"input": ')
                assert error_of(malformed, 400, "invalid_request") == (
                    "the body must be a JSON object; send it with content-type: application/json"
                )
                huge = check(c, client, "POST", path, content=b"[" + b" " * 20000 + b"]")
                message = error_of(huge, 413, "request_too_large")
                assert message == "the body is over 16384 bytes"
            for path, body in UNSUPPORTED.items():
                response = check(c, client, "POST", path, json=body)
                assert error_of(response, 422, "unsupported_surface") == UNSUPPORTED_MESSAGES[path]
                missing = check(c, client, "POST", path, json=with_model(body, "nope"))
                assert error_of(missing, 404, "model_not_found") == (
                    f"model 'nope' is not served here (served: {SERVED})"
                )
                forward = control(runtime, HELD[path][0])
                forward.fail_finish = RuntimeError("finish broke")
                try:
                    broken = check(c, client, "POST", path, json=HELD[path][1])
                finally:
                    forward.fail_finish = None
                # the exception's type, never its text
                message = error_of(broken, 500, "internal_error")
                assert message == "finishing the response failed: RuntimeError"
            too_many = {"tasks": [{"id": str(i), "embeddings": {"input": "x"}} for i in range(4)]}
            response = check(c, client, "POST", "/v1/bundle", json=too_many)
            assert (
                error_of(response, 413, "request_too_large") == "the bundle has 4 tasks; at most 3"
            )
        for path in HELD:
            fill_the_queue(runtime, server, c, transport, path)

    expected = {("GET", "/health", 200), ("GET", "/health", 503), ("GET", "/health/live", 200)}
    expected |= {("GET", "/v1/models", 200), ("GET", "/metrics", 200)}
    expected |= {("POST", "/v1/bundle", s) for s in (200, 400, 413)}
    expected |= {("POST", p, s) for p in UNSUPPORTED for s in (200, *SURFACE_ERRORS)}
    for transport in TRANSPORTS:
        assert contract[transport].checked == expected, transport
