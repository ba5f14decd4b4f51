"""Admission, batching, deadlines, failures and cancellation through HTTP.

Concurrency goes through a live uvicorn server; a test holds a model's forward
(:meth:`Controlled.hold`) to make the queue state it needs, so nothing depends
on timing luck.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import httpx
import pytest

from .conftest import control, make_client, unanswered, wait_until

WORDS = "good bad great terrible love hate okay fine movie film dana whitfield new york london"
TEXTS = [
    " ".join(WORDS.split()[i : i + n]) for i, n in [(0, 2), (3, 5), (6, 1), (2, 9), (10, 5)]
] + ["dana whitfield from new york", "alice and bob in paris", "the movie was okay"]


def post(server, path: str, body: dict[str, Any], transport: str = "tcp") -> httpx.Response:
    with server.client(transport) as client:
        return client.post(path, json=body)


def close(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


# -- admission ------------------------------------------------------------------------------
def test_each_bundle_task_is_admitted_or_refused_as_it_would_be_alone(make_runtime):
    """A bundle's tasks on one model are admitted one by one: a task weighing more than
    the queue fails alone, and the queue fills task by task (the ones before queued)."""
    runtime = make_runtime(("pooled", "sequence"), max_queue=3)
    client = make_client(runtime)
    heavy = {
        "model": "pooled",
        "state": "s",
        "questions": {"q": {"type": "noul", "instructions": "i"}},
        "states": {
            f"e{i}": {"state": "s", "questions": {"q": {"type": "noul", "instructions": "i"}}}
            for i in range(3)
        },
    }
    tasks = [{"id": "heavy", "decisions": heavy}]
    tasks += [{"id": f"t{i}", "embeddings": {"model": "pooled", "input": "okay"}} for i in range(4)]
    tasks += [{"id": "other", "classify": {"model": "sequence", "input": "okay"}}]
    results = client.post("/v1/bundle", json={"tasks": tasks}).json()["results"]
    assert [(r["id"], r["status"]) for r in results] == [
        ("heavy", 429),
        ("t0", 200),
        ("t1", 200),
        ("t2", 200),
        ("t3", 429),
        ("other", 200),
    ]
    assert results[0]["error"]["message"].startswith(
        "the request counts as 4 requests (a decisions `states` entry counts as one) against "
        "--max-queue 3 of model pooled"
    )
    assert results[4]["error"]["message"].startswith("model pooled has 3 requests and ")


@pytest.mark.slow
def test_a_full_queue_is_429_and_nothing_admitted_is_lost(
    make_runtime, live_server, loaded_models, packages
):
    runtime = make_runtime(("pooled",), max_queue=3)
    server = live_server(runtime)
    forward = control(runtime, "pooled")
    bodies = [{"model": "pooled", "input": [t, TEXTS[-1]]} for t in TEXTS[:3]]
    with concurrent.futures.ThreadPoolExecutor(3) as pool, forward.held():
        first = pool.submit(post, server, "/v1/embeddings", bodies[0])
        assert forward.entered.wait(10)
        rest = [pool.submit(post, server, "/v1/embeddings", b) for b in bodies[1:]]
        wait_until(lambda: unanswered(runtime, "pooled") == 3, 10, "three admitted requests")
        refused = [
            post(server, "/v1/embeddings", {"model": "pooled", "input": "okay"}),
            post(server, "/v1/embeddings", {"model": "pooled", "input": TEXTS}),
            post(server, "/v1/bundle", {"tasks": [{"id": "t", "embeddings": bodies[0]}]}),
        ]
        forward.release()
        admitted = [future.result(30) for future in (first, *rest)]
    for response in refused[:2]:
        assert response.status_code == 429, response.text
        error = response.json()["error"]
        assert error["code"] == "overloaded"
        assert error["message"].startswith("model pooled has 3 requests and ")
        assert error["message"].endswith("(limits 3 and 4194304); retry later")
        assert response.headers["retry-after"] == "1"
    [task] = refused[2].json()["results"]
    assert task["status"] == 429 and task["error"]["code"] == "overloaded"

    reference = loaded_models[str(packages["pooled"])]
    for body, response in zip(bodies, admitted, strict=True):
        assert response.status_code == 200, response.text
        expected = reference.answer("embeddings", body)["data"]
        data = response.json()["data"]
        assert [d["index"] for d in data] == [0, 1]
        for got, want in zip(data, expected, strict=True):
            assert close(got["embedding"], want["embedding"]) < 1e-5
    assert unanswered(runtime, "pooled") == 0
    assert post(server, "/v1/embeddings", {"model": "pooled", "input": "okay"}).status_code == 200


@pytest.mark.slow
def test_a_request_over_the_token_bound_runs_when_nothing_else_waits(make_runtime, live_server):
    runtime = make_runtime(("pooled",), max_queued_tokens=10)
    server = live_server(runtime)
    big = {"model": "pooled", "input": ["good movie", "bad film", "okay fine"]}  # 12 tokens
    response = post(server, "/v1/embeddings", big)
    assert response.status_code == 200
    assert all("embedding" in d for d in response.json()["data"])
    forward = control(runtime, "pooled")
    with concurrent.futures.ThreadPoolExecutor(1) as pool, forward.held():
        held = pool.submit(post, server, "/v1/embeddings", {"model": "pooled", "input": "love"})
        assert forward.entered.wait(10)
        refused = post(server, "/v1/embeddings", big)
        forward.release()
        assert held.result(30).status_code == 200
    assert refused.status_code == 429
    assert "requests and 3 tokens queued (limits 256 and 10)" in refused.json()["error"]["message"]


# -- batching -------------------------------------------------------------------------------
CASES = [
    ("/v1/classify", "sequence", lambda text: {"model": "sequence", "input": text}),
    (
        "/v1/classify",
        "token",
        lambda text: {"model": "token", "input": text, "options": {"threshold": 0.0}},
    ),
    ("/v1/classify", "scores", lambda text: {"model": "scores", "input": [text, "good"]}),
    ("/v1/embeddings", "pooled", lambda text: {"model": "pooled", "input": text}),
    (
        "/v1/rerank",
        "relevance",
        lambda text: {"model": "relevance", "query": text, "documents": ["good", "movie"]},
    ),
]


def agree(path: str, alone: dict[str, Any], batched: dict[str, Any]) -> None:
    """Equal labels, spans and order; every number within 1e-5."""
    if path == "/v1/embeddings":
        for a, b in zip(alone["data"], batched["data"], strict=True):
            assert close(a["embedding"], b["embedding"]) <= 1e-5
        return
    for a, b in zip(alone["results"], batched["results"], strict=True):
        assert a["index"] == b["index"]
        for key in ("probabilities", "scores"):
            if key in a:
                assert close(a[key], b[key]) <= 1e-5
        assert a.get("label") == b.get("label")
        assert a.get("selected") == b.get("selected")
        if "spans" in a:
            strip = [{k: v for k, v in s.items() if k != "probability"} for s in a["spans"]]
            assert strip == [{k: v for k, v in s.items() if k != "probability"} for s in b["spans"]]
            assert (
                close(
                    [s["probability"] for s in a["spans"]], [s["probability"] for s in b["spans"]]
                )
                <= 1e-5
            )
        if "relevance_score" in a:
            assert abs(a["relevance_score"] - b["relevance_score"]) <= 1e-5
            assert abs(a["logit"] - b["logit"]) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize(("path", "model", "request_of"), CASES, ids=[c[1] for c in CASES])
def test_a_row_alone_and_inside_a_concurrent_batch_agree(
    make_runtime, live_server, path, model, request_of
):
    # Cross-request batching of rows of any length is the `batching` profile's (under
    # `exact`, a fixture whose rows differ in the last bits answers one by one).
    runtime = make_runtime((model,), result_cache_entries=0, batch_window_ms=20, profile="batching")
    # One forward for every queued row: no split by length (tests/test_scheduler.py covers it).
    runtime.models[model].service.scheduler.limits.forward_overhead_tokens = None
    server = live_server(runtime)
    forward = control(runtime, model)
    alone = {}
    for text in TEXTS:
        forwards = len(forward.forwards)
        response = post(server, path, request_of(text))
        assert response.status_code == 200, response.text
        alone[text] = response.json()
        assert len(forward.forwards) == forwards + 1  # a forward of this request's rows only

    with concurrent.futures.ThreadPoolExecutor(len(TEXTS) + 1) as pool, forward.held():
        blocker = pool.submit(post, server, path, request_of("hate"))
        assert forward.entered.wait(10)
        futures = {text: pool.submit(post, server, path, request_of(text)) for text in TEXTS}
        wait_until(lambda: unanswered(runtime, model) == len(TEXTS) + 1, 10, "every request")
        forward.release()
        assert blocker.result(30).status_code == 200
        batched = {text: future.result(30) for text, future in futures.items()}
    rows_alone = {key for keys in forward.forwards[: len(TEXTS)] for key in keys}
    together = forward.forwards[-1]
    assert sorted(together) == sorted(rows_alone), "the queued requests share one forward"
    for text, response in batched.items():
        assert response.status_code == 200, response.text
        agree(path, alone[text], response.json())


# -- deadlines, failures, cancellation ------------------------------------------------------
@pytest.mark.slow
def test_a_request_past_its_deadline_answers_deadline_exceeded(make_runtime, live_server):
    runtime = make_runtime(("pooled",))
    server = live_server(runtime)
    forward = control(runtime, "pooled")
    late = {"model": "pooled", "input": ["good", "bad"], "options": {"deadline_ms": 50}}
    bundle = {
        "tasks": [{"id": "x", "embeddings": {"model": "pooled", "input": "okay"}}],
        "options": {"deadline_ms": 50},
    }
    with concurrent.futures.ThreadPoolExecutor(3) as pool, forward.held():
        blocker = pool.submit(post, server, "/v1/embeddings", {"model": "pooled", "input": "film"})
        assert forward.entered.wait(10)
        expired = pool.submit(post, server, "/v1/embeddings", late)
        expired_bundle = pool.submit(post, server, "/v1/bundle", bundle)
        wait_until(lambda: unanswered(runtime, "pooled") == 3, 10, "three admitted requests")
        # both arrived before now: their 50 ms deadlines end before now + 50 ms
        passed = time.monotonic() + 0.05
        wait_until(lambda: time.monotonic() > passed, 1, "the deadlines to pass")
        forward.release()
        assert blocker.result(30).status_code == 200
        response, bundled = expired.result(30), expired_bundle.result(30)
    assert response.status_code == 200
    message = "the request's deadline passed before this input ran"
    assert response.json()["data"] == [
        {"object": "embedding", "index": i, "error": "deadline_exceeded", "message": message}
        for i in (0, 1)
    ]
    [task] = bundled.json()["results"]
    assert task["status"] == 200
    assert task["embeddings"]["data"][0]["error"] == "deadline_exceeded"
    answered = post(server, "/v1/embeddings", late)  # nothing queued now: in time
    assert all("embedding" in d for d in answered.json()["data"])


def test_a_forward_that_raises_fails_its_items_and_the_next_request_succeeds(runtime):
    client = make_client(runtime)
    for model, path, body in [
        ("pooled", "/v1/embeddings", {"model": "pooled", "input": ["good", "bad"], "options": {}}),
        ("sequence", "/v1/classify", {"model": "sequence", "input": ["good", "bad"]}),
        ("relevance", "/v1/rerank", {"model": "relevance", "query": "q", "documents": ["a"]}),
    ]:
        forward = control(runtime, model)
        forward.fail_run = RuntimeError("device lost")
        response = client.post(path, json=body)
        assert response.status_code == 200, response.text
        items = response.json()["data" if model == "pooled" else "results"]
        assert items and all(item["error"] == "internal_error" for item in items)
        assert {item["message"] for item in items} == {"the forward failed: RuntimeError"}
        forward.fail_run = None
        again = client.post(path, json=body).json()
        items = again["data" if model == "pooled" else "results"]
        assert items and all("error" not in item for item in items)


@pytest.mark.slow
def test_a_client_that_goes_away_cancels_its_queued_work(make_runtime, live_server):
    runtime = make_runtime(("pooled",), result_cache_entries=0)
    server = live_server(runtime)
    forward = control(runtime, "pooled")
    body = b'{"model": "pooled", "input": ["alice and bob", "carol in tokyo"]}'
    with concurrent.futures.ThreadPoolExecutor(1) as pool, forward.held():
        blocker = pool.submit(post, server, "/v1/embeddings", {"model": "pooled", "input": "x"})
        assert forward.entered.wait(10)
        sock = server.connect()
        sock.sendall(
            b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        wait_until(lambda: unanswered(runtime, "pooled") == 2, 10, "the request to queue")
        sock.close()
        wait_until(lambda: unanswered(runtime, "pooled") == 1, 5, "the request to be cancelled")
        forward.release()
        assert blocker.result(30).status_code == 200
    assert len(forward.forwards) == 1  # the cancelled rows never ran
    assert post(server, "/v1/embeddings", {"model": "pooled", "input": "ok"}).status_code == 200
    assert len(forward.forwards) == 2


@pytest.mark.slow
def test_a_client_that_leaves_a_bundle_cancels_every_queued_task(make_runtime, live_server):
    runtime = make_runtime(("pooled", "sequence"), result_cache_entries=0)
    server = live_server(runtime)
    forward = control(runtime, "pooled")
    body = (
        b'{"tasks": [{"id": "a", "embeddings": {"model": "pooled", "input": "alice"}},'
        b' {"id": "b", "embeddings": {"model": "pooled", "input": "bob"}},'
        b' {"id": "c", "classify": {"model": "sequence", "input": "carol"}}]}'
    )
    with concurrent.futures.ThreadPoolExecutor(1) as pool, forward.held():
        blocker = pool.submit(post, server, "/v1/embeddings", {"model": "pooled", "input": "x"})
        assert forward.entered.wait(10)
        sock = server.connect()
        sock.sendall(
            b"POST /v1/bundle HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        wait_until(lambda: unanswered(runtime, "pooled") == 3, 10, "the tasks to queue")
        sock.close()
        wait_until(lambda: unanswered(runtime, "pooled") == 1, 5, "the tasks to be cancelled")
        forward.release()
        assert blocker.result(30).status_code == 200
    assert len(forward.forwards) == 1  # neither cancelled task ran
